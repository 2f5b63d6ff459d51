//! `mounthost plugin info|list|plan`: how plugin authors see what the host would do with their
//! plugin, without mounting anything. The plan printed is the one the host would execute:
//! after the policy check, paths resolved, secrets only as references. A plan that lacks
//! grants is refused with every grant it lacks and the host flags that give them
//! ([`policy::missing_grants`]), not just the first.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;

use crate::config::Config;
use crate::error::ErrorKind;
use crate::plan::Plan;
use crate::plan::policy::{self, Context, MissingGrant, Operation, PolicyError};
use crate::plugin::bindings::types as wit;
use crate::plugin::{LoadedPlugin, PluginError, PluginRuntime};
use crate::secrets::Secrets;
use crate::volume::VolumeDirs;

/// Plugin subcommands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Print a plugin's name, version, contract version, digest and documented parameters as
    /// JSON.
    Info {
        /// A `.wasm` file (contains '/' or ends in .wasm) or a plugin name.
        plugin: String,
    },
    /// List the plugins a StorageClass can select (stock and folder).
    List,
    /// Run a planner and print the checked plan as JSON.
    Plan(PlanArgs),
    /// Publish a `.wasm` plugin to an OCI registry and print the pinned reference
    /// (`oci://REGISTRY/REPOSITORY@sha256:...`) a StorageClass's `plugin` parameter takes.
    Push(super::plugin_push::PushArgs),
    /// Check a `.wasm` plugin: size, contract version, imports and exports, its `info`, a dry
    /// plan of every CSI operation with example parameters under this host's policy, and limits.
    /// Exit status 1 when a check fails.
    Check(super::plugin_check::CheckArgs),
}

/// Arguments of `plugin plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// A `.wasm` file or a plugin name.
    pub plugin: String,
    /// Which planner to run.
    #[arg(long, value_enum, default_value = "stage")]
    pub op: Op,
    /// A StorageClass parameter / volume attribute, KEY=VALUE (repeatable).
    #[arg(long = "param", value_parser = parse_kv)]
    pub params: Vec<(String, String)>,
    /// A secret, KEY=VALUE or KEY=@FILE to read the value from a file and keep it out of argv.
    #[arg(long = "secret", value_parser = parse_kv)]
    pub secrets: Vec<(String, String)>,
    /// Volume id (or, for --op provision, the volume name).
    #[arg(long, default_value = "cli-volume")]
    pub volume_id: String,
    /// Directory the plan mounts into: the staging path for stage, the target for publish.
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// The staging path when planning publish.
    #[arg(long)]
    pub staging: Option<PathBuf>,
    /// Ask for a read-only publish.
    #[arg(long)]
    pub readonly: bool,
    /// Access mode of the volume capability.
    #[arg(long, value_enum, default_value = "single-node-writer")]
    pub access_mode: AccessModeArg,
    /// Mount flag of the volume capability (repeatable).
    #[arg(long = "mount-flag")]
    pub mount_flags: Vec<String>,
}

/// Planner to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Op {
    Validate,
    Provision,
    Delete,
    Stage,
    Publish,
    Unstage,
}

/// CSI access modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AccessModeArg {
    SingleNodeWriter,
    SingleNodeReaderOnly,
    MultiNodeReaderOnly,
    MultiNodeSingleWriter,
    MultiNodeMultiWriter,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
}

/// Why a CLI command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The plan lacks these grants (and passes the policy otherwise).
    #[error(
        "plan from plugin {plugin} needs what the host config does not grant it: {}\ngrant it with the host flags: {}",
        list(missing),
        flags(plugin, missing)
    )]
    MissingGrants { plugin: String, missing: Vec<MissingGrant> },
    #[error("{0}")]
    Usage(String),
    /// `plugin check` found problems: the report.
    #[error("{0}")]
    CheckFailed(String),
    /// A registry or the node's registry configuration refused (`plugin push`).
    #[error(transparent)]
    Registry(crate::error::Error),
}

fn list(missing: &[MissingGrant]) -> String {
    missing.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

fn flags(plugin: &str, missing: &[MissingGrant]) -> String {
    missing.iter().map(|m| m.flag(plugin)).collect::<Vec<_>>().join(" ")
}

impl CliError {
    /// The gRPC class of the failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CliError::Plugin(e) => e.kind(),
            CliError::Policy(e) => e.kind(),
            CliError::MissingGrants { .. } | CliError::Usage(_) | CliError::CheckFailed(_) => {
                ErrorKind::InvalidArgument
            }
            CliError::Registry(e) => e.kind,
        }
    }
}

/// `KEY=VALUE`.
pub fn parse_kv(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected KEY=VALUE"))?;
    if k.is_empty() {
        return Err(format!("{s:?}: the key is empty"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Run a plugin subcommand; returns what to print on stdout.
pub async fn run(cfg: &Config, cmd: PluginCommand) -> Result<String, CliError> {
    let runtime = PluginRuntime::new(cfg.runtime())?;
    match cmd {
        PluginCommand::Info { plugin } => {
            let p = load(&runtime, &plugin).await?;
            Ok(pretty(&json!({
                "digest": p.digest.to_string(),
                "origin": p.origin,
                "contract": p.contract(),
                "info": p.info,
                "grant": grant_json(cfg, &p.info.name),
            })))
        }
        PluginCommand::List => {
            let list: Vec<_> = runtime
                .list()
                .await
                .iter()
                .map(|p| {
                    json!({
                        "name": p.info.name,
                        "version": p.info.version,
                        "contract": p.contract(),
                        "digest": p.digest.to_string(),
                        "origin": p.origin,
                    })
                })
                .collect();
            Ok(pretty(&list))
        }
        PluginCommand::Plan(args) => plan(cfg, &runtime, args).await,
        PluginCommand::Push(args) => super::plugin_push::run(cfg, &runtime, args).await,
        PluginCommand::Check(args) => match super::plugin_check::run(cfg, &runtime, args).await? {
            (report, false) => Ok(report),
            (report, true) => Err(CliError::CheckFailed(report)),
        },
    }
}

async fn load(runtime: &PluginRuntime, what: &str) -> Result<Arc<LoadedPlugin>, PluginError> {
    if what.contains('/') || what.ends_with(".wasm") {
        runtime.load_file(std::path::Path::new(what)).await
    } else {
        runtime.resolve(what, None).await
    }
}

fn grant_json(cfg: &Config, plugin: &str) -> serde_json::Value {
    let g = cfg.grant(plugin);
    json!({"programs": g.programs, "fstypes": g.fstypes, "hosts": g.hosts})
}

fn pretty(v: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(v).expect("JSON values always serialize")
}

fn kvs(pairs: &[(String, String)]) -> Vec<wit::Kv> {
    pairs.iter().map(|(k, v)| wit::Kv { key: k.clone(), value: v.clone() }).collect()
}

/// Secrets from flags, `KEY=@FILE` read from the file.
pub fn read_secrets(pairs: &[(String, String)]) -> Result<Vec<(String, String)>, CliError> {
    pairs
        .iter()
        .map(|(k, v)| match v.strip_prefix('@') {
            Some(file) => std::fs::read_to_string(file)
                .map(|s| (k.clone(), s.trim_end_matches('\n').to_string()))
                .map_err(|e| CliError::Usage(format!("secret {k}: reading {file}: {e}"))),
            None => Ok((k.clone(), v.clone())),
        })
        .collect()
}

/// Where the planned volume's directories would be on a node.
fn dirs_for(cfg: &Config, args: &PlanArgs) -> VolumeDirs {
    let kubelet = PathBuf::from("/var/lib/kubelet");
    let key = crate::volume::dirs::volume_key(&args.volume_id);
    let default_staging = kubelet.join(format!("plugins/kubernetes.io/csi/csi.mounthost.dev/{key}/globalmount"));
    let default_target =
        kubelet.join(format!("pods/00000000-0000-0000-0000-000000000000/volumes/kubernetes.io~csi/{key}/mount"));
    let mut dirs = VolumeDirs::host_owned(&cfg.state_dir, &args.volume_id);
    dirs.fuse_files = Some(cfg.fuse_files().join(&key));
    match args.op {
        Op::Stage | Op::Unstage => dirs.staging = Some(args.target.clone().unwrap_or(default_staging)),
        Op::Publish => {
            dirs.staging = Some(args.staging.clone().unwrap_or(default_staging));
            dirs.target = Some(args.target.clone().unwrap_or(default_target));
        }
        Op::Validate | Op::Provision | Op::Delete => dirs = VolumeDirs::default(),
    }
    dirs
}

pub(super) async fn plan(cfg: &Config, runtime: &PluginRuntime, args: PlanArgs) -> Result<String, CliError> {
    for dir in [&args.target, &args.staging].into_iter().flatten() {
        if !dir.is_absolute() {
            return Err(CliError::Usage(format!("{} must be an absolute path", dir.display())));
        }
    }
    let p = load(runtime, &args.plugin).await?;
    let secret_pairs = read_secrets(&args.secrets)?;
    let secrets: Secrets = secret_pairs.iter().cloned().collect();
    let capability = wit::VolumeCapability {
        access_mode: access_mode(args.access_mode),
        fs_type: String::new(),
        mount_flags: args.mount_flags.clone(),
    };
    let (params, wsecrets, id) = (kvs(&args.params), kvs(&secret_pairs), args.volume_id.clone());
    let dirs = dirs_for(cfg, &args);
    let grant = cfg.grant(&p.info.name);
    let hosts = policy::endpoint_hosts(&p.info, args.params.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let ctx = |operation| Context {
        operation,
        plugin: &p.info.name,
        digest: p.digest.to_string(),
        grant: &grant,
        programs: &cfg.programs,
        program_args: &cfg.program_args,
        rules: &cfg.program_rules,
        endpoint_hosts: hosts.clone(),
        dirs: &dirs,
        secrets: &secrets,
    };
    let wit_plan = match args.op {
        Op::Validate => {
            let req = wit::ValidateRequest { parameters: params, secrets: wsecrets, capabilities: vec![capability] };
            runtime.call(&p, &id, req).await?;
            return Ok(pretty(&json!({"valid": true})));
        }
        Op::Provision => {
            let req = wit::ProvisionRequest {
                name: id.clone(),
                parameters: params,
                secrets: wsecrets,
                capabilities: vec![capability],
                required_bytes: 0,
                limit_bytes: 0,
                // A dry run: the first round only (the plan shows the lookups a real call makes).
                looked_up: Vec::new(),
            };
            let out = runtime.call(&p, &id, req).await?;
            let plan = wit::Plan { steps: out.steps, attributes: Vec::new() };
            let checked = check_all(&ctx(Operation::Provision), plan)?;
            let context: std::collections::BTreeMap<_, _> =
                out.context.into_iter().map(|kv| (kv.key, kv.value)).collect();
            return Ok(pretty(&json!({
                "volumeId": format!("{}~{}", p.info.name, out.volume_id),
                "capacityBytes": out.capacity_bytes,
                "context": context,
                "plan": checked,
            })));
        }
        Op::Delete => runtime.call(&p, &id, wit::DeleteRequest { volume_id: id.clone(), secrets: wsecrets }).await?,
        Op::Stage => {
            let req = wit::StageRequest {
                volume_id: id.clone(),
                context: params,
                secrets: wsecrets,
                capability,
                ephemeral: false,
                resolved: None,
                looked_up: Vec::new(),
                node_id: cfg.node_id.clone(),
            };
            runtime.call(&p, &id, req).await?
        }
        Op::Publish => {
            let req = wit::PublishRequest {
                volume_id: id.clone(),
                context: params,
                secrets: wsecrets,
                capability,
                readonly: args.readonly,
                recorded: Vec::new(),
            };
            runtime.call(&p, &id, req).await?
        }
        Op::Unstage => {
            runtime
                .call(&p, &id, wit::UnstageRequest { volume_id: id.clone(), context: params, recorded: Vec::new() })
                .await?
        }
    };
    let operation = match args.op {
        Op::Delete => Operation::Delete,
        Op::Publish => Operation::Publish,
        Op::Unstage => Operation::Unstage,
        _ => Operation::Stage,
    };
    let checked = check_all(&ctx(operation), wit_plan)?;
    Ok(pretty(&checked))
}

/// The plan the host would execute; one that lacks grants is refused naming every grant it
/// lacks (other refusals as the host gives them).
fn check_all(ctx: &Context<'_>, plan: wit::Plan) -> Result<Plan, CliError> {
    let missing = policy::missing_grants(ctx, &plan)?;
    if !missing.is_empty() {
        return Err(CliError::MissingGrants { plugin: ctx.plugin.to_string(), missing });
    }
    Ok(policy::check(ctx, plan)?)
}

impl AccessModeArg {
    /// The CSI enum value.
    pub fn csi(self) -> crate::proto::csi::volume_capability::access_mode::Mode {
        use crate::proto::csi::volume_capability::access_mode::Mode as M;
        match self {
            AccessModeArg::SingleNodeWriter => M::SingleNodeWriter,
            AccessModeArg::SingleNodeReaderOnly => M::SingleNodeReaderOnly,
            AccessModeArg::MultiNodeReaderOnly => M::MultiNodeReaderOnly,
            AccessModeArg::MultiNodeSingleWriter => M::MultiNodeSingleWriter,
            AccessModeArg::MultiNodeMultiWriter => M::MultiNodeMultiWriter,
            AccessModeArg::SingleNodeSingleWriter => M::SingleNodeSingleWriter,
            AccessModeArg::SingleNodeMultiWriter => M::SingleNodeMultiWriter,
        }
    }
}

fn access_mode(m: AccessModeArg) -> wit::AccessMode {
    use wit::AccessMode as A;
    match m {
        AccessModeArg::SingleNodeWriter => A::SingleNodeWriter,
        AccessModeArg::SingleNodeReaderOnly => A::SingleNodeReaderOnly,
        AccessModeArg::MultiNodeReaderOnly => A::MultiNodeReaderOnly,
        AccessModeArg::MultiNodeSingleWriter => A::MultiNodeSingleWriter,
        AccessModeArg::MultiNodeMultiWriter => A::MultiNodeMultiWriter,
        AccessModeArg::SingleNodeSingleWriter => A::SingleNodeSingleWriter,
        AccessModeArg::SingleNodeMultiWriter => A::SingleNodeMultiWriter,
    }
}
