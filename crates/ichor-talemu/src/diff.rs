//! A small line diff for ApplyConfiguration dry-run answers.

/// A unified-style diff of two texts (`-`/`+`/` ` prefixed lines, with
/// `@@` markers). Empty when the texts are equal.
pub fn unified(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    if a == b {
        return String::new();
    }
    // Longest common subsequence table (configs are small).
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    // Hunks with three lines of context, headed `@@ -l,s +l,s @@`.
    const CONTEXT: usize = 3;
    let changes: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    let mut hunks: Vec<(usize, usize)> = Vec::new();
    for &k in &changes {
        let lo = k.saturating_sub(CONTEXT);
        let hi = (k + CONTEXT + 1).min(ops.len());
        match hunks.last_mut() {
            Some((_, end)) if lo <= *end => *end = hi,
            _ => hunks.push((lo, hi)),
        }
    }
    let mut out = String::from("--- a\n+++ b\n");
    for (lo, hi) in hunks {
        let old_before = ops[..lo].iter().filter(|(c, _)| *c != '+').count();
        let new_before = ops[..lo].iter().filter(|(c, _)| *c != '-').count();
        let old_len = ops[lo..hi].iter().filter(|(c, _)| *c != '+').count();
        let new_len = ops[lo..hi].iter().filter(|(c, _)| *c != '-').count();
        let start = |before: usize, len: usize| if len == 0 { before } else { before + 1 };
        out.push_str(&format!(
            "@@ -{},{} +{},{} @@\n",
            start(old_before, old_len),
            old_len,
            start(new_before, new_len),
            new_len
        ));
        for (c, line) in &ops[lo..hi] {
            out.push(*c);
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unified;

    #[test]
    fn equal_texts_have_no_diff() {
        assert_eq!(unified("a\nb\n", "a\nb\n"), "");
    }

    #[test]
    fn changed_line_shows_both_sides() {
        let d = unified("a\nb\nc\n", "a\nB\nc\n");
        assert!(d.contains("-b\n"), "{d}");
        assert!(d.contains("+B\n"), "{d}");
        assert!(d.contains(" a\n"), "{d}");
        assert_eq!(d, "--- a\n+++ b\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n");
    }

    #[test]
    fn distant_changes_make_two_hunks() {
        let old: String = (1..=20).map(|i| format!("l{i}\n")).collect();
        let new = old.replace("l2\n", "L2\n").replace("l18\n", "L18\n");
        let d = unified(&old, &new);
        assert!(d.contains("@@ -1,5 +1,5 @@\n"), "{d}");
        assert!(d.contains("@@ -15,6 +15,6 @@\n"), "{d}");
    }
}
