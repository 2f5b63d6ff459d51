//! Network endpoints in parameters: `host[:port]`, as a StorageClass gives a server, a filer or
//! a registry.
//!
//! Plugins check endpoints themselves so that a typo is refused at CreateVolume (or at the first
//! stage of an inline volume) with a message naming the parameter, rather than by a program
//! failing to connect on every node. The host still decides whether a plugin may reach the
//! endpoint; this module only says whether the text is one.
//!
//! The grammar: a host is a DNS name (labels of ASCII letters, digits and `-`, not starting or
//! ending with `-`, at most 63 bytes each and 253 in all), an IPv4 address (dotted decimal), or
//! an IPv6 address in brackets (`[::1]`); a port is 1 to 65535 in decimal, at most 5 digits.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Whether [`check_host_port`] requires the `:port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// `host` and `host:port` are both accepted.
    Optional,
    /// Only `host:port` is accepted; `host` alone is [`HostPortError::MissingPort`].
    Required,
}

/// Why a text is not a `host[:port]`, from the first check that fails.
///
/// [`fmt::Display`] gives a short reason for messages (`bad port: give 1 to 65535`); a plugin
/// that words its messages differently matches on the variant instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostPortError {
    /// The text is empty.
    Empty,
    /// A `[` opens an IPv6 address and no `]` closes it.
    MissingBracket,
    /// The text between `[` and `]` is not an IPv6 address.
    BadIpv6,
    /// Something other than `:port` follows the `]` of an IPv6 address.
    TextAfterBracket,
    /// More than one `:` without brackets: an IPv6 address must be written `[::1]`.
    NeedsBrackets,
    /// [`Port::Required`] and there is no `:port` (checked before the port and the host).
    MissingPort,
    /// The port is not a decimal number from 1 to 65535 of at most 5 digits.
    BadPort,
    /// The host is digits and dots but not an IPv4 address.
    BadIpv4,
    /// The host is not a DNS name.
    BadHostName,
}

impl fmt::Display for HostPortError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HostPortError::Empty => "empty",
            HostPortError::MissingBracket => "missing ] after an IPv6 address",
            HostPortError::BadIpv6 => "bad IPv6 address",
            HostPortError::TextAfterBracket => "unexpected text after ]",
            HostPortError::NeedsBrackets => "an IPv6 address needs brackets, such as [::1]:5000",
            HostPortError::MissingPort => "missing :port",
            HostPortError::BadPort => "bad port: give 1 to 65535",
            HostPortError::BadIpv4 => "bad IPv4 address",
            HostPortError::BadHostName => "bad host name",
        })
    }
}

impl std::error::Error for HostPortError {}

/// Check `host[:port]` (see the module docs for the grammar); `port` says whether the port may
/// be left out. The checks run in the order of [`HostPortError`]'s variants, so the error names
/// the first thing wrong: the brackets, then whether a port is there, then its value, then the
/// host.
///
/// ```
/// use mounthost_plugin_sdk::net::{HostPortError, Port, check_host_port};
///
/// assert_eq!(check_host_port("filer.example.com:8888", Port::Required), Ok(()));
/// assert_eq!(check_host_port("[::1]", Port::Optional), Ok(()));
/// assert_eq!(check_host_port("[::1]", Port::Required), Err(HostPortError::MissingPort));
/// assert_eq!(check_host_port("::1", Port::Optional), Err(HostPortError::NeedsBrackets));
/// ```
pub fn check_host_port(item: &str, port: Port) -> Result<(), HostPortError> {
    if item.is_empty() {
        return Err(HostPortError::Empty);
    }
    let (host, given_port) = if let Some(rest) = item.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or(HostPortError::MissingBracket)?;
        v6.parse::<Ipv6Addr>().map_err(|_| HostPortError::BadIpv6)?;
        match after {
            "" => (None, None),
            _ => (None, Some(after.strip_prefix(':').ok_or(HostPortError::TextAfterBracket)?)),
        }
    } else if item.matches(':').count() > 1 {
        return Err(HostPortError::NeedsBrackets);
    } else {
        match item.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(item), None),
        }
    };
    match given_port {
        None if port == Port::Required => return Err(HostPortError::MissingPort),
        None => {}
        Some(p) if !is_port(p) => return Err(HostPortError::BadPort),
        Some(_) => {}
    }
    match host {
        None => Ok(()),
        Some(h) if h.bytes().all(|b| b.is_ascii_digit() || b == b'.') => {
            h.parse::<Ipv4Addr>().map(|_| ()).map_err(|_| HostPortError::BadIpv4)
        }
        Some(h) if is_dns_name(h) => Ok(()),
        Some(_) => Err(HostPortError::BadHostName),
    }
}

/// True for a port as an endpoint spells it: 1 to 5 decimal digits (leading zeros allowed)
/// whose value is 1 to 65535.
pub fn is_port(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 5
        && p.bytes().all(|b| b.is_ascii_digit())
        && p.parse::<u32>().is_ok_and(|n| (1..=65_535).contains(&n))
}

/// True for a DNS name: 1 to 253 bytes of dot-separated labels, each 1 to 63 ASCII letters,
/// digits or `-`, not starting or ending with `-`. No trailing dot; any case.
pub fn is_dns_name(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use HostPortError::*;

    #[test]
    fn accepted_endpoints() {
        for item in [
            "localhost",
            "mirror.example.com",
            "seaweedfs-filer.storage.svc.cluster.local:8888",
            "a-b.c:1",
            "Caps.Example:65535",
            "10.0.0.1",
            "10.0.0.1:443",
            "[::1]",
            "[::1]:5000",
            "[2001:db8::1]:00080",
        ] {
            assert_eq!(check_host_port(item, Port::Optional), Ok(()), "{item:?}");
            let required = if item.ends_with(']') || !item.contains(':') { Err(MissingPort) } else { Ok(()) };
            assert_eq!(check_host_port(item, Port::Required), required, "{item:?}");
        }
    }

    #[test]
    fn refusals_name_the_first_thing_wrong() {
        for (item, optional, required) in [
            ("", Empty, Empty),
            ("[::1", MissingBracket, MissingBracket),
            ("[zz::1]:5000", BadIpv6, BadIpv6),
            ("[::1]x", TextAfterBracket, TextAfterBracket),
            ("::1", NeedsBrackets, NeedsBrackets),
            ("fe80::1:8888", NeedsBrackets, NeedsBrackets),
            ("a:0", BadPort, BadPort),
            ("a:", BadPort, BadPort),
            ("a:65536", BadPort, BadPort),
            ("a:000001", BadPort, BadPort),
            ("a:http", BadPort, BadPort),
            ("a_b:x", BadPort, BadPort),
            ("300.1.1.1", BadIpv4, MissingPort),
            ("256.1.1.1:1", BadIpv4, BadIpv4),
            (":1", BadIpv4, BadIpv4),
            ("a_b", BadHostName, MissingPort),
            ("a_b:1", BadHostName, BadHostName),
            ("-bad-:1", BadHostName, BadHostName),
            ("a..b:1", BadHostName, BadHostName),
            ("a/b", BadHostName, MissingPort),
        ] {
            assert_eq!(check_host_port(item, Port::Optional), Err(optional), "{item:?}");
            assert_eq!(check_host_port(item, Port::Required), Err(required), "{item:?}");
        }
    }

    #[test]
    fn dns_name_limits() {
        assert!(is_dns_name(&"a".repeat(63)));
        assert!(!is_dns_name(&"a".repeat(64)));
        let name = |len: usize| ["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(len - 192)].join(".");
        assert!(is_dns_name(&name(253)));
        assert!(!is_dns_name(&name(254)));
        assert!(!is_dns_name("a."));
        assert!(!is_dns_name(""));
    }

    #[test]
    fn reasons_read_as_text() {
        assert_eq!(BadPort.to_string(), "bad port: give 1 to 65535");
        assert_eq!(NeedsBrackets.to_string(), "an IPv6 address needs brackets, such as [::1]:5000");
        assert!(is_port("00080") && !is_port("0") && !is_port("123456") && !is_port("+1"));
    }
}
