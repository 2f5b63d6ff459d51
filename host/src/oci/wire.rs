//! The registry's HTTP side, for pulls: one reqwest client per registry as contacted, whose
//! every reply is read under a cap, whose redirects and DNS answers are checked by
//! [`super::guard`], and which fetches bearer tokens itself only from a realm those checks allow.
//!
//! oci-client (still used to push) reads manifests, referrers and token replies whole, follows
//! up to 10 redirects anywhere and a token realm to any URL: a registry's reply could exhaust
//! the root daemon's memory or point it at a loopback service. Here nothing is read past its
//! cap ([`read_capped`]), and a reply over it is refused naming what, which registry and the cap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderMap, HeaderValue, RANGE, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode, Url};

use super::Credentials;
use super::error::{Ctx, OciError, What, chain, note_refusal, tls_cause};
use super::guard::{Places, Pointer, PrivateName, Refused, Resolver, redirect_policy};
use super::stall::Window;

/// The largest manifest, index or referrers list read (registries cap manifests at 4 MiB).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// The largest token reply read.
pub const MAX_TOKEN_BYTES: u64 = 1 << 20;
/// Of an error reply, only this much is read (its code and message are at its start).
pub const MAX_ERROR_BYTES: u64 = 64 << 10;
/// A token without `expires_in` is kept this long (the distribution spec's default is 60 s).
const DEFAULT_TOKEN_SECS: u64 = 60;

/// One registry as contacted, with the node's TLS, proxy and redirect rules.
pub(super) struct Wire {
    http: reqwest::Client,
    /// `scheme://host:port` of the registry.
    base: Url,
    places: Arc<Places>,
    credentials: Credentials,
    /// The stall window of every reply read.
    pub stall: Duration,
    /// Bearer tokens by repository, with their end of life.
    tokens: Mutex<HashMap<String, (String, Instant)>>,
    /// The registry asked for HTTP Basic: it is sent with every request from then on.
    basic: AtomicBool,
}

/// What a request is for, to name it in errors and to scope its token.
pub(super) struct Call<'a> {
    pub ctx: &'a Ctx,
    pub repository: &'a str,
    pub what: What<'a>,
    /// Named in a "too large" refusal: "the manifest", "the referrers list".
    pub reply: &'a str,
}

/// What a [`Wire`] is made of: the registry's base URL and places, credentials, the node's CA
/// bundle, proxy and stall window.
pub(super) struct Settings<'a> {
    pub base: Url,
    pub places: Places,
    pub credentials: Credentials,
    pub ca: &'a [reqwest::Certificate],
    pub proxy: Option<&'a str>,
    pub stall: Duration,
}

impl Wire {
    /// The client for one registry as contacted; nothing is contacted yet.
    pub fn new(s: Settings<'_>) -> Result<Wire, OciError> {
        let places = Arc::new(s.places);
        let mut trusted = places.trusted_names();
        let mut builder = reqwest::Client::builder()
            .redirect(redirect_policy(places.clone()))
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(60))
            .user_agent(concat!("mounthost/", env!("CARGO_PKG_VERSION")))
            .tls_certs_merge(s.ca.iter().cloned())
            .referer(false);
        // A proxy is connected to through this client's resolver too: its name may resolve to a
        // private address (the environment's proxies apply when no proxy is configured).
        for var in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"] {
            if let Some(host) = std::env::var(var).ok().as_deref().and_then(proxy_host) {
                trusted.insert(host);
            }
        }
        if let Some(proxy) = s.proxy {
            let p = reqwest::Proxy::all(proxy).map_err(|e| {
                OciError::Config(format!(
                    "the registry proxy URL is unusable (check the host daemon flag --registry-proxy): {}",
                    chain(&e)
                ))
            })?;
            if let Some(host) = proxy_host(proxy) {
                trusted.insert(host);
            }
            builder = builder.proxy(p);
        }
        let http = builder.dns_resolver(Arc::new(Resolver { trusted })).build().map_err(|e| {
            OciError::Config(format!(
                "building the client for registry {} (check the CA bundle): {}",
                s.base,
                chain(&e)
            ))
        })?;
        Ok(Wire {
            http,
            base: s.base,
            places,
            stall: s.stall,
            credentials: s.credentials,
            tokens: Mutex::new(HashMap::new()),
            basic: AtomicBool::new(false),
        })
    }

    fn url(&self, path: &str) -> Url {
        let mut u = self.base.clone();
        u.set_path(path);
        u
    }

    /// `method path` with `headers`, authenticated as the registry asks (a bearer token from an
    /// allowed realm, or HTTP Basic). Any status comes back; [`Wire::fail`] turns an error
    /// status into an error.
    pub async fn send(
        &self,
        call: &Call<'_>,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        headers: HeaderMap,
    ) -> Result<reqwest::Response, OciError> {
        let url = self.url(path);
        let mut challenged = false;
        loop {
            let mut req = self.http.request(method.clone(), url.clone()).headers(headers.clone());
            if !query.is_empty() {
                req = req.query(query);
            }
            req = match self.authorization(call.repository) {
                Some(Auth::Header(v)) => req.header(AUTHORIZATION, v),
                Some(Auth::Basic(user, password)) => req.basic_auth(user, Some(password)),
                None => req,
            };
            let resp = self.reply(call.ctx, req, Pointer::Redirect, "the reply's headers").await?;
            if resp.status() != StatusCode::UNAUTHORIZED || challenged {
                return Ok(resp);
            }
            challenged = true;
            let challenge = resp.headers().get(WWW_AUTHENTICATE).and_then(|h| h.to_str().ok()).map(str::to_string);
            drop(resp);
            let Some(challenge) = challenge else { return Err(call.ctx.auth()) };
            self.answer(call, &challenge).await?;
        }
    }

    /// Send `req`, waiting for its reply's headers at most one stall window (a redirect's and
    /// a token round trip included).
    async fn reply(
        &self,
        ctx: &Ctx,
        req: reqwest::RequestBuilder,
        pointer: Pointer,
        what: &str,
    ) -> Result<reqwest::Response, OciError> {
        match tokio::time::timeout(self.stall, req.send()).await {
            Ok(sent) => sent.map_err(|e| self.transport(ctx, &e, pointer)),
            Err(_) => Err(Window::new(self.stall).stalled(ctx, what)),
        }
    }

    /// What authenticates a request for `repository`, if anything is known.
    fn authorization(&self, repository: &str) -> Option<Auth<'_>> {
        if let Credentials::Bearer(t) = &self.credentials {
            return bearer(t).map(Auth::Header);
        }
        let tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((token, until)) = tokens.get(repository)
            && Instant::now() < *until
        {
            return bearer(token).map(Auth::Header);
        }
        drop(tokens);
        if self.basic.load(Ordering::Relaxed) {
            return self.basic();
        }
        None
    }

    fn basic(&self) -> Option<Auth<'_>> {
        match &self.credentials {
            Credentials::Basic { username, password } => Some(Auth::Basic(username, password)),
            _ => None,
        }
    }

    /// Meet a 401's challenge: HTTP Basic with the credentials given, or a bearer token from
    /// the realm (checked first: the realm receives the credentials).
    async fn answer(&self, call: &Call<'_>, challenge: &str) -> Result<(), OciError> {
        let parsed = parse_challenge(challenge);
        let Some(bearer) = parsed else {
            if challenge.trim_start().to_ascii_lowercase().starts_with("basic")
                && matches!(self.credentials, Credentials::Basic { .. })
            {
                self.basic.store(true, Ordering::Relaxed);
                return Ok(());
            }
            return Err(call.ctx.auth());
        };
        if matches!(self.credentials, Credentials::Bearer(_)) {
            // The token given was refused.
            return Err(call.ctx.auth());
        }
        let realm = Url::parse(&bearer.realm).map_err(|_| {
            let e = OciError::Refused {
                registry: call.ctx.registry.clone(),
                reference: call.ctx.reference.clone(),
                kind: "realm",
                detail: format!("its token realm {:?} is not a URL; not followed", super::error::redact(&bearer.realm)),
            };
            note_refusal(&e);
            e
        })?;
        self.places.check(&realm, Pointer::Realm, self.base.scheme() == "https").map_err(|r| {
            let e = refused(call.ctx, r);
            note_refusal(&e);
            e
        })?;
        let scope = format!("repository:{}:pull", call.repository);
        let mut query: Vec<(&str, &str)> = vec![("scope", &scope)];
        if let Some(s) = &bearer.service {
            query.push(("service", s));
        }
        let realm_host = realm.host_str().unwrap_or_default().to_string();
        let mut req = self.http.get(realm).query(&query);
        if let Some(Auth::Basic(user, password)) = self.basic() {
            req = req.basic_auth(user, Some(password));
        }
        let resp = self.reply(call.ctx, req, Pointer::Realm, "the token reply's headers").await?;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(call.ctx.auth());
        }
        if !status.is_success() {
            // The token service's own error, not the artifact's: never "not found".
            let code = status.as_u16();
            return Err(OciError::Registry {
                registry: call.ctx.registry.clone(),
                reference: call.ctx.reference.clone(),
                status: Some(code),
                detail: format!("from its token service at {realm_host}"),
                transient: code == 408 || code == 429 || code >= 500,
            });
        }
        let body = read_capped(call.ctx, resp, MAX_TOKEN_BYTES, "the token reply", self.stall).await?;
        #[derive(serde::Deserialize)]
        struct TokenReply {
            token: Option<String>,
            access_token: Option<String>,
            expires_in: Option<u64>,
        }
        let reply: TokenReply = serde_json::from_slice(&body).map_err(|_| OciError::Protocol {
            registry: call.ctx.registry.clone(),
            reference: call.ctx.reference.clone(),
            detail: "the token reply is not the JSON of a token".into(),
        })?;
        let Some(token) = reply.token.or(reply.access_token).filter(|t| !t.is_empty()) else {
            return Err(OciError::Protocol {
                registry: call.ctx.registry.clone(),
                reference: call.ctx.reference.clone(),
                detail: "the token reply holds no token".into(),
            });
        };
        // Renewed a little before its end; a token for less than 10 s is used once.
        let secs = reply.expires_in.unwrap_or(DEFAULT_TOKEN_SECS).clamp(10, 3600);
        let until = Instant::now() + Duration::from_secs(secs - 5);
        self.tokens.lock().unwrap_or_else(|p| p.into_inner()).insert(call.repository.to_string(), (token, until));
        Ok(())
    }

    /// A request that got no reply: refused by the guard, TLS, or the network.
    fn transport(&self, ctx: &Ctx, e: &reqwest::Error, pointer: Pointer) -> OciError {
        for c in super::error::causes(e) {
            if let Some(r) = c.downcast_ref::<Refused>() {
                let err = refused(ctx, r.clone());
                note_refusal(&err);
                return err;
            }
            if let Some(p) = c.downcast_ref::<PrivateName>() {
                let err = refused(
                    ctx,
                    Refused {
                        pointer,
                        target: p.name.clone(),
                        why: "it resolves only to loopback, link-local or private addresses".into(),
                    },
                );
                note_refusal(&err);
                return err;
            }
        }
        if let Some(tls) = tls_cause(e) {
            return ctx.tls(tls);
        }
        OciError::Unreachable { registry: ctx.registry.clone(), reference: ctx.reference.clone(), detail: chain(e) }
    }

    /// The error an error status stands for; of its body, [`MAX_ERROR_BYTES`] at most are read.
    pub async fn fail(&self, call: &Call<'_>, resp: reqwest::Response) -> OciError {
        let status = resp.status().as_u16();
        let body = read_some(resp, MAX_ERROR_BYTES, self.stall).await;
        call.ctx.of_reply(status, &String::from_utf8_lossy(&body), call.what)
    }

    /// GET `path` and read its body under `cap`; an error status is an error.
    pub async fn get_capped(
        &self,
        call: &Call<'_>,
        path: &str,
        query: &[(&str, &str)],
        accept: &str,
        cap: u64,
    ) -> Result<Vec<u8>, OciError> {
        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(accept) {
            headers.insert(ACCEPT, v);
        }
        let resp = self.send(call, Method::GET, path, query, headers).await?;
        if !resp.status().is_success() {
            return Err(self.fail(call, resp).await);
        }
        read_capped(call.ctx, resp, cap, call.reply, self.stall).await
    }

    /// GET a byte range of a blob (`len`: to its end when None). The response is the caller's:
    /// 206 a part, 200 the whole blob (the registry ignored the range).
    pub async fn range(
        &self,
        call: &Call<'_>,
        path: &str,
        start: u64,
        len: Option<u64>,
    ) -> Result<reqwest::Response, OciError> {
        let mut headers = HeaderMap::new();
        let range = match len {
            Some(n) => format!("bytes={start}-{}", start + n.max(1) - 1),
            None => format!("bytes={start}-"),
        };
        if start > 0 || len.is_some() {
            headers.insert(RANGE, HeaderValue::from_str(&range).expect("ASCII"));
        }
        let resp = self.send(call, Method::GET, path, &[], headers).await?;
        if resp.status() == StatusCode::RANGE_NOT_SATISFIABLE {
            return Err(OciError::Registry {
                registry: call.ctx.registry.clone(),
                reference: call.ctx.reference.clone(),
                status: Some(416),
                detail: String::new(),
                transient: false,
            });
        }
        if !resp.status().is_success() {
            return Err(self.fail(call, resp).await);
        }
        Ok(resp)
    }
}

/// The host of a proxy URL (`http://proxy:3128`, or `proxy:3128` without a scheme).
fn proxy_host(url: &str) -> Option<String> {
    let url = url.trim();
    let parsed = if url.contains("://") { Url::parse(url) } else { Url::parse(&format!("http://{url}")) };
    parsed.ok()?.host_str().map(|h| h.trim_end_matches('.').to_ascii_lowercase())
}

/// How a request authenticates.
enum Auth<'a> {
    Header(HeaderValue),
    Basic(&'a str, &'a str),
}

/// `Bearer <token>`, marked sensitive (never printed by the HTTP stack's debug output).
fn bearer(token: &str) -> Option<HeaderValue> {
    let mut v = HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
    v.set_sensitive(true);
    Some(v)
}

fn refused(ctx: &Ctx, r: Refused) -> OciError {
    OciError::Refused {
        registry: ctx.registry.clone(),
        reference: ctx.reference.clone(),
        kind: r.pointer.label(),
        detail: r.to_string(),
    }
}

/// The body of `resp`, refused as soon as it would pass `cap` bytes (by its `Content-Length`
/// before a byte is read, or while reading), or when it stalls.
pub(super) async fn read_capped(
    ctx: &Ctx,
    resp: reqwest::Response,
    cap: u64,
    reply: &str,
    stall: Duration,
) -> Result<Vec<u8>, OciError> {
    let too_large = || {
        let e = OciError::TooLarge {
            registry: ctx.registry.clone(),
            reference: ctx.reference.clone(),
            what: reply.to_string(),
            cap,
        };
        note_refusal(&e);
        e
    };
    if resp.content_length().is_some_and(|n| n > cap) {
        return Err(too_large());
    }
    let mut out = Vec::with_capacity(resp.content_length().unwrap_or(0).min(64 << 10) as usize);
    let mut stream = resp.bytes_stream();
    let mut window = Window::new(stall);
    while let Some(chunk) = window.next(&mut stream, ctx, reply).await? {
        let chunk: Bytes = chunk.map_err(|e| OciError::Unreachable {
            registry: ctx.registry.clone(),
            reference: ctx.reference.clone(),
            detail: format!("the connection broke while reading {reply}: {}", chain(&e)),
        })?;
        if out.len() as u64 + chunk.len() as u64 > cap {
            return Err(too_large());
        }
        out.extend_from_slice(&chunk);
        if !window.got(chunk.len() as u64) {
            return Err(window.stalled(ctx, reply));
        }
    }
    Ok(out)
}

/// At most `cap` bytes of `resp`'s body, read for at most `within`; what comes after is not
/// read, errors end it.
async fn read_some(resp: reqwest::Response, cap: u64, within: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    let until = tokio::time::Instant::now() + within;
    while let Ok(Some(Ok(chunk))) = tokio::time::timeout_at(until, stream.next()).await {
        let room = cap as usize - out.len();
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() as u64 >= cap {
            break;
        }
    }
    out
}

/// A `Bearer` challenge's realm and service.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Bearer {
    pub realm: String,
    pub service: Option<String>,
}

/// The first `Bearer` challenge of a `WWW-Authenticate` value (RFC 7235 syntax, by http-auth).
pub(super) fn parse_challenge(value: &str) -> Option<Bearer> {
    for c in http_auth::ChallengeParser::new(value).flatten() {
        if !c.scheme.eq_ignore_ascii_case("bearer") {
            continue;
        }
        let mut realm = None;
        let mut service = None;
        for (k, v) in &c.params {
            if k.eq_ignore_ascii_case("realm") {
                realm = Some(v.to_unescaped());
            } else if k.eq_ignore_ascii_case("service") {
                service = Some(v.to_unescaped());
            }
        }
        return realm.map(|realm| Bearer { realm, service });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_are_parsed_and_others_ignored() {
        let v = r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull""#;
        assert_eq!(
            parse_challenge(v),
            Some(Bearer {
                realm: "https://auth.example.com/token".into(),
                service: Some("registry.example.com".into())
            })
        );
        assert_eq!(parse_challenge(r#"Basic realm="Registry""#), None);
        assert_eq!(parse_challenge("Bearer service=\"x\""), None);
        let two = r#"Basic realm="x", Bearer realm="https://a/t""#;
        assert_eq!(parse_challenge(two).map(|b| b.realm), Some("https://a/t".to_string()));
    }
}
