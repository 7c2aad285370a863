//! Error texts of parsers quote the value they choked on (`invalid type:
//! string "…"`, ``unknown variant `…` ``); in a machine config, a bundle or a
//! talosconfig that value can be a key or a token. Every such value is
//! replaced before the text reaches an error, a log or a status.

/// What stands in for a quoted value.
pub const REDACTED: &str = "(redacted)";

/// `message` with every double-quoted stretch, and the backticked value after
/// `variant `, replaced by [`REDACTED`]. Field names (``unknown field `x` ``)
/// stay: they are keys, and they tell the user what to fix.
pub fn quoted_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    loop {
        let dq = rest.find('"');
        let bt = rest.find("variant `").map(|i| i + "variant ".len());
        let (start, close) = match (dq, bt) {
            (Some(d), Some(b)) if b < d => (b, '`'),
            (Some(d), _) => (d, '"'),
            (None, Some(b)) => (b, '`'),
            (None, None) => break,
        };
        out.push_str(&rest[..=start]);
        let after = &rest[start + 1..];
        out.push_str(REDACTED);
        match after.find(close) {
            Some(end) => {
                out.push(close);
                rest = &after[end + 1..];
            }
            None => {
                rest = "";
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_go_and_field_names_stay() {
        assert_eq!(
            quoted_values(r#"invalid type: string "s3cr3t", expected struct ClusterNetwork"#),
            r#"invalid type: string "(redacted)", expected struct ClusterNetwork"#
        );
        assert_eq!(
            quoted_values("unknown variant `hunter2`, expected one of `a`, `b`"),
            "unknown variant `(redacted)`, expected one of `a`, `b`"
        );
        assert_eq!(
            quoted_values("unknown field `machien`, expected `machine`"),
            "unknown field `machien`, expected `machine`"
        );
        assert_eq!(quoted_values(r#"open "abc"#), r#"open "(redacted)"#);
        assert_eq!(quoted_values("no quotes"), "no quotes");
    }
}
