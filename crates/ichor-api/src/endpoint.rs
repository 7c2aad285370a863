//! An address Ichor dials: `host`, `host:port`, an IPv6 address bare or in
//! brackets, `[v6]:port`, and the port the API listens on when none is
//! written. One parser for the webhook that checks `spec.address`, the
//! controller that dials it, and every other reader of an endpoint.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// The Talos API's port (apid), where a node's address names none.
pub const TALOS_API_PORT: u16 = 50000;

/// The Kubernetes API server's port, where an endpoint names none.
pub const KUBERNETES_API_PORT: u16 = 6443;

/// A host (an IP address or a DNS host name, as written; an IPv6 address
/// without its brackets) and a port. Shown as `host:port`, `[v6]:port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

/// A text that is no endpoint, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("address {text:?} {problem}")]
pub struct EndpointError {
    pub text: String,
    pub problem: EndpointProblem,
}

/// What is wrong with an address, said after it ("address "x" is empty").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointProblem {
    Empty,
    TooLong {
        len: usize,
        max: usize,
    },
    Character(char),
    /// A scheme, a path, user info, a query: a different request than meant.
    NotAHost,
    UnclosedBracket,
    NoIpv6InBrackets,
    TextAfterBracket,
    Port(String),
    /// No port written where one must be.
    NoPort,
    /// Neither an IP address nor a DNS host name (`10.0.0.300`, `a..b`).
    NotAHostName,
}

impl fmt::Display for EndpointProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointProblem::Empty => f.write_str("is empty"),
            EndpointProblem::TooLong { len, max } => write!(f, "is {len} bytes long, over {max}"),
            EndpointProblem::Character(c) => write!(f, "holds the character {c:?}"),
            EndpointProblem::NotAHost => {
                f.write_str("is a URL, a path or holds user info, not a host")
            }
            EndpointProblem::UnclosedBracket => f.write_str("opens a [ without closing it"),
            EndpointProblem::NoIpv6InBrackets => f.write_str("has no IPv6 address between [ and ]"),
            EndpointProblem::TextAfterBracket => f.write_str("has text after ]"),
            EndpointProblem::Port(p) => write!(f, "has port {p:?}, not a number from 1 to 65535"),
            EndpointProblem::NoPort => f.write_str("names no port"),
            EndpointProblem::NotAHostName => {
                f.write_str("is neither an IP address nor a DNS host name")
            }
        }
    }
}

/// The longest address: a DNS name's 253 bytes and `:65535` with room.
const MAX_LEN: usize = 253 + 8;

impl Endpoint {
    /// Reads `host`, `host:port`, an IPv6 address (bare or in brackets) or
    /// `[v6]:port`; `default_port` where none is written. Nothing else: a
    /// scheme, a path, user info, spaces or control characters would make
    /// a different request than the one meant.
    pub fn parse(text: &str, default_port: u16) -> Result<Endpoint, EndpointError> {
        Endpoint::read(text, Some(default_port))
    }

    /// [`Endpoint::parse`] of a text that must write its port (`host:port`,
    /// `[v6]:port`): where none is written, [`EndpointProblem::NoPort`].
    pub fn parse_with_port(text: &str) -> Result<Endpoint, EndpointError> {
        Endpoint::read(text, None)
    }

    /// The one parser; `default_port` none: the port must be written.
    fn read(text: &str, default_port: Option<u16>) -> Result<Endpoint, EndpointError> {
        let fail = |problem| EndpointError {
            text: text.to_owned(),
            problem,
        };
        if text.is_empty() {
            return Err(fail(EndpointProblem::Empty));
        }
        if text.len() > MAX_LEN {
            return Err(fail(EndpointProblem::TooLong {
                len: text.len(),
                max: MAX_LEN,
            }));
        }
        if let Some(c) = text
            .chars()
            .find(|c| c.is_whitespace() || c.is_control() || !c.is_ascii())
        {
            return Err(fail(EndpointProblem::Character(c)));
        }
        if text.contains("://") || text.contains(['/', '@', '?', '#', '%', '\\']) {
            return Err(fail(EndpointProblem::NotAHost));
        }
        // (host, port as written, whether the host is an IPv6 address)
        let (host, port, ipv6) = if let Some(rest) = text.strip_prefix('[') {
            let Some((ip, after)) = rest.split_once(']') else {
                return Err(fail(EndpointProblem::UnclosedBracket));
            };
            if ip.parse::<Ipv6Addr>().is_err() {
                return Err(fail(EndpointProblem::NoIpv6InBrackets));
            }
            match after.strip_prefix(':') {
                Some(p) => (ip, Some(p), true),
                None if after.is_empty() => (ip, None, true),
                None => return Err(fail(EndpointProblem::TextAfterBracket)),
            }
        } else if text.parse::<Ipv6Addr>().is_ok() {
            (text, None, true)
        } else {
            match text.split_once(':') {
                Some((h, p)) => (h, Some(p), false),
                None => (text, None, false),
            }
        };
        let port = match port {
            None => default_port.ok_or_else(|| fail(EndpointProblem::NoPort))?,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| fail(EndpointProblem::Port(p.to_owned())))?,
        };
        if !ipv6 && !is_host(host) {
            return Err(fail(EndpointProblem::NotAHostName));
        }
        Ok(Endpoint {
            host: host.to_owned(),
            port,
        })
    }

    /// Reads `https://HOST[:PORT][/]` (a Kubernetes API server's URL, as
    /// `cluster.controlPlane.endpoint` holds it): the endpoint between the
    /// scheme and the optional closing `/`.
    pub fn parse_https_url(text: &str, default_port: u16) -> Result<Endpoint, EndpointError> {
        Endpoint::read_https_url(text, Some(default_port))
    }

    /// [`Endpoint::parse_https_url`] of a URL that must write its port
    /// (`https://HOST:PORT[/]`).
    pub fn parse_https_url_with_port(text: &str) -> Result<Endpoint, EndpointError> {
        Endpoint::read_https_url(text, None)
    }

    fn read_https_url(text: &str, default_port: Option<u16>) -> Result<Endpoint, EndpointError> {
        let authority = text
            .strip_prefix("https://")
            .map(|rest| rest.strip_suffix('/').unwrap_or(rest))
            .ok_or_else(|| EndpointError {
                text: text.to_owned(),
                problem: EndpointProblem::NotAHost,
            })?;
        Endpoint::read(authority, default_port).map_err(|e| EndpointError {
            text: text.to_owned(),
            problem: e.problem,
        })
    }
}

/// An IPv4 address or a DNS host name.
fn is_host(host: &str) -> bool {
    if host.parse::<Ipv4Addr>().is_ok() {
        return true;
    }
    let labels_ok = host.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    });
    // An all-digit last label is a mistyped IPv4 address (10.0.0.300), not a name.
    let numeric_tail = host
        .rsplit('.')
        .next()
        .is_some_and(|l| l.chars().all(|c| c.is_ascii_digit()));
    labels_ok && !numeric_tail && host.len() <= 253
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(text: &str) -> String {
        Endpoint::parse(text, TALOS_API_PORT)
            .map(|e| e.to_string())
            .unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn an_endpoint_takes_the_default_port_only_when_it_names_none() {
        assert_eq!(shown("10.0.0.2"), "10.0.0.2:50000");
        assert_eq!(shown("10.0.0.2:4000"), "10.0.0.2:4000");
        assert_eq!(shown("node-1.lab"), "node-1.lab:50000");
        assert_eq!(shown("fd00::2"), "[fd00::2]:50000");
        assert_eq!(shown("[fd00::2]"), "[fd00::2]:50000");
        assert_eq!(shown("[fd00::2]:4000"), "[fd00::2]:4000");
        let e = Endpoint::parse("[fd00::2]:4000", TALOS_API_PORT).unwrap();
        assert_eq!((e.host.as_str(), e.port), ("fd00::2", 4000));
    }

    #[test]
    fn a_text_that_is_no_endpoint_says_what_is_wrong() {
        for (text, problem) in [
            ("", "is empty"),
            ("a b", "holds the character ' '"),
            (
                "https://x",
                "is a URL, a path or holds user info, not a host",
            ),
            ("[fd00::2", "opens a [ without closing it"),
            ("[x]:1", "has no IPv6 address between [ and ]"),
            ("[fd00::2]x", "has text after ]"),
            ("10.5.0.2:0", "has port \"0\", not a number from 1 to 65535"),
            (
                "10.5.0.2:65536",
                "has port \"65536\", not a number from 1 to 65535",
            ),
            ("10.0.0.300", "is neither an IP address nor a DNS host name"),
            (
                "fd00::2:50000:1]",
                "has port \":2:50000:1]\", not a number from 1 to 65535",
            ),
        ] {
            let e = Endpoint::parse(text, TALOS_API_PORT).unwrap_err();
            assert_eq!(e.problem.to_string(), problem, "{text}");
            assert_eq!(e.to_string(), format!("address {text:?} {problem}"));
        }
        let long = "a".repeat(300);
        assert_eq!(
            Endpoint::parse(&long, 1).unwrap_err().problem,
            EndpointProblem::TooLong { len: 300, max: 261 }
        );
    }

    #[test]
    fn an_api_server_url_reads_with_its_port_or_6443() {
        let url =
            |t: &str| Endpoint::parse_https_url(t, KUBERNETES_API_PORT).map(|e| e.to_string());
        assert_eq!(url("https://10.5.0.2:6443").unwrap(), "10.5.0.2:6443");
        assert_eq!(
            url("https://k8s.example.com/").unwrap(),
            "k8s.example.com:6443"
        );
        assert_eq!(url("https://[fd00::1]:443").unwrap(), "[fd00::1]:443");
        for bad in [
            "http://x:6443",
            "10.5.0.2:6443",
            "https://x/api",
            "https://",
        ] {
            assert!(url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_endpoint_that_must_write_its_port_says_when_it_names_none() {
        for (text, shown) in [
            ("10.0.0.2:4000", "10.0.0.2:4000"),
            ("[fd00::2]:4000", "[fd00::2]:4000"),
            ("node-1.lab:1", "node-1.lab:1"),
        ] {
            assert_eq!(Endpoint::parse_with_port(text).unwrap().to_string(), shown);
        }
        for text in ["10.0.0.2", "fd00::2", "[fd00::2]", "node-1.lab"] {
            let e = Endpoint::parse_with_port(text).unwrap_err();
            assert_eq!(e.problem, EndpointProblem::NoPort, "{text}");
            assert_eq!(e.to_string(), format!("address {text:?} names no port"));
        }
        assert_eq!(
            Endpoint::parse_https_url_with_port("https://k8s.example.com:443/")
                .unwrap()
                .to_string(),
            "k8s.example.com:443"
        );
        let e = Endpoint::parse_https_url_with_port("https://10.5.0.2").unwrap_err();
        assert_eq!(
            (e.text.as_str(), e.problem),
            ("https://10.5.0.2", EndpointProblem::NoPort)
        );
    }
}
