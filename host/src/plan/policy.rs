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
//! - Environment variable names are validated and the loader's (`LD_*`) refused; a program
//!   with host config rules gets only the variables they allow ([`args`]), one without gets
//!   none of the deny list's ([`env`]: `PATH`, `HOME`, `OPENSSL_CONF`, `SSH_ASKPASS`, proxies,
//!   `GIT_*`, `RCLONE_*`, ...) unless host config allows it by name; secrets may
//!   appear only as references (a secret, a secret inside a template text, a secret file),
//!   and a literal holding a secret's value is refused. Secret files and path values are for
//!   programs only: never mount options or HTTP headers.
//! - URLs only to hosts granted by config or by the StorageClass's endpoint parameters, judged
//!   by [`super::url`], the same parser the HTTP client builds its requests with; OCI
//!   registries and mirrors likewise, granted by config or by the StorageClass's
//!   `oci-reference` and `endpoint` parameters ([`oci`]).
//! - Each operation allows only the steps and directories that make sense for it.
//! - A program's arguments carry no option host config denies it, and only options it
//!   allows when it has an allow-list; a program's environment, which can make it run other
//!   programs (`PATH`, `OPENSSL_CONF`, `SSH_ASKPASS`), holds only the variables its rules
//!   allow once it has any rule ([`args`]), and nothing of the deny list before ([`env`]).
//!
//! A refused plan is an InvalidArgument-class error naming the step and the reason. The same
//! rules, run by [`missing_grants`], list every grant a plan lacks at once (for
//! `mounthost plugin plan`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::error::ErrorKind;
use crate::plugin::bindings::types as wit;
use crate::plugin::info::PluginInfo;
use crate::secrets::Secrets;
use crate::volume::VolumeDirs;
use crate::volume::dirs::root_name;

use super::oci_ref::OciRef;
use super::rules::{self, HostFd, ProgramRules, RuleSet};
use super::tar_rules::Layering;
use super::url::{HostGrant, Target, parse as parse_url};
use super::{Archive, EnvVar, Header, MountOption, Plan, SpawnArg, Step, Value};

mod args;
mod env;
mod fuse;
mod oci;

pub use args::{ArgRules, OPTION_SETS, OptionName, SSHFS_DENY, option_set};
pub use env::listed as denied_env;
pub use fuse::HOST_MOUNT_OPTIONS;

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
    /// ControllerExpandVolume.
    Expand,
    /// NodeExpandVolume.
    NodeExpand,
    /// GetCapacity.
    Capacity,
    /// ListVolumes.
    List,
    /// Whether a volume exists (ValidateVolumeCapabilities).
    Describe,
}

impl Operation {
    fn allows(self, step: &wit::Step) -> bool {
        use wit::Step as S;
        match self {
            Operation::Provision | Operation::Expand => matches!(step, S::Http(_) | S::Lookup(_)),
            Operation::Delete => matches!(step, S::Http(_)),
            Operation::Stage => !matches!(step, S::Http(_) | S::Socket(_) | S::SocketCall(_)),
            // What enforces the size on the node: a running program told so over its socket.
            Operation::NodeExpand => matches!(step, S::SocketCall(_) | S::Lookup(_)),
            Operation::Capacity | Operation::List | Operation::Describe => matches!(step, S::Lookup(_)),
            // A dynamic volume's socket is the host's own step (`daemon::dynamic`), never a plan's.
            Operation::Publish => matches!(step, S::Mkdir(_) | S::Mount(_) | S::Bind(_)),
            Operation::Unstage => matches!(step, S::Remove(_)),
            // A pod's mount lays files out and mounts them read-only: no programs (nothing would
            // supervise them), no HTTP, no removal. It may resolve an artifact (the two-call
            // protocol of `daemon::dynamic`) from a registry the volume's StorageClass grants.
            Operation::DynamicMount => {
                matches!(step, S::Mkdir(_) | S::Mount(_) | S::Bind(_) | S::Resolve(_) | S::FetchBlob(_) | S::Unpack(_))
            }
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
    /// Hosts (`host` or `host:port`) it may reach over HTTP or pull OCI artifacts from,
    /// besides those the StorageClass's endpoint and oci-reference parameters grant.
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
    /// Host config: program name → what its arguments may name and which environment
    /// variables it may be given.
    pub program_args: &'a BTreeMap<String, ArgRules>,
    /// Host config: program name → the rule set its whole argv is judged by, and the programs
    /// that must run on a connection the host mounts ([`super::rules`]).
    pub rules: &'a ProgramRules,
    /// Hosts granted by the request's endpoint and oci-reference parameters (see
    /// [`endpoint_hosts`]).
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
    /// The grant that would let the step through, when a grant is all it lacks.
    pub missing: Option<MissingGrant>,
    /// The program rule that refused it, when one did (for the refusals metric).
    pub rule: Option<RuleRef>,
}

/// A program rule that refused a plan: which program (a granted one) and which rule (a name
/// from host config or a rule set, never text from the plan).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRef {
    /// The program, as plans and host config name it.
    pub program: String,
    /// The rule (`options.-cacheDir`, `unknown-option`, `host-fd`, `program-args.deny`).
    pub rule: String,
}

/// A grant a plan needs and the host config does not give ([`missing_grants`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum MissingGrant {
    /// A program name the plugin is not granted (`--grant PLUGIN:program=NAME`).
    Program(String),
    /// A granted program with no binary configured (`--program NAME=/absolute/path`).
    Binary(String),
    /// A filesystem type (`--grant PLUGIN:fstype=TYPE`).
    Fstype(String),
    /// A host, `host:port` (`--grant PLUGIN:host=HOST:PORT`).
    Host(String),
}

impl MissingGrant {
    /// The host flag that grants it to `plugin`, quoted for a POSIX shell where needed.
    pub fn flag(&self, plugin: &str) -> String {
        let (flag, value) = match self {
            MissingGrant::Program(n) => ("--grant", format!("{plugin}:program={n}")),
            MissingGrant::Binary(n) => ("--program", format!("{n}=/absolute/path/to/{n}")),
            MissingGrant::Fstype(t) => ("--grant", format!("{plugin}:fstype={t}")),
            MissingGrant::Host(h) => ("--grant", format!("{plugin}:host={h}")),
        };
        let plain = value.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-+:/=@".contains(&b));
        if plain { format!("{flag} {value}") } else { format!("{flag} '{}'", value.replace('\'', "'\\''")) }
    }

    /// Add it to `grant` and `programs` (with a placeholder binary).
    fn add_to(&self, grant: &mut Grant, programs: &mut BTreeMap<String, PathBuf>) {
        match self {
            MissingGrant::Program(n) => _ = grant.programs.insert(n.clone()),
            MissingGrant::Binary(n) => _ = programs.insert(n.clone(), PathBuf::from("/absolute/path").join(n)),
            MissingGrant::Fstype(t) => _ = grant.fstypes.insert(t.clone()),
            MissingGrant::Host(h) => _ = grant.hosts.insert(h.clone()),
        }
    }
}

impl std::fmt::Display for MissingGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MissingGrant::Program(n) => write!(f, "program {n:?}"),
            MissingGrant::Binary(n) => write!(f, "a binary for program {n:?}"),
            MissingGrant::Fstype(t) => write!(f, "fstype {t:?}"),
            MissingGrant::Host(h) => write!(f, "host {h}"),
        }
    }
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

/// Why a step was refused, and the grant that would let it through when that is all it
/// lacks. Plain reasons (`String`) convert into it.
#[derive(Debug)]
struct Refusal {
    reason: String,
    missing: Option<MissingGrant>,
    rule: Option<RuleRef>,
}

impl From<String> for Refusal {
    fn from(reason: String) -> Self {
        Refusal { reason, missing: None, rule: None }
    }
}

impl From<&str> for Refusal {
    fn from(reason: &str) -> Self {
        Refusal { reason: reason.into(), missing: None, rule: None }
    }
}

/// A refusal by `program`'s rule `rule`.
fn by_rule(program: &str, rule: &str, reason: String) -> Refusal {
    Refusal { reason, missing: None, rule: Some(RuleRef { program: program.into(), rule: rule.into() }) }
}

/// The result of a check that may lack a grant.
type G<T> = Result<T, Refusal>;

/// A refusal for want of `missing`.
fn lacks<T>(missing: MissingGrant, reason: String) -> G<T> {
    Err(Refusal { reason, missing: Some(missing), rule: None })
}

/// Check a node or controller plan and resolve it.
pub fn check(ctx: &Context<'_>, plan: wit::Plan) -> Result<Plan, PolicyError> {
    // A refusal quotes what the plan said, which may hold a secret's value; it reaches logs
    // and the CO's events.
    check_steps(ctx, plan).map_err(|mut e| {
        e.reason = ctx.secrets.scrub(&e.reason);
        e
    })
}

fn check_steps(ctx: &Context<'_>, plan: wit::Plan) -> Result<Plan, PolicyError> {
    let whole = |reason: String| PolicyError {
        plugin: ctx.plugin.into(),
        index: 0,
        kind: "plan",
        reason,
        missing: None,
        rule: None,
    };
    if plan.steps.len() > MAX_STEPS {
        return Err(whole(format!("{} steps; at most {MAX_STEPS} are allowed", plan.steps.len())));
    }
    let attributes = check_attributes(ctx, plan.attributes).map_err(whole)?;
    // One FUSE program a plan: the volume's process, the one the supervisor watches and heals.
    let spawns: Vec<usize> =
        (0..plan.steps.len()).filter(|i| matches!(plan.steps[*i], wit::Step::SpawnFuse(_))).collect();
    if let [first, second, ..] = spawns.as_slice() {
        return Err(whole(format!(
            "steps {} and {} both spawn a FUSE program; a plan runs one (its volume's process, which the host \
             supervises)",
            first + 1,
            second + 1
        )));
    }
    let mut seen = Seen::default();
    let mut steps = Vec::with_capacity(plan.steps.len());
    for (i, step) in plan.steps.into_iter().enumerate() {
        let kind = wit_kind(&step);
        let refuse = |r: Refusal| PolicyError {
            plugin: ctx.plugin.into(),
            index: i + 1,
            kind,
            reason: r.reason,
            missing: r.missing,
            rule: r.rule,
        };
        if !ctx.operation.allows(&step) {
            return Err(refuse(format!("a {kind} step is not allowed in a {:?} plan", ctx.operation).into()));
        }
        let step = check_step(ctx, step, &seen).map_err(refuse)?;
        if ctx.operation == Operation::DynamicMount {
            dynamic_mount_step(ctx, &step).map_err(|e| refuse(e.into()))?;
        }
        match &step {
            Step::Fetch { digest, .. } => {
                seen.fetched.insert(digest.clone(), Layering::Files);
            }
            Step::FetchBlob { digest, media_type, .. } => {
                seen.fetched.insert(digest.clone(), Layering::of(media_type));
            }
            Step::Resolve { .. } => seen.resolved = true,
            _ => {}
        }
        steps.push(step);
    }
    Ok(Plan { plugin: ctx.plugin.into(), digest: ctx.digest.clone(), steps, attributes })
}

/// Every grant `plan` lacks, judged by the rules of [`check`]: check it, and while the refusal
/// is for want of a grant, add that grant and check again. Empty when the plan passes as it
/// is; a refusal of another kind (a path leaving the volume, a denied option, ...) is the
/// error, as [`check`] would give it once the grants are there.
pub fn missing_grants(ctx: &Context<'_>, plan: &wit::Plan) -> Result<Vec<MissingGrant>, PolicyError> {
    let mut grant = ctx.grant.clone();
    let mut programs = ctx.programs.clone();
    let mut missing: Vec<MissingGrant> = Vec::new();
    loop {
        let trial = Context { grant: &grant, programs: &programs, ..ctx.clone() };
        match check(&trial, plan.clone()) {
            Ok(_) => return Ok(missing),
            // Each round adds a grant not added before, from a finite plan: the loop ends.
            Err(PolicyError { missing: Some(m), .. }) if !missing.contains(&m) => {
                m.add_to(&mut grant, &mut programs);
                missing.push(m);
            }
            Err(e) => return Err(e),
        }
    }
}

/// A dynamic mount's step: every bind and mount read-only, and what it reads or fills (bind
/// and mount sources, unpack destinations) in the mount's own cache directory, never in the
/// pod-writable target.
fn dynamic_mount_step(ctx: &Context<'_>, step: &Step) -> R<()> {
    if let Step::Bind { readonly: false, .. } | Step::Mount { readonly: false, .. } = step {
        return Err("a dynamic mount is read-only: every bind and mount must be read-only".into());
    }
    let in_cache = |p: &Path| ctx.dirs.cache.as_deref().is_some_and(|c| p.starts_with(c));
    let read = match step {
        Step::Bind { source, .. } => Some(source.as_path()),
        Step::Mount { source, .. } if source.starts_with('/') => Some(Path::new(source.as_str())),
        Step::Unpack { dest, .. } => Some(dest.as_path()),
        _ => None,
    };
    match read {
        Some(p) if !in_cache(p) => Err(format!(
            "{} is outside the mount's cache directory: a dynamic mount's sources and unpacked files live there, never in the pod's directory",
            p.display()
        )),
        _ => Ok(()),
    }
}

/// What the steps before the one being checked did.
#[derive(Debug, Default)]
struct Seen {
    /// Digests fetched (by `fetch` or `fetch-blob`), and how an `unpack` lays each out (by the
    /// media type it was fetched under).
    fetched: BTreeMap<String, Layering>,
    /// Whether a `resolve` step came.
    resolved: bool,
}

/// Hosts granted by a StorageClass's parameters: every `host:port` in the values of
/// parameters the plugin documents as `endpoint`, the `host:port` of the value of each one it
/// documents as `url` (parsed as every URL of a plan is, [`parse_url`]), and the registry of
/// the value of each one it documents as `oci-reference`, normalised like URL hosts
/// ([`HostGrant`]). A value that does not parse grants nothing. Only pass parameters that come
/// from a StorageClass.
pub fn endpoint_hosts<'a>(info: &PluginInfo, params: impl IntoIterator<Item = (&'a str, &'a str)>) -> BTreeSet<String> {
    let mut hosts = BTreeSet::new();
    for (key, value) in params {
        let Some(doc) = info.parameters.iter().find(|p| p.name == key) else { continue };
        let granted: Vec<String> = if doc.is_endpoint() {
            value.split(',').map(|h| h.trim().to_string()).collect()
        } else if doc.is_url() {
            parse_url(value.trim()).map(|t| vec![t.authority()]).unwrap_or_default()
        } else if doc.is_oci_reference() {
            // The registry only: the plan still has to name the repository it pulls.
            OciRef::parse(value.trim()).map(|r| vec![r.registry().to_string()]).unwrap_or_default()
        } else {
            Vec::new()
        };
        hosts.extend(granted.iter().filter_map(|h| HostGrant::parse(h).ok()).map(|g| g.to_string()));
    }
    hosts
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
        S::Resolve(_) => "resolve",
        S::FetchBlob(_) => "fetch-blob",
        S::Unpack(_) => "unpack",
        S::Http(_) => "http",
        S::Socket(_) => "socket",
        S::Lookup(_) => "lookup",
        S::SocketCall(_) => "socket-call",
    }
}

fn check_step(ctx: &Context<'_>, step: wit::Step, seen: &Seen) -> G<Step> {
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
                return Err(format!("{} arguments; at most {MAX_ARGS}", s.args.len()).into());
            }
            if s.env.len() > MAX_ENV {
                return Err(format!("{} environment variables; at most {MAX_ENV}", s.env.len()).into());
            }
            if !(1..=MAX_READY_TIMEOUT_MS).contains(&s.ready_timeout_ms) {
                return Err(
                    format!("ready timeout {} ms is outside 1..={MAX_READY_TIMEOUT_MS}", s.ready_timeout_ms).into()
                );
            }
            if s.memory_limit_bytes.is_some_and(|m| m < MIN_MEMORY_LIMIT) {
                return Err(format!("memory limit below the minimum of {MIN_MEMORY_LIMIT} bytes").into());
            }
            let args = s.args.iter().map(|a| arg(ctx, a)).collect::<R<Vec<_>>>()?;
            let host_mount = fuse::host_mount(ctx, s.mount, &s.fstype, &args)?;
            let mountpoint = path(ctx, &s.mountpoint)?;
            program_rules(ctx, &s.program, s.mountpoint.root, &mountpoint, &args, host_mount.is_some())?;
            program_args(ctx, &s.program, &args, host_mount.is_some())
                .map_err(|e| by_rule(&s.program, "program-args", e))?;
            let mut names = BTreeSet::new();
            let mut env = Vec::with_capacity(s.env.len());
            for e in s.env {
                text(ctx, &e.name, "an environment variable's name")?;
                env_name(&e.name)?;
                program_env(ctx, &s.program, &e.name)?;
                if !names.insert(e.name.clone()) {
                    return Err(format!("environment variable {} is set twice", e.name).into());
                }
                env.push(EnvVar {
                    value: value(ctx, e.value, &format!("environment variable {}", e.name), Place::Env)?,
                    name: e.name,
                });
            }
            Step::SpawnFuse {
                program: s.program,
                executable,
                args,
                env,
                mountpoint,
                fstype: s.fstype,
                ready_timeout_ms: s.ready_timeout_ms,
                memory_limit_bytes: s.memory_limit_bytes,
                host_mount,
                lazy: None,
            }
        }
        S::Mount(m) => {
            fstype(ctx, &m.fstype)?;
            let source = match &m.source {
                wit::MountSource::Named(n) => {
                    // First: the refusal below shows the name. A source shows in mountinfo.
                    text(ctx, n, "mount source")?;
                    if !token(n) {
                        return Err(format!(
                            "mount source {n:?} must be a pseudo name such as \"tmpfs\" or a path inside the volume; devices are not allowed"
                        ).into());
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
                    return Err(
                        format!("bind option {o:?} is not allowed; allowed: {}", BIND_OPTIONS.join(", ")).into()
                    );
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
        S::Resolve(r) => oci::resolve(ctx, r, seen.resolved)?,
        S::FetchBlob(f) => oci::fetch_blob(ctx, f, seen.resolved)?,
        S::Unpack(u) => {
            let Some(&layering) = seen.fetched.get(&u.digest) else {
                return Err(format!(
                    "blob {} is not fetched by an earlier step (a fetch or fetch-blob of it)",
                    u.digest
                )
                .into());
            };
            let format = match u.format {
                wit::Archive::Raw => Archive::Raw,
                wit::Archive::Tar => Archive::Tar,
                wit::Archive::TarGzip => Archive::TarGzip,
                wit::Archive::TarZstd => Archive::TarZstd,
            };
            Step::Unpack { digest: u.digest, format, dest: path(ctx, &u.dest)?, layering }
        }
        S::Http(h) => {
            const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"];
            if !METHODS.contains(&h.method.as_str()) {
                return Err(format!("HTTP method {:?} is not one of {}", h.method, METHODS.join(", ")).into());
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
                return Err(format!("body of {} bytes; at most {MAX_HTTP_BODY}", h.body.len()).into());
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
        S::Lookup(l) => {
            if !matches!(l.method.as_str(), "GET" | "HEAD") {
                return Err(format!("lookup method {:?} is not GET or HEAD (lookups only read)", l.method).into());
            }
            text(ctx, &l.key, "a lookup key")?;
            if l.key.is_empty() || l.key.len() > 64 || !token(&l.key) {
                return Err(format!("lookup key {:?} must be 1 to 64 letters, digits, '.', '_' or '-'", l.key).into());
            }
            if l.urls.is_empty() || l.urls.len() > 16 {
                return Err("a lookup needs 1 to 16 alternative URLs".into());
            }
            for u in &l.urls {
                url(ctx, u)?;
            }
            Step::Lookup { key: l.key, method: l.method, urls: l.urls, headers: headers(ctx, l.headers)? }
        }
        S::SocketCall(c) => {
            if c.socket.root != wit::DirRoot::Runtime {
                return Err("a socket-call's socket must be in the volume's runtime directory".into());
            }
            let valid_method =
                c.method.strip_prefix('/').and_then(|m| m.split_once('/')).is_some_and(|(service, name)| {
                    let ok = |s: &str, dots: bool| {
                        !s.is_empty()
                            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || (dots && b == b'.'))
                    };
                    ok(service, true) && ok(name, false)
                });
            if !valid_method {
                return Err(format!("socket-call method {:?} is not /<package>.<service>/<method>", c.method).into());
            }
            if c.message.len() > MAX_HTTP_BODY {
                return Err(
                    format!("a socket-call message of {} bytes; at most {MAX_HTTP_BODY}", c.message.len()).into()
                );
            }
            if !(1..=60_000).contains(&c.timeout_ms) {
                return Err(format!("a socket-call timeout of {} ms; 1 to 60000", c.timeout_ms).into());
            }
            Step::SocketCall {
                socket: path(ctx, &c.socket)?,
                method: c.method,
                message: c.message,
                timeout_ms: c.timeout_ms,
            }
        }
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
    // A path shows in mountinfo, which every process on the node reads, and in logs.
    text(ctx, rel, &format!("path (in {})", root_name(p.root)))?;
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

fn program(ctx: &Context<'_>, name: &str) -> G<PathBuf> {
    if name.contains('/') {
        return Err(format!(
            "program {name:?} is a path; plans name programs (such as \"weed\") and the host maps names to binaries"
        )
        .into());
    }
    if !token(name) {
        return Err(format!("program name {name:?} must be letters, digits, '.', '_' or '-'").into());
    }
    if !ctx.grant.programs.contains(name) {
        return lacks(
            MissingGrant::Program(name.into()),
            format!(
                "program {name:?} is not granted to plugin {} (granted: {})",
                ctx.plugin,
                list(&ctx.grant.programs)
            ),
        );
    }
    match ctx.programs.get(name) {
        Some(binary) => Ok(binary.clone()),
        None => lacks(
            MissingGrant::Binary(name.into()),
            format!(
                "program {name:?} has no binary configured on this host (host option --program {name}=/absolute/path)"
            ),
        ),
    }
}

/// The arguments a program would receive (secret files at the paths the executor gives them,
/// a FUSE descriptor at its `/dev/fd` path) against what host config lets that program's
/// arguments name. The rules judge exactly the strings the program gets: a path after a `-`
/// reads as short options, so which directory holds the secret files matters.
fn program_args(ctx: &Context<'_>, program: &str, args: &[SpawnArg], host_mounted: bool) -> R<()> {
    let Some(rules) = ctx.program_args.get(program) else { return Ok(()) };
    let names_file = args.iter().any(|a| matches!(a, SpawnArg::SecretFile { .. }));
    let dir = match ctx.dirs.secret_files(host_mounted) {
        Some(dir) => dir,
        None if names_file => {
            return Err(format!(
                "an argument names a secret file, and a {:?} plan has no directory for this program's secret files",
                ctx.operation
            ));
        }
        None => PathBuf::new(),
    };
    let rendered: Vec<String> = args.iter().map(|a| a.render_at(&dir)).collect();
    rules.check(program, &rendered)
}

/// An environment variable a plan sets for `program`: with a rule set or host config rules for
/// the program, only those they allow; without, any valid one but those of the deny list
/// ([`env`]).
fn program_env(ctx: &Context<'_>, program: &str, name: &str) -> G<()> {
    let args = ctx.program_args.get(program);
    match (ctx.rules.set(program), args) {
        (Some(set), _) if set.env.contains(name) => Ok(()),
        (_, Some(rules)) if rules.env.contains(name) => Ok(()),
        (Some(set), _) => {
            let mut allowed: BTreeSet<String> = set.env.clone();
            allowed.extend(args.map(|a| a.env.iter().cloned()).into_iter().flatten());
            Err(by_rule(
                program,
                "env",
                format!(
                    "program {program:?}: environment variable {name:?} is not allowed by rule set @{} (allowed: {}; \
                     host config adds one with --program-args {program}:env={name})",
                    set.name,
                    list(&allowed)
                ),
            ))
        }
        (None, Some(rules)) => rules.check_env(program, name).map_err(|e| by_rule(program, "program-args", e)),
        (None, None) => Ok(env::check(program, name)?),
    }
}

/// What `program`'s rule set and the node say about how it runs and about its whole argv
/// ([`super::rules`]): a program that must run on a connection the host mounts, or cannot, a
/// program that mounts by itself somewhere kubelet does not look, and every argument.
fn program_rules(
    ctx: &Context<'_>,
    program: &str,
    root: wit::DirRoot,
    mountpoint: &Path,
    args: &[SpawnArg],
    host_mounted: bool,
) -> G<()> {
    let set = ctx.rules.set(program);
    let named = |set: &RuleSet| format!("@{}", set.name);
    if host_mounted {
        if let Some(set) = set.filter(|s| s.host_fd == HostFd::Unsupported) {
            return Err(by_rule(
                program,
                "host-fd",
                format!(
                    "program {program:?} cannot take a FUSE connection the host mounts (rule set {}: host-fd: \
                     unsupported; programs linked with libfuse 2 fail with \"/dev/fd/3 is not a directory\"): plan \
                     fuse-mount.by-program for it",
                    named(set)
                ),
            ));
        }
    } else {
        if ctx.rules.host_fd_required.contains(program) {
            return Err(by_rule(
                program,
                "host-fd",
                format!(
                    "program {program:?} must run unprivileged on a FUSE connection the host mounts (host flag \
                     --require-host-fd {program}): plan fuse-mount.host-fd with a fuse-fd argument"
                ),
            ));
        }
        if let Some(set) = set.filter(|s| s.host_fd == HostFd::Required) {
            return Err(by_rule(
                program,
                "host-fd",
                format!(
                    "program {program:?} must run unprivileged on a FUSE connection the host mounts (rule set {}: \
                     host-fd: required): plan fuse-mount.host-fd with a fuse-fd argument",
                    named(set)
                ),
            ));
        }
        // Its mount reaches the node from its own mount namespace only where kubelet looks
        // (exec::confine): the staging or the target directory.
        if !matches!(root, wit::DirRoot::Staging | wit::DirRoot::Target) {
            return Err(format!(
                "a program that mounts by itself (fuse-mount.by-program) mounts at the staging or target directory, not \
                 in the {} directory",
                root_name(root)
            )
            .into());
        }
    }
    let Some(set) = set else { return Ok(()) };
    let dir = ctx.dirs.secret_files(host_mounted);
    let at = dir.clone().unwrap_or_default();
    let rendered: Vec<String> = args.iter().map(|a| a.render_at(&at)).collect();
    let secret_files = args
        .iter()
        .filter_map(|a| match a {
            SpawnArg::SecretFile { key, .. } => Some(
                SpawnArg::SecretFile { prefix: String::new(), key: key.clone(), suffix: String::new() }.render_at(&at),
            ),
            _ => None,
        })
        .collect();
    let values = rules::Values {
        mount_point: if host_mounted {
            SpawnArg::FuseFd { prefix: String::new(), suffix: String::new() }.render_at(&at)
        } else {
            mountpoint.display().to_string()
        },
        secret_files,
        cache: ctx.dirs.cache.as_deref(),
        runtime: ctx.dirs.runtime.as_deref(),
        secret_files_dir: dir.as_deref(),
        grants: ctx.grant.hosts.iter().chain(&ctx.endpoint_hosts).filter_map(|g| HostGrant::parse(g).ok()).collect(),
    };
    set.check(&rendered, &values).map_err(|r| {
        let place = if r.position == 0 {
            "its arguments".to_string()
        } else {
            format!("argument {} {:?}", r.position, r.argument)
        };
        let reason = format!("program {program:?}, {place}: {} (rule set {}, rule {})", r.reason, named(set), r.rule);
        // A host the StorageClass or host config could grant: a missing grant (missing_grants
        // lists it with the flag that gives it).
        Refusal { missing: r.ungranted.map(MissingGrant::Host), ..by_rule(program, &r.rule, reason) }
    })
}

fn fstype(ctx: &Context<'_>, fstype: &str) -> G<()> {
    if ctx.grant.fstypes.contains(fstype) {
        Ok(())
    } else {
        lacks(
            MissingGrant::Fstype(fstype.into()),
            format!(
                "fstype {fstype:?} is not allowed for plugin {} (allowed: {})",
                ctx.plugin,
                list(&ctx.grant.fstypes)
            ),
        )
    }
}

/// A program argument: paths resolved into the text, secret files kept as references.
fn arg(ctx: &Context<'_>, a: &wit::Arg) -> R<SpawnArg> {
    const WHAT: &str = "argument";
    match a {
        wit::Arg::Literal(s) => text(ctx, s, WHAT).map(|()| SpawnArg::Text(s.clone())),
        wit::Arg::Path(p) => {
            text(ctx, &p.prefix, WHAT)?;
            text(ctx, &p.suffix, WHAT)?;
            Ok(SpawnArg::Text(format!("{}{}{}", p.prefix, path(ctx, &p.path)?.display(), p.suffix)))
        }
        wit::Arg::SecretFile(f) => {
            text(ctx, &f.prefix, WHAT)?;
            text(ctx, &f.suffix, WHAT)?;
            secret_file(ctx, &f.key, WHAT)?;
            Ok(SpawnArg::SecretFile { prefix: f.prefix.clone(), key: f.key.clone(), suffix: f.suffix.clone() })
        }
        wit::Arg::FuseFd(f) => fuse::fd_arg(ctx, f),
    }
}

fn mount_option(ctx: &Context<'_>, o: &wit::Arg) -> R<MountOption> {
    const WHAT: &str = "mount option";
    let no_comma = |s: &str| {
        if s.contains(',') {
            Err(format!("mount option {s:?} contains ','; give each option separately"))
        } else {
            Ok(())
        }
    };
    match o {
        wit::Arg::Literal(t) => {
            text(ctx, t, WHAT)?;
            no_comma(t)?;
            Ok(MountOption::Text(t.clone()))
        }
        wit::Arg::Path(p) => {
            text(ctx, &p.prefix, WHAT)?;
            if !p.suffix.is_empty() {
                return Err(format!(
                    "mount option {:?} + path has the suffix {:?}; a mount option is a prefix and a path only (give further options separately; suffixes are for program arguments)",
                    p.prefix, p.suffix
                ));
            }
            let resolved = path(ctx, &p.path)?;
            no_comma(&format!("{}{}", p.prefix, resolved.display()))?;
            Ok(MountOption::Path { prefix: p.prefix.clone(), path: resolved })
        }
        wit::Arg::SecretFile(f) => Err(format!(
            "mount option {:?} names a file holding secret {:?}; secret files are for program arguments and              environment values only (the kernel would read the file's path, not the secret)",
            f.prefix, f.key
        )),
        wit::Arg::FuseFd(f) => Err(format!(
            "mount option {:?} names a fuse-fd argument, which only a host-fd spawn-fuse's program gets",
            f.prefix
        )),
    }
}

/// Plain text a plan carries: bounded, no NUL, and never a secret's value.
fn text(ctx: &Context<'_>, s: &str, what: &str) -> R<()> {
    if s.len() > MAX_TEXT || s.contains('\0') {
        return Err(format!("{what} is longer than {MAX_TEXT} bytes or contains NUL"));
    }
    if let Some(key) = ctx.secrets.leaks_into(s) {
        return Err(format!(
            "{what} contains the value of secret {key:?}; secrets must be passed as secret references (a secret, a secret template or a secret file), never as text"
        ));
    }
    Ok(())
}

/// Where a value goes: some kinds make sense only for a spawned program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// An environment variable of a spawn.
    Env,
    /// An HTTP header.
    Header,
}

fn value(ctx: &Context<'_>, v: wit::Value, what: &str, place: Place) -> R<Value> {
    match v {
        wit::Value::Literal(s) => text(ctx, &s, what).map(|()| Value::Literal(s)),
        wit::Value::Secret(key) => {
            secret_key(ctx, &key, what)?;
            Ok(Value::Secret(key))
        }
        wit::Value::SecretTemplate(t) => {
            text(ctx, &t.prefix, what)?;
            text(ctx, &t.suffix, what)?;
            secret_key(ctx, &t.key, what)?;
            Ok(Value::SecretTemplate { prefix: t.prefix, key: t.key, suffix: t.suffix })
        }
        wit::Value::Path(p) if place == Place::Env => Ok(Value::Path(path(ctx, &p)?)),
        wit::Value::Path(_) => Err(format!(
            "{what} is a path value; paths are for environment variables of a spawn only (a URL or literal header \
             carries what a server needs)"
        )),
        wit::Value::SecretFile(key) if place == Place::Env => {
            secret_file(ctx, &key, what)?;
            Ok(Value::SecretFile(key))
        }
        wit::Value::SecretFile(key) => Err(format!(
            "{what} names a file holding secret {key:?}; secret files are for spawned programs only (send the secret \
             itself with a secret or secret-template value)"
        )),
    }
}

/// A secret the request must carry.
fn secret_key(ctx: &Context<'_>, key: &str, what: &str) -> R<()> {
    if ctx.secrets.get(key).is_some() {
        return Ok(());
    }
    let given: BTreeSet<String> = ctx.secrets.iter().map(|(k, _)| k.to_string()).collect();
    Err(format!("{what} references secret {key:?}, which the request does not carry (given: {})", list(&given)))
}

/// A secret the executor will write into a file of the volume's runtime directory.
fn secret_file(ctx: &Context<'_>, key: &str, what: &str) -> R<()> {
    secret_key(ctx, key, what)?;
    if ctx.dirs.runtime.is_none() {
        return Err(format!(
            "{what} names a secret file, which lives in a host directory of the volume (its runtime directory or \
             its FUSE files directory); a {:?} plan has none",
            ctx.operation
        ));
    }
    Ok(())
}

/// An environment variable name a plan, or host config (`--program-args PROGRAM:env=NAME`),
/// may use: `[A-Za-z_][A-Za-z0-9_]*`, and none of the dynamic loader's.
pub fn env_name(name: &str) -> Result<(), String> {
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
            // First: the refusals below show the name, and a name is sent as it is.
            text(ctx, &h.name, "a header name")?;
            let valid = !h.name.is_empty()
                && h.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !valid {
                return Err(format!("header name {:?} is not an HTTP token", h.name));
            }
            // The host names the connection (the approved URL) and frames the message itself.
            if CONNECTION_HEADERS.iter().any(|c| h.name.eq_ignore_ascii_case(c)) {
                return Err(format!("header {} is set by the host from the approved URL and body", h.name));
            }
            let texts = match &h.value {
                wit::Value::Literal(v) => vec![v.as_str()],
                wit::Value::SecretTemplate(t) => vec![t.prefix.as_str(), t.suffix.as_str()],
                _ => Vec::new(),
            };
            if texts.iter().any(|t| t.contains(['\r', '\n'])) {
                return Err(format!("header {} contains a line break", h.name));
            }
            let what = format!("header {}", h.name);
            Ok(Header { value: value(ctx, h.value, &what, Place::Header)?, name: h.name })
        })
        .collect()
}

/// `http(s)://host[:port]/...` to a granted host. The URL is parsed by
/// [`super::url::parse`], the parser the HTTP client builds its request with, so the approved
/// host and port are the ones connected to. Grants are normalised the same way; one that does
/// not parse grants nothing.
fn url(ctx: &Context<'_>, u: &str) -> G<Target> {
    text(ctx, u, "URL")?;
    let target = parse_url(u).map_err(|e| e.to_string())?;
    granted(ctx, &target, "host")?;
    Ok(target)
}

/// `target`'s host and port are granted by config or by the StorageClass; `what` names the
/// host's role in the message (`host`, `registry`, `mirror`).
fn granted(ctx: &Context<'_>, target: &Target, what: &str) -> G<()> {
    let granted =
        |set: &BTreeSet<String>| set.iter().filter_map(|g| HostGrant::parse(g).ok()).any(|g| g.allows(target));
    if granted(&ctx.endpoint_hosts) || granted(&ctx.grant.hosts) {
        Ok(())
    } else {
        let mut all: BTreeSet<String> = ctx.grant.hosts.clone();
        all.extend(ctx.endpoint_hosts.iter().cloned());
        lacks(
            MissingGrant::Host(target.authority()),
            format!("{what} {} is not granted to plugin {} (granted: {})", target.authority(), ctx.plugin, list(&all)),
        )
    }
}

fn digest(d: &str) -> R<()> {
    if crate::plugin::Digest::parse(d).is_some() {
        Ok(())
    } else {
        Err(format!("digest {d:?} is not sha256:<64 lowercase hex digits>"))
    }
}

/// Recorded attributes the host adds itself (a dynamic mount's resolution, see
/// `daemon::dynamic`); a plan may not record them.
pub const RESERVED_ATTRIBUTE_PREFIX: &str = "mounthost.";

fn check_attributes(ctx: &Context<'_>, kvs: Vec<wit::Kv>) -> R<Vec<(String, String)>> {
    if kvs.len() > MAX_ATTRIBUTES {
        return Err(format!("{} attributes; at most {MAX_ATTRIBUTES}", kvs.len()));
    }
    kvs.into_iter()
        .map(|kv| {
            text(ctx, &kv.key, "an attribute key")?;
            if kv.key.is_empty() || kv.key.len() > 128 || !kv.key.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!("attribute key {:?} must be 1-128 printable characters", kv.key));
            }
            if kv.key.starts_with(RESERVED_ATTRIBUTE_PREFIX) {
                return Err(format!(
                    "attribute key {:?} is reserved: the host passes what it resolved under {RESERVED_ATTRIBUTE_PREFIX}*",
                    kv.key
                ));
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
