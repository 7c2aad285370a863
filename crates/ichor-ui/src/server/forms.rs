//! Form bodies as the handlers read them.

/// A form body's fields in order, repeated keys kept (a multi-select).
pub(super) type FormPairs = Vec<(String, String)>;

pub(super) fn form_value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_decode_repeated_keys() {
        let pairs: FormPairs =
            serde_urlencoded::from_bytes(b"kind=reboot&machines=a&machines=b%2Dc&version=&x=1+2%")
                .unwrap();
        assert_eq!(
            pairs,
            vec![
                ("kind".to_string(), "reboot".to_string()),
                ("machines".into(), "a".into()),
                ("machines".into(), "b-c".into()),
                ("version".into(), "".into()),
                ("x".into(), "1 2%".into()),
            ]
        );
    }
}
