//! Error texts of parsers quote the value they choked on (`invalid type:
//! string "…"`, ``unknown variant `…` ``); in a machine config, a bundle or a
//! talosconfig that value can be a key or a token. Every such value is
//! replaced before the text reaches an error, a log or a status.

/// What stands in for a quoted value.
pub const REDACTED: &str = "(redacted)";

/// Where a backticked value (not a field name) starts: serde writes the
/// value it choked on as ``variant `…` `` and ``character `…` ``.
const BACKTICKED_VALUES: [&str; 2] = ["variant `", "character `"];

/// `message` with every double-quoted stretch (a `\"` inside it does not end
/// it), and the backticked value after `variant ` or `character `, replaced
/// by [`REDACTED`]. Field names (``unknown field `x` ``) stay: they are keys,
/// and they tell the user what to fix.
pub fn quoted_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    loop {
        let dq = rest.find('"');
        let bt = BACKTICKED_VALUES
            .iter()
            .filter_map(|m| rest.find(m).map(|i| i + m.len() - 1))
            .min();
        let (start, close) = match (dq, bt) {
            (Some(d), Some(b)) if b < d => (b, '`'),
            (Some(d), _) => (d, '"'),
            (None, Some(b)) => (b, '`'),
            (None, None) => break,
        };
        out.push_str(&rest[..=start]);
        let after = &rest[start + 1..];
        out.push_str(REDACTED);
        match closing(after, close) {
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

/// A parser's error as a cause fit for an error chain: its text with the
/// values it quotes replaced ([`quoted_values`]), and no causes of its own
/// (they could quote the same values). Neither its `Display` nor its `Debug`
/// holds the original text.
#[derive(Clone, PartialEq, Eq)]
pub struct Redacted {
    text: String,
}

impl Redacted {
    /// `error`'s text, its quoted values replaced.
    pub fn of(error: &dyn std::fmt::Display) -> Self {
        Self {
            text: quoted_values(&error.to_string()),
        }
    }
}

impl std::fmt::Display for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Redacted").field(&self.text).finish()
    }
}

impl std::error::Error for Redacted {}

/// The byte index of the `close` that ends a quoted stretch: for a double
/// quote, one not escaped by a backslash.
fn closing(text: &str, close: char) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            '\\' if close == '"' && !escaped => escaped = true,
            c if c == close && !escaped => return Some(i),
            _ => escaped = false,
        }
    }
    None
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

    /// Covers: R8.1
    #[test]
    fn escaped_quotes_and_backticked_characters_do_not_let_a_value_through() {
        assert_eq!(
            quoted_values(r#"invalid type: string "ab\"cd\"ef", expected u16"#),
            r#"invalid type: string "(redacted)", expected u16"#
        );
        assert_eq!(
            quoted_values(r#"string "a\\" then "b""#),
            r#"string "(redacted)" then "(redacted)""#
        );
        assert_eq!(
            quoted_values("invalid type: character `k`, expected a string"),
            "invalid type: character `(redacted)`, expected a string"
        );
        assert_eq!(
            quoted_values("unknown variant `x`, expected one of `a`"),
            "unknown variant `(redacted)`, expected one of `a`"
        );
    }

    /// Every text of a parse error's chain, its `Debug` included.
    fn texts(e: &(dyn std::error::Error + 'static)) -> String {
        let mut all = format!("{e:?}");
        let mut next = Some(e);
        while let Some(cause) = next {
            all.push_str(&cause.to_string());
            next = cause.source();
        }
        all
    }

    #[test]
    fn parse_errors_carry_no_value_down_their_chain() {
        let talosconfig = crate::talosconfig::Talosconfig::parse(
            "context: a\ncontexts: \"s3cr3t\"\n",
            "talosconfig",
        )
        .unwrap_err();
        let bundle =
            crate::secrets::SecretsBundle::parse("cluster: \"s3cr3t\"\n", "bundle").unwrap_err();
        for e in [&talosconfig as &(dyn std::error::Error + 'static), &bundle] {
            let all = texts(e);
            assert!(all.contains(REDACTED), "{all}");
            assert!(!all.contains("s3cr3t"), "{all}");
        }
    }
}
