//! `mounthost plugin check FILE`: is this `.wasm` a plugin the host can load and use? Checked,
//! one line each:
//! - **size**: at most [`MAX_PULLED_BYTES`], the most a plugin selected by OCI reference may
//!   weigh (a folder plugin may be larger; that is a warning);
//! - **load**: the host loads it as it would load a folder plugin: a component exporting a
//!   contract version the host speaks (the current one or an older one it adapts), importing
//!   nothing but the allowed interfaces, whose `info` answers with a valid name;
//! - **imports** and **exports**, as the component declares them;
//! - **info**: a version, no parameter documented twice, every parameter with a line of
//!   documentation;
//! - **a dry plan of every CSI operation** (validate, provision, stage, publish, unstage,
//!   delete; not `dynamic-mount`, which plans from a resolved artifact a node fetched)
//!   with example parameters — each required parameter's documented default, else a value made
//!   up from its kind, or what `--param`/`--secret` give — checked by the policy under this
//!   host's config: grants it lacks are listed with the flags that give them (a node needs
//!   them, the plugin is not broken); `provision` answered `unsupported` (contract 0.5.0 on: the
//!   plugin does not offer it) is a note; any other refusal, the plugin's own of its example
//!   values included, is a failure. A plugin of an earlier contract cannot say `unsupported`:
//!   its refusal of `provision` as the SDK's default worded it ("does not provision volumes")
//!   is a note;
//! - **programs**: for each program the plugin names, the binary this host runs for it and
//!   which libfuse that links (`DT_NEEDED`): libfuse 2 cannot take a connection the host mounts;
//! - **limits**: the deadline and memory its calls run under, and the slowest call.
//!
//! Exit status 0 when nothing failed ("usable by this host"), 1 otherwise ("not usable"; the
//! report is printed either way).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;

use super::libfuse::{self, Linked};
use super::plugin::{AccessModeArg, CliError, Op, PlanArgs, parse_kv};
use crate::config::Config;
use crate::plan::policy::MissingGrant;
use crate::plugin::contract::Contract;
use crate::plugin::info::{ParamDoc, PluginInfo};
use crate::plugin::pulled::MAX_PULLED_BYTES;
use crate::plugin::{BackendError, PluginError, PluginRuntime};

/// Arguments of `plugin check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The plugin's `.wasm` component.
    pub file: PathBuf,
    /// A parameter for the dry plans, KEY=VALUE (repeatable); overrides the example value.
    #[arg(long = "param", value_parser = parse_kv)]
    pub params: Vec<(String, String)>,
    /// A secret for the dry plans, KEY=VALUE or KEY=@FILE (repeatable); overrides the example.
    #[arg(long = "secret", value_parser = parse_kv)]
    pub secrets: Vec<(String, String)>,
}

/// KEY=VALUE pairs, in order.
type Pairs = Vec<(String, String)>;

/// How one check came out.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Ok,
    /// Usable, but worth a look (or needs host config).
    Note,
    Fail,
}

/// The report: one line per check.
#[derive(Default)]
struct Report {
    lines: Vec<(Outcome, String, String)>,
}

impl Report {
    fn add(&mut self, outcome: Outcome, what: &str, detail: impl Into<String>) {
        self.lines.push((outcome, what.to_string(), detail.into()));
    }

    fn failed(&self) -> usize {
        self.lines.iter().filter(|(o, _, _)| *o == Outcome::Fail).count()
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for (outcome, what, detail) in &self.lines {
            let tag = match outcome {
                Outcome::Ok => "ok",
                Outcome::Note => "note",
                Outcome::Fail => "FAIL",
            };
            for (i, line) in detail.lines().enumerate() {
                let what = if i == 0 { what.as_str() } else { "" };
                out.push_str(&format!("{tag:<5} {what:<10} {line}\n"));
            }
        }
        out
    }
}

/// The operations a dry plan runs, in a volume's order.
const OPERATIONS: [(Op, &str); 6] = [
    (Op::Validate, "validate"),
    (Op::Provision, "provision"),
    (Op::Stage, "stage"),
    (Op::Publish, "publish"),
    (Op::Unstage, "unstage"),
    (Op::Delete, "delete"),
];

/// Run `plugin check`: the report, and whether anything failed.
pub async fn run(cfg: &Config, runtime: &PluginRuntime, args: CheckArgs) -> Result<(String, bool), CliError> {
    let mut report = Report::default();
    let size =
        std::fs::metadata(&args.file).map_err(|e| CliError::Usage(format!("{}: {e}", args.file.display())))?.len();
    if size > MAX_PULLED_BYTES {
        report.add(
            Outcome::Note,
            "size",
            format!(
                "{size} bytes: over the {MAX_PULLED_BYTES} a plugin selected by OCI reference may have (a folder plugin may)"
            ),
        );
    } else {
        report.add(Outcome::Ok, "size", format!("{size} bytes (at most {MAX_PULLED_BYTES} for an OCI reference)"));
    }
    let plugin = match runtime.load_file(&args.file).await {
        Ok(p) => p,
        Err(e) => {
            report.add(Outcome::Fail, "load", one_line(&e));
            return Ok((report.render(), true));
        }
    };
    report.add(Outcome::Ok, "load", format!("{} {} (sha256 {})", plugin.info.name, plugin.info.version, plugin.digest));
    let contract = plugin.contract();
    let (imports, exports) = plugin.interfaces(runtime.engine());
    if contract == Contract::CURRENT {
        report.add(Outcome::Ok, "contract", format!("mounthost:plugin@{contract} (current)"));
    } else {
        report.add(
            Outcome::Note,
            "contract",
            format!("mounthost:plugin@{contract}: older than the current {}, adapted by the host", Contract::CURRENT),
        );
    }
    // Loading refused any other import: what is left is allowed (WASI's grant nothing here).
    let (wasi, own): (Vec<&String>, Vec<&String>) = imports.iter().partition(|i| i.starts_with("wasi:"));
    let mut shown: Vec<String> = own.iter().map(|s| s.to_string()).collect();
    if !wasi.is_empty() {
        shown.push(format!("{} WASI interfaces (no files, sockets or HTTP)", wasi.len()));
    }
    report.add(Outcome::Ok, "imports", if shown.is_empty() { "none".to_string() } else { shown.join(", ") });
    report.add(Outcome::Ok, "exports", exports.join(", "));
    info_checks(&plugin.info, &mut report);

    let (params, secrets) = examples(&plugin.info, &args);
    let shown: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .chain(secrets.iter().map(|(k, _)| format!("{k}=(secret)")))
        .collect();
    report.add(
        Outcome::Ok,
        "examples",
        if shown.is_empty() { "no required parameters".to_string() } else { shown.join(" ") },
    );
    let mut slowest = Duration::ZERO;
    let mut missing: Vec<MissingGrant> = Vec::new();
    // As a CO would go on after CreateVolume: delete plans for the volume provision made, and
    // stage, publish and unstage get its volume context (the parameters and what the plugin
    // returned).
    let mut provisioned: Option<(String, Pairs)> = None;
    for (op, name) in OPERATIONS {
        let (volume_id, params) = match (op, &provisioned) {
            (Op::Delete, Some((id, _))) => (id.clone(), params.clone()),
            // The host's CreateVolume gives the volume the parameters and the plugin's context.
            (Op::Stage | Op::Publish | Op::Unstage, Some((id, context))) => {
                let mut merged: Vec<(String, String)> =
                    params.iter().filter(|(k, _)| !context.iter().any(|(c, _)| c == k)).cloned().collect();
                merged.extend(context.iter().cloned());
                (id.clone(), merged)
            }
            _ => ("check-volume".to_string(), params.clone()),
        };
        let plan_args = PlanArgs {
            plugin: args.file.display().to_string(),
            op,
            params,
            secrets: secrets.clone(),
            volume_id,
            target: None,
            staging: None,
            readonly: false,
            access_mode: AccessModeArg::SingleNodeWriter,
            mount_flags: Vec::new(),
        };
        let started = Instant::now();
        let result = super::plugin::plan(cfg, runtime, plan_args).await;
        slowest = slowest.max(started.elapsed());
        match result {
            Ok(out) => {
                if op == Op::Provision {
                    provisioned = serde_json::from_str::<serde_json::Value>(&out).ok().and_then(|v| {
                        let id = v["volumeId"].as_str()?;
                        let context = v["context"].as_object()?;
                        let context =
                            context.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect();
                        Some((id.split_once('~').map_or(id, |(_, local)| local).to_string(), context))
                    });
                }
                report.add(Outcome::Ok, name, "planned and passes the policy")
            }
            Err(CliError::MissingGrants { missing: m, .. }) => {
                let list = m.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
                report.add(Outcome::Note, name, format!("passes once the host grants {list}"));
                for g in m {
                    if !missing.contains(&g) {
                        missing.push(g);
                    }
                }
            }
            Err(CliError::Plugin(e @ PluginError::Backend { .. })) => {
                let PluginError::Backend { error, .. } = &e else { unreachable!("matched above") };
                match refusal(op, contract, error) {
                    Refusal::NotOffered => {
                        let says = match error {
                            BackendError::Unsupported(m) => one_line(m),
                            other => one_line(other),
                        };
                        report.add(Outcome::Note, name, format!("not offered: {says}"))
                    }
                    Refusal::NotOfferedBefore050 => report.add(
                        Outcome::Note,
                        name,
                        format!(
                            "{}\n(contract {contract} cannot say an operation is not offered: taken as not offered)",
                            one_line(&e)
                        ),
                    ),
                    Refusal::Refused => report.add(
                        Outcome::Fail,
                        name,
                        format!(
                            "{}\n(refused the example values? give real ones with --param KEY=VALUE / --secret KEY=VALUE)",
                            one_line(&e)
                        ),
                    ),
                }
            }
            // A trap, a limit, a plan the policy refuses, an answer the host cannot read.
            Err(e) => report.add(Outcome::Fail, name, one_line(&e)),
        }
    }
    let limits = plugin.limits;
    report.add(
        if slowest > limits.deadline / 2 { Outcome::Note } else { Outcome::Ok },
        "limits",
        format!(
            "deadline {:?} and {} MiB of memory per call; slowest dry plan {:.1} ms (host side included)",
            limits.deadline,
            limits.memory_bytes >> 20,
            slowest.as_secs_f64() * 1e3
        ),
    );
    if !missing.is_empty() {
        let flags = missing.iter().map(|m| m.flag(&plugin.info.name)).collect::<Vec<_>>().join(" ");
        report.add(Outcome::Note, "grants", format!("a node running it needs the host flags: {flags}"));
    }
    programs(cfg, &plugin.info, &mut report);
    let failed = report.failed();
    let verdict = match failed {
        0 => format!("{}: usable by this host", plugin.info.name),
        n => format!("{}: not usable: {n} check(s) failed", plugin.info.name),
    };
    Ok((format!("{}{verdict}", report.render()), failed > 0))
}

/// What a planner's own refusal of a dry plan says about the plugin.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// `provision` answered `unsupported`: the plugin does not offer it (the one dry-planned
    /// operation without a default that plans).
    NotOffered,
    /// `provision` refused by a plugin of a contract before 0.5.0, which cannot say
    /// `unsupported`, as the SDK's default worded it ("does not provision volumes").
    NotOfferedBefore050,
    /// Anything else: a CO would get this refusal, so the check fails.
    Refused,
}

fn refusal(op: Op, contract: Contract, error: &BackendError) -> Refusal {
    match error {
        _ if op != Op::Provision => Refusal::Refused,
        BackendError::Unsupported(_) => Refusal::NotOffered,
        BackendError::InvalidArgument(m) if contract < Contract::V050 && m.contains("does not provision volumes") => {
            Refusal::NotOfferedBefore050
        }
        _ => Refusal::Refused,
    }
}

/// Each program the plugin names: the binary this host runs for it and which libfuse that links
/// (libfuse 2 cannot run on a connection the host mounts).
fn programs(cfg: &Config, info: &PluginInfo, report: &mut Report) {
    for name in &info.programs {
        let Some(path) = cfg.programs.get(name) else {
            report.add(Outcome::Note, "program", format!("{name}: no binary configured (--program {name}=PATH)"));
            continue;
        };
        let linked = libfuse::linked(path);
        let outcome = match linked {
            Linked::Fuse3(_) | Linked::Neither => Outcome::Ok,
            Linked::Fuse2(_) | Linked::Unknown(_) => Outcome::Note,
        };
        report.add(outcome, "program", format!("{name}: {} {}", path.display(), linked.describe()));
    }
}

/// An error on one line (some carry a pretty-printed byte dump).
fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What `info` says beyond what loading already checked.
fn info_checks(info: &PluginInfo, report: &mut Report) {
    let mut problems = Vec::new();
    if info.version.trim().is_empty() {
        problems.push("no version".to_string());
    }
    let mut seen = BTreeMap::new();
    for p in &info.parameters {
        if seen.insert(p.name.as_str(), ()).is_some() {
            problems.push(format!("parameter {:?} is documented twice", p.name));
        }
        if p.doc.trim().is_empty() {
            problems.push(format!("parameter {:?} has no documentation", p.name));
        }
    }
    if problems.is_empty() {
        report.add(
            Outcome::Ok,
            "info",
            format!(
                "{} parameters; programs [{}]; fstypes [{}]",
                info.parameters.len(),
                info.programs.join(", "),
                info.fstypes.join(", ")
            ),
        );
    } else {
        report.add(Outcome::Fail, "info", problems.join("\n"));
    }
}

/// Parameters and secrets for the dry plans: every required one, from `--param`/`--secret`,
/// else its documented default, else a value made up from its kind; plus whatever else the
/// flags give.
fn examples(info: &PluginInfo, args: &CheckArgs) -> (Pairs, Pairs) {
    let (mut params, mut secrets) = (args.params.clone(), args.secrets.clone());
    for p in info.parameters.iter().filter(|p| p.required) {
        let into = if p.source == "secret" { &mut secrets } else { &mut params };
        if !into.iter().any(|(k, _)| *k == p.name) {
            into.push((p.name.clone(), example(p)));
        }
    }
    (params, secrets)
}

/// A plausible value of `p`'s kind.
fn example(p: &ParamDoc) -> String {
    if let Some(d) = &p.default {
        return d.clone();
    }
    match p.kind {
        "boolean" => "true",
        "integer" => "1",
        "endpoint" => "127.0.0.1:8888",
        "remote-path" => "/",
        "url" => "http://127.0.0.1:8080/",
        "oci-reference" => {
            "registry.example:5000/example/artifact@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        }
        _ if p.source == "secret" => "example-secret",
        _ => "example",
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(name: &str, kind: &'static str, source: &'static str, required: bool, default: Option<&str>) -> ParamDoc {
        ParamDoc { name: name.into(), doc: "d".into(), kind, source, required, default: default.map(str::to_string) }
    }

    #[test]
    fn examples_fill_required_parameters_only_and_flags_win() {
        let info = PluginInfo {
            name: "x".into(),
            version: "1.0.0".into(),
            description: String::new(),
            parameters: vec![
                doc("filer", "endpoint", "parameter", true, None),
                doc("size", "integer", "parameter", true, Some("7")),
                doc("path", "remote-path", "parameter", true, None),
                doc("optional", "text", "parameter", false, None),
                doc("site", "url", "parameter", true, None),
                doc("key", "text", "secret", true, None),
            ],
            programs: vec![],
            fstypes: vec![],
        };
        let args = CheckArgs { file: "x.wasm".into(), params: vec![("path".into(), "/data".into())], secrets: vec![] };
        let (params, secrets) = examples(&info, &args);
        assert_eq!(
            params,
            [("path", "/data"), ("filer", "127.0.0.1:8888"), ("size", "7"), ("site", "http://127.0.0.1:8080/")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert_eq!(secrets, vec![("key".to_string(), "example-secret".to_string())]);
    }

    #[test]
    fn only_a_provision_the_plugin_does_not_offer_is_not_a_refusal() {
        let unsupported = BackendError::Unsupported("plugin p does not provision volumes".into());
        let sdk_default =
            BackendError::InvalidArgument("plugin p does not provision volumes; create a static PV".into());
        let refused = BackendError::InvalidArgument("parameter \"site\" must be a URL".into());
        assert_eq!(refusal(Op::Provision, Contract::V050, &unsupported), Refusal::NotOffered);
        assert_eq!(refusal(Op::Provision, Contract::V040, &sdk_default), Refusal::NotOfferedBefore050);
        assert_eq!(refusal(Op::Provision, Contract::V010, &sdk_default), Refusal::NotOfferedBefore050);
        // A current plugin says unsupported; an old one's other refusals are refusals.
        assert_eq!(refusal(Op::Provision, Contract::V050, &sdk_default), Refusal::Refused);
        assert_eq!(refusal(Op::Provision, Contract::V040, &refused), Refusal::Refused);
        assert_eq!(refusal(Op::Provision, Contract::V040, &BackendError::NotFound("x".into())), Refusal::Refused);
        // No other dry-planned operation may be "not offered": each has a default that plans.
        for op in [Op::Validate, Op::Stage, Op::Publish, Op::Unstage, Op::Delete] {
            assert_eq!(refusal(op, Contract::V050, &unsupported), Refusal::Refused, "{op:?}");
            assert_eq!(refusal(op, Contract::V040, &sdk_default), Refusal::Refused, "{op:?}");
        }
    }

    #[test]
    fn info_problems_fail_the_check() {
        let mut info = PluginInfo {
            name: "x".into(),
            version: String::new(),
            description: String::new(),
            parameters: vec![doc("a", "text", "parameter", false, None), doc("a", "text", "parameter", false, None)],
            programs: vec![],
            fstypes: vec![],
        };
        info.parameters[1].doc = " ".into();
        let mut report = Report::default();
        info_checks(&info, &mut report);
        assert_eq!(report.failed(), 1);
        let text = report.render();
        assert!(text.contains("no version"), "{text}");
        assert!(text.contains("\"a\" is documented twice"), "{text}");
        assert!(text.contains("\"a\" has no documentation"), "{text}");
    }
}
