//! Where a registry may send the host daemon: the checks on a token realm, on every redirect
//! hop, and on the addresses a name resolves to (docs/model-cache.md#where-requests-go).
//!
//! A registry is code the platform team did not write, and the host daemon is root on every
//! node. So a reply may point the daemon only at
//!
//! - the registry itself (the same scheme, host and port that was contacted: its mirror when
//!   it has one),
//! - a host the node lists for that registry (`--registry-endpoint REGISTRY=HOST[:PORT]`;
//!   `docker.io=auth.docker.io` is built in), or
//! - for a redirect only, any other host on a public address (storage services and CDNs serve
//!   blobs from their own hosts).
//!
//! Never from HTTPS to plain HTTP, and plain HTTP only to hosts the node lists as insecure. A
//! token realm is the registry's own host or a listed one (it receives the credentials). A name
//! is resolved here ([`Resolver`]) and a loopback, link-local or private address of a name that
//! is neither the registry's nor listed is dropped, so the check holds at the connection, not
//! only on the name (a name that resolves to 127.0.0.1 on a second lookup changes nothing).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// What pointed the daemon somewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pointer {
    /// A `WWW-Authenticate: Bearer realm=...` challenge.
    Realm,
    /// A 3xx `Location`.
    Redirect,
}

impl Pointer {
    /// Its `kind` in `mounthost_registry_refusals_total`.
    pub fn label(self) -> &'static str {
        match self {
            Pointer::Realm => "realm",
            Pointer::Redirect => "redirect",
        }
    }
}

/// A place a registry pointed the daemon at that it may not go; the request was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct Refused {
    pub pointer: Pointer,
    /// `host:port` of the refused URL.
    pub target: String,
    pub why: String,
}

impl Refused {
    fn describe(&self) -> String {
        let what = match self.pointer {
            Pointer::Realm => "its token realm",
            Pointer::Redirect => "a redirect",
        };
        format!("{what} points to {}: {}; not followed", self.target, self.why)
    }
}

/// `scheme`, lower-case host (IPv6 in brackets) and port of a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub https: bool,
    pub host: String,
    pub port: u16,
}

impl Origin {
    /// An HTTP(S) URL's place; None for another scheme or no host.
    pub fn of(url: &Url) -> Option<Origin> {
        let https = match url.scheme() {
            "https" => true,
            "http" => false,
            _ => return None,
        };
        let host = url.host_str()?.trim_end_matches('.').to_ascii_lowercase();
        let port = url.port_or_known_default()?;
        Some(Origin { https, host, port })
    }

    /// `host[:port]` as written in a reference (`registry.example.com`, `10.0.0.1:5000`).
    pub fn of_host(host_port: &str, https: bool) -> Option<Origin> {
        let scheme = if https { "https" } else { "http" };
        Origin::of(&Url::parse(&format!("{scheme}://{host_port}/")).ok()?)
    }

    /// `host:port`.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    fn ip(&self) -> Option<IpAddr> {
        self.host.trim_start_matches('[').trim_end_matches(']').parse().ok()
    }

    /// Same host and port (the scheme is judged apart).
    fn same_place(&self, other: &Origin) -> bool {
        self.host == other.host && self.port == other.port
    }
}

/// `host` or `host:port` a node lists; no port: any port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub host: String,
    pub port: Option<u16>,
}

impl Listed {
    /// `host` or `host:port`, as `--registry-endpoint` gives it; None: not a host.
    pub fn parse(s: &str) -> Option<Listed> {
        let o = Origin::of_host(s.trim(), true)?;
        let port = s.trim().rsplit_once(':').filter(|(h, p)| !h.ends_with(':') && p.parse::<u16>().is_ok());
        Some(Listed { host: o.host, port: port.map(|_| o.port) })
    }

    fn matches(&self, o: &Origin) -> bool {
        self.host == o.host && self.port.is_none_or(|p| p == o.port)
    }
}

/// The places one registry's replies may point to.
#[derive(Debug, Clone)]
pub struct Places {
    /// The registry as contacted.
    pub origin: Origin,
    /// The registry as the reference names it (`host[:port]`, lower case): the key of
    /// `--registry-endpoint` a refusal suggests.
    pub registry: String,
    /// `--registry-endpoint` entries for it.
    pub listed: Vec<Listed>,
    /// `--insecure-registry` entries (`host[:port]` as written, lower case).
    pub insecure: BTreeSet<String>,
}

impl Places {
    /// May a reply send the daemon to `url`? `after_https`: the chain so far used HTTPS.
    pub fn check(&self, url: &Url, pointer: Pointer, after_https: bool) -> Result<(), Refused> {
        let refuse = |target: String, why: &str| Refused { pointer, target, why: why.to_string() };
        let Some(to) = Origin::of(url) else {
            let target = url.host_str().unwrap_or("").to_string();
            return Err(refuse(target, &format!("{}:// is not HTTP(S)", url.scheme())));
        };
        let target = to.authority();
        let listed = self.listed.iter().any(|l| l.matches(&to));
        if !to.https {
            if self.origin.https || after_https {
                return Err(refuse(target, "plain HTTP after HTTPS (a downgrade)"));
            }
            let insecure = self.insecure.iter().any(|i| {
                Origin::of_host(i, false).is_some_and(|o| o.same_place(&to) || (o.host == to.host && !i.contains(':')))
            });
            if !insecure && !to.same_place(&self.origin) {
                return Err(refuse(
                    target,
                    "plain HTTP to a host the node does not list as insecure (--insecure-registry)",
                ));
            }
        }
        if to.same_place(&self.origin) || listed {
            return Ok(());
        }
        match pointer {
            Pointer::Realm => Err(refuse(
                target,
                &format!(
                    "another host than the registry's ({}), which receives the credentials; a node allows it with --registry-endpoint {}={}",
                    self.origin.authority(),
                    self.registry,
                    to.authority()
                ),
            )),
            Pointer::Redirect => {
                if let Some(ip) = to.ip()
                    && !is_public(ip)
                {
                    return Err(refuse(target, "a loopback, link-local or private address that is not the registry"));
                }
                if to.host == self.origin.host {
                    return Err(refuse(target, "another port of the registry's host"));
                }
                Ok(())
            }
        }
    }

    /// The names that may resolve to any address: the registry's, and the listed hosts'.
    pub fn trusted_names(&self) -> BTreeSet<String> {
        let mut names: BTreeSet<String> = self.listed.iter().map(|l| l.host.clone()).collect();
        names.insert(self.origin.host.clone());
        names
    }
}

/// Is `ip` an address anyone on the internet could reach (not loopback, link-local, private,
/// shared, unspecified, multicast or documentation space)?
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && v4.octets()[2] == 0)
                || (a == 198 && (18..20).contains(&b))
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let seg = v6.segments();
            // IPv4-compatible (::a.b.c.d), deprecated but routed by some stacks to the v4 host.
            if seg[..6] == [0; 6] && !v6.is_loopback() && !v6.is_unspecified() {
                return false;
            }
            let first = seg[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || (first & 0xffc0) == 0xfec0
                || first == 0x2001 && seg[1] == 0x0db8
                || first == 0x2002
                || first == 0x0064 && (seg[1] == 0xff9b))
        }
    }
}

/// A name that resolved to no address the daemon may connect to.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{name} resolves only to loopback, link-local or private addresses, and is neither the registry nor a host listed for it"
)]
pub struct PrivateName {
    pub name: String,
}

/// reqwest's resolver for one registry's client: the system's lookup, keeping for a name that
/// is not in `trusted` only its public addresses.
pub struct Resolver {
    pub trusted: BTreeSet<String>,
}

impl Resolve for Resolver {
    fn resolve(&self, name: Name) -> Resolving {
        let name = name.as_str().to_ascii_lowercase();
        let trusted = self.trusted.contains(name.trim_end_matches('.'));
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let kept: Vec<SocketAddr> = addrs.into_iter().filter(|a| trusted || is_public(a.ip())).collect();
            if kept.is_empty() {
                return Err(Box::new(PrivateName { name }) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(kept.into_iter()) as Addrs)
        })
    }
}

/// The redirect policy of one registry's client: at most 5 hops, each checked by [`Places`].
pub fn redirect_policy(places: Arc<Places>) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > 5 {
            let target = attempt.url().host_str().unwrap_or("").to_string();
            return attempt.error(Refused {
                pointer: Pointer::Redirect,
                target,
                why: "more than 5 redirects in a row".into(),
            });
        }
        let after_https = attempt.previous().iter().any(|u| u.scheme() == "https");
        let checked = places.check(attempt.url(), Pointer::Redirect, after_https);
        match checked {
            Ok(()) => attempt.follow(),
            Err(refused) => attempt.error(refused),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places(origin: &str, https: bool, listed: &[&str], insecure: &[&str]) -> Places {
        Places {
            origin: Origin::of_host(origin, https).unwrap(),
            registry: origin.to_string(),
            listed: listed.iter().map(|l| Listed::parse(l).unwrap()).collect(),
            insecure: insecure.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn a_realm_is_the_registry_or_a_listed_host() {
        let p = places("registry.example.com", true, &["auth.example.com"], &[]);
        assert!(p.check(&url("https://registry.example.com/token"), Pointer::Realm, true).is_ok());
        assert!(p.check(&url("https://registry.example.com:443/token"), Pointer::Realm, true).is_ok());
        assert!(p.check(&url("https://auth.example.com:8443/token"), Pointer::Realm, true).is_ok());
        let e = p.check(&url("https://evil.example.net/token"), Pointer::Realm, true).unwrap_err();
        assert_eq!(e.target, "evil.example.net:443");
        assert!(e.to_string().contains("--registry-endpoint registry.example.com=evil.example.net:443"), "{e}");
        // The flag named is keyed as the reference names the registry, port included.
        let p = places("127.0.0.1:5000", true, &[], &[]);
        let e = p.check(&url("https://127.0.0.1:5001/token"), Pointer::Realm, true).unwrap_err();
        assert!(e.to_string().contains("--registry-endpoint 127.0.0.1:5000=127.0.0.1:5001"), "{e}");
        // Another port of the registry's own host is another host.
        let e = p.check(&url("https://registry.example.com:5001/token"), Pointer::Realm, true).unwrap_err();
        assert_eq!(e.target, "registry.example.com:5001");
    }

    #[test]
    fn no_plain_http_after_https_even_to_a_listed_host() {
        let p = places("registry.example.com", true, &["auth.example.com"], &["auth.example.com"]);
        let e = p.check(&url("http://auth.example.com/token"), Pointer::Realm, true).unwrap_err();
        assert!(e.why.contains("downgrade"), "{e}");
        let e = p.check(&url("http://registry.example.com/v2/x"), Pointer::Redirect, true).unwrap_err();
        assert!(e.why.contains("downgrade"), "{e}");
    }

    #[test]
    fn a_plain_http_registry_stays_on_insecure_hosts() {
        let p = places("127.0.0.1:5000", false, &[], &["127.0.0.1:5000"]);
        assert!(p.check(&url("http://127.0.0.1:5000/token"), Pointer::Realm, false).is_ok());
        let e = p.check(&url("http://127.0.0.1:5001/x"), Pointer::Redirect, false).unwrap_err();
        assert!(e.why.contains("insecure"), "{e}");
        // HTTPS elsewhere is fine for a redirect to a public address, refused to a private one.
        assert!(p.check(&url("https://93.184.216.34/blob"), Pointer::Redirect, false).is_ok());
        let e = p.check(&url("https://127.0.0.1:5001/x"), Pointer::Redirect, false).unwrap_err();
        assert!(e.why.contains("loopback"), "{e}");
    }

    #[test]
    fn redirects_reach_public_hosts_but_not_private_addresses() {
        let p = places("registry.example.com", true, &[], &[]);
        assert!(p.check(&url("https://cdn.example.net/blob?sig=x"), Pointer::Redirect, true).is_ok());
        for bad in [
            "https://169.254.169.254/latest/meta-data",
            "https://10.1.2.3/x",
            "https://[::1]:8080/x",
            "https://[fe80::1]/x",
            "https://[::ffff:127.0.0.1]/x",
            "https://100.64.0.1/x",
            "https://0.0.0.0/x",
            "https://2130706433/x",
            "https://0x7f000001/x",
            "https://127.1/x",
            "https://[::127.0.0.1]/x",
            "https://[2002:7f00:1::]/x",
            "https://[64:ff9b::7f00:1]/x",
            "https://198.18.0.1/x",
        ] {
            assert!(p.check(&url(bad), Pointer::Redirect, true).is_err(), "{bad}");
        }
        assert!(p.check(&url("https://registry.example.com:444/x"), Pointer::Redirect, true).is_err());
        assert!(p.check(&url("https://registry.example.com.:444/x"), Pointer::Redirect, true).is_err());
        assert!(p.check(&url("https://registry.example.com./v2/x"), Pointer::Redirect, true).is_ok());
        assert!(p.check(&url("ftp://cdn.example.net/x"), Pointer::Redirect, true).is_err());
    }

    #[test]
    fn a_registry_on_a_private_address_keeps_its_own_place() {
        let p = places("10.0.0.5:5000", true, &["10.0.0.6"], &[]);
        assert!(p.check(&url("https://10.0.0.5:5000/v2/x"), Pointer::Redirect, true).is_ok());
        assert!(p.check(&url("https://10.0.0.6:9000/bucket/x"), Pointer::Redirect, true).is_ok());
        assert!(p.check(&url("https://10.0.0.7/x"), Pointer::Redirect, true).is_err());
    }

    #[test]
    fn public_means_public() {
        for ip in ["8.8.8.8", "2606:4700::1111", "93.184.216.34"] {
            assert!(is_public(ip.parse().unwrap()), "{ip}");
        }
        for ip in
            ["127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "::1", "fd00::1", "fe80::1", "::"]
        {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
    }

    #[tokio::test]
    async fn the_resolver_drops_private_addresses_of_untrusted_names() {
        let r = Resolver { trusted: BTreeSet::new() };
        let e = match r.resolve("localhost".parse().unwrap()).await {
            Ok(_) => panic!("localhost resolved"),
            Err(e) => e,
        };
        assert!(e.to_string().contains("localhost resolves only to"), "{e}");
        let r = Resolver { trusted: ["localhost".to_string()].into() };
        let addrs: Vec<SocketAddr> = r.resolve("localhost".parse().unwrap()).await.unwrap().collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()) && !addrs.is_empty(), "{addrs:?}");
    }
}
