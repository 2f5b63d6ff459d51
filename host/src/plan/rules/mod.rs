//! Rule sets: everything a granted program's argv may hold, and nothing else
//! ([docs/policy.md](../../../../docs/policy.md#rule-sets)).
//!
//! A grant of a program is a grant of everything its arguments can make it do: a literal source
//! of `/`, a cache directory on the node, a second mount point, a command to run. Deny lists of
//! option names (`--program-args`, [`super::policy::ArgRules`]) judge names only; a rule set
//! judges the whole argv, deny by default, as a seccomp or AppArmor profile does:
//!
//! - the subcommand: argv's first words, fixed (after the options a `go` program takes before
//!   it, `global-options`);
//! - each option, by its exact spelling (`-dir`, `--vfs-cache-mode`, `-f`, or an item of an
//!   `-o` list), with the class of its value ([`Class`]);
//! - each positional argument, by position, with its class;
//! - the options that must be given (`required`);
//! - the files the program reads by itself (`reads`: kept out of its mount namespace,
//!   `exec::confine`);
//! - the option through which it takes a configuration file (`config-file`: the host points it
//!   at an empty file);
//! - whether it must run unprivileged on a connection the host mounts (`host-fd`);
//! - the environment variables a plan may set for it (`env`).
//!
//! An argument no rule names is refused, and so is any spelling the rule set's `style` does not
//! read one way only (clusters of short options, `--`, a value in the next argument where the
//! program could read it as an option): what the host judges is what the program reads.
//!
//! Pure: no I/O. Rule sets come from YAML (unknown keys refused): the built-in sets in
//! `sets/` (`@weed`, `@sshfs`, `@bindfs`, `@rclone`, `@s3fs`) and files in a host directory
//! (`--program-rules-dir`, read by the command line).

mod argv;
mod class;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

pub use class::{Class, Dir, Values};

/// How a program reads its argv; the host reads only the spellings each style reads one way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Style {
    /// Go's `flag` package (`weed`): `-name` (a flag) or `-name=value`, every option before
    /// the first positional argument (Go stops reading options there).
    Go,
    /// libfuse's option parser with getopt-style options (sshfs, s3fs, bindfs): `-o LIST` or
    /// `-oLIST` (items `name` or `name=value`, split at commas), `-X` (a flag, or its value in
    /// the next argument), `--name` or `--name=value`; positional arguments anywhere.
    Fuse,
    /// GNU-style long options (rclone's pflag): `--name` or `--name=value`, `-X` (a flag, or
    /// its value in the next argument); positional arguments anywhere.
    Gnu,
}

/// Whether the program may, must or cannot run on a FUSE connection the host mounted
/// (WIT `fuse-mount.host-fd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostFd {
    /// Either way, as the plan asks.
    #[default]
    Allowed,
    /// Only unprivileged, on a connection the host mounted: a plan asking it to mount by
    /// itself is refused.
    Required,
    /// Never: it cannot take a host-opened connection (libfuse 2 programs: "MOUNTPOINT:
    /// /dev/fd/3 is not a directory").
    Unsupported,
}

/// The version a rule set was checked against, and how to ask the installed program.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Checked {
    /// The program's version the rules were checked against, as its version command prints it
    /// (`4.48`, `3.7.3`).
    pub version: String,
    /// The arguments that make the program print its version (`[version]`, `[--version]`).
    pub command: Vec<String>,
    /// Other programs the rules depend on and their versions, for the docs (`OpenSSH 9.2p1`).
    #[serde(default)]
    pub with: Vec<String>,
}

/// A positional argument's rule.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Positional {
    /// What it is, for messages (`source`, `mountpoint`).
    pub name: String,
    /// Its class.
    pub class: Class,
}

/// One program's rule set (the YAML file's whole content).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RuleSet {
    /// The set's name: `@NAME` in host config, and the file's name without `.yaml`.
    pub name: String,
    /// The program version it was checked against.
    pub checked: Checked,
    /// How the program reads its argv.
    pub style: Style,
    /// argv's first words, fixed (`[mount]`); empty: none.
    #[serde(default)]
    pub subcommand: Vec<String>,
    /// Options that may come before the subcommand (style `go` only).
    #[serde(default)]
    pub global_options: BTreeMap<String, Class>,
    /// Options by their exact spelling (`-dir`, `-f`, `--perms`), with the class of their value.
    #[serde(default)]
    pub options: BTreeMap<String, Class>,
    /// Items of `-o` lists by name (style `fuse` only), with the class of their value.
    #[serde(default)]
    pub o_options: BTreeMap<String, Class>,
    /// Positional arguments, in order; each must be given.
    #[serde(default)]
    pub positionals: Vec<Positional>,
    /// Options that must be given (by their spelling, or an `-o` item by its name): what the
    /// program would otherwise default to (a filer on `localhost`, an endpoint on the internet)
    /// is no host anyone granted.
    #[serde(default)]
    pub required: BTreeSet<String>,
    /// Files and directories the program reads by itself whatever its arguments say: none of
    /// them is in its mount namespace.
    #[serde(default)]
    pub reads: Vec<PathBuf>,
    /// Arguments the host appends so the program reads an empty configuration file instead of
    /// the node's (`["-F", "{empty}"]`); `{empty}` is that file's path.
    #[serde(default)]
    pub config_file: Vec<String>,
    /// Whether it may, must or cannot run on a connection the host mounts.
    #[serde(default)]
    pub host_fd: HostFd,
    /// Environment variables a plan may set for it (exact names).
    #[serde(default)]
    pub env: BTreeSet<String>,
}

/// Why an argv was refused: where, and by which rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgRefusal {
    /// 1-based position in argv (0: the argv as a whole, such as a missing positional).
    pub position: usize,
    /// The argument as the program would get it.
    pub argument: String,
    /// The rule that refused it (`options.-cacheDir`, `positionals.1`, `unknown-option`), a
    /// bounded name for metrics.
    pub rule: String,
    /// What is wrong and what would be accepted.
    pub reason: String,
    /// The host (`host` or `host:port`) a value names that no grant covers, when being granted
    /// is all it lacks.
    pub ungranted: Option<String>,
}

/// The placeholder of the empty configuration file in `config-file`.
pub const EMPTY_FILE: &str = "{empty}";

impl RuleSet {
    /// Parse and check a rule set (the text of a YAML file); `origin` names it in errors.
    pub fn parse(origin: &str, text: &str) -> Result<RuleSet, String> {
        let set: RuleSet = yaml_serde::from_str(text).map_err(|e| format!("rule set {origin}: {e}"))?;
        set.validate().map_err(|e| format!("rule set {origin}: {e}"))?;
        Ok(set)
    }

    fn validate(&self) -> Result<(), String> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !name_ok {
            return Err(format!("name {:?} must be 1-64 letters, digits, '.', '_' or '-'", self.name));
        }
        if self.checked.command.is_empty() || self.checked.version.is_empty() {
            return Err("checked needs a version and the command that prints it".into());
        }
        if self.style != Style::Go && !self.global_options.is_empty() {
            return Err("global-options are for style go (options before the subcommand)".into());
        }
        if self.style != Style::Fuse && !self.o_options.is_empty() {
            return Err("o-options are for style fuse (items of -o lists)".into());
        }
        for word in &self.subcommand {
            if word.is_empty() || word.starts_with('-') {
                return Err(format!("subcommand word {word:?} must be non-empty and not start with '-'"));
            }
        }
        for (spelled, class) in self.global_options.iter().chain(&self.options) {
            argv::check_spelling(self.style, spelled)?;
            class.validate().map_err(|e| format!("option {spelled}: {e}"))?;
        }
        for (name, class) in &self.o_options {
            let ok = !name.is_empty()
                && !name.starts_with('-')
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !ok {
                return Err(format!(
                    "-o option {name:?} must be letters, digits, '.', '_' or '-', not starting with '-'"
                ));
            }
            class.validate().map_err(|e| format!("-o option {name}: {e}"))?;
        }
        if self.style == Style::Fuse && self.options.contains_key("-o") {
            return Err("-o is how style fuse gives o-options; list them under o-options".into());
        }
        for name in &self.required {
            let known = self.options.contains_key(name) || self.o_options.contains_key(name);
            if !known {
                return Err(format!("required {name:?} is not one of its options or -o options"));
            }
        }
        for (i, p) in self.positionals.iter().enumerate() {
            p.class.validate().map_err(|e| format!("positional {} ({}): {e}", i + 1, p.name))?;
            if matches!(p.class, Class::Flag | Class::Bool) {
                return Err(format!("positional {} ({}) needs a value class", i + 1, p.name));
            }
        }
        for r in &self.reads {
            if !r.is_absolute() {
                return Err(format!("reads: {} is not an absolute path", r.display()));
            }
        }
        if !self.config_file.is_empty() && !self.config_file.iter().any(|a| a.contains(EMPTY_FILE)) {
            return Err(format!("config-file must name the empty file as {EMPTY_FILE}"));
        }
        for name in &self.env {
            super::policy::env_name(name).map_err(|e| format!("env: {e}"))?;
        }
        Ok(())
    }

    /// Judge the arguments the program would receive (secret-file paths, paths and the
    /// `/dev/fd` path filled in), in order.
    pub fn check(&self, args: &[String], values: &Values<'_>) -> Result<(), ArgRefusal> {
        argv::check(self, args, values)
    }

    /// The arguments the host appends (its empty configuration file at `empty`).
    pub fn config_args(&self, empty: &Path) -> Vec<String> {
        let path = empty.display().to_string();
        self.config_file.iter().map(|a| a.replace(EMPTY_FILE, &path)).collect()
    }
}

/// The built-in rule sets, `@NAME` in host config: name and YAML.
pub const BUILTIN: &[(&str, &str)] = &[
    ("bindfs", include_str!("sets/bindfs.yaml")),
    ("rclone", include_str!("sets/rclone.yaml")),
    ("s3fs", include_str!("sets/s3fs.yaml")),
    ("sshfs", include_str!("sets/sshfs.yaml")),
    ("weed", include_str!("sets/weed.yaml")),
];

/// The built-in rule set `@name`.
pub fn builtin(name: &str) -> Option<Arc<RuleSet>> {
    let (_, text) = BUILTIN.iter().find(|(n, _)| *n == name)?;
    Some(Arc::new(RuleSet::parse(&format!("@{name}"), text).expect("built-in rule sets parse")))
}

/// What host config says about programs beyond their grants: the rule set each program name
/// runs under, and the programs that must run on a connection the host mounts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProgramRules {
    /// Program name (as plans name it) → its rule set.
    pub sets: BTreeMap<String, Arc<RuleSet>>,
    /// Programs that must run unprivileged on a connection the host mounts, node-wide
    /// (`--require-host-fd`), whatever their rule set says.
    pub host_fd_required: BTreeSet<String>,
}

impl ProgramRules {
    /// The defaults: each built-in set for the program of its own name (`weed` runs under
    /// `@weed`, ...).
    pub fn builtin() -> Self {
        ProgramRules {
            sets: BUILTIN.iter().map(|(n, _)| (n.to_string(), builtin(n).expect("listed"))).collect(),
            host_fd_required: BTreeSet::new(),
        }
    }

    /// The rule set of `program`, if any.
    pub fn set(&self, program: &str) -> Option<&RuleSet> {
        self.sets.get(program).map(|s| s.as_ref())
    }
}

#[cfg(test)]
mod tests;
