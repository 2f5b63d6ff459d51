//! Test fixture: a hostile plugin that plans whatever program and argv a test asks for, so the
//! host's rule sets and each program's mount namespace can be shown against every route a
//! plugin granted a program could take (host/tests/e2e_grants.rs).
//!
//! Its `stage` planner plans one `spawn-fuse` from these parameters:
//!
//! | parameter | meaning |
//! |-----------|---------|
//! | `program` | the program name (required) |
//! | `fstype`  | the fstype the host waits for (default `fuse`) |
//! | `args`    | the arguments, one a line; in each, at most one `{...}` is replaced by a reference the host resolves: `{staging}` or `{staging:REL}`, `{cache}` or `{cache:REL}`, `{runtime}` or `{runtime:REL}`, `{fd}` (the host-mounted connection), `{secret:KEY}` (a file holding the secret `KEY`) |
//! | `mount`   | `by-program` (default) or `host-fd` |
//! | `env`     | `NAME=VALUE` items separated by `;` (`NAME=secret:KEY` references a secret) |
//! | `timeout` | the ready timeout in milliseconds (default 5000) |
//! | `hosts`   | hosts the StorageClass grants (an endpoint parameter, not read by the planner) |
//!
//! Its mount point is always the staging directory; `publish` is the SDK's bind.

use mounthost_plugin_sdk::params::invalid;
use mounthost_plugin_sdk::*;

/// The plugin, as exported to the host.
pub struct Argv;

const PARAMS: [(&str, ParamKind, &str); 7] = [
    ("program", ParamKind::Text, "The program to spawn."),
    ("fstype", ParamKind::Text, "The fstype to wait for."),
    ("args", ParamKind::Text, "Arguments, one a line, with {staging}, {cache}, {runtime}, {fd}, {secret:KEY}."),
    ("mount", ParamKind::Choice, "by-program or host-fd."),
    ("env", ParamKind::Text, "NAME=VALUE;... (NAME=secret:KEY for a secret)."),
    ("timeout", ParamKind::Integer, "Ready timeout in milliseconds."),
    ("hosts", ParamKind::Endpoint, "Hosts the StorageClass grants."),
];

/// One argument: text with at most one `{...}` reference in it.
fn parse_arg(text: &str) -> Result<Arg, BackendError> {
    let Some(open) = text.find('{') else { return Ok(arg(text)) };
    let close = text[open..].find('}').map(|c| open + c).ok_or_else(|| invalid(format!("unclosed {{ in {text:?}")))?;
    let (prefix, inner, suffix) = (&text[..open], &text[open + 1..close], &text[close + 1..]);
    let (root, rel) = inner.split_once(':').unwrap_or((inner, ""));
    Ok(match root {
        "staging" => path_arg_with_suffix(prefix, staging(rel), suffix),
        "cache" => path_arg_with_suffix(prefix, cache(rel), suffix),
        "runtime" => path_arg_with_suffix(prefix, runtime(rel), suffix),
        "fd" => fuse_fd_arg(prefix, suffix),
        "secret" => secret_file_arg(prefix, rel, suffix),
        other => return Err(invalid(format!("unknown reference {{{other}}} in {text:?}"))),
    })
}

fn env(list: &str) -> Result<Vec<EnvVar>, BackendError> {
    list.split(';')
        .filter(|i| !i.is_empty())
        .map(|item| {
            let (name, value) =
                item.split_once('=').ok_or_else(|| invalid(format!("env item {item:?} is not NAME=VALUE")))?;
            let value = match value.strip_prefix("secret:") {
                Some(key) => Value::Secret(key.into()),
                None => Value::Literal(value.into()),
            };
            Ok(EnvVar::new(name, value))
        })
        .collect()
}

impl Plugin for Argv {
    fn info() -> PluginInfo {
        PluginInfo::new("argv", "0.1.0", "Test fixture: plans whatever program and arguments a test asks for.")
            .with_parameters(
                PARAMS
                    .iter()
                    .map(|(name, kind, doc)| ParamDoc::new(*name, *kind, *doc).with_required(*name == "program"))
                    .collect::<Vec<_>>(),
            )
    }

    fn validate(_req: ValidateRequest) -> Result<(), BackendError> {
        Ok(())
    }

    fn stage(req: StageRequest) -> Result<Plan, BackendError> {
        let params = Params::new("parameter", &req.context)?;
        let program = params.required("program")?;
        let args = params.get("args").unwrap_or("").lines().map(parse_arg).collect::<Result<Vec<_>, _>>()?;
        let mount = match params.text("mount")?.unwrap_or("by-program") {
            "by-program" => FuseMount::ByProgram,
            "host-fd" => host_fd("argv", &[], false),
            other => return Err(invalid(format!("mount {other:?} is by-program or host-fd"))),
        };
        let spawn = SpawnFuse::new(program, args, staging(""), params.text("fstype")?.unwrap_or("fuse"))
            .with_env(env(params.text("env")?.unwrap_or(""))?)
            .with_ready_timeout_ms(params.integer("timeout", 1, 600_000)?.unwrap_or(5_000) as u32)
            .with_mount(mount);
        Ok(Plan::new([Step::SpawnFuse(spawn)]))
    }
}

export_plugin!(Argv);
