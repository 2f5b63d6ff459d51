//! The host's policy over plans: nothing a plugin returns is executed before it passes here.
//!
//! - Programs are *names* granted to the plugin and mapped by host config to binaries; a plan
//!   can never name a path to execute.
//! - Filesystem types are allow-listed per plugin; mount sources are pseudo names or paths
//!   inside the volume, never devices.
//! - Every path is `root + relative` and must stay inside that root: no absolute paths, no
//!   `.`/`..` components, no empty components. (The executor additionally resolves paths
//!   without following symlinks planted inside the volume; that needs the filesystem and is
//!   not this pure check.)
//! - Environment variable names are validated and the loader's (`LD_*`) refused; secrets may
//!   appear only as references, and a literal holding a secret's value is refused.
//! - URLs only to hosts granted by config or by the StorageClass's endpoint parameters, judged
//!   by [`super::url`], the same parser the HTTP client builds its requests with.
//! - Each operation allows only the steps and directories that make sense for it.
//!
//! A refused plan is an InvalidArgument-class error naming the step and the reason.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::error::ErrorKind;
use crate::plugin::bindings::types as wit;
use crate::plugin::info::PluginInfo;
use crate::secrets::Secrets;
use crate::volume::VolumeDirs;
use crate::volume::dirs::root_name;

use super::url::{HostGrant, Target, parse as parse_url};
use super::{Archive, EnvVar, Header, MountOption, Plan, Step, Value};

/// The CSI operation a plan is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// CreateVolume.
    Provision,
    /// DeleteVolume.
    Delete,
    /// NodeStageVolume.
    Stage,
    /// NodePublishVolume.
    Publish,
    /// NodeUnstageVolume.
    Unstage,
    /// A pod's dynamic mount.
    DynamicMount,
}

impl Operation {
    fn allows(self, step: &wit::Step) -> bool {
        use wit::Step as S;
        match self {
            Operation::Provision | Operation::Delete => matches!(step, S::Http(_)),
            Operation::Stage => !matches!(step, S::Http(_)),
            Operation::Publish => matches!(step, S::Mkdir(_) | S::Mount(_) | S::Bind(_) | S::Socket(_)),
            Operation::Unstage => matches!(step, S::Remove(_)),
            Operation::DynamicMount => !matches!(step, S::Http(_) | S::Socket(_)),
        }
    }
}

/// What the host grants one plugin (from host config).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// Program names it may spawn.
    pub programs: BTreeSet<String>,
    /// Filesystem types it may mount or wait for.
    pub fstypes: BTreeSet<String>,
    /// Hosts (`host` or `host:port`) it may reach over HTTP, besides endpoint parameters.
    pub hosts: BTreeSet<String>,
}

/// Everything the policy needs to judge one plan.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    /// Which operation.
    pub operation: Operation,
    /// The plugin's name.
    pub plugin: &'a str,
    /// The plugin's digest.
    pub digest: String,
    /// What the plugin is granted.
    pub grant: &'a Grant,
    /// Host config: program name → absolute binary.
    pub programs: &'a BTreeMap<String, PathBuf>,
    /// Hosts granted by the request's endpoint parameters (see [`endpoint_hosts`]).
    pub endpoint_hosts: BTreeSet<String>,
    /// The volume's directories for this operation.
    pub dirs: &'a VolumeDirs,
    /// The request's secrets.
    pub secrets: &'a Secrets,
}

/// Why a plan was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plan from plugin {plugin} refused at step {index} ({kind}): {reason}")]
pub struct PolicyError {
    /// The plugin.
    pub plugin: String,
    /// 1-based step number (0 for the plan as a whole).
    pub index: usize,
    /// The step's kind.
    pub kind: &'static str,
    /// What is wrong and what would be accepted.
    pub reason: String,
}

impl PolicyError {
    /// Always InvalidArgument: the plugin's reading of the request is not acceptable.
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidArgument
    }
}

/// Steps one plan may hold.
pub const MAX_STEPS: usize = 256;
const MAX_TEXT: usize = 4096;
const MAX_ARGS: usize = 512;
const MAX_ENV: usize = 128;
const MAX_REL_PATH: usize = 1024;
const MAX_READY_TIMEOUT_MS: u32 = 600_000;
const MIN_MEMORY_LIMIT: u64 = 16 << 20;
const MAX_ATTRIBUTES: usize = 64;
const MAX_HTTP_BODY: usize = 64 << 10;
/// Bind flags a plan may ask for (the executor maps each, a test in `exec/mount.rs` checks).
pub const BIND_OPTIONS: &[&str] = &["nosuid", "nodev", "noexec", "noatime", "nodiratime", "relatime", "strictatime"];
/// Headers a plan may not set: they would name another virtual host than the approved URL or
/// reframe the request.
const CONNECTION_HEADERS: &[&str] =
    &["host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer", "keep-alive"];
/// Environment variables a plan may never set: they change what the dynamic loader runs.
const DENIED_ENV_PREFIXES: &[&str] = &["LD_", "GCONV_PATH", "MALLOC_", "GLIBC_TUNABLES"];

type R<T> = Result<T, String>;

/// Check a node or controller plan and resolve it.
pub fn check(ctx: &Context<'_>, plan: wit::Plan) -> Result<Plan, PolicyError> {
    let whole = |reason: String| PolicyError { plugin: ctx.plugin.into(), index: 0, kind: "plan", reason };
    if plan.steps.len() > MAX_STEPS {
        return Err(whole(format!("{} steps; at most {MAX_STEPS} are allowed", plan.steps.len())));
    }
    let attributes = check_attributes(ctx, plan.attributes).map_err(whole)?;
    let mut fetched = BTreeSet::new();
    let mut steps = Vec::with_capacity(plan.steps.len());
    for (i, step) in plan.steps.into_iter().enumerate() {
        let kind = wit_kind(&step);
        let refuse = |reason: String| PolicyError { plugin: ctx.plugin.into(), index: i + 1, kind, reason };
        if !ctx.operation.allows(&step) {
            return Err(refuse(format!("a {kind} step is not allowed in a {:?} plan", ctx.operation)));
        }
        let step = check_step(ctx, step, &fetched).map_err(refuse)?;
        if let Step::Fetch { digest, .. } = &step {
            fetched.insert(digest.clone());
        }
        steps.push(step);
    }
    Ok(Plan { plugin: ctx.plugin.into(), digest: ctx.digest.clone(), steps, attributes })
}

/// Hosts granted by endpoint parameters: every `host:port` in the values of parameters the
/// plugin documents as `endpoint`, normalised like URL hosts ([`HostGrant`]); a value that is
/// not a plain `host[:port]` grants nothing. Only pass parameters that come from a
/// StorageClass.
pub fn endpoint_hosts<'a>(info: &PluginInfo, params: impl IntoIterator<Item = (&'a str, &'a str)>) -> BTreeSet<String> {
    params
        .into_iter()
        .filter(|(k, _)| info.parameters.iter().any(|p| p.name == *k && p.is_endpoint()))
        .flat_map(|(_, v)| v.split(','))
        .filter_map(|h| HostGrant::parse(h.trim()).ok())
        .map(|g| g.to_string())
        .collect()
}

fn wit_kind(step: &wit::Step) -> &'static str {
    use wit::Step as S;
    match step {
        S::Mkdir(_) => "mkdir",
        S::Remove(_) => "remove",
        S::SpawnFuse(_) => "spawn-fuse",
        S::Mount(_) => "mount",
        S::Bind(_) => "bind",
        S::Fetch(_) => "fetch",
        S::Unpack(_) => "unpack",
        S::Http(_) => "http",
        S::Socket(_) => "socket",
    }
}

fn check_step(ctx: &Context<'_>, step: wit::Step, fetched: &BTreeSet<String>) -> R<Step> {
    use wit::Step as S;
    Ok(match step {
        S::Mkdir(p) => Step::Mkdir { path: path(ctx, &p)? },
        S::Remove(p) => {
            if p.rel.is_empty() && matches!(p.root, wit::DirRoot::Staging | wit::DirRoot::Target) {
                return Err("removing the staging or target directory itself is the CO's job".into());
            }
            Step::Remove { path: path(ctx, &p)? }
        }
        S::SpawnFuse(s) => {
            let executable = program(ctx, &s.program)?;
            fstype(ctx, &s.fstype)?;
            if s.args.len() > MAX_ARGS {
                return Err(format!("{} arguments; at most {MAX_ARGS}", s.args.len()));
            }
            if s.env.len() > MAX_ENV {
                return Err(format!("{} environment variables; at most {MAX_ENV}", s.env.len()));
            }
            if !(1..=MAX_READY_TIMEOUT_MS).contains(&s.ready_timeout_ms) {
                return Err(format!("ready timeout {} ms is outside 1..={MAX_READY_TIMEOUT_MS}", s.ready_timeout_ms));
            }
            if s.memory_limit_bytes.is_some_and(|m| m < MIN_MEMORY_LIMIT) {
                return Err(format!("memory limit below the minimum of {MIN_MEMORY_LIMIT} bytes"));
            }
            let args = s.args.iter().map(|a| arg(ctx, a, "argument")).collect::<R<Vec<_>>>()?;
            let mut names = BTreeSet::new();
            let mut env = Vec::with_capacity(s.env.len());
            for e in s.env {
                env_name(&e.name)?;
                if !names.insert(e.name.clone()) {
                    return Err(format!("environment variable {} is set twice", e.name));
                }
                env.push(EnvVar {
                    value: value(ctx, e.value, &format!("environment variable {}", e.name))?,
                    name: e.name,
                });
            }
            Step::SpawnFuse {
                program: s.program,
                executable,
                args,
                env,
                mountpoint: path(ctx, &s.mountpoint)?,
                fstype: s.fstype,
                ready_timeout_ms: s.ready_timeout_ms,
                memory_limit_bytes: s.memory_limit_bytes,
            }
        }
        S::Mount(m) => {
            fstype(ctx, &m.fstype)?;
            let source = match &m.source {
                wit::MountSource::Named(n) => {
                    if !token(n) {
                        return Err(format!(
                            "mount source {n:?} must be a pseudo name such as \"tmpfs\" or a path inside the volume; devices are not allowed"
                        ));
                    }
                    n.clone()
                }
                wit::MountSource::Path(p) => path(ctx, p)?.display().to_string(),
            };
            let options = m.options.iter().map(|o| mount_option(ctx, o)).collect::<R<Vec<_>>>()?;
            Step::Mount { fstype: m.fstype, source, target: path(ctx, &m.target)?, options, readonly: m.readonly }
        }
        S::Bind(b) => {
            for o in &b.options {
                if !BIND_OPTIONS.contains(&o.as_str()) {
                    return Err(format!("bind option {o:?} is not allowed; allowed: {}", BIND_OPTIONS.join(", ")));
                }
            }
            Step::Bind {
                source: path(ctx, &b.source)?,
                target: path(ctx, &b.target)?,
                readonly: b.readonly,
                options: b.options,
            }
        }
        S::Fetch(f) => {
            url(ctx, &f.url)?;
            digest(&f.digest)?;
            Step::Fetch { url: f.url, headers: headers(ctx, f.headers)?, digest: f.digest, size: f.size }
        }
        S::Unpack(u) => {
            if !fetched.contains(&u.digest) {
                return Err(format!("blob {} is not fetched by an earlier step", u.digest));
            }
            let format = match u.format {
                wit::Archive::Raw => Archive::Raw,
                wit::Archive::Tar => Archive::Tar,
                wit::Archive::TarGzip => Archive::TarGzip,
                wit::Archive::TarZstd => Archive::TarZstd,
            };
            Step::Unpack { digest: u.digest, format, dest: path(ctx, &u.dest)? }
        }
        S::Http(h) => {
            const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"];
            if !METHODS.contains(&h.method.as_str()) {
                return Err(format!("HTTP method {:?} is not one of {}", h.method, METHODS.join(", ")));
            }
            if h.urls.is_empty() || h.urls.len() > 16 {
                return Err("an http step needs 1 to 16 alternative URLs".into());
            }
            for u in &h.urls {
                url(ctx, u)?;
            }
            if h.ok_status.is_empty() || h.ok_status.iter().any(|s| !(100..=599).contains(s)) {
                return Err("ok-status must list HTTP status codes (100-599)".into());
            }
            if h.body.len() > MAX_HTTP_BODY {
                return Err(format!("body of {} bytes; at most {MAX_HTTP_BODY}", h.body.len()));
            }
            let body = String::from_utf8(h.body).map_err(|_| "the body must be UTF-8 text".to_string())?;
            text(ctx, &body, "the body")?;
            Step::Http {
                method: h.method,
                urls: h.urls,
                headers: headers(ctx, h.headers)?,
                body,
                ok_status: h.ok_status,
            }
        }
        S::Socket(p) => Step::Socket { path: path(ctx, &p)? },
    })
}

/// Resolve `root + rel`, refusing anything that could leave the root.
fn path(ctx: &Context<'_>, p: &wit::PathRef) -> R<PathBuf> {
    let root = ctx
        .dirs
        .root(p.root)
        .ok_or_else(|| format!("the {} directory is not available in a {:?} plan", root_name(p.root), ctx.operation))?;
    if !root.is_absolute() {
        return Err(format!("the host's {} directory {} is not absolute", root_name(p.root), root.display()));
    }
    let rel = &p.rel;
    let shown = || format!("path {rel:?} (in {})", root_name(p.root));
    if rel.len() > MAX_REL_PATH || rel.chars().any(char::is_control) {
        return Err(format!("{} is too long or has control characters", shown()));
    }
    if rel.starts_with('/') {
        return Err(format!("{} is absolute; plans name paths relative to the volume's directories", shown()));
    }
    if rel.is_empty() {
        return Ok(root.to_path_buf());
    }
    for c in rel.split('/') {
        if c.is_empty() || c == "." || c == ".." {
            return Err(format!(
                "{} would leave the volume's directory or is not normalised (empty, `.` or `..` component)",
                shown()
            ));
        }
    }
    Ok(root.join(Path::new(rel)))
}

fn program(ctx: &Context<'_>, name: &str) -> R<PathBuf> {
    if name.contains('/') {
        return Err(format!(
            "program {name:?} is a path; plans name programs (such as \"weed\") and the host maps names to binaries"
        ));
    }
    if !token(name) {
        return Err(format!("program name {name:?} must be letters, digits, '.', '_' or '-'"));
    }
    if !ctx.grant.programs.contains(name) {
        return Err(format!(
            "program {name:?} is not granted to plugin {} (granted: {})",
            ctx.plugin,
            list(&ctx.grant.programs)
        ));
    }
    ctx.programs.get(name).cloned().ok_or_else(|| {
        format!("program {name:?} has no binary configured on this host (host option --program {name}=/absolute/path)")
    })
}

fn fstype(ctx: &Context<'_>, fstype: &str) -> R<()> {
    if ctx.grant.fstypes.contains(fstype) {
        Ok(())
    } else {
        Err(format!(
            "fstype {fstype:?} is not allowed for plugin {} (allowed: {})",
            ctx.plugin,
            list(&ctx.grant.fstypes)
        ))
    }
}

fn arg(ctx: &Context<'_>, a: &wit::Arg, what: &str) -> R<String> {
    match a {
        wit::Arg::Literal(s) => text(ctx, s, what).map(|()| s.clone()),
        wit::Arg::Path(p) => {
            text(ctx, &p.prefix, what)?;
            Ok(format!("{}{}", p.prefix, path(ctx, &p.path)?.display()))
        }
    }
}

fn mount_option(ctx: &Context<'_>, o: &wit::Arg) -> R<MountOption> {
    let s = arg(ctx, o, "mount option")?;
    if s.contains(',') {
        return Err(format!("mount option {s:?} contains ','; give each option separately"));
    }
    Ok(match o {
        wit::Arg::Literal(text) => MountOption::Text(text.clone()),
        wit::Arg::Path(p) => MountOption::Path { prefix: p.prefix.clone(), path: path(ctx, &p.path)? },
    })
}

/// Plain text a plan carries: bounded, no NUL, and never a secret's value.
fn text(ctx: &Context<'_>, s: &str, what: &str) -> R<()> {
    if s.len() > MAX_TEXT || s.contains('\0') {
        return Err(format!("{what} is longer than {MAX_TEXT} bytes or contains NUL"));
    }
    if let Some(key) = ctx.secrets.leaks_into(s) {
        return Err(format!(
            "{what} contains the value of secret {key:?}; secrets must be passed as secret references (environment or headers), never as text"
        ));
    }
    Ok(())
}

fn value(ctx: &Context<'_>, v: wit::Value, what: &str) -> R<Value> {
    match v {
        wit::Value::Literal(s) => text(ctx, &s, what).map(|()| Value::Literal(s)),
        wit::Value::Secret(key) => {
            if ctx.secrets.get(&key).is_none() {
                let given: BTreeSet<String> = ctx.secrets.iter().map(|(k, _)| k.to_string()).collect();
                return Err(format!(
                    "{what} references secret {key:?}, which the request does not carry (given: {})",
                    list(&given)
                ));
            }
            Ok(Value::Secret(key))
        }
    }
}

fn env_name(name: &str) -> R<()> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(format!("environment variable name {name:?} must match [A-Za-z_][A-Za-z0-9_]*"));
    }
    if DENIED_ENV_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return Err(format!("environment variable {name} would change what the dynamic loader runs"));
    }
    Ok(())
}

fn headers(ctx: &Context<'_>, hs: Vec<wit::Header>) -> R<Vec<Header>> {
    hs.into_iter()
        .map(|h| {
            let valid = !h.name.is_empty()
                && h.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !valid {
                return Err(format!("header name {:?} is not an HTTP token", h.name));
            }
            // The host names the connection (the approved URL) and frames the message itself.
            if CONNECTION_HEADERS.iter().any(|c| h.name.eq_ignore_ascii_case(c)) {
                return Err(format!("header {} is set by the host from the approved URL and body", h.name));
            }
            if let wit::Value::Literal(v) = &h.value
                && v.contains(['\r', '\n'])
            {
                return Err(format!("header {} contains a line break", h.name));
            }
            let what = format!("header {}", h.name);
            Ok(Header { value: value(ctx, h.value, &what)?, name: h.name })
        })
        .collect()
}

/// `http(s)://host[:port]/...` to a granted host. The URL is parsed by
/// [`super::url::parse`], the parser the HTTP client builds its request with, so the approved
/// host and port are the ones connected to. Grants are normalised the same way; one that does
/// not parse grants nothing.
fn url(ctx: &Context<'_>, u: &str) -> R<Target> {
    text(ctx, u, "URL")?;
    let target = parse_url(u).map_err(|e| e.to_string())?;
    let granted =
        |set: &BTreeSet<String>| set.iter().filter_map(|g| HostGrant::parse(g).ok()).any(|g| g.allows(&target));
    if granted(&ctx.endpoint_hosts) || granted(&ctx.grant.hosts) {
        Ok(target)
    } else {
        let mut all: BTreeSet<String> = ctx.grant.hosts.clone();
        all.extend(ctx.endpoint_hosts.iter().cloned());
        Err(format!("host {} is not granted to plugin {} (granted: {})", target.authority(), ctx.plugin, list(&all)))
    }
}

fn digest(d: &str) -> R<()> {
    if crate::plugin::Digest::parse(d).is_some() {
        Ok(())
    } else {
        Err(format!("digest {d:?} is not sha256:<64 lowercase hex digits>"))
    }
}

fn check_attributes(ctx: &Context<'_>, kvs: Vec<wit::Kv>) -> R<Vec<(String, String)>> {
    if kvs.len() > MAX_ATTRIBUTES {
        return Err(format!("{} attributes; at most {MAX_ATTRIBUTES}", kvs.len()));
    }
    kvs.into_iter()
        .map(|kv| {
            if kv.key.is_empty() || kv.key.len() > 128 || !kv.key.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!("attribute key {:?} must be 1-128 printable characters", kv.key));
            }
            text(ctx, &kv.value, &format!("attribute {}", kv.key))?;
            Ok((kv.key, kv.value))
        })
        .collect()
}

fn token(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b))
}

fn list(set: &BTreeSet<String>) -> String {
    if set.is_empty() { "none".into() } else { set.iter().cloned().collect::<Vec<_>>().join(", ") }
}

impl From<PolicyError> for crate::error::Error {
    fn from(e: PolicyError) -> Self {
        crate::error::Error::new(e.kind(), e.to_string())
    }
}

#[cfg(test)]
mod tests;
