//! The room rules of docs/architecture.md, checked on the source: a change that breaks one
//! fails here, naming the chain of imports that breaks it.
//!
//! Each file of `host/src` is a node; its `use` lines and inline `crate::`/`super::` paths are
//! edges to the module files they name (the part after a `#[cfg(test)]` line is the file's
//! tests and does not count). A file *has effects* when it names an effectful crate or module
//! (`std::fs`, `std::process`, sockets, `nix`, `rustix`, `libc`, `tokio::fs`, `tokio::net`, ...;
//! address and error-number types are data).
//!
//! - The CSI front (`front/`) never reaches the host daemon (`daemon/`) or the privileged room
//!   (`exec/`), not even through a shared module.
//! - The policy and the plan model (`plan/`) and the plugin runtime (`plugin/`) reach nothing
//!   that has effects, and no process's room.
//! - The host daemon's own files (`daemon/`) have no effects: every effect goes through the
//!   executor. Volume state (`volume/`) is read and written only through it too.
//! - The registry side (`oci/`: the OCI client, the node's blob cache and its downloads) is a
//!   room of its own: it reaches neither the privileged room (`exec/`) nor any process's room
//!   (`daemon/`, `front/`, `cli/`), and the CSI front does not reach it (it gets plugin pulls
//!   through the `PluginPuller` trait).
//! - The lazy volumes' FUSE server (`lazyfs/`, the process `mounthost lazyfs`, run
//!   unprivileged) reaches nothing of the host daemon's, the privileged room, the registry side,
//!   the front or the plugin runtime: only the unprivileged room and the plan's constants.
//! - `unsafe` is allowed only in the executor room, in loading compiled plugins and in the few
//!   unprivileged calls without a safe wrapper (`unpriv/sys.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// Effectful crates and std modules, as they appear in paths.
const EFFECTS: &[&str] = &[
    "std::fs",
    "std::process",
    "std::net::TcpStream",
    "std::net::TcpListener",
    "std::net::UdpSocket",
    "std::net::ToSocketAddrs",
    "std::os::unix::net",
    "std::os::unix::fs",
    "std::os::fd",
    "tokio::fs",
    "tokio::net",
    "tokio::process",
    "tokio::signal",
    "nix::",
    "rustix::",
    "libc::",
    "File::",
    "Command::",
];

struct Module {
    /// `a::b` for `src/a/b.rs` or `src/a/b/mod.rs`.
    name: String,
    /// The code before its tests.
    code: String,
}

fn collect(dir: &Path, out: &mut Vec<Module>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(SRC).unwrap().with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            if parts.iter().any(|p| p == "tests") || parts == ["main"] {
                continue; // test modules (and the files of a `tests/` folder) and the binary's entry point
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = match text.find("\n#[cfg(test)]") {
                Some(i) => text[..i].to_string(),
                None => text,
            };
            let code: String =
                code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
            out.push(Module { name: parts.join("::"), code });
        }
    }
}

/// Expand `use a::{b, c::{d, e}};` into `a::b`, `a::c::d`, `a::c::e`.
fn expand(prefix: &str, body: &str, out: &mut Vec<String>) {
    let body = body.trim();
    if let Some(open) = body.find('{') {
        let head = body[..open].trim().trim_end_matches("::");
        let inner = &body[open + 1..body.rfind('}').unwrap_or(body.len())];
        let mut depth = 0;
        let mut start = 0;
        let full = if head.is_empty() { prefix.to_string() } else { format!("{prefix}{head}::") };
        for (i, ch) in inner.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&full, &inner[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand(&full, &inner[start..], out);
    } else if !body.is_empty() {
        out.push(format!("{prefix}{}", body.split(" as ").next().unwrap().trim()));
    }
}

/// Every path the code names: expanded `use` items and inline `crate::`/`super::`/`std::` paths.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    // `use` items start a line (possibly `pub use`, `pub(crate) use`) and end at `;`.
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let line_start = rest[..i].rfind('\n').map(|n| n + 1).unwrap_or(0);
        let before = rest[line_start..i].trim();
        let starts_item = before.is_empty() || before == "pub" || before.starts_with("pub(");
        let tail = &rest[i + 4..];
        let Some(end) = tail.find(';') else { break };
        if starts_item {
            expand("", &tail[..end], &mut out);
            rest = &tail[end..];
        } else {
            rest = tail;
        }
    }
    for word in code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
        if word.contains("::") {
            out.push(word.trim_matches(':').to_string());
        }
    }
    out
}

/// The module file a path names, resolved from module `from`.
fn target(path: &str, from: &str, modules: &BTreeSet<String>) -> Option<String> {
    let mut parts: Vec<&str> = path.split("::").collect();
    let mut base: Vec<String> = match parts.first() {
        Some(&"crate") => {
            parts.remove(0);
            Vec::new()
        }
        Some(&"super") => {
            let mut b: Vec<String> = from.split("::").map(String::from).collect();
            while parts.first() == Some(&"super") {
                parts.remove(0);
                b.pop();
            }
            b
        }
        Some(&"self") => {
            parts.remove(0);
            from.split("::").map(String::from).collect()
        }
        _ => return None,
    };
    let mut found = None;
    for p in parts {
        base.push(p.to_string());
        let name = base.join("::");
        if modules.contains(&name) {
            found = Some(name);
        }
    }
    found
}

struct Graph {
    edges: BTreeMap<String, BTreeSet<String>>,
    effects: BTreeMap<String, Vec<&'static str>>,
}

fn graph() -> Graph {
    let mut mods = Vec::new();
    collect(Path::new(SRC), &mut mods);
    let names: BTreeSet<String> = mods.iter().map(|m| m.name.clone()).collect();
    let mut edges = BTreeMap::new();
    let mut effects = BTreeMap::new();
    for m in &mods {
        let ps = paths(&m.code);
        let to: BTreeSet<String> =
            ps.iter().filter_map(|p| target(p, &m.name, &names)).filter(|t| *t != m.name).collect();
        edges.insert(m.name.clone(), to);
        // Error numbers are data, not effects.
        let ps: Vec<&String> = ps.iter().filter(|p| !p.contains("::errno")).collect();
        let found: Vec<&'static str> = EFFECTS
            .iter()
            .copied()
            .filter(|e| ps.iter().any(|p| p.starts_with(e) || (e.ends_with("::") && p.contains(e))))
            .collect();
        effects.insert(m.name.clone(), found);
    }
    Graph { edges, effects }
}

impl Graph {
    /// A chain of imports from `from` to a module `bad` says is bad, if any.
    fn reaches(&self, from: &str, bad: &dyn Fn(&str) -> bool) -> Option<Vec<String>> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![vec![from.to_string()]];
        while let Some(chain) = stack.pop() {
            let last = chain.last().unwrap().clone();
            if chain.len() > 1 && bad(&last) {
                return Some(chain);
            }
            if !seen.insert(last.clone()) {
                continue;
            }
            for next in self.edges.get(&last).into_iter().flatten() {
                let mut c = chain.clone();
                c.push(next.clone());
                stack.push(c);
            }
        }
        None
    }

    fn rooms(&self, prefix: &str) -> Vec<String> {
        self.edges.keys().filter(|m| *m == prefix || m.starts_with(&format!("{prefix}::"))).cloned().collect()
    }
}

fn in_room(m: &str, rooms: &[&str]) -> bool {
    rooms.iter().any(|r| m == *r || m.starts_with(&format!("{r}::")))
}

#[test]
fn the_front_never_reaches_the_daemon_or_the_privileged_room() {
    let g = graph();
    let fronts = g.rooms("front");
    assert!(fronts.len() >= 4, "the front's files were found: {fronts:?}");
    for m in fronts {
        if let Some(chain) = g.reaches(&m, &|t| in_room(t, &["daemon", "exec"])) {
            panic!("{m} reaches {}: {}", chain.last().unwrap(), chain.join(" -> "));
        }
    }
}

#[test]
fn the_registry_room_reaches_no_process_room_and_not_the_privileged_one() {
    let g = graph();
    let oci = g.rooms("oci");
    assert!(oci.len() >= 10, "the registry room's files were found: {oci:?}");
    for m in &oci {
        if let Some(chain) = g.reaches(m, &|t| in_room(t, &["exec", "daemon", "front", "cli"])) {
            panic!("{m} reaches {}: {}", chain.last().unwrap(), chain.join(" -> "));
        }
    }
    for m in g.rooms("front") {
        if let Some(chain) = g.reaches(&m, &|t| in_room(t, &["oci"])) {
            panic!("{m} reaches {}: {}", chain.last().unwrap(), chain.join(" -> "));
        }
    }
    // Who imports it: the host daemon, the command line (plugin pulls handed to the front,
    // `plugin push`) and the privileged room's unpacking and linking (`exec/artifacts`).
    let importers: BTreeSet<String> = g
        .edges
        .iter()
        .filter(|(m, to)| !in_room(m, &["oci"]) && to.iter().any(|t| in_room(t, &["oci"])))
        .map(|(m, _)| m.split("::").next().unwrap().to_string())
        .collect();
    let allowed: BTreeSet<String> = ["daemon", "cli", "exec"].map(String::from).into();
    assert!(importers.is_subset(&allowed), "the registry room is imported by {importers:?}");
    // Its files (other than `oci/mod.rs`, which declares the shared types and the entry points)
    // import one another without a circle.
    let files: Vec<&String> = oci.iter().filter(|m| *m != "oci").collect();
    for m in &files {
        let within = |t: &str| t != "oci" && in_room(t, &["oci"]);
        for next in g.edges[*m].iter().filter(|t| within(t)) {
            let back = g.reaches(next, &|t| t == m.as_str());
            if let Some(chain) = back.filter(|c| c.iter().all(|t| within(t))) {
                panic!("a circle in oci/: {m} -> {}", chain.join(" -> "));
            }
        }
    }
    println!("checked: {} files of oci/, imported by {importers:?}", oci.len());
}

#[test]
fn the_lazy_server_reaches_nothing_of_the_privileged_side() {
    let g = graph();
    let server = g.rooms("lazyfs");
    assert!(server.len() >= 4, "the lazy server's files were found: {server:?}");
    for m in &server {
        if let Some(chain) =
            g.reaches(m, &|t| in_room(t, &["exec", "daemon", "oci", "front", "cli", "plugin", "volume"]))
        {
            panic!("{m} reaches {}: {}", chain.last().unwrap(), chain.join(" -> "));
        }
    }
    println!("checked: {} files of lazyfs/", server.len());
}

#[test]
fn the_plan_and_the_plugin_runtime_reach_nothing_with_effects() {
    let g = graph();
    let pure: Vec<String> = g.rooms("plan").into_iter().chain(g.rooms("plugin")).collect();
    assert!(pure.len() >= 10, "{pure:?}");
    for m in pure {
        let bad = |t: &str| {
            in_room(t, &["exec", "unpriv", "oci", "daemon", "front", "cli"])
                || !g.effects.get(t).is_none_or(Vec::is_empty)
        };
        if !g.effects[&m].is_empty() {
            panic!("{m} itself names {:?}", g.effects[&m]);
        }
        if let Some(chain) = g.reaches(&m, &bad) {
            let last = chain.last().unwrap();
            panic!("{m} reaches {last} (effects {:?}): {}", g.effects.get(last), chain.join(" -> "));
        }
    }
}

#[test]
fn the_daemon_and_volume_state_act_only_through_the_executor() {
    let g = graph();
    let mut checked = 0;
    for m in g.rooms("daemon").into_iter().chain(g.rooms("volume")) {
        assert!(g.effects[&m].is_empty(), "{m} has effects of its own: {:?}", g.effects[&m]);
        checked += 1;
    }
    assert!(checked >= 15, "{checked}");
    // The state store's I/O is the executor's `Files`.
    let state = std::fs::read_to_string(Path::new(SRC).join("volume/state.rs")).unwrap();
    assert!(state.contains("crate::exec::Files"), "volume state goes through the executor");
}

#[test]
fn unsafe_code_lives_in_the_executor_room_the_artifact_loader_and_unpriv_sys_only() {
    let mut files = Vec::new();
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() { walk(&p, out) } else { out.push(p) }
        }
    }
    walk(Path::new(SRC), &mut files);
    let lib = std::fs::read_to_string(Path::new(SRC).join("lib.rs")).unwrap();
    assert!(lib.contains("#![deny(unsafe_code)]"), "the crate denies unsafe by default");
    let mut allowed = BTreeMap::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let rel = f.strip_prefix(SRC).unwrap().display().to_string();
        if text.contains("allow(unsafe_code)") {
            assert!(
                rel.starts_with("exec/") || rel == "unpriv/artifact.rs" || rel == "unpriv/sys.rs",
                "{rel} allows unsafe code outside the executor room"
            );
            let blocks = text.matches("unsafe {").count();
            let safety = text.matches("// SAFETY:").count();
            assert!(safety >= text.matches("unsafe {").count(), "{rel}: every unsafe block has a SAFETY comment");
            allowed.insert(rel, blocks);
        } else {
            assert!(!text.contains("unsafe {"), "{rel} has unsafe code without being allowed to");
        }
    }
    println!("checked: unsafe allowed in {allowed:?}");
}

#[test]
fn where_effects_live_by_room() {
    let g = graph();
    let mut by_room: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for (m, e) in &g.effects {
        let room = m.split("::").next().unwrap().to_string();
        by_room.entry(room).or_default().extend(e.iter().copied());
    }
    by_room.retain(|_, e| !e.is_empty());
    let rooms: BTreeSet<&str> = by_room.keys().map(String::as_str).collect();
    let allowed: BTreeSet<&str> = ["cli", "exec", "lazyfs", "oci", "unpriv", "telemetry"].into();
    assert!(rooms.is_subset(&allowed), "effects outside their rooms: {by_room:?}");
    println!("checked: effects by room {by_room:?}");
}

#[test]
fn the_import_reader_finds_what_it_should() {
    // Guard the guard: the parser sees grouped, nested and inline paths.
    let mut v = Vec::new();
    expand("", "crate::{exec::Files, plan::{Step, policy::{self, Grant}}}", &mut v);
    assert_eq!(
        v,
        ["crate::exec::Files", "crate::plan::Step", "crate::plan::policy::self", "crate::plan::policy::Grant"]
    );
    let ps = paths("fn f() { crate::exec::fs::x(); let y = std::fs::read(p); }");
    assert!(ps.contains(&"crate::exec::fs::x".to_string()) && ps.contains(&"std::fs::read".to_string()), "{ps:?}");
    let g = graph();
    assert!(g.edges["daemon::pipeline"].contains("exec"), "{:?}", g.edges["daemon::pipeline"]);
    assert!(g.effects["exec::beneath"].contains(&"rustix::"), "{:?}", g.effects["exec::beneath"]);
    assert!(g.reaches("front::provision", &|t| t == "unpriv::http").is_some(), "inline edges count");
}
