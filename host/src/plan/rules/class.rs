//! Value classes: what an option's value or a positional argument may be.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use crate::plan::url::{self, HostGrant};

/// One of the volume's own directories, made by the host without following links, which no
/// pod and no backend can replace ([`crate::volume::VolumeDirs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// The volume's cache directory.
    Cache,
    /// The volume's runtime directory (sockets, the secret files of a program that mounts by
    /// itself).
    Runtime,
    /// The directory of an unprivileged program's secret files.
    SecretFiles,
}

impl Dir {
    fn parse(s: &str) -> Option<Dir> {
        Some(match s {
            "cache" => Dir::Cache,
            "runtime" => Dir::Runtime,
            "secret-files" => Dir::SecretFiles,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Dir::Cache => "cache",
            Dir::Runtime => "runtime",
            Dir::SecretFiles => "secret-files",
        }
    }
}

/// The class of a value.
#[derive(Debug, Clone)]
pub enum Class {
    /// No value: the option alone.
    Flag,
    /// No value, or `=true` / `=false`.
    Bool,
    /// The planned mount point, or the `/dev/fd/N` of a connection the host mounted.
    MountPoint,
    /// A file the host wrote for this volume (a plan's secret file).
    SecretFile,
    /// `host` or `host:port` granted to the plugin (by host config or the StorageClass's
    /// endpoint parameters); a host without a port is judged by its name alone.
    GrantedHost,
    /// An `http(s)://` URL to a granted host, parsed as the policy parses URLs.
    GrantedUrl,
    /// Exactly one of the volume's own directories.
    VolumeDir(Dir),
    /// One of the volume's own directories or a path below it (plain components only).
    Below(Dir),
    /// One of these words.
    Enum(Vec<String>),
    /// A whole match of a regular expression; each named group in `parts` must also match its
    /// class.
    Pattern(Box<Pattern>),
    /// Items split at `separator`, at most `max`, each of class `of`.
    List { of: Box<Class>, separator: String, max: usize },
    /// A whole number in decimal, from `min` to `max`.
    Int { min: i64, max: i64 },
}

/// A [`Class::Pattern`].
#[derive(Debug, Clone)]
pub struct Pattern {
    source: String,
    regex: regex::Regex,
    parts: BTreeMap<String, Class>,
}

impl PartialEq for Class {
    fn eq(&self, other: &Self) -> bool {
        // By what the YAML said: a pattern compiles the same way each time.
        self.to_string() == other.to_string()
    }
}

/// What the classes are judged against, for one spawn.
#[derive(Debug, Clone, Default)]
pub struct Values<'a> {
    /// The mount point as the program gets it: the planned path, or `/dev/fd/3`.
    pub mount_point: String,
    /// The paths of the secret files the plan writes for the program.
    pub secret_files: BTreeSet<String>,
    /// The volume's cache directory, if the operation has one.
    pub cache: Option<&'a Path>,
    /// Its runtime directory.
    pub runtime: Option<&'a Path>,
    /// The directory of the program's secret files.
    pub secret_files_dir: Option<&'a Path>,
    /// Hosts granted to the plugin (host config and the StorageClass's endpoint parameters).
    pub grants: Vec<HostGrant>,
}

impl Values<'_> {
    fn dir(&self, d: Dir) -> Option<&Path> {
        match d {
            Dir::Cache => self.cache,
            Dir::Runtime => self.runtime,
            Dir::SecretFiles => self.secret_files_dir,
        }
    }

    fn granted(&self) -> String {
        if self.grants.is_empty() {
            "none".into()
        } else {
            self.grants.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        }
    }
}

/// Why a value was refused, and the host it names when being granted is all it lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// What is wrong and what would be accepted.
    pub reason: String,
    /// A host (`host` or `host:port`) of a granted-host or granted-url value that no grant
    /// covers.
    pub ungranted: Option<String>,
}

impl From<String> for Refused {
    fn from(reason: String) -> Self {
        Refused { reason, ungranted: None }
    }
}

impl Refused {
    fn context(self, f: impl FnOnce(&str) -> String) -> Refused {
        Refused { reason: f(&self.reason), ungranted: self.ungranted }
    }
}

/// Longest list a [`Class::List`] may allow.
const MAX_LIST: usize = 256;

impl Class {
    /// Judge `value` (`None`: the option came without one).
    pub fn check(&self, value: Option<&str>, v: &Values<'_>) -> Result<(), Refused> {
        match (self, value) {
            (Class::Flag, None) | (Class::Bool, None | Some("true" | "false")) => Ok(()),
            (Class::Flag, Some(_)) => Err(String::from("it takes no value").into()),
            (Class::Bool, Some(_)) => Err(String::from("it takes no value, =true or =false").into()),
            (_, None) => Err(format!("it needs a value: {self}").into()),
            (_, Some(value)) => self.value(value, v),
        }
    }

    fn value(&self, value: &str, v: &Values<'_>) -> Result<(), Refused> {
        let not = || Err(format!("{value:?} is not {}", self.describe(v)).into());
        let ungranted = |host: String| {
            Err(Refused { reason: format!("{value:?} is not {}", self.describe(v)), ungranted: Some(host) })
        };
        match self {
            Class::Flag | Class::Bool => unreachable!("judged in check"),
            Class::MountPoint if value == v.mount_point => Ok(()),
            Class::SecretFile if v.secret_files.contains(value) => Ok(()),
            Class::GrantedHost => match HostGrant::parse(value) {
                Ok(asked) if v.grants.iter().any(|g| g.covers(&asked)) => Ok(()),
                Ok(asked) => ungranted(asked.to_string()),
                Err(_) => not(),
            },
            Class::GrantedUrl => match url::parse(value) {
                Ok(target) if v.grants.iter().any(|g| g.allows(&target)) => Ok(()),
                Ok(target) => ungranted(target.authority()),
                Err(_) => not(),
            },
            Class::VolumeDir(d) => match v.dir(*d) {
                Some(dir) if Path::new(value) == dir && value == dir.display().to_string() => Ok(()),
                _ => not(),
            },
            Class::Below(d) => match v.dir(*d) {
                Some(dir) if below(value, dir) => Ok(()),
                _ => not(),
            },
            Class::Enum(words) if words.iter().any(|w| w == value) => Ok(()),
            Class::Pattern(p) => {
                let Some(caps) = p.regex.captures(value) else { return not() };
                for (part, class) in &p.parts {
                    if let Some(m) = caps.name(part) {
                        class
                            .value(m.as_str(), v)
                            .map_err(|e| e.context(|e| format!("in {value:?}, part {part} {:?}: {e}", m.as_str())))?;
                    }
                }
                Ok(())
            }
            Class::List { of, separator, max } => {
                let items: Vec<&str> = value.split(separator.as_str()).collect();
                if items.len() > *max {
                    return Err(format!("{value:?} has {} items; at most {max}", items.len()).into());
                }
                for item in items {
                    if item.is_empty() {
                        return Err(format!("{value:?} has an empty item").into());
                    }
                    of.value(item, v).map_err(|e| e.context(|e| format!("in {value:?}: {e}")))?;
                }
                Ok(())
            }
            Class::Int { min, max } => {
                let digits = value.strip_prefix('-').unwrap_or(value);
                let canonical = !digits.is_empty()
                    && digits.len() <= 19
                    && digits.bytes().all(|b| b.is_ascii_digit())
                    && (digits == "0" || !digits.starts_with('0'));
                match value.parse::<i64>() {
                    Ok(n) if canonical && (*min..=*max).contains(&n) => Ok(()),
                    _ => not(),
                }
            }
            _ => not(),
        }
    }

    /// What a value must be, for messages.
    fn describe(&self, v: &Values<'_>) -> String {
        let dir = |d: Dir| v.dir(d).map_or_else(|| "none in this operation".into(), |p| p.display().to_string());
        match self {
            Class::MountPoint => format!("the planned mount point ({})", v.mount_point),
            Class::SecretFile => "a secret file the plan has the host write".into(),
            Class::GrantedHost => format!("a host[:port] granted to the plugin (granted: {})", v.granted()),
            Class::GrantedUrl => format!("a URL to a host granted to the plugin (granted: {})", v.granted()),
            Class::VolumeDir(d) => format!("the volume's {} directory ({})", d.name(), dir(*d)),
            Class::Below(d) => format!("the volume's {} directory ({}) or a path below it", d.name(), dir(*d)),
            other => other.to_string(),
        }
    }

    /// Check what a rule set's author wrote (sizes of lists, parts of patterns).
    pub(super) fn validate(&self) -> Result<(), String> {
        match self {
            Class::List { of, separator, max } => {
                if separator.is_empty() || !(1..=MAX_LIST).contains(max) {
                    return Err(format!("a list needs a separator and a max of 1 to {MAX_LIST}"));
                }
                if matches!(**of, Class::Flag | Class::Bool | Class::List { .. }) {
                    return Err("a list's items need a value class other than a list".into());
                }
                of.validate()
            }
            Class::Pattern(p) => {
                let names: BTreeSet<&str> = p.regex.capture_names().flatten().collect();
                for (part, class) in &p.parts {
                    if !names.contains(part.as_str()) {
                        return Err(format!("pattern {:?} has no group named {part}", p.source));
                    }
                    if matches!(class, Class::Flag | Class::Bool) {
                        return Err(format!("part {part} needs a value class"));
                    }
                    class.validate()?;
                }
                Ok(())
            }
            Class::Int { min, max } if min > max => Err(format!("int range {min}..{max} is empty")),
            Class::Enum(words) if words.is_empty() => Err("an enum needs at least one word".into()),
            _ => Ok(()),
        }
    }
}

/// `value` is `dir` or a path below it of plain components (no empty, `.` or `..` one).
fn below(value: &str, dir: &Path) -> bool {
    let dir = dir.display().to_string();
    match value.strip_prefix(dir.as_str()) {
        Some("") => true,
        Some(rest) => {
            rest.strip_prefix('/').is_some_and(|rest| rest.split('/').all(|c| !c.is_empty() && c != "." && c != ".."))
        }
        None => false,
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Class::Flag => f.write_str("no value"),
            Class::Bool => f.write_str("no value, true or false"),
            Class::MountPoint => f.write_str("the mount point"),
            Class::SecretFile => f.write_str("a secret file"),
            Class::GrantedHost => f.write_str("a granted host[:port]"),
            Class::GrantedUrl => f.write_str("a URL to a granted host"),
            Class::VolumeDir(d) => write!(f, "the volume's {} directory", d.name()),
            Class::Below(d) => write!(f, "a path in the volume's {} directory", d.name()),
            Class::Enum(words) => write!(f, "one of {}", words.join(", ")),
            Class::Pattern(p) => {
                write!(f, "a match of {:?}", p.source)?;
                for (part, class) in &p.parts {
                    write!(f, ", {part} {class}")?;
                }
                Ok(())
            }
            Class::List { of, separator, max } => write!(f, "up to {max} of ({of}) separated by {separator:?}"),
            Class::Int { min, max } => write!(f, "a whole number from {min} to {max}"),
        }
    }
}

impl TryFrom<yaml_serde::Value> for Class {
    type Error = String;

    fn try_from(value: yaml_serde::Value) -> Result<Self, String> {
        use yaml_serde::Value as V;
        let names = "flag, bool, mount-point, secret-file, granted-host, granted-url, cache-dir, runtime-dir, \
                     secret-files-dir, or a map with one of enum, pattern, list, int, below";
        let map = match value {
            V::String(s) => {
                return Ok(match s.as_str() {
                    "flag" => Class::Flag,
                    "bool" => Class::Bool,
                    "mount-point" => Class::MountPoint,
                    "secret-file" => Class::SecretFile,
                    "granted-host" => Class::GrantedHost,
                    "granted-url" => Class::GrantedUrl,
                    "cache-dir" => Class::VolumeDir(Dir::Cache),
                    "runtime-dir" => Class::VolumeDir(Dir::Runtime),
                    "secret-files-dir" => Class::VolumeDir(Dir::SecretFiles),
                    other => return Err(format!("unknown class {other:?}; a class is {names}")),
                });
            }
            V::Mapping(m) => m,
            other => return Err(format!("a class is {names}, not {other:?}")),
        };
        let mut fields: BTreeMap<String, V> = BTreeMap::new();
        for (k, v) in map {
            let V::String(k) = k else { return Err(format!("class keys are words, not {k:?}")) };
            fields.insert(k, v);
        }
        let kinds: Vec<&str> =
            ["enum", "pattern", "list", "int", "below"].into_iter().filter(|k| fields.contains_key(*k)).collect();
        let [kind] = kinds.as_slice() else {
            return Err(format!("a class map has exactly one of enum, pattern, list, int, below (got {kinds:?})"));
        };
        let allowed: &[&str] = match *kind {
            "pattern" => &["pattern", "parts"],
            "list" => &["list", "separator", "max"],
            other => std::slice::from_ref(match other {
                "enum" => &"enum",
                "int" => &"int",
                _ => &"below",
            }),
        };
        if let Some(extra) = fields.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(format!("unknown key {extra:?} in a {kind} class (allowed: {})", allowed.join(", ")));
        }
        let text = |v: &V, what: &str| match v {
            V::String(s) => Ok(s.clone()),
            other => Err(format!("{what} must be text, not {other:?}")),
        };
        let class = match *kind {
            "enum" => {
                let V::Sequence(words) = &fields["enum"] else { return Err("enum is a list of words".into()) };
                Class::Enum(words.iter().map(|w| text(w, "an enum word")).collect::<Result<_, _>>()?)
            }
            "int" => {
                let range: Vec<i64> = match &fields["int"] {
                    V::Sequence(s) => s.iter().filter_map(V::as_i64).collect(),
                    _ => Vec::new(),
                };
                let [min, max] = range.as_slice() else { return Err("int is [min, max], two whole numbers".into()) };
                Class::Int { min: *min, max: *max }
            }
            "below" => {
                let name = text(&fields["below"], "below")?;
                let dir = Dir::parse(&name)
                    .ok_or_else(|| format!("below names cache, runtime or secret-files, not {name:?}"))?;
                Class::Below(dir)
            }
            "list" => {
                let of = Class::try_from(fields["list"].clone())?;
                let separator =
                    fields.get("separator").map(|v| text(v, "separator")).transpose()?.unwrap_or(",".into());
                let max = match fields.get("max") {
                    None => 16,
                    Some(v) => v.as_u64().and_then(|n| usize::try_from(n).ok()).ok_or("max is a whole number")?,
                };
                Class::List { of: Box::new(of), separator, max }
            }
            _ => {
                let source = text(&fields["pattern"], "pattern")?;
                let regex = regex::Regex::new(&format!("^(?:{source})$"))
                    .map_err(|e| format!("pattern {source:?} does not compile: {e}"))?;
                let mut parts = BTreeMap::new();
                if let Some(p) = fields.get("parts") {
                    let V::Mapping(m) = p else { return Err("parts maps group names to classes".into()) };
                    for (k, v) in m {
                        let name = text(k, "a part's name")?;
                        parts
                            .insert(name.clone(), Class::try_from(v.clone()).map_err(|e| format!("part {name}: {e}"))?);
                    }
                }
                Class::Pattern(Box::new(Pattern { source, regex, parts }))
            }
        };
        class.validate()?;
        Ok(class)
    }
}

impl<'de> serde::Deserialize<'de> for Class {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = yaml_serde::Value::deserialize(d)?;
        Class::try_from(value).map_err(serde::de::Error::custom)
    }
}
