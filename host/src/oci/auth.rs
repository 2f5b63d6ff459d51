//! Registry credentials, and reading them from a Kubernetes `kubernetes.io/dockerconfigjson`
//! secret (`.dockerconfigjson`: `{"auths": {"<registry>": {"auth": base64(user:pass)}}}`, or
//! `username`/`password`, or a `registrytoken` sent as a bearer token).
//!
//! Secrets never reach a log line, an error message, argv or a file: [`Credentials`]' `Debug`
//! prints only the kind of credential, and errors name the registry and the field, never a value.

use std::fmt;

use oci_client::secrets::RegistryAuth;

use super::error::OciError;

/// How to authenticate to a registry.
#[derive(Clone, PartialEq, Eq, Default)]
pub enum Credentials {
    /// No credentials (a token is still fetched anonymously when the registry asks for one).
    #[default]
    Anonymous,
    /// HTTP Basic, or the user and password exchanged for a token.
    Basic { username: String, password: String },
    /// A bearer token sent as is.
    Bearer(String),
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Basic { .. } => f.write_str("Basic(<redacted>)"),
            Credentials::Bearer(_) => f.write_str("Bearer(<redacted>)"),
        }
    }
}

impl Credentials {
    /// Were any credentials given?
    pub fn given(&self) -> bool {
        !matches!(self, Credentials::Anonymous)
    }

    /// oci-client's form.
    pub(super) fn to_registry_auth(&self) -> RegistryAuth {
        match self {
            Credentials::Anonymous => RegistryAuth::Anonymous,
            Credentials::Basic { username, password } => RegistryAuth::Basic(username.clone(), password.clone()),
            Credentials::Bearer(t) => RegistryAuth::Bearer(t.clone()),
        }
    }

    /// A digest of the credentials, to key cached clients without keeping a second copy of the
    /// secret around in a map key. Never logged.
    pub(super) fn fingerprint(&self) -> [u8; 32] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        match self {
            Credentials::Anonymous => h.update(b"anonymous"),
            Credentials::Basic { username, password } => {
                h.update(b"basic\0");
                h.update((username.len() as u64).to_le_bytes());
                h.update(username.as_bytes());
                h.update(password.as_bytes());
            }
            Credentials::Bearer(t) => {
                h.update(b"bearer\0");
                h.update(t.as_bytes());
            }
        }
        h.finalize().into()
    }
}

/// The credentials for `registry` (`host[:port]`) in a `.dockerconfigjson` document. An entry
/// matches when its key is the host itself or a URL of it (`https://host`, `http://host`,
/// optionally with a path such as `/v1/`). No entry for the registry: [`Credentials::Anonymous`].
pub fn credentials_from_docker_config(json: &str, registry: &str) -> Result<Credentials, OciError> {
    let doc: serde_json::Value = serde_json::from_str(json).map_err(|e| {
        OciError::Config(format!("the docker config secret is not JSON (line {}, column {})", e.line(), e.column()))
    })?;
    // `.dockerconfigjson` has `auths`; the older `.dockercfg` is the map itself.
    let auths = doc.get("auths").unwrap_or(&doc);
    let Some(auths) = auths.as_object() else {
        return Err(OciError::Config("the docker config secret has no \"auths\" object".into()));
    };
    let wanted = normalise(registry);
    let Some((key, entry)) = auths.iter().find(|(k, _)| normalise(k) == wanted) else {
        return Ok(Credentials::Anonymous);
    };
    let field = |name: &str| entry.get(name).and_then(|v| v.as_str()).filter(|s| !s.is_empty());
    let bad = |what: &str| OciError::Config(format!("the docker config entry for {key}: {what}"));
    if let Some(token) = field("registrytoken") {
        return Ok(Credentials::Bearer(token.to_string()));
    }
    if let Some(auth) = field("auth") {
        let raw = base64_decode(auth).ok_or_else(|| bad("\"auth\" is not valid base64"))?;
        let text = String::from_utf8(raw).map_err(|_| bad("\"auth\" does not decode to UTF-8 text"))?;
        let (username, password) =
            text.split_once(':').ok_or_else(|| bad("\"auth\" does not decode to username:password"))?;
        return Ok(Credentials::Basic { username: username.to_string(), password: password.to_string() });
    }
    if let (Some(username), Some(password)) = (field("username"), field("password")) {
        return Ok(Credentials::Basic { username: username.to_string(), password: password.to_string() });
    }
    if field("identitytoken").is_some() {
        // A refresh token for the OAuth2 exchange, which this puller does not do.
        return Err(bad(
            "it holds only an \"identitytoken\", which mounthost cannot use; give \"auth\" or \"username\" and \"password\"",
        ));
    }
    Err(bad("it has neither \"auth\" nor \"username\" and \"password\""))
}

/// `https://Host:5000/v1/` → `host:5000`.
fn normalise(key: &str) -> String {
    let key = key.trim();
    let key = key.strip_prefix("https://").or_else(|| key.strip_prefix("http://")).unwrap_or(key);
    let host = key.split('/').next().unwrap_or(key);
    let host = host.to_ascii_lowercase();
    // Docker Hub is stored under its v1 URL by `docker login`.
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
        _ => host,
    }
}

/// Standard base64 (padding optional; the URL-safe alphabet accepted too).
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.trim().bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
pub(super) fn base64_for_test(s: &str) -> Option<Vec<u8>> {
    base64_decode(s)
}
