//! Example plugin: volumes served by `sshfs` over SFTP, written only with the mounthost SDK.
//!
//! `stage` plans one `spawn-fuse` of `sshfs <user>@<host>:<path> /dev/fd/3 -f ...` whose
//! filesystem the host mounts itself (`mount: host_fd(..)`): the host opens `/dev/fuse`, mounts
//! it at the staging directory as `fuse.sshfs`, and starts sshfs as the volume's own FUSE id
//! with that descriptor only; sshfs (libfuse 3.3 or later) serves the connection it is handed.
//! The private key and the server's host keys come from the node-stage secret and reach
//! `ssh` as files (`IdentityFile=`, `UserKnownHostsFile=`), never in argv; host keys are always
//! checked (`StrictHostKeyChecking=yes`). `publish` is the SDK's bind of the staging directory.
//! There is no dynamic provisioning: use a static PersistentVolume or an inline volume.
//!
//! Parameters (StorageClass, PV `volumeAttributes` or inline `volumeAttributes`): `host`
//! (required), `port` (22), `user` (required), `path` (the remote directory; the user's home
//! when empty), `readOnly` (`false`) and `memoryLimitMiB` (no limit). Secrets: `sshPrivateKey`
//! and `sshKnownHosts` (both required; `known_hosts` lines, `[host]:port` for a port other
//! than 22).
//!
//! The host grants nothing by default: run it with `--program sshfs=/usr/bin/sshfs
//! --grant sshfs:program=sshfs --grant sshfs:fstype=fuse.sshfs`.

use mounthost_plugin_sdk::params::{ParamSpec, invalid, known, param_docs};
use mounthost_plugin_sdk::*;

/// The plugin, as exported to the host (public so native builds, which export nothing, use it).
pub struct Sshfs;

/// The program name the host maps to its `sshfs` binary.
pub const PROGRAM: &str = "sshfs";
/// The fstype of the mount the host makes (`fuse.<subtype>`).
pub const FSTYPE: &str = "fuse.sshfs";
/// The secret holding the private key.
pub const KEY: &str = "sshPrivateKey";
/// The secret holding the server's `known_hosts` lines.
pub const KNOWN_HOSTS: &str = "sshKnownHosts";

const HOST: &str = "host";
const PORT: &str = "port";
const USER: &str = "user";
const PATH: &str = "path";
const READ_ONLY: &str = "readOnly";
const MEMORY: &str = "memoryLimitMiB";
const OPTIONS: &str = "options";

/// Longest mount source the host accepts (`user@host:path`).
const MAX_SOURCE: usize = 256;

const SPECS: &[ParamSpec] = &[
    ParamSpec::parameter(HOST, ParamKind::Text, None, "The SSH server: a DNS name or an IPv4 address.").required(),
    ParamSpec::parameter(PORT, ParamKind::Integer, Some("22"), "The SSH server's port, 1 to 65535."),
    ParamSpec::parameter(USER, ParamKind::Text, None, "The user to log in as.").required(),
    ParamSpec::parameter(
        PATH,
        ParamKind::RemotePath,
        Some(""),
        "The remote directory to mount (absolute, or relative to the user's home; empty: the home).",
    ),
    ParamSpec::parameter(READ_ONLY, ParamKind::Boolean, Some("false"), "Mount read-only."),
    ParamSpec::parameter(MEMORY, ParamKind::Integer, None, "Memory limit of sshfs's cgroup in MiB, 16 to 4096."),
    ParamSpec::parameter(
        OPTIONS,
        ParamKind::CommaList,
        None,
        "More sshfs -o options, comma-separated (cache=yes,compression=yes); the host's program-argument rules \
         decide which it accepts.",
    ),
    ParamSpec::secret(KEY, "The private key (OpenSSH format) to log in with.").required(),
    ParamSpec::secret(
        KNOWN_HOSTS,
        "known_hosts lines of the server's host keys ([host]:port for another port than 22).",
    )
    .required(),
];

/// What a volume mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub path: String,
    pub read_only: bool,
    pub memory_mib: Option<u64>,
    /// Extra `-o` options, as given.
    pub options: Vec<String>,
}

impl Settings {
    /// Read and check a parameter list (`source`: StorageClass parameters or a volume context).
    pub fn read(kvs: &[Kv], source: ParamSource) -> Result<Settings, BackendError> {
        let params = Params::new("parameter", kvs)?;
        params.check_known(known(SPECS), source)?;
        let host = params.required(HOST)?;
        if !mounthost_plugin_sdk::net::is_dns_name(host) {
            return Err(invalid(format!("parameter {HOST}: {host:?} is not a DNS name or an IPv4 address")));
        }
        let port = params.integer(PORT, 1, 65_535)?.unwrap_or(22) as u16;
        let user = params.required(USER)?;
        let user_ok = user.len() <= 32
            && !user.starts_with('-')
            && user.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !user_ok {
            return Err(invalid(format!(
                "parameter {USER}: {user:?} must be 1 to 32 letters, digits, '_', '-' or '.', not starting with '-'"
            )));
        }
        let path = params.text(PATH)?.unwrap_or_default();
        if path.starts_with('-') || !path.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
            return Err(invalid(format!(
                "parameter {PATH}: {path:?} must be printable ASCII without spaces or commas, not starting with '-'"
            )));
        }
        let settings = Settings {
            host: host.to_string(),
            port,
            user: user.to_string(),
            path: path.to_string(),
            read_only: params.boolean(READ_ONLY)?.unwrap_or(false),
            memory_mib: params.integer(MEMORY, 16, 4096)?,
            options: options(params.text(OPTIONS)?.unwrap_or_default())?,
        };
        if settings.remote().len() > MAX_SOURCE {
            return Err(invalid(format!("{USER}@{HOST}:{PATH} is longer than {MAX_SOURCE} characters")));
        }
        Ok(settings)
    }

    /// `user@host:path`, sshfs's first argument and the mount's source.
    pub fn remote(&self) -> String {
        format!("{}@{}:{}", self.user, self.host, self.path)
    }
}

/// The `options` list: each item printable ASCII without spaces, not starting with '-'. Which
/// options are acceptable is the host's decision (its program-argument rules), not this
/// plugin's: it passes them on.
fn options(list: &str) -> Result<Vec<String>, BackendError> {
    let items: Vec<String> = list.split(',').filter(|o| !o.is_empty()).map(str::to_string).collect();
    for o in &items {
        if o.starts_with('-') || !o.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(format!(
                "parameter {OPTIONS}: {o:?} must be printable ASCII without spaces, not starting with '-'"
            )));
        }
    }
    Ok(items)
}

/// Both secrets present and nothing else.
fn check_secrets(secrets: &[Kv]) -> Result<(), BackendError> {
    let secrets = Params::new("secret", secrets)?;
    secrets.check_known(known(SPECS), ParamSource::Secret)?;
    // Multi-line values (a key, known_hosts lines): read raw, never through `text`, which
    // refuses line breaks.
    for key in [KEY, KNOWN_HOSTS] {
        if secrets.get(key).is_none_or(str::is_empty) {
            return Err(invalid(format!("secret {key:?} is required")));
        }
    }
    Ok(())
}

/// `-o <option>`.
fn option(args: &mut Vec<Arg>, o: Arg) {
    args.push(arg("-o"));
    args.push(o);
}

/// The stage plan of `s`.
pub fn plan(s: &Settings, readonly: bool) -> Plan {
    let remote = s.remote();
    // `-f`: stay in the foreground (the host supervises the process it started).
    let mut args = vec![arg(remote.clone()), fuse_fd_arg("", ""), arg("-f")];
    option(&mut args, arg(format!("port={}", s.port)));
    option(&mut args, secret_file_arg("IdentityFile=", KEY, ""));
    option(&mut args, arg("IdentitiesOnly=yes"));
    option(&mut args, secret_file_arg("UserKnownHostsFile=", KNOWN_HOSTS, ""));
    option(&mut args, arg("GlobalKnownHostsFile=/dev/null"));
    option(&mut args, arg("StrictHostKeyChecking=yes"));
    option(&mut args, arg("BatchMode=yes"));
    option(&mut args, arg("ServerAliveInterval=15"));
    option(&mut args, arg("reconnect"));
    for o in &s.options {
        option(&mut args, arg(o.clone()));
    }
    // No environment, and the SDK's default wait for the mount (30 s).
    let sshfs = SpawnFuse::new(PROGRAM, args, staging(""), FSTYPE)
        .with_memory_limit_bytes(s.memory_mib.map(|mib| mib << 20))
        .with_mount(host_fd(remote, &[], readonly));
    Plan::new([Step::SpawnFuse(sshfs)])
}

impl Plugin for Sshfs {
    fn info() -> PluginInfo {
        PluginInfo::new(
            "sshfs",
            "0.1.0",
            "Example plugin: mounts a directory of an SSH server with sshfs, run unprivileged on a FUSE \
             connection the host mounts. Needs the program sshfs and the fstype fuse.sshfs granted.",
        )
        .with_parameters(param_docs(SPECS))
        .with_programs([PROGRAM])
        .with_fstypes([FSTYPE])
    }

    fn validate(req: ValidateRequest) -> Result<(), BackendError> {
        Settings::read(&req.parameters, ParamSource::Parameter)?;
        check_secrets(&req.secrets)
    }

    fn stage(req: StageRequest) -> Result<Plan, BackendError> {
        let s = Settings::read(&req.context, ParamSource::Context)?;
        check_secrets(&req.secrets)?;
        let readonly = s.read_only || is_read_only(req.capability.access_mode);
        Ok(plan(&s, readonly))
    }
}

export_plugin!(Sshfs);

#[cfg(test)]
mod tests {
    use super::*;

    fn stage_req(context: Vec<Kv>, secrets: Vec<Kv>) -> StageRequest {
        StageRequest::default()
            .with_volume_id("v")
            .with_context(context)
            .with_secrets(secrets)
            .with_capability(VolumeCapability::new(AccessMode::MultiNodeMultiWriter))
            .with_node_id("node-1")
    }

    fn secrets() -> Vec<Kv> {
        vec![
            kv(KEY, "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n-----END OPENSSH PRIVATE KEY-----\n"),
            kv(KNOWN_HOSTS, "[h]:2222 ssh-ed25519 AAAA\n"),
        ]
    }

    fn spawn(plan: &Plan) -> SpawnFuse {
        match &plan.steps[..] {
            [Step::SpawnFuse(s)] => s.clone(),
            other => panic!("expected one spawn-fuse, got {other:?}"),
        }
    }

    #[test]
    fn stage_runs_sshfs_on_a_connection_the_host_mounts() {
        let ctx = vec![kv(HOST, "sftp.example.com"), kv(PORT, "2222"), kv(USER, "alice"), kv(PATH, "/srv/data")];
        let s = spawn(&Sshfs::stage(stage_req(ctx.clone(), secrets())).unwrap());
        assert_eq!((s.program.as_str(), s.fstype.as_str()), ("sshfs", "fuse.sshfs"));
        assert_eq!(s.mount, host_fd("alice@sftp.example.com:/srv/data", &[], false));
        assert_eq!(&s.args[..3], &[arg("alice@sftp.example.com:/srv/data"), fuse_fd_arg("", ""), arg("-f")]);
        assert!(s.args.contains(&arg("port=2222")));
        assert!(s.args.contains(&secret_file_arg("IdentityFile=", KEY, "")));
        assert!(s.args.contains(&secret_file_arg("UserKnownHostsFile=", KNOWN_HOSTS, "")));
        assert!(s.args.contains(&arg("StrictHostKeyChecking=yes")));
        // No secret value anywhere in the plan.
        let shown = format!("{:?}", Sshfs::stage(stage_req(ctx.clone(), secrets())).unwrap());
        assert!(!shown.contains("BEGIN OPENSSH") && !shown.contains("AAAA"), "{shown}");
        assert!(s.env.is_empty());
        assert_eq!(s.mountpoint, staging(""));
        let mut ro = ctx;
        ro.push(kv(READ_ONLY, "true"));
        ro.push(kv(MEMORY, "64"));
        let s = spawn(&Sshfs::stage(stage_req(ro, secrets())).unwrap());
        assert_eq!(s.mount, host_fd("alice@sftp.example.com:/srv/data", &[], true));
        assert_eq!(s.memory_limit_bytes, Some(64 << 20));
    }

    #[test]
    fn options_pass_on_as_dash_o_items_after_the_plugins_own() {
        let ctx = vec![kv(HOST, "h"), kv(USER, "u"), kv(OPTIONS, "cache=yes,,compression=no")];
        let s = spawn(&Sshfs::stage(stage_req(ctx, secrets())).unwrap());
        let n = s.args.len();
        assert_eq!(&s.args[n - 4..], &[arg("-o"), arg("cache=yes"), arg("-o"), arg("compression=no")]);
        assert!(!s.args.contains(&arg("-F")), "no -F: hosts deny it (it names an ssh_config)");
        for bad in ["-F/tmp/x", "a b", "x\ty"] {
            let ctx = vec![kv(HOST, "h"), kv(USER, "u"), kv(OPTIONS, bad)];
            assert!(Sshfs::stage(stage_req(ctx, secrets())).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bad_parameters_and_missing_secrets_are_refused() {
        let base = || vec![kv(HOST, "h"), kv(USER, "u")];
        assert!(Sshfs::stage(stage_req(base(), secrets())).is_ok());
        for (key, bad) in [
            (HOST, "-oProxyCommand=x"),
            (HOST, "a b"),
            (USER, "-x"),
            (USER, "a@b"),
            (PATH, "a,b"),
            (PATH, "-x"),
            (PORT, "0"),
            (READ_ONLY, "yes"),
        ] {
            let mut ctx: Vec<Kv> = base().into_iter().filter(|k| k.key != key).collect();
            ctx.push(kv(key, bad));
            assert!(Sshfs::stage(stage_req(ctx, secrets())).is_err(), "{key}={bad:?}");
        }
        assert!(Sshfs::stage(stage_req(vec![kv(HOST, "h")], secrets())).is_err(), "user is required");
        assert!(Sshfs::stage(stage_req(base(), vec![kv(KEY, "k")])).is_err(), "known hosts are required");
        assert!(Sshfs::stage(stage_req(base(), vec![])).is_err());
        let mut extra = secrets();
        extra.push(kv("password", "p"));
        assert!(Sshfs::stage(stage_req(base(), extra)).is_err());
    }
}
