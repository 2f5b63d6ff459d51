//! The policy over OCI steps: `resolve` (one per stage plan, to a granted registry) and
//! `fetch-blob` (after that resolve, by sha256 digest).
//!
//! A registry is reached as `https://<registry>/v2/` (`http://` when the plan asks for an
//! insecure one; whether the node allows that is the host config's call, at execution), and
//! that URL is judged like any other plan URL: its host and port must be granted by config or
//! by the StorageClass. An `oci-reference` parameter grants its registry, an `endpoint`
//! parameter its hosts ([`super::endpoint_hosts`]); a mirror is judged the same way.

use crate::plan::oci_ref::OciRef;
use crate::plan::url::HostGrant;
use crate::plan::{RegistryAuth, Step};
use crate::plugin::bindings::types as wit;

use super::{Context, G, R, Refusal, digest, granted, parse_url, secret_key, text};

/// Longest media type accepted (RFC 6838 bounds type and subtype to 127 characters each).
const MAX_MEDIA_TYPE: usize = 255;

/// Check a `resolve` step; `resolved` says whether an earlier step already resolved.
pub(super) fn resolve(ctx: &Context<'_>, r: wit::Resolve, resolved: bool) -> G<Step> {
    if resolved {
        return Err("a plan resolves at most one OCI reference; this is the second resolve step".into());
    }
    text(ctx, &r.reference, "the reference")?;
    let parsed = OciRef::parse(&r.reference).map_err(|e| format!("reference {:?} does not parse: {e}", r.reference))?;
    let scheme = if r.insecure { "http" } else { "https" };
    registry(ctx, parsed.registry(), scheme, "registry")?;
    if let Some(m) = &r.mirror {
        text(ctx, m, "the mirror")?;
        // host[:port] only: no scheme, path or userinfo.
        if HostGrant::parse(m).is_err() {
            return Err(format!("mirror {m:?} must be host[:port], as in mirror.example:5000").into());
        }
        registry(ctx, m, scheme, "mirror")?;
    }
    let auth = match r.auth {
        wit::RegistryAuth::Anonymous => RegistryAuth::Anonymous,
        wit::RegistryAuth::Basic(b) => {
            RegistryAuth::Basic { username_key: b.username_key, password_key: b.password_key }
        }
        wit::RegistryAuth::Token(k) => RegistryAuth::Token(k),
        wit::RegistryAuth::DockerConfig(k) => RegistryAuth::DockerConfig(k),
    };
    for key in auth.keys() {
        secret_key(ctx, key, "the registry credentials")?;
    }
    Ok(Step::Resolve { reference: r.reference, mirror: r.mirror, auth, insecure: r.insecure })
}

/// A registry (or mirror) `host[:port]` the plan may pull from.
fn registry(ctx: &Context<'_>, host: &str, scheme: &str, what: &str) -> G<()> {
    let target = parse_url(&format!("{scheme}://{host}/v2/")).map_err(|e| format!("{what} {host:?}: {e}"))?;
    let parameter = if what == "mirror" { "an endpoint" } else { "an oci-reference" };
    granted(ctx, &target, what).map_err(|r| Refusal {
        reason: format!(
            "{}; grant it on the host (--grant {}:host={host}) or name it in {parameter} parameter of the StorageClass \
             (an inline volume's attributes grant nothing)",
            r.reason, ctx.plugin
        ),
        ..r
    })
}

/// Check a `fetch-blob` step; `resolved` says whether an earlier step resolved the artifact.
pub(super) fn fetch_blob(ctx: &Context<'_>, f: wit::FetchBlob, resolved: bool) -> R<Step> {
    if !resolved {
        return Err(format!("blob {} is fetched before any resolve step; resolve the artifact first", f.digest));
    }
    digest(&f.digest)?;
    // Size 0 is a real blob (an empty file, such as an `__init__.py`, packed raw); the
    // download checks the size and the digest like any other.
    if f.media_type.len() > MAX_MEDIA_TYPE || f.media_type.chars().any(char::is_control) {
        return Err(format!(
            "media type of blob {} is longer than {MAX_MEDIA_TYPE} bytes or has control characters",
            f.digest
        ));
    }
    text(ctx, &f.media_type, "the media type")?;
    Ok(Step::FetchBlob { digest: f.digest, size: f.size, media_type: f.media_type })
}
