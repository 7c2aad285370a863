//! `check_endpoint` reads `--endpoint` with the one endpoint parser; this
//! holds it to the hand-written check it replaced. What the old check took
//! and the parser refuses is no address, each case named below.

use ichor_api::endpoint::EndpointProblem;
use proptest::prelude::*;

use super::{EndpointFault, check_endpoint};

/// The check before the one parser: whether it took the endpoint, and
/// whether it refused it for not starting with `https://`.
fn old_check_endpoint(endpoint: &str) -> Result<(), &'static str> {
    let Some(rest) = endpoint.strip_prefix("https://") else {
        return Err("not https");
    };
    let authority = rest.trim_end_matches('/');
    if authority.contains('/') || authority.contains('?') || authority.contains('@') {
        return Err("not only host and port");
    }
    let host = old_endpoint_host(endpoint).ok_or("no host")?;
    let port = authority
        .rsplit_once(':')
        .map(|(_, p)| p)
        .filter(|_| !authority.ends_with(']'));
    match port.map(str::parse::<u16>) {
        Some(Ok(p)) if p > 0 => {}
        _ => return Err("no port"),
    }
    if host.chars().any(char::is_whitespace) {
        return Err("spaces in host");
    }
    Ok(())
}

/// The host as the old check read it.
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

/// What the old check took and the parser refuses, and why that is no
/// address: a character that is neither printable ASCII nor a space, or a
/// space outside the host (the old check looked for spaces only in the
/// host, so one it took sits in the port or after a `]`), a
/// fragment or `%` or `\` or a doubled `/`, a host that is no IP address
/// nor DNS name (`a..b`, `[x]`, text after `]`, an unclosed `[`), a host
/// with a `:` outside brackets (read as a port), a bare IPv6 address
/// (its last group read as the port), an over-long text.
fn no_address(endpoint: &str, problem: &EndpointProblem) -> bool {
    let authority = endpoint.trim_start_matches("https://");
    match problem {
        EndpointProblem::Character(_) => true,
        EndpointProblem::Port(p) => p.contains(':'),
        EndpointProblem::NoPort => authority
            .trim_end_matches('/')
            .parse::<std::net::Ipv6Addr>()
            .is_ok(),
        EndpointProblem::NotAHost => {
            authority.contains(['#', '%', '\\']) || authority.contains("//")
        }
        EndpointProblem::TooLong { .. }
        | EndpointProblem::NoIpv6InBrackets
        | EndpointProblem::TextAfterBracket
        | EndpointProblem::UnclosedBracket
        | EndpointProblem::NotAHostName => true,
        EndpointProblem::Empty => false,
    }
}

/// `--endpoint` values near every rule: schemes, IPv4 and IPv6 (bare and
/// bracketed), DNS names, garbage with `:` `[` `]` `/` `@`, ports in and
/// out of range, paths and trailing slashes, empty parts.
fn endpoint() -> impl Strategy<Value = String> {
    let scheme = prop_oneof![Just("https://"), Just("http://"), Just(""), Just("https:/")];
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
    let tail = prop_oneof![
        Just(""),
        Just("/"),
        Just("//"),
        Just("/api"),
        Just("?x"),
        Just(" ")
    ];
    prop_oneof![
        4 => (scheme, host, port, tail).prop_map(|(s, h, p, t)| format!("{s}{h}{p}{t}")),
        1 => any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// Covers: R10.1
    /// What the parser takes, the old check took; what the old check
    /// refused, the parser refuses (for the same reason when it is the
    /// scheme); what only the old check took is no address.
    #[test]
    fn the_one_parser_checks_an_endpoint_as_init_did(text in endpoint()) {
        let old = old_check_endpoint(&text);
        match check_endpoint(&text) {
            Ok(()) => prop_assert_eq!(old, Ok(()), "{:?}", text),
            Err(e) => {
                prop_assert_eq!(&e.endpoint, &text);
                match (&e.fault, old) {
                    (EndpointFault::NotHttps, old) => prop_assert_eq!(old, Err("not https")),
                    (EndpointFault::Address(problem), Ok(())) => prop_assert!(
                        no_address(&text, problem),
                        "{:?}: the old check took it, the parser says {}", text, e
                    ),
                    (EndpointFault::Address(_), Err(why)) => prop_assert_ne!(why, "not https"),
                }
            }
        }
    }

    /// A refusal names the endpoint and says what is wrong in words of its own.
    #[test]
    fn a_refused_endpoint_is_named_in_its_message(text in endpoint()) {
        if let Err(e) = check_endpoint(&text) {
            let message = e.to_string();
            let named = format!("--endpoint {text:?} is not a URL of the Kubernetes API: ");
            prop_assert!(message.starts_with(&named), "{}", message);
            prop_assert!(message.ends_with("; give it as https://HOST:6443"), "{}", message);
        }
    }
}
