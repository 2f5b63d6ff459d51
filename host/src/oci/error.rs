//! What can go wrong while resolving or pulling from a registry, said so that the person reading
//! it knows what to change: every variant names the registry or the reference, and the ones a
//! user can fix say how.
//!
//! oci-client reports a wrong password and a missing one alike (`UnauthorizedError`) and hides a
//! TLS failure's cause in the source chain of "error sending request"; [`Ctx::classify`] tells
//! them apart (whether credentials were given; the rustls error found in the chain).
//!
//! Text taken from other errors passes through [`redact`]: reqwest ends its messages with
//! `for url (…)`, and after a redirect that URL is the storage's presigned one, whose query
//! string is a credential (`X-Amz-Signature`, `sig`, tokens). Queries, fragments and userinfo
//! never reach a message, a log line or `Debug`.

use std::error::Error as StdError;
use std::io;

use oci_client::errors::{OciDistributionError, OciErrorCode};

/// A failure of the OCI cache or puller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OciError {
    /// The TLS handshake with the registry failed (untrusted or wrong certificate, or the
    /// registry speaks plain HTTP).
    #[error("TLS with registry {registry} failed: {detail}{hint}")]
    Tls { registry: String, detail: String, hint: String, plain_http: bool },
    /// Plain HTTP was asked for a registry the node's configuration does not list as insecure.
    #[error(
        "registry {registry} is to be reached over plain HTTP, but the node's registry configuration does not list it as insecure; add it there or use HTTPS"
    )]
    InsecureRefused { registry: String },
    /// The registry wants credentials and none were given.
    #[error("registry {registry} requires authentication for {reference} and no credentials were given")]
    AuthMissing { registry: String, reference: String },
    /// The registry refused the credentials given.
    #[error("registry {registry} refused the credentials given for {reference}")]
    AuthRefused { registry: String, reference: String },
    /// The manifest (the tag or the digest) does not exist.
    #[error("{reference}: manifest not found on registry {registry} (check the repository and the tag or digest)")]
    ManifestNotFound { registry: String, reference: String },
    /// The blob does not exist in that repository.
    #[error("{reference}: blob {digest} not found on registry {registry}")]
    BlobNotFound { registry: String, reference: String, digest: String },
    /// The bytes received do not hash to the digest asked for.
    #[error("{reference}: digest mismatch for {digest}: the registry {registry} sent content hashing to {actual}")]
    DigestMismatch { registry: String, reference: String, digest: String, actual: String },
    /// The registry holds a blob of another size than the manifest says.
    #[error("{reference}: size mismatch for {digest} from registry {registry}: {detail}")]
    SizeMismatch { registry: String, reference: String, digest: String, detail: String },
    /// The cache's filesystem is full.
    #[error(
        "the model cache at {path} is full while storing {digest} from {reference}: free space or lower the cache limit"
    )]
    DiskFull { path: String, reference: String, digest: String },
    /// The registry could not be reached (refused, reset, timed out, name not resolved).
    #[error("registry {registry} is unreachable ({reference}): {detail}")]
    Unreachable { registry: String, reference: String, detail: String },
    /// The registry answered with an error (`status`: the HTTP status when known).
    #[error("registry {registry} answered {} for {reference}: {detail}", status.map(|s| format!("HTTP {s}")).unwrap_or_else(|| "an error".into()))]
    Registry { registry: String, reference: String, status: Option<u16>, detail: String, transient: bool },
    /// The registry sent something this puller cannot use (a bad manifest, a config too large).
    #[error("{reference} from registry {registry}: {detail}")]
    Protocol { registry: String, reference: String, detail: String },
    /// The image index has no manifest for the platform asked for (plan/platform.rs).
    #[error("{reference} from registry {registry}: {detail}")]
    NoPlatform { registry: String, reference: String, detail: String },
    /// A local file of the cache could not be read or written.
    #[error("the model cache at {path}: {detail}")]
    Local { path: String, detail: String, kind: io::ErrorKind },
    /// The node's registry configuration or the given secret is unusable.
    #[error("registry configuration: {0}")]
    Config(String),
    /// A lazy download stopped because no volume wants the blob any more (its volumes were
    /// unstaged); not a failure of the blob.
    #[error("the download of {digest} was stopped: no volume uses it any more")]
    Cancelled { digest: String },
    /// A reply was larger than the most mounthost reads of it; the rest was not read.
    #[error(
        "{reference}: registry {registry} sent {what} larger than {cap} bytes, the most mounthost reads of it; not read further"
    )]
    TooLarge { registry: String, reference: String, what: String, cap: u64 },
    /// A reply pointed the daemon where it may not go (`kind`: `realm` or `redirect`).
    #[error("{reference}: registry {registry}: {detail}")]
    Refused { registry: String, reference: String, kind: &'static str, detail: String },
    /// A download received less than [`super::STALL_BYTES`] in the stall window.
    #[error(
        "{reference}: registry {registry} stalled: {what} received {received} bytes in the last {secs} s (less than 64 KiB); stopped, and resumed at the next attempt (host daemon flag --download-stall-secs)"
    )]
    Stalled { registry: String, reference: String, what: String, received: u64, secs: u64 },
    /// The source did not prove it holds the bytes of a blob the node's cache already has.
    #[error(
        "{reference}: registry {registry} did not prove it holds {digest}, which this node's cache has from another source ({detail}); the cached copy is not handed to this volume"
    )]
    ProofFailed { registry: String, reference: String, digest: String, detail: String },
}

impl OciError {
    /// Would the same request succeed later without anyone changing anything (a network
    /// failure, a registry restarting, rate limiting)? A pull that failed so keeps its partial
    /// file and resumes.
    pub fn is_transient(&self) -> bool {
        match self {
            OciError::Unreachable { .. } | OciError::Stalled { .. } => true,
            OciError::Registry { transient, .. } => *transient,
            OciError::Local { kind, .. } => matches!(kind, io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted),
            _ => false,
        }
    }

    /// Do the bytes not match what the manifest says (a digest or size mismatch)? A lazy
    /// volume reading them fails; any other failure only stops its fill for a while.
    pub fn is_integrity(&self) -> bool {
        matches!(self, OciError::DigestMismatch { .. } | OciError::SizeMismatch { .. })
    }

    /// The gRPC class of this failure.
    pub fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            OciError::ManifestNotFound { .. } | OciError::BlobNotFound { .. } => ErrorKind::NotFound,
            OciError::AuthMissing { .. } => ErrorKind::Unauthenticated,
            OciError::AuthRefused { .. } => ErrorKind::PermissionDenied,
            OciError::Tls { .. }
            | OciError::InsecureRefused { .. }
            | OciError::Config(_)
            | OciError::TooLarge { .. }
            | OciError::Refused { .. }
            | OciError::NoPlatform { .. } => ErrorKind::FailedPrecondition,
            OciError::ProofFailed { .. } => ErrorKind::PermissionDenied,
            OciError::Stalled { .. } => ErrorKind::Unavailable,
            OciError::DigestMismatch { .. } | OciError::SizeMismatch { .. } => ErrorKind::DataLoss,
            OciError::DiskFull { .. } => ErrorKind::ResourceExhausted,
            OciError::Unreachable { .. } => ErrorKind::Unavailable,
            OciError::Registry { transient: true, .. } => ErrorKind::Unavailable,
            OciError::Registry { .. } | OciError::Protocol { .. } | OciError::Local { .. } => ErrorKind::Internal,
            OciError::Cancelled { .. } => ErrorKind::Aborted,
        }
    }

    /// This failure as a caller sees it, naming what was asked for (`reference`) and, where the
    /// operator fixes it with a host flag, the flag.
    pub fn into_error(self, reference: &str) -> crate::error::Error {
        let mut message = self.to_string();
        if !message.contains(reference) {
            message = format!("{reference}: {message}");
        }
        // Say which host flag the operator sets (a plain-HTTP registry's hint names its own).
        match &self {
            OciError::Tls { plain_http: false, .. } => message.push_str(" (host daemon flag --registry-ca FILE)"),
            OciError::InsecureRefused { .. } => message.push_str(" (host daemon flag --insecure-registry HOST[:PORT])"),
            _ => {}
        }
        crate::error::Error::new(self.kind(), message)
    }

    /// A local I/O failure at `path`; ENOSPC becomes [`OciError::DiskFull`].
    pub fn local(path: &std::path::Path, e: &io::Error, reference: &str, digest: &str) -> OciError {
        if e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error())
            || e.kind() == io::ErrorKind::StorageFull
            || e.raw_os_error() == Some(rustix::io::Errno::DQUOT.raw_os_error())
        {
            return OciError::DiskFull {
                path: path.display().to_string(),
                reference: reference.to_string(),
                digest: digest.to_string(),
            };
        }
        OciError::Local { path: path.display().to_string(), detail: redact(&e.to_string()), kind: e.kind() }
    }

    /// The same error with every URL in its text stripped of query, fragment and userinfo
    /// ([`redact`]): applied where an error leaves the cache, whatever built it.
    pub fn redacted(self) -> OciError {
        let r = |s: String| redact(&s);
        match self {
            OciError::Tls { registry, detail, hint, plain_http } => {
                OciError::Tls { registry: r(registry), detail: r(detail), hint, plain_http }
            }
            OciError::InsecureRefused { registry } => OciError::InsecureRefused { registry: r(registry) },
            OciError::AuthMissing { registry, reference } => {
                OciError::AuthMissing { registry: r(registry), reference: r(reference) }
            }
            OciError::AuthRefused { registry, reference } => {
                OciError::AuthRefused { registry: r(registry), reference: r(reference) }
            }
            OciError::ManifestNotFound { registry, reference } => {
                OciError::ManifestNotFound { registry: r(registry), reference: r(reference) }
            }
            OciError::BlobNotFound { registry, reference, digest } => {
                OciError::BlobNotFound { registry: r(registry), reference: r(reference), digest }
            }
            OciError::DigestMismatch { registry, reference, digest, actual } => {
                OciError::DigestMismatch { registry: r(registry), reference: r(reference), digest, actual }
            }
            OciError::SizeMismatch { registry, reference, digest, detail } => {
                OciError::SizeMismatch { registry: r(registry), reference: r(reference), digest, detail: r(detail) }
            }
            OciError::DiskFull { path, reference, digest } => {
                OciError::DiskFull { path: r(path), reference: r(reference), digest }
            }
            OciError::Unreachable { registry, reference, detail } => {
                OciError::Unreachable { registry: r(registry), reference: r(reference), detail: r(detail) }
            }
            OciError::Registry { registry, reference, status, detail, transient } => OciError::Registry {
                registry: r(registry),
                reference: r(reference),
                status,
                detail: r(detail),
                transient,
            },
            OciError::Protocol { registry, reference, detail } => {
                OciError::Protocol { registry: r(registry), reference: r(reference), detail: r(detail) }
            }
            OciError::NoPlatform { registry, reference, detail } => {
                OciError::NoPlatform { registry: r(registry), reference: r(reference), detail: r(detail) }
            }
            OciError::Local { path, detail, kind } => OciError::Local { path: r(path), detail: r(detail), kind },
            OciError::Config(detail) => OciError::Config(r(detail)),
            OciError::Cancelled { digest } => OciError::Cancelled { digest },
            OciError::TooLarge { registry, reference, what, cap } => {
                OciError::TooLarge { registry: r(registry), reference: r(reference), what, cap }
            }
            OciError::Refused { registry, reference, kind, detail } => {
                OciError::Refused { registry: r(registry), reference: r(reference), kind, detail: r(detail) }
            }
            OciError::Stalled { registry, reference, what, received, secs } => {
                OciError::Stalled { registry: r(registry), reference: r(reference), what, received, secs }
            }
            OciError::ProofFailed { registry, reference, digest, detail } => {
                OciError::ProofFailed { registry: r(registry), reference: r(reference), digest, detail: r(detail) }
            }
        }
    }

    /// The refusal this error is (`mounthost_registry_refusals_total{kind}`), if it is one.
    pub fn refusal(&self) -> Option<&'static str> {
        match self {
            OciError::TooLarge { .. } => Some("reply_too_large"),
            OciError::Refused { kind, .. } => Some(kind),
            OciError::Stalled { .. } => Some("stall"),
            OciError::ProofFailed { .. } => Some("proof"),
            _ => None,
        }
    }
}

/// Count and log a refusal where it is made (once): `mounthost_registry_refusals_total{kind}`,
/// and a warning carrying `refusal=<kind>` an operator can alert on.
pub(super) fn note_refusal(e: &OciError) {
    if let Some(kind) = e.refusal() {
        crate::metrics::global().registry_refusal(kind);
        tracing::warn!(refusal = kind, error = %e.clone().redacted(), "a registry's reply was refused");
    }
}

/// What a request was about, to name it in errors.
#[derive(Debug, Clone)]
pub(super) struct Ctx {
    /// The host contacted (the mirror when there is one).
    pub registry: String,
    /// `registry/repository:tag` or `@digest`, as the user wrote it.
    pub reference: String,
    /// Whether credentials were given (tells "missing" from "refused").
    pub given: bool,
}

/// What was being fetched.
#[derive(Debug, Clone, Copy)]
pub(super) enum What<'a> {
    Manifest,
    Blob(&'a str),
}

impl Ctx {
    /// Turn an oci-client error into one a person can act on.
    pub fn classify(&self, e: &OciDistributionError, what: What<'_>) -> OciError {
        let registry = self.registry.clone();
        let reference = self.reference.clone();
        match e {
            OciDistributionError::RequestError(r) => {
                if let Some(tls) = tls_cause(r) {
                    return self.tls(tls);
                }
                // A status turned into an error by `error_for_status` (a blob HEAD does that).
                if let Some(status) = r.status() {
                    return self.status(status.as_u16(), "", what);
                }
                let detail = chain(r);
                if let Some(url) = r.url().filter(|u| r.is_builder() && !matches!(u.scheme(), "http" | "https")) {
                    // reqwest refuses to follow a redirect to another scheme.
                    let detail =
                        format!("it redirected to {}, which is not HTTP(S); not followed", redact(url.as_str()));
                    return OciError::Protocol { registry, reference, detail };
                }
                if r.is_builder() {
                    return OciError::Config(format!("registry {registry}: {detail}"));
                }
                OciError::Unreachable { registry, reference, detail }
            }
            OciDistributionError::UnauthorizedError { .. } | OciDistributionError::AuthenticationFailure(_) => {
                self.auth()
            }
            OciDistributionError::ImageManifestNotFoundError(_) => OciError::ManifestNotFound { registry, reference },
            OciDistributionError::RegistryError { envelope, .. } => {
                let code = envelope.errors.first().map(|e| &e.code);
                let detail = envelope
                    .errors
                    .iter()
                    .map(|e| format!("{:?}: {}", e.code, redact(&e.message)))
                    .collect::<Vec<_>>()
                    .join("; ");
                match code {
                    Some(OciErrorCode::Unauthorized | OciErrorCode::Denied) => self.auth(),
                    Some(OciErrorCode::BlobUnknown) => self.not_found(what),
                    Some(OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::NotFound) => {
                        self.not_found(what)
                    }
                    Some(OciErrorCode::Toomanyrequests) => {
                        OciError::Registry { registry, reference, status: Some(429), detail, transient: true }
                    }
                    _ => OciError::Registry { registry, reference, status: None, detail, transient: false },
                }
            }
            OciDistributionError::ServerError { code, message, .. } => self.status(*code, message, what),
            OciDistributionError::DigestError(d) => match d {
                oci_client::errors::DigestError::VerificationError { expected, actual } => {
                    OciError::DigestMismatch { registry, reference, digest: expected.clone(), actual: actual.clone() }
                }
                other => OciError::Protocol { registry, reference, detail: redact(&other.to_string()) },
            },
            OciDistributionError::IoError(io) => OciError::Unreachable { registry, reference, detail: chain(io) },
            other => OciError::Protocol { registry, reference, detail: redact(&other.to_string()) },
        }
    }

    /// An HTTP status without an OCI error body (`message`: the body, maybe empty).
    fn status(&self, code: u16, message: &str, what: What<'_>) -> OciError {
        let detail = body_detail(message);
        match code {
            401 | 403 => self.auth(),
            404 => self.not_found(what),
            _ => OciError::Registry {
                registry: self.registry.clone(),
                reference: self.reference.clone(),
                status: Some(code),
                detail,
                transient: code == 408 || code == 429 || code >= 500,
            },
        }
    }

    fn not_found(&self, what: What<'_>) -> OciError {
        match what {
            What::Manifest => {
                OciError::ManifestNotFound { registry: self.registry.clone(), reference: self.reference.clone() }
            }
            What::Blob(digest) => OciError::BlobNotFound {
                registry: self.registry.clone(),
                reference: self.reference.clone(),
                digest: digest.to_string(),
            },
        }
    }

    /// An error reply: `status` and the start of its body (an OCI error document, or text).
    pub fn of_reply(&self, status: u16, body: &str, what: What<'_>) -> OciError {
        #[derive(serde::Deserialize)]
        struct Envelope {
            errors: Vec<Entry>,
        }
        #[derive(serde::Deserialize)]
        struct Entry {
            code: String,
            #[serde(default)]
            message: String,
        }
        let Ok(envelope) = serde_json::from_str::<Envelope>(body) else { return self.status(status, body, what) };
        let detail = envelope
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.code, redact(&e.message)))
            .collect::<Vec<_>>()
            .join("; ");
        let detail: String = detail.chars().take(300).collect();
        match envelope.errors.first().map(|e| e.code.to_ascii_uppercase()).as_deref() {
            Some("UNAUTHORIZED" | "DENIED") => self.auth(),
            Some("BLOB_UNKNOWN" | "MANIFEST_UNKNOWN" | "NAME_UNKNOWN" | "NOT_FOUND") => self.not_found(what),
            Some("TOOMANYREQUESTS") => OciError::Registry {
                registry: self.registry.clone(),
                reference: self.reference.clone(),
                status: Some(status),
                detail,
                transient: true,
            },
            _ if matches!(status, 401 | 403 | 404) => self.status(status, "", what),
            _ => OciError::Registry {
                registry: self.registry.clone(),
                reference: self.reference.clone(),
                status: Some(status),
                detail,
                transient: status == 408 || status == 429 || status >= 500,
            },
        }
    }

    /// The authentication failure, missing or refused as credentials were given or not.
    pub fn auth(&self) -> OciError {
        let (registry, reference) = (self.registry.clone(), self.reference.clone());
        if self.given {
            OciError::AuthRefused { registry, reference }
        } else {
            OciError::AuthMissing { registry, reference }
        }
    }

    pub(super) fn tls(&self, cause: TlsCause) -> OciError {
        let hint = match cause.kind {
            TlsKind::UnknownIssuer => {
                "; the certificate is signed by an authority this node does not trust: configure the registry's CA (the CA bundle of the node's registry configuration)"
            }
            TlsKind::Name => "; the certificate does not name this host (check the registry address)",
            TlsKind::Expired => {
                "; the certificate is expired or not yet valid (check the registry's certificate and the node's clock)"
            }
            TlsKind::NotTls => {
                "; the registry does not speak TLS here: if it serves plain HTTP, list it with the host daemon flag \
                 --insecure-registry HOST[:PORT] and ask for plain HTTP (a model volume's parameter insecure: \"true\", \
                 `mounthost cache pull --insecure`)"
            }
            TlsKind::Other => "",
        };
        OciError::Tls {
            registry: self.registry.clone(),
            detail: cause.detail,
            hint: hint.to_string(),
            plain_http: cause.kind == TlsKind::NotTls,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TlsKind {
    UnknownIssuer,
    Name,
    Expired,
    NotTls,
    Other,
}

pub(super) struct TlsCause {
    kind: TlsKind,
    detail: String,
}

/// Every error of the chain below `e`, including the ones `io::Error::source` skips (the
/// error it wraps).
pub(super) fn causes<'a>(e: &'a (dyn StdError + 'static)) -> Vec<&'a (dyn StdError + 'static)> {
    let mut out = Vec::new();
    let mut next = Some(e);
    while let Some(cur) = next {
        if out.len() > 32 {
            break;
        }
        out.push(cur);
        next = match cur.downcast_ref::<io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => cur.source(),
        };
    }
    out
}

/// The chain's messages joined, without repeating one that already contains the next,
/// [redacted](redact).
pub(super) fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in causes(e) {
        let s = c.to_string();
        if parts.last().is_some_and(|p| p.contains(&s)) {
            continue;
        }
        parts.push(s);
    }
    redact(&parts.join(": "))
}

/// What an error body says, short and without secrets. Storage services answer in XML, and
/// S3's `SignatureDoesNotMatch` echoes the signature and the string signed: of XML or HTML only
/// `<Code>` and `<Message>` are kept. Other bodies: their first 300 characters.
fn body_detail(body: &str) -> String {
    let body = body.trim();
    if body.starts_with('<') {
        let tag = |name: &str| {
            let open = format!("<{name}>");
            let start = body.find(&open)? + open.len();
            let len = body[start..].find('<')?;
            Some(body[start..start + len].trim().to_string())
        };
        let kept: Vec<String> = [tag("Code"), tag("Message")].into_iter().flatten().filter(|t| !t.is_empty()).collect();
        return redact(&kept.join(": ").chars().take(300).collect::<String>());
    }
    redact(&body.chars().take(300).collect::<String>())
}

/// `text` with every URL in it (`scheme://…`) stripped of its userinfo (`user:password@`), its
/// query and its fragment, and with the value of every `name=value` whose name says it is a
/// secret (`…signature`, `…token`, `…credential`, `password`, `secret`, `sig`) replaced. Idempotent.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // The scheme: letters, digits, `+`, `-`, `.` before `://`.
        let scheme = rest[..at]
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .last()
            .map_or(at, |(i, _)| i);
        out.push_str(&rest[..scheme]);
        let url_start = scheme;
        let after = &rest[at + 3..];
        // The URL runs to the next blank or quote-like character.
        let len = after.find(|c: char| c.is_whitespace() || matches!(c, '"' | '<' | '>' | '`')).unwrap_or(after.len());
        let url = &after[..len];
        // Trailing punctuation belongs to the sentence, not the URL: `(… ?q=x):`.
        let tail_len = url.len() - url.trim_end_matches([')', ']', ',', '.', ';', ':', '\'']).len();
        let (url, tail) = url.split_at(url.len() - tail_len);
        // Userinfo: in the authority (up to the first `/`, `?` or `#`), up to its last `@`.
        let authority_end = url.find(['/', '?', '#']).unwrap_or(url.len());
        let host_start = url[..authority_end].rfind('@').map_or(0, |i| i + 1);
        let url = &url[host_start..];
        let url = &url[..url.find(['?', '#']).unwrap_or(url.len())];
        out.push_str(&rest[url_start..at + 3]);
        out.push_str(url);
        out.push_str(tail);
        rest = &after[len..];
    }
    out.push_str(rest);
    redact_pairs(&out)
}

/// `name=value` pairs whose name says secret: the value replaced by `<redacted>`.
fn redact_pairs(text: &str) -> String {
    const SECRET: [&str; 6] = ["signature", "token", "credential", "password", "secret", "sig"];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let name_start = rest[..eq]
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .last()
            .map_or(eq, |(i, _)| i);
        let name = rest[name_start..eq].to_ascii_lowercase();
        out.push_str(&rest[..=eq]);
        let after = &rest[eq + 1..];
        let value_len = after
            .find(|c: char| c.is_whitespace() || matches!(c, '&' | '"' | '\'' | '<' | '>' | ')' | ',' | ';'))
            .unwrap_or(after.len());
        if !name.is_empty()
            && value_len > 0
            && SECRET.iter().any(|s| name.ends_with(s))
            && &after[..value_len] != "<redacted>"
        {
            out.push_str("<redacted>");
        } else {
            out.push_str(&after[..value_len]);
        }
        rest = &after[value_len..];
    }
    out.push_str(rest);
    out
}

/// The rustls failure in `e`'s chain, if the request failed in the TLS handshake.
pub(super) fn tls_cause(e: &(dyn StdError + 'static)) -> Option<TlsCause> {
    for c in causes(e) {
        if let Some(r) = c.downcast_ref::<rustls::Error>() {
            use rustls::CertificateError as C;
            let kind = match r {
                rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => TlsKind::UnknownIssuer,
                rustls::Error::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
                    TlsKind::Name
                }
                rustls::Error::InvalidCertificate(
                    C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
                ) => TlsKind::Expired,
                rustls::Error::InvalidMessage(_) => TlsKind::NotTls,
                _ => TlsKind::Other,
            };
            return Some(TlsCause { kind, detail: r.to_string() });
        }
    }
    // A verifier that reports in its own words (the platform verifier wraps some failures).
    let text = chain(e);
    let lower = text.to_lowercase();
    if lower.contains("unknownissuer") || lower.contains("unknown issuer") {
        return Some(TlsCause { kind: TlsKind::UnknownIssuer, detail: text });
    }
    if lower.contains("invalid peer certificate") || lower.contains("certificate") && lower.contains("tls") {
        return Some(TlsCause { kind: TlsKind::Other, detail: text });
    }
    None
}

#[cfg(test)]
pub(super) fn tls_hint_for_test(detail: &str) -> OciError {
    Ctx { registry: "r".into(), reference: "r/x:1".into(), given: false }
        .tls(TlsCause { kind: TlsKind::UnknownIssuer, detail: detail.into() })
}
