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
        } else if j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j]) {
            ops.push(('+', b[j]));
            j += 1;
        } else {
            ops.push(('-', a[i]));
            i += 1;
        }
    }
    // Keep three lines of context around changes.
    let changed: Vec<bool> = ops.iter().map(|(c, _)| *c != ' ').collect();
    let keep: Vec<bool> = (0..ops.len())
        .map(|k| {
            let lo = k.saturating_sub(3);
            let hi = (k + 3).min(ops.len() - 1);
            changed[lo..=hi].iter().any(|c| *c)
        })
        .collect();
    let mut out = String::from("--- a\n+++ b\n");
    let mut in_hunk = false;
    for (k, (c, line)) in ops.iter().enumerate() {
        if keep[k] {
            if !in_hunk {
                out.push_str("@@ @@\n");
                in_hunk = true;
            }
            out.push(*c);
            out.push_str(line);
            out.push('\n');
        } else {
            in_hunk = false;
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
    }
}
