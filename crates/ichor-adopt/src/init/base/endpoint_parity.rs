//! The API server's host in a base config (its certificate SANs) is read
//! with the one endpoint parser; this holds it to the hand-written reading
//! it replaced. Where they differ, init refuses the endpoint anyway, or the
//! text is a bare IPv6 address (whose last group the old reading took for
//! a port).

use proptest::prelude::*;

use super::endpoint_host;
use crate::init::check_endpoint;

/// The host as the hand-written reading took it.
fn old_endpoint_host(endpoint: &str) -> Option<&str> {
    let rest = endpoint.strip_prefix("https://")?;
    let authority = rest.split('/').next()?;
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next()?
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    (!host.is_empty()).then_some(host)
}

/// Whether the text after `https://` (without a closing `/`) is a bare IPv6 address.
fn bare_ipv6(endpoint: &str) -> bool {
    endpoint
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .parse::<std::net::Ipv6Addr>()
        .is_ok()
}

/// Endpoints near every rule: IPv4 and IPv6 (bare and bracketed), DNS
/// names, garbage with `:` `[` `]` `/` `@`, ports in and out of range,
/// paths and trailing slashes, other schemes.
fn endpoint() -> impl Strategy<Value = String> {
    let scheme = prop_oneof![Just("https://"), Just("http://"), Just("")];
    let host = prop_oneof![
        any::<std::net::Ipv4Addr>().prop_map(|ip| ip.to_string()),
        any::<std::net::Ipv6Addr>().prop_map(|ip| ip.to_string()),
        any::<std::net::Ipv6Addr>().prop_map(|ip| format!("[{ip}]")),
        "[a-z0-9-]{1,8}(\\.[a-z0-9-]{1,8}){0,3}",
        "[a-zA-Z0-9.:\\[\\]/@ _#%-]{0,16}",
        Just(String::new()),
    ];
    let port = prop_oneof![
        Just(String::new()),
        (0u32..=70000).prop_map(|p| format!(":{p}")),
        ":[0-9a-z+: ]{0,7}",
    ];
    let tail = prop_oneof![Just(""), Just("/"), Just("//"), Just("/api"), Just("?x")];
    prop_oneof![
        4 => (scheme, host, port, tail).prop_map(|(s, h, p, t)| format!("{s}{h}{p}{t}")),
        1 => any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// Every endpoint init takes gets the host the old reading gave.
    #[test]
    fn an_accepted_endpoint_gets_the_old_host(text in endpoint()) {
        if check_endpoint(&text).is_ok() {
            let new = endpoint_host(&text);
            prop_assert_eq!(new.as_deref(), old_endpoint_host(&text), "{:?}", text);
        }
    }

    /// A host the parser reads is the old one, but for a bare IPv6
    /// address; a host only the old reading found is on an endpoint init
    /// refuses.
    #[test]
    fn the_host_differs_only_where_init_refuses_or_on_a_bare_ipv6(text in endpoint()) {
        let (new, old) = (endpoint_host(&text), old_endpoint_host(&text));
        match (new.as_deref(), old) {
            (Some(n), o) if Some(n) != o => prop_assert!(bare_ipv6(&text), "{:?}: {} vs {:?}", text, n, o),
            (None, Some(_)) => prop_assert!(check_endpoint(&text).is_err(), "{:?}", text),
            _ => {}
        }
    }
}
