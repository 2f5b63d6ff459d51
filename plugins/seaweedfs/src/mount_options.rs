//! Which `weed mount` flags a StorageClass may pass through, and why the others are refused.
//!
//! Users can add `weed mount` flags through the `mountOptions` parameter and through the CSI
//! capability's mount flags (StorageClass `mountOptions`). Both go through one allowlist of
//! flags that name no node path and open no port, checked against `weed mount -h` of SeaweedFS
//! 4.48; each value is checked by the flag's type. Everything else is refused with the reason,
//! so nobody has to guess whether a flag is unknown, dangerous, or owned by a parameter.

use mounthost_plugin_sdk::params::invalid;
use mounthost_plugin_sdk::{BackendError, VolumeCapability};

/// The type of a pass-through flag's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptType {
    /// `name` (true), `name=true` or `name=false`.
    Bool,
    /// A whole decimal number from 0 to `max`.
    Int {
        /// Largest accepted value.
        max: u64,
    },
    /// A Go duration such as `6s`, `1m30s`, `500ms`.
    Duration,
    /// A short name of `[A-Za-z0-9._-]`, at most 64 bytes (it ends up in the mount table).
    Name,
}

/// One flag users may pass through.
#[derive(Debug, Clone, Copy)]
pub struct Passthrough {
    /// The flag without its dash.
    pub name: &'static str,
    /// The type of its value.
    pub ty: OptType,
}

const fn opt(name: &'static str, ty: OptType) -> Passthrough {
    Passthrough { name, ty }
}

/// The allowlist, in the order the flags appear in plans.
pub const PASSTHROUGH: &[Passthrough] = &[
    opt("allowOthers", OptType::Bool),
    opt("asyncDio", OptType::Bool),
    opt("cacheSymlink", OptType::Bool),
    opt("cacheDirMaxEntries", OptType::Int { max: 100_000_000 }),
    opt("dirIdleEvictSec", OptType::Int { max: 31_536_000 }),
    opt("disableXAttr", OptType::Bool),
    opt("writebackCache", OptType::Bool),
    opt("collectionQuotaMB", OptType::Int { max: 1 << 40 }),
    opt("readRetryTime", OptType::Duration),
    opt("readerCacheSizeMB", OptType::Int { max: 1_048_576 }),
    opt("writeBufferSizeMB", OptType::Int { max: 1_048_576 }),
    opt("metadataFlushSeconds", OptType::Int { max: 86_400 }),
    opt("fuse.maxBackground", OptType::Int { max: 65_535 }),
    opt("fuse.congestionThreshold", OptType::Int { max: 65_535 }),
    opt("defaultPermissions", OptType::Bool),
    opt("posix.dirNLink", OptType::Bool),
    opt("df.logical", OptType::Bool),
    opt("includeSystemEntries", OptType::Bool),
    opt("volumeName", OptType::Name),
    opt("nonempty", OptType::Bool),
    opt("dlm", OptType::Bool),
];

/// Flags owned by a plugin parameter: flag, parameter.
const OWNED: &[(&str, &str)] = &[
    ("filer", "filer"),
    ("filer.path", "path"),
    ("collection", "collection"),
    ("replication", "replication"),
    ("disk", "diskType"),
    ("dataCenter", "dataCenter"),
    ("ttl", "ttl"),
    ("chunkSizeLimitMB", "chunkSizeLimitMB"),
    ("cacheCapacityMB", "cacheCapacityMB"),
    ("cacheMetaTtlSec", "cacheMetaTtlSec"),
    ("concurrentWriters", "concurrentWriters"),
    ("concurrentReaders", "concurrentReaders"),
    ("volumeServerAccess", "volumeServerAccess"),
    ("map.uid", "uidMap"),
    ("map.gid", "gidMap"),
    ("umask", "umask"),
    ("readOnly", "readOnly"),
    ("memoryLimitMB", "memoryLimitMB"),
];

/// Known flags refused for another reason: flag, reason.
const REFUSED: &[(&str, &str)] = &[
    ("dir", "it names a node path; the host mounts at the staging directory"),
    ("cacheDir", "it names a node path; use the cacheDir parameter (volume or disabled)"),
    ("cacheDirWrite", "it names a node path"),
    ("localSocket", "it names a node path; the host puts the socket in the volume's runtime directory"),
    ("options", "it names a node path (a file of more options)"),
    ("cpuprofile", "it names a node path"),
    ("memprofile", "it names a node path"),
    ("debug", "it opens a port (pprof over HTTP)"),
    ("debug.port", "it opens a port (pprof over HTTP)"),
    ("debug.fuse", "it logs raw FUSE traffic, file names and data, into the node's logs"),
    ("dirAutoCreate", "the host creates the mount point"),
    ("autofs", "it changes how weed treats an existing mount on the mount point, which the host owns"),
    ("sys.novncache", "it only has an effect on macOS"),
    ("windows.uid", "it only has an effect on Windows"),
    ("windows.gid", "it only has an effect on Windows"),
];

/// Why `name` is not on the allowlist.
fn refusal(name: &str) -> String {
    if let Some((_, param)) = OWNED.iter().find(|(flag, _)| *flag == name) {
        return format!("it is set by the {param} parameter");
    }
    if let Some((_, why)) = REFUSED.iter().find(|(flag, _)| *flag == name) {
        return (*why).to_string();
    }
    if name.starts_with("peer.") {
        return "peer chunk sharing opens a port (peer.listen) and serves the node's cache".into();
    }
    if let Some(bare) = name.strip_prefix('-') {
        return format!("write weed mount options without the leading dash ({bare:?})");
    }
    let allowed: Vec<&str> = PASSTHROUGH.iter().map(|p| p.name).collect();
    format!("it is not a weed mount option this plugin passes through; accepted: {}", allowed.join(", "))
}

/// A validated pass-through flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOption {
    /// Its position in [`PASSTHROUGH`], which fixes its place in plans.
    pub rank: usize,
    /// The flag without its dash.
    pub name: &'static str,
    /// The canonical value; `None` for a bare boolean (true).
    pub value: Option<String>,
}

impl MountOption {
    /// The `weed` argument: `-name` or `-name=value`.
    pub fn to_arg(&self) -> String {
        match &self.value {
            None => format!("-{}", self.name),
            Some(v) => format!("-{}={v}", self.name),
        }
    }
}

/// Parse one `name` or `name=value` item. `what` names where it came from, for messages.
pub fn parse_item(what: &str, item: &str) -> Result<MountOption, BackendError> {
    let (name, value) = match item.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (item, None),
    };
    if name.is_empty() {
        return Err(invalid(format!("{what}: empty option in {item:?}")));
    }
    let Some((rank, spec)) = PASSTHROUGH.iter().enumerate().find(|(_, p)| p.name == name) else {
        return Err(invalid(format!("{what}: option {name:?} is refused: {}", refusal(name))));
    };
    let bad =
        |accepted: &str| invalid(format!("{what}: option {name:?} takes {accepted}, not {:?}", value.unwrap_or("")));
    let value = match (spec.ty, value) {
        (OptType::Bool, None | Some("true")) => None,
        (OptType::Bool, Some("false")) => Some("false".to_string()),
        (OptType::Bool, Some(_)) => return Err(bad("no value, =true or =false")),
        (OptType::Int { max }, Some(v)) => {
            let n = if !v.is_empty() && v.len() <= 20 && v.bytes().all(|b| b.is_ascii_digit()) {
                v.parse::<u64>().ok().filter(|n| *n <= max)
            } else {
                None
            };
            match n {
                Some(n) => Some(n.to_string()),
                None => return Err(bad(&format!("a whole number from 0 to {max}"))),
            }
        }
        (OptType::Duration, Some(v)) if is_go_duration(v) => Some(v.to_string()),
        (OptType::Duration, _) => return Err(bad("a duration such as 6s, 1m30s or 500ms")),
        (OptType::Name, Some(v))
            if !v.is_empty()
                && v.len() <= 64
                && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) =>
        {
            Some(v.to_string())
        }
        (OptType::Name, _) => return Err(bad("a name of [A-Za-z0-9._-], at most 64 characters")),
        (OptType::Int { max }, None) => {
            return Err(bad(&format!("=<a whole number from 0 to {max}>")));
        }
    };
    Ok(MountOption { rank, name: spec.name, value })
}

/// Parse a comma-separated list of items.
pub fn parse_list(what: &str, list: &str) -> Result<Vec<MountOption>, BackendError> {
    let mut out = Vec::new();
    for item in list.split(',') {
        if item.is_empty() {
            return Err(invalid(format!("{what}: empty item in {list:?}; separate options by single commas")));
        }
        out.push(parse_item(what, item)?);
    }
    Ok(out)
}

/// What a CSI capability adds to the mount.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapabilityFlags {
    /// `ro` was among the mount flags.
    pub read_only: bool,
    /// Pass-through flags.
    pub options: Vec<MountOption>,
}

/// The filesystem types a capability may ask for.
const FS_TYPES: &[&str] = &["", "seaweedfs", "fuse.seaweedfs"];

/// Check a capability: its fs type, and its mount flags through the allowlist (plus `ro` for
/// read-only and `rw`, the default, accepted and ignored).
pub fn check_capability(cap: &VolumeCapability) -> Result<CapabilityFlags, BackendError> {
    if !FS_TYPES.contains(&cap.fs_type.as_str()) {
        return Err(invalid(format!(
            "fsType {:?} is not supported: leave it empty or use seaweedfs or fuse.seaweedfs",
            cap.fs_type
        )));
    }
    let mut out = CapabilityFlags::default();
    for flag in &cap.mount_flags {
        for item in flag.split(',') {
            match item {
                "ro" => out.read_only = true,
                "rw" => {}
                "" => {
                    return Err(invalid(format!("mount flag {flag:?} has an empty item")));
                }
                _ => out.options.push(parse_item("StorageClass mountOptions", item)?),
            }
        }
    }
    Ok(out)
}

/// Join the `mountOptions` parameter's flags and a capability's, refusing a flag given twice,
/// and order them as [`PASSTHROUGH`] does so equal inputs always give equal plans.
pub fn merge(mut options: Vec<MountOption>, more: Vec<MountOption>) -> Result<Vec<MountOption>, BackendError> {
    options.extend(more);
    options.sort_by_key(|o| o.rank);
    if let Some(w) = options.windows(2).find(|w| w[0].rank == w[1].rank) {
        return Err(invalid(format!(
            "weed mount option {:?} is given twice (in parameter \"mountOptions\" and/or the \
             StorageClass mountOptions); give it once",
            w[0].name
        )));
    }
    Ok(options)
}

/// Go's `time.ParseDuration` syntax, ASCII units only, no sign: `0`, or one or more
/// `<number>[.<fraction>]<unit>` with unit `ns`, `us`, `ms`, `s`, `m` or `h`.
fn is_go_duration(v: &str) -> bool {
    if v == "0" {
        return true;
    }
    if v.is_empty() || v.len() > 32 {
        return false;
    }
    let b = v.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
            i += 1;
        }
        let number = &v[start..i];
        let dots = number.bytes().filter(|c| *c == b'.').count();
        if number.is_empty() || number == "." || dots > 1 {
            return false;
        }
        let rest = &v[i..];
        let unit = ["ns", "us", "ms", "s", "m", "h"].into_iter().find(|u| rest.starts_with(u));
        match unit {
            Some(u) => i += u.len(),
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        for ok in ["0", "6s", "1m30s", "500ms", "1.5h", "10us", "3ns"] {
            assert!(is_go_duration(ok), "{ok}");
        }
        for bad in ["", "6", "-1s", "1x", "s", ".s", "1..2s", "1 s", "1µs"] {
            assert!(!is_go_duration(bad), "{bad}");
        }
    }

    /// Every flag `weed mount -h` of SeaweedFS 4.48 lists.
    const WEED_448_FLAGS: &[&str] = &[
        "allowOthers",
        "asyncDio",
        "autofs",
        "cacheCapacityMB",
        "cacheDir",
        "cacheDirMaxEntries",
        "cacheDirWrite",
        "cacheMetaTtlSec",
        "cacheSymlink",
        "chunkSizeLimitMB",
        "collection",
        "collectionQuotaMB",
        "concurrentReaders",
        "concurrentWriters",
        "cpuprofile",
        "dataCenter",
        "debug",
        "debug.fuse",
        "debug.port",
        "defaultPermissions",
        "df.logical",
        "dir",
        "dirAutoCreate",
        "dirIdleEvictSec",
        "disableXAttr",
        "disk",
        "dlm",
        "filer",
        "filer.path",
        "fuse.congestionThreshold",
        "fuse.maxBackground",
        "includeSystemEntries",
        "localSocket",
        "map.gid",
        "map.uid",
        "memoryLimitMB",
        "memprofile",
        "metadataFlushSeconds",
        "nonempty",
        "options",
        "peer.advertise",
        "peer.dataCenter",
        "peer.enable",
        "peer.listen",
        "peer.rack",
        "posix.dirNLink",
        "readOnly",
        "readRetryTime",
        "readerCacheSizeMB",
        "replication",
        "sys.novncache",
        "ttl",
        "umask",
        "volumeName",
        "volumeServerAccess",
        "windows.gid",
        "windows.uid",
        "writeBufferSizeMB",
        "writebackCache",
    ];

    #[test]
    fn every_weed_flag_is_classified_and_every_listed_flag_exists() {
        for flag in WEED_448_FLAGS {
            let allowed = PASSTHROUGH.iter().any(|p| p.name == *flag);
            let reason = refusal(flag);
            assert!(allowed || !reason.contains("not a weed mount option"), "{flag} has no specific classification");
        }
        let listed = PASSTHROUGH.iter().map(|p| p.name).chain(OWNED.iter().chain(REFUSED).map(|(f, _)| *f));
        for flag in listed {
            assert!(WEED_448_FLAGS.contains(&flag), "{flag} is not a weed 4.48 mount flag");
        }
    }

    #[test]
    fn every_refused_reason_is_specific() {
        for (flag, _) in OWNED.iter().chain(REFUSED) {
            assert!(!refusal(flag).contains("not a weed mount option"), "{flag}");
            assert!(PASSTHROUGH.iter().all(|p| p.name != *flag), "{flag} both allowed and refused");
        }
    }
}
