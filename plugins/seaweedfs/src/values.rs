//! What each parameter value may look like.
//!
//! The checks behind [`crate::params::Settings::parse`] and the volume-id parser: filer
//! endpoints, remote paths, names, TTLs, id maps. Each refusal is `invalid-argument`, names the
//! parameter (or the volume id) and says what would be accepted.

use mounthost_plugin_sdk::BackendError;
use mounthost_plugin_sdk::net::{HostPortError, Port, check_host_port, is_port};
use mounthost_plugin_sdk::params::invalid;

/// `parameter "key"`, for messages.
pub fn label(key: &str) -> String {
    format!("parameter {key:?}")
}

/// Validate a comma-separated list of `host:port` filer endpoints. `what` names the source
/// (`parameter "filer"`, `volume id ...`).
pub fn parse_filers<'v>(what: &str, value: &'v str) -> Result<Vec<&'v str>, BackendError> {
    let mut out: Vec<&str> = Vec::new();
    for item in value.split(',') {
        check_endpoint(item).map_err(|why| {
            invalid(format!(
                "{what}: {item:?} is not a filer address ({why}); give one or several host:port \
                 separated by commas without spaces, host a DNS name, an IPv4 address or an \
                 [IPv6] address, port 1 to 65535"
            ))
        })?;
        if out.contains(&item) {
            return Err(invalid(format!("{what}: filer {item:?} is listed twice")));
        }
        out.push(item);
    }
    Ok(out)
}

/// Check one filer `host:port`; the reason is in this plugin's words.
fn check_endpoint(item: &str) -> Result<(), &'static str> {
    check_host_port(item, Port::Required).map_err(|e| match e {
        HostPortError::Empty => "empty item",
        HostPortError::MissingBracket => "missing ]",
        HostPortError::BadIpv6 => "bad IPv6 address",
        HostPortError::TextAfterBracket | HostPortError::MissingPort => "missing :port",
        // Colons without brackets: the port is what follows the last one, and the host before
        // it (which a colon makes bad) is named only when that port is good.
        HostPortError::NeedsBrackets if item.rsplit(':').next().is_some_and(is_port) => "bad host name",
        HostPortError::NeedsBrackets | HostPortError::BadPort => "bad port",
        HostPortError::BadIpv4 => "bad IPv4 address",
        HostPortError::BadHostName => "bad host name",
        // A reason a later SDK adds.
        _ => "bad address",
    })
}

/// Longest remote path: the host refuses plan texts over 4 KiB, and `-filer.path=` adds 12.
pub const MAX_REMOTE_PATH: usize = 4000;

/// Validate a remote (filer) path: absolute, `/`-separated, no empty, `.` or `..` components,
/// no control characters, at most [`MAX_REMOTE_PATH`] bytes. `/` alone is the filer's root.
pub fn check_remote_path<'v>(what: &str, v: &'v str) -> Result<&'v str, BackendError> {
    let accepted = "an absolute path such as /buckets/data: starting with /, no empty, . or .. \
                    components, no trailing /, no control characters, at most 4000 bytes";
    let ok = v.len() <= MAX_REMOTE_PATH
        && !v.chars().any(char::is_control)
        && (v == "/"
            || v.strip_prefix('/').is_some_and(|rest| rest.split('/').all(|c| !c.is_empty() && c != "." && c != "..")));
    if ok { Ok(v) } else { Err(invalid(format!("{what} must be {accepted}, not {v:?}"))) }
}

/// Refuse a remote path whose bucket (the component right under `/buckets`) SeaweedFS refuses
/// ([`crate::names::bucket_rule`]): `weed mount` would exit with the filer's 500, or the
/// directory could not be created. `what` names the parameter.
pub fn check_bucket_path(what: &str, path: &str) -> Result<(), BackendError> {
    let Some(bucket) = crate::names::bucket_of(path) else { return Ok(()) };
    crate::names::bucket_rule(bucket).map_err(|why| {
        invalid(format!(
            "{what} is {path:?}, which makes {bucket:?} an S3 bucket of SeaweedFS, and SeaweedFS \
             refuses that name ({why}): a directory directly under /buckets needs 3 to 63 lower-case \
             letters, digits, dots or hyphens, starting and ending with a letter or digit, no \"..\", \
             not an IP address, no xn-- prefix or -s3alias suffix"
        ))
    })
}

/// A SeaweedFS collection name: `[A-Za-z0-9_.-]`, 1 to 64 bytes.
pub fn check_collection<'v>(key: &str, v: &'v str) -> Result<&'v str, BackendError> {
    check_token(key, v, 64, "a collection name of [A-Za-z0-9_.-]", true)
}

/// A name of ASCII letters, digits, `_`, `-` (and `.` when `dot`), 1 to `max` bytes.
pub fn check_token<'v>(key: &str, v: &'v str, max: usize, accepted: &str, dot: bool) -> Result<&'v str, BackendError> {
    let ok = !v.is_empty()
        && v.len() <= max
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (dot && b == b'.'));
    if ok {
        Ok(v)
    } else {
        Err(invalid(format!("{} must be {accepted}, at most {max} characters, not {v:?}", label(key))))
    }
}

/// A replica placement: three digits.
pub fn check_replication(v: &str) -> Result<&str, BackendError> {
    if v.len() == 3 && v.bytes().all(|b| b.is_ascii_digit()) {
        Ok(v)
    } else {
        Err(invalid(format!(
            "parameter \"replication\" must be three digits such as 000 or 001 \
             (other data centers, other racks, same rack), not {v:?}"
        )))
    }
}

/// An octal umask of 3 or 4 digits.
pub fn check_umask(v: &str) -> Result<&str, BackendError> {
    if (v.len() == 3 || v.len() == 4) && v.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        Ok(v)
    } else {
        Err(invalid(format!(
            "parameter \"umask\" must be an octal umask of 3 or 4 digits such as 022 or 0002, not {v:?}"
        )))
    }
}

/// Largest TTL `weed mount` 4.48 accepts: it stores `-ttl` as an int32 of seconds.
const MAX_TTL_SECS: u64 = i32::MAX as u64;

/// A TTL in whole seconds, or a number with suffix `s`, `m`, `h`, `d` or `w`; returns seconds.
pub fn parse_ttl(v: &str) -> Result<u64, BackendError> {
    let (digits, unit) = match v.as_bytes().last() {
        Some(b's') => (&v[..v.len() - 1], 1),
        Some(b'm') => (&v[..v.len() - 1], 60),
        Some(b'h') => (&v[..v.len() - 1], 3_600),
        Some(b'd') => (&v[..v.len() - 1], 86_400),
        Some(b'w') => (&v[..v.len() - 1], 604_800),
        _ => (v, 1),
    };
    let secs = if !digits.is_empty() && digits.len() <= 10 && digits.bytes().all(|b| b.is_ascii_digit()) {
        digits.parse::<u64>().ok().and_then(|n| n.checked_mul(unit))
    } else {
        None
    };
    match secs {
        Some(s) if s <= MAX_TTL_SECS => Ok(s),
        _ => Err(invalid(format!(
            "parameter \"ttl\" must be whole seconds, or a whole number with suffix s, m, h, d or \
             w (such as 3600, 90m, 7d), at most {MAX_TTL_SECS} seconds, not {v:?}"
        ))),
    }
}

/// `local:filer[,local:filer...]` with u32 ids, normalised (no leading zeros).
pub fn parse_id_map(key: &str, v: &str) -> Result<String, BackendError> {
    let bad = || {
        invalid(format!(
            "{} must be local:filer pairs of numeric ids (0 to 4294967295) separated by commas, \
             such as 1000:0,1001:1, not {v:?}",
            label(key)
        ))
    };
    let num = |s: &str| -> Option<u32> {
        if !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit()) {
            s.parse::<u32>().ok()
        } else {
            None
        }
    };
    let mut pairs: Vec<(u32, u32)> = Vec::new();
    for item in v.split(',') {
        let (local, filer) = item.split_once(':').ok_or_else(bad)?;
        let (local, filer) = (num(local).ok_or_else(bad)?, num(filer).ok_or_else(bad)?);
        if pairs.iter().any(|(l, _)| *l == local) {
            return Err(invalid(format!("{} maps local id {local} twice", label(key))));
        }
        pairs.push((local, filer));
    }
    Ok(pairs.iter().map(|(l, f)| format!("{l}:{f}")).collect::<Vec<_>>().join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("localhost:8888")]
    #[case("seaweedfs-filer.storage.svc.cluster.local:8888")]
    #[case("a-b.c:1")]
    #[case("10.0.0.1:65535")]
    #[case("[::1]:8888")]
    #[case("[2001:db8::1]:1")]
    #[case("filer-0:8888,filer-1:8888,[::1]:8888")]
    fn good_filers(#[case] v: &str) {
        assert_eq!(parse_filers("f", v).unwrap().join(","), v);
    }

    #[rstest]
    #[case("2147483647", 2_147_483_647)]
    #[case("0", 0)]
    #[case("35791394m", 2_147_483_640)]
    #[case("1s", 1)]
    fn ttl_bounds(#[case] v: &str, #[case] secs: u64) {
        assert_eq!(parse_ttl(v).unwrap(), secs);
    }

    #[rstest]
    #[case("/")]
    #[case("/buckets")]
    #[case("/a b/ü/c?d")]
    fn good_remote_paths(#[case] v: &str) {
        assert_eq!(check_remote_path("p", v).unwrap(), v);
    }

    #[test]
    fn long_paths_are_refused() {
        let ok = format!("/{}", "a".repeat(MAX_REMOTE_PATH - 1));
        assert!(check_remote_path("p", &ok).is_ok());
        assert!(check_remote_path("p", &format!("{ok}b")).is_err());
    }
}
