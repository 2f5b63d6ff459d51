//! Validation of the fields CSI requests carry, shared by every RPC: ids, maps, capabilities,
//! paths (confined to the directories the host serves), and the reserved volume attributes
//! that select a plugin.
//!
//! Limits follow the CSI spec's size limits where it has them (ids 128 bytes); maps are
//! bounded generously (secrets may hold certificates).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use crate::error::Error;
use crate::plugin::bindings::types as wit;
use crate::proto::csi;
use crate::secrets::Secrets;

/// Longest volume id (CSI size limit for identifiers).
pub const MAX_ID: usize = 128;
/// Largest map (context, parameters, secrets), keys plus values.
pub const MAX_MAP: usize = 64 << 10;

/// The attribute naming the plugin.
pub const PLUGIN_KEY: &str = "plugin";
/// The attribute pinning the plugin's digest.
pub const DIGEST_KEY: &str = "pluginDigest";
/// Attributes kubelet and the external sidecars add (pod info, ephemeral); never for plugins.
pub const K8S_PREFIX: &str = "csi.storage.k8s.io/";
/// Set by kubelet on a CSI ephemeral inline volume.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// The attribute making a volume dynamic (`"true"`): its published directory gets a socket
/// through which its pod mounts more into it (`daemon::dynamic`).
pub const DYNAMIC_KEY: &str = "dynamic";
/// The plugins a dynamic volume's pod may mount with, comma-separated (default: its own).
pub const DYNAMIC_PLUGINS_KEY: &str = "dynamicPlugins";
/// The attribute making a volume lazy (`"true"`): the host serves the blobs its stage plan
/// unpacks through its own FUSE server while they download (`plan::lazy`, docs/lazy.md).
pub const LAZY_KEY: &str = "lazy";

/// Is the volume lazy (`lazy: "true"`)? Anything but `true` or `false` is refused.
pub fn lazy(attrs: &HashMap<String, String>) -> Result<bool, Error> {
    match attrs.get(LAZY_KEY).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => {
            Err(Error::invalid(format!("volume attribute {LAZY_KEY} is {}; use \"true\" or \"false\"", shown(other))))
        }
    }
}

/// The trust entries a volume's OCI artifact must be signed by, comma-separated
/// (docs/signing.md).
pub const SIGNED_BY_KEY: &str = "signedBy";
/// `required`: a lazy stage whose model has no chunk index fails (docs/signing.md).
pub const CHUNK_INDEX_KEY: &str = "chunkIndex";
/// `os/architecture[/variant]`: the platform an image index or Docker manifest list resolves
/// to, instead of the node's own (docs/plugins/model.md).
pub const PLATFORM_KEY: &str = "platform";

/// The platform `platform` names, if set.
pub fn platform(attrs: &HashMap<String, String>) -> Result<Option<crate::plan::platform::Platform>, Error> {
    attrs
        .get(PLATFORM_KEY)
        .map(|raw| {
            crate::plan::platform::Platform::parse(raw).map_err(|why| {
                Error::invalid(format!(
                    "volume attribute {PLATFORM_KEY} is {}: {why}; give os/architecture[/variant], such as linux/arm64",
                    shown(raw)
                ))
            })
        })
        .transpose()
}

/// Most names a `signedBy` value lists.
pub const MAX_SIGNERS: usize = 16;

/// The trust entries `signedBy` names (empty: the attribute is not set). Each name is a trust
/// entry's (lowercase letters, digits and `-`, at most 63 characters), at most once.
pub fn signed_by(attrs: &HashMap<String, String>) -> Result<Vec<String>, Error> {
    let Some(raw) = attrs.get(SIGNED_BY_KEY) else { return Ok(Vec::new()) };
    parse_signers(raw)
        .map_err(|why| Error::invalid(format!("volume attribute {SIGNED_BY_KEY} is {}: {why}", shown(raw))))
}

/// A `signedBy` value's names, or why it is not one.
pub fn parse_signers(raw: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for name in raw.split(',').map(str::trim) {
        let ok = !name.is_empty()
            && name.len() <= 63
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if !ok {
            return Err(format!(
                "{} is not a trust entry's name (lowercase letters, digits and '-', at most 63); list names separated by commas",
                shown(name)
            ));
        }
        if out.iter().any(|n| n == name) {
            return Err(format!("{name} is listed twice"));
        }
        out.push(name.to_string());
    }
    if out.len() > MAX_SIGNERS {
        return Err(format!("it lists {} names, at most {MAX_SIGNERS}", out.len()));
    }
    Ok(out)
}

/// Does the volume say `chunkIndex: required`? Anything but `required` is refused.
pub fn chunk_index_required(attrs: &HashMap<String, String>) -> Result<bool, Error> {
    match attrs.get(CHUNK_INDEX_KEY).map(String::as_str) {
        None => Ok(false),
        Some("required") => Ok(true),
        Some(other) => Err(Error::invalid(format!(
            "volume attribute {CHUNK_INDEX_KEY} is {}; the one value is \"required\" (leave it out otherwise)",
            shown(other)
        ))),
    }
}

/// A dynamic volume's cap on its mounts (at most the node's `--dynamic-max-mounts`).
pub const DYNAMIC_MAX_MOUNTS_KEY: &str = "dynamicMaxMounts";
/// A dynamic volume's cap on the bytes its mounts fetch, in MiB (at most `--dynamic-max-mib`).
pub const DYNAMIC_MAX_MIB_KEY: &str = "dynamicMaxMiB";
/// A dynamic volume's rate of POST and DELETE (at most `--dynamic-requests-per-minute`).
pub const DYNAMIC_RATE_KEY: &str = "dynamicRequestsPerMinute";
/// The attributes that lower a dynamic volume's limits.
pub const DYNAMIC_LIMIT_KEYS: [&str; 3] = [DYNAMIC_MAX_MOUNTS_KEY, DYNAMIC_MAX_MIB_KEY, DYNAMIC_RATE_KEY];

/// What a dynamic volume's attributes say of its limits: each one set lowers the node's (a
/// value above the node's is refused at publish); one not set is the node's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DynamicLimits {
    /// Mounts at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mounts: Option<u64>,
    /// Bytes all its mounts fetch together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// POST and DELETE requests a minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
}

impl DynamicLimits {
    /// No attribute set.
    pub fn is_default(&self) -> bool {
        *self == DynamicLimits::default()
    }
}

/// The limits a dynamic volume's attributes set (checked: positive integers in range).
pub fn dynamic_limits(attrs: &HashMap<String, String>) -> Result<DynamicLimits, Error> {
    let number = |key: &str, max: u64| -> Result<Option<u64>, Error> {
        let Some(raw) = attrs.get(key) else { return Ok(None) };
        match raw.trim().parse::<u64>() {
            Ok(n) if (1..=max).contains(&n) => Ok(Some(n)),
            _ => {
                Err(Error::invalid(format!("volume attribute {key} is {}; use an integer from 1 to {max}", shown(raw))))
            }
        }
    };
    Ok(DynamicLimits {
        max_mounts: number(DYNAMIC_MAX_MOUNTS_KEY, 1024)?,
        max_bytes: number(DYNAMIC_MAX_MIB_KEY, 1 << 30)?.map(|mib| mib << 20),
        requests_per_minute: number(DYNAMIC_RATE_KEY, 60_000)?,
    })
}

/// A dynamic volume's allowed plugins, or `None` for a volume that is not dynamic; its limit
/// attributes are checked too ([`dynamic_limits`]).
pub fn dynamic_plugins(attrs: &HashMap<String, String>, own: &str) -> Result<Option<Vec<String>>, Error> {
    let dynamic = match attrs.get(DYNAMIC_KEY).map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(Error::invalid(format!(
                "volume attribute {DYNAMIC_KEY} is {}; use \"true\" or \"false\"",
                shown(other)
            )));
        }
    };
    let listed = attrs.get(DYNAMIC_PLUGINS_KEY);
    if !dynamic {
        return match DYNAMIC_LIMIT_KEYS.iter().copied().chain([DYNAMIC_PLUGINS_KEY]).find(|k| attrs.contains_key(*k)) {
            Some(key) => {
                Err(Error::invalid(format!("volume attribute {key} is set but {DYNAMIC_KEY} is not \"true\"")))
            }
            None => Ok(None),
        };
    }
    dynamic_limits(attrs)?;
    let mut plugins = Vec::new();
    for name in listed.map(|l| l.split(',').map(str::trim).collect()).unwrap_or_else(|| vec![own]) {
        if !crate::plugin::info::valid_name(name) {
            return Err(Error::invalid(format!(
                "volume attribute {DYNAMIC_PLUGINS_KEY}: {} is not a plugin name (1 to 63 lowercase letters, digits and dashes, starting with a letter; comma-separated)",
                shown(name)
            )));
        }
        if !plugins.iter().any(|p| p == name) {
            plugins.push(name.to_string());
        }
    }
    Ok(Some(plugins))
}

/// Check a volume id.
pub fn volume_id(raw: &str) -> Result<String, Error> {
    identifier("volume_id", raw)
}

/// Check an identifier-like field (non-empty, ≤ 128 bytes, printable).
pub fn identifier(field: &str, raw: &str) -> Result<String, Error> {
    if raw.is_empty() {
        return Err(Error::invalid(format!("{field} is required")));
    }
    if raw.len() > MAX_ID {
        return Err(Error::invalid(format!("{field} {} is too long: at most {MAX_ID} bytes", shown(raw))));
    }
    if raw.chars().any(char::is_control) {
        return Err(Error::invalid(format!("{field} {} contains control characters", shown(raw))));
    }
    Ok(raw.to_string())
}

/// Check a string map's size and keys.
pub fn map(field: &str, m: &HashMap<String, String>) -> Result<(), Error> {
    let size: usize = m.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_MAP {
        return Err(Error::invalid(format!("{field} holds {size} bytes; at most {MAX_MAP} are allowed")));
    }
    if let Some(k) = m.keys().find(|k| k.is_empty() || k.contains('\0')) {
        return Err(Error::invalid(format!("{field} has an invalid key {}", shown(k))));
    }
    if let Some(k) = m.iter().find(|(_, v)| v.contains('\0')).map(|(k, _)| k) {
        return Err(Error::invalid(format!("{field}[{k}] contains a NUL byte")));
    }
    Ok(())
}

/// Secrets of a request, checked.
pub fn secrets(m: &HashMap<String, String>) -> Result<Secrets, Error> {
    map("secrets", m)?;
    Ok(m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// The volume capability: required, mount access (block is not supported), a known mode.
pub fn capability(cap: Option<&csi::VolumeCapability>) -> Result<wit::VolumeCapability, Error> {
    use csi::volume_capability::AccessType;
    use csi::volume_capability::access_mode::Mode;
    let cap = cap.ok_or_else(|| Error::invalid("volume_capability is required"))?;
    let mount = match &cap.access_type {
        Some(AccessType::Mount(m)) => m,
        Some(AccessType::Block(_)) => {
            return Err(Error::invalid("block access is not supported: mounthost serves filesystem (mount) volumes"));
        }
        None => return Err(Error::invalid("volume_capability.access_type is required (mount)")),
    };
    if !mount.volume_mount_group.is_empty() {
        return Err(Error::invalid(
            "volume_capability.mount.volume_mount_group is not supported (no VOLUME_MOUNT_GROUP capability)",
        ));
    }
    let mode = cap.access_mode.as_ref().map(|m| m.mode).unwrap_or_default();
    let access_mode = match Mode::try_from(mode) {
        Ok(Mode::SingleNodeWriter) => wit::AccessMode::SingleNodeWriter,
        Ok(Mode::SingleNodeReaderOnly) => wit::AccessMode::SingleNodeReaderOnly,
        Ok(Mode::MultiNodeReaderOnly) => wit::AccessMode::MultiNodeReaderOnly,
        Ok(Mode::MultiNodeSingleWriter) => wit::AccessMode::MultiNodeSingleWriter,
        Ok(Mode::MultiNodeMultiWriter) => wit::AccessMode::MultiNodeMultiWriter,
        Ok(Mode::SingleNodeSingleWriter) => wit::AccessMode::SingleNodeSingleWriter,
        Ok(Mode::SingleNodeMultiWriter) => wit::AccessMode::SingleNodeMultiWriter,
        Ok(Mode::Unknown) | Err(_) => {
            return Err(Error::invalid(format!("volume_capability.access_mode {mode} is not a known access mode")));
        }
    };
    for flag in &mount.mount_flags {
        if flag.is_empty() || flag.len() > MAX_ID * 8 || flag.contains('\0') {
            return Err(Error::invalid(format!("mount flag {} is invalid", shown(flag))));
        }
    }
    Ok(wit::VolumeCapability { access_mode, fs_type: mount.fs_type.clone(), mount_flags: mount.mount_flags.clone() })
}

/// SINGLE_NODE_READER_ONLY or MULTI_NODE_READER_ONLY: a publication must be read-only.
pub fn is_reader_only(mode: wit::AccessMode) -> bool {
    matches!(mode, wit::AccessMode::SingleNodeReaderOnly | wit::AccessMode::MultiNodeReaderOnly)
}

/// The CSI spec's name of an access mode (`SINGLE_NODE_WRITER`, ...).
pub fn access_mode_name(mode: wit::AccessMode) -> &'static str {
    match mode {
        wit::AccessMode::SingleNodeWriter => "SINGLE_NODE_WRITER",
        wit::AccessMode::SingleNodeReaderOnly => "SINGLE_NODE_READER_ONLY",
        wit::AccessMode::MultiNodeReaderOnly => "MULTI_NODE_READER_ONLY",
        wit::AccessMode::MultiNodeSingleWriter => "MULTI_NODE_SINGLE_WRITER",
        wit::AccessMode::MultiNodeMultiWriter => "MULTI_NODE_MULTI_WRITER",
        wit::AccessMode::SingleNodeSingleWriter => "SINGLE_NODE_SINGLE_WRITER",
        wit::AccessMode::SingleNodeMultiWriter => "SINGLE_NODE_MULTI_WRITER",
    }
}

/// Which plugin a volume uses: its `plugin` attribute, else the `<plugin>~` prefix of ids that
/// mounthost's CreateVolume made.
pub fn plugin_name(volume_id: &str, attrs: &HashMap<String, String>) -> Result<String, Error> {
    if let Some(p) = attrs.get(PLUGIN_KEY) {
        // `oci://registry/repository@sha256:…` is longer than an identifier; it is parsed where
        // it is pulled (`plugin::pulled`).
        if crate::plugin::pulled::is_reference(p) {
            if p.len() > crate::plugin::pulled::MAX_VALUE || p.chars().any(char::is_control) {
                return Err(Error::invalid(format!("volume attribute plugin {} is not an OCI reference", shown(p))));
            }
            return Ok(p.clone());
        }
        return identifier("volume attribute plugin", p);
    }
    match volume_id.split_once('~') {
        Some((p, _)) if !p.is_empty() => Ok(p.to_string()),
        _ => Err(Error::invalid(format!(
            "volume {volume_id:?} names no plugin: set the volume attribute (or StorageClass parameter) `{PLUGIN_KEY}`"
        ))),
    }
}

/// The attributes a plugin sees: everything but the reserved keys.
pub fn plugin_attrs(attrs: &HashMap<String, String>) -> BTreeMap<String, String> {
    attrs.iter().filter(|(k, _)| !is_reserved(k)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Keys the host consumes itself.
pub fn is_reserved(key: &str) -> bool {
    key == PLUGIN_KEY
        || key == DIGEST_KEY
        || key == DYNAMIC_KEY
        || key == DYNAMIC_PLUGINS_KEY
        || key == LAZY_KEY
        || key == SIGNED_BY_KEY
        || key == CHUNK_INDEX_KEY
        || key == PLATFORM_KEY
        || DYNAMIC_LIMIT_KEYS.contains(&key)
        || key.starts_with(K8S_PREFIX)
}

/// WIT key-value pairs.
pub fn kvs<'a>(pairs: impl IntoIterator<Item = (&'a String, &'a String)>) -> Vec<wit::Kv> {
    pairs.into_iter().map(|(k, v)| wit::Kv { key: k.clone(), value: v.clone() }).collect()
}

/// Secrets as WIT key-value pairs, for a planner: all but the host's own (the credentials it
/// pulls plugins with, `plugin::pulled::AUTH_SECRET_KEY`).
pub fn secret_kvs(secrets: &Secrets) -> Vec<wit::Kv> {
    secrets
        .iter()
        .filter(|(k, _)| *k != crate::plugin::pulled::AUTH_SECRET_KEY)
        .map(|(k, v)| wit::Kv { key: k.into(), value: v.into() })
        .collect()
}

/// Longest path accepted (PATH_MAX).
pub const MAX_PATH: usize = 4096;

/// The directories requests may name paths inside.
#[derive(Debug, Clone)]
pub struct Roots {
    roots: Vec<PathBuf>,
}

impl Roots {
    /// Paths must be inside one of `roots` (absolute and canonical: the CLI resolves a node
    /// whose `/var/lib/kubelet` is itself a link before the daemon starts).
    pub fn new(roots: impl IntoIterator<Item = PathBuf>) -> Self {
        Roots { roots: roots.into_iter().collect() }
    }

    /// The roots, for messages.
    pub fn describe(&self) -> String {
        self.roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(" or ")
    }

    /// Check `raw`, the value of request field `field`, and return it as a path.
    pub fn check(&self, field: &str, raw: &str) -> Result<PathBuf, Error> {
        let path = lexical(field, raw)?;
        if !self.roots.iter().any(|r| path.starts_with(r) && path != *r) {
            return Err(Error::invalid(format!(
                "{field} {raw:?} is outside the directories this host serves ({})",
                self.describe()
            )));
        }
        // Symbolic links are refused where the path is used, at the syscall (exec::beneath).
        Ok(path)
    }
}

/// The lexical rules, without touching the filesystem.
pub fn lexical(field: &str, raw: &str) -> Result<PathBuf, Error> {
    let bad = |why: &str| Error::invalid(format!("{field} {}: {why}", shown(raw)));
    if raw.is_empty() {
        return Err(Error::invalid(format!("{field} is required")));
    }
    if raw.len() > MAX_PATH {
        return Err(bad(&format!("{} bytes; at most {MAX_PATH} are allowed", raw.len())));
    }
    if raw.contains('\0') {
        return Err(bad("contains a NUL byte"));
    }
    if !raw.starts_with('/') {
        return Err(bad("must be an absolute path"));
    }
    for component in raw[1..].split('/') {
        match component {
            "" => return Err(bad("has an empty component (// or a trailing /)")),
            "." | ".." => return Err(bad("must not contain . or .. components")),
            _ => {}
        }
    }
    Ok(PathBuf::from(raw))
}

/// A value for a message: long values are cut, control characters escaped.
pub fn shown(raw: &str) -> String {
    let cut: String = raw.chars().take(160).collect();
    if cut.len() < raw.len() { format!("{:?}... ({} bytes)", cut, raw.len()) } else { format!("{cut:?}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn mount_cap(mode: i32) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_mode: Some(csi::volume_capability::AccessMode { mode }),
            access_type: Some(
                csi::volume_capability::AccessType::Mount(csi::volume_capability::MountVolume::default()),
            ),
        }
    }

    #[test]
    fn ids() {
        assert_eq!(volume_id("").unwrap_err().message, "volume_id is required");
        let e = volume_id(&"x".repeat(100_000)).unwrap_err();
        assert!(e.message.contains("too long") && e.message.len() < 400, "{}", e.message);
        assert!(volume_id("a\0b").unwrap_err().message.contains("control"));
        assert_eq!(
            volume_id("seaweedfs~127.0.0.1:8888/buckets/pvc-1").unwrap(),
            "seaweedfs~127.0.0.1:8888/buckets/pvc-1"
        );
    }

    #[test]
    fn capabilities() {
        assert_eq!(capability(None).unwrap_err().kind, ErrorKind::InvalidArgument);
        assert!(capability(Some(&mount_cap(0))).unwrap_err().message.contains("not a known access mode"));
        assert!(capability(Some(&mount_cap(99))).is_err());
        let block = csi::VolumeCapability {
            access_mode: Some(csi::volume_capability::AccessMode { mode: 1 }),
            access_type: Some(csi::volume_capability::AccessType::Block(Default::default())),
        };
        assert!(capability(Some(&block)).unwrap_err().message.contains("block access"));
        assert_eq!(capability(Some(&mount_cap(5))).unwrap().access_mode, wit::AccessMode::MultiNodeMultiWriter);
    }

    #[test]
    fn plugin_selection_and_reserved_keys() {
        let attrs: HashMap<String, String> = [
            ("plugin".to_string(), "seaweedfs".to_string()),
            ("filer".into(), "f:1".into()),
            ("csi.storage.k8s.io/pod.name".into(), "p".into()),
        ]
        .into();
        assert_eq!(plugin_name("x", &attrs).unwrap(), "seaweedfs");
        assert_eq!(plugin_name("model~r/x", &HashMap::new()).unwrap(), "model");
        assert!(plugin_name("plain", &HashMap::new()).unwrap_err().message.contains("`plugin`"));
        assert_eq!(
            plugin_attrs(&attrs).into_iter().collect::<Vec<_>>(),
            vec![("filer".to_string(), "f:1".to_string())]
        );
    }

    #[test]
    fn lexical_rules() {
        for bad in ["", "relative/x", "/a/../b", "/a/./b", "/a//b", "/a/b/", "/a/\0b"] {
            let e = lexical("target_path", bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{bad:?}");
            assert!(e.message.starts_with("target_path"), "{}", e.message);
        }
        assert!(lexical("t", &format!("/{}", "a".repeat(5000))).unwrap_err().message.contains("at most 4096"));
        assert_eq!(lexical("t", "/var/lib/kubelet/x").unwrap(), PathBuf::from("/var/lib/kubelet/x"));
    }

    #[test]
    fn confined_to_roots() {
        let root = PathBuf::from("/var/lib/kubelet");
        let roots = Roots::new([root.clone()]);
        let ok = root.join("pods/u/volumes/x/mount");
        assert_eq!(roots.check("target_path", ok.to_str().unwrap()).unwrap(), ok);
        let e = roots.check("target_path", "/etc/passwd").unwrap_err();
        assert!(e.message.contains("outside the directories"), "{}", e.message);
        let e = roots.check("target_path", root.to_str().unwrap()).unwrap_err();
        assert!(e.message.contains("outside"), "the root itself is refused: {}", e.message);
    }
}

#[cfg(test)]
mod dynamic_tests {
    use super::*;

    fn attrs(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn dynamic_volumes_name_the_plugins_their_pod_may_use() {
        assert_eq!(dynamic_plugins(&attrs(&[]), "model").unwrap(), None);
        assert_eq!(dynamic_plugins(&attrs(&[("dynamic", "false")]), "model").unwrap(), None);
        assert_eq!(dynamic_plugins(&attrs(&[("dynamic", "true")]), "model").unwrap(), Some(vec!["model".into()]));
        let listed = attrs(&[("dynamic", "true"), ("dynamicPlugins", "model, tmpfs,model")]);
        assert_eq!(dynamic_plugins(&listed, "model").unwrap(), Some(vec!["model".into(), "tmpfs".into()]));
        for bad in [
            attrs(&[("dynamic", "yes")]),
            attrs(&[("dynamicPlugins", "model")]),
            attrs(&[("dynamic", "true"), ("dynamicPlugins", "Model")]),
            attrs(&[("dynamic", "true"), ("dynamicPlugins", "a,,b")]),
            attrs(&[("dynamic", "true"), ("dynamicPlugins", "../x")]),
        ] {
            let e = dynamic_plugins(&bad, "model").unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::InvalidArgument, "{bad:?}: {e:?}");
        }
        assert!(is_reserved(DYNAMIC_KEY) && is_reserved(DYNAMIC_PLUGINS_KEY), "plugins never see them");
    }

    #[test]
    fn a_dynamic_volume_may_lower_its_limits_with_positive_integers() {
        let set = attrs(&[
            ("dynamic", "true"),
            ("dynamicMaxMounts", "4"),
            ("dynamicMaxMiB", "512"),
            ("dynamicRequestsPerMinute", " 30 "),
        ]);
        assert!(dynamic_plugins(&set, "model").unwrap().is_some());
        assert_eq!(
            dynamic_limits(&set).unwrap(),
            DynamicLimits { max_mounts: Some(4), max_bytes: Some(512 << 20), requests_per_minute: Some(30) }
        );
        assert!(dynamic_limits(&attrs(&[("dynamic", "true")])).unwrap().is_default());
        for (key, value, says) in [
            ("dynamicMaxMounts", "0", "use an integer from 1 to 1024"),
            ("dynamicMaxMounts", "-1", "use an integer from 1 to 1024"),
            ("dynamicMaxMounts", "1025", "use an integer from 1 to 1024"),
            ("dynamicMaxMiB", "1.5", "use an integer from 1 to 1073741824"),
            ("dynamicRequestsPerMinute", "lots", "use an integer from 1 to 60000"),
            ("dynamicRequestsPerMinute", "60001", "use an integer from 1 to 60000"),
        ] {
            let e = dynamic_plugins(&attrs(&[("dynamic", "true"), (key, value)]), "model").unwrap_err();
            assert!(e.message.contains(key) && e.message.contains(says), "{key}={value}: {}", e.message);
        }
        // A limit without `dynamic: "true"` is a mistake.
        let e = dynamic_plugins(&attrs(&[("dynamicMaxMounts", "4")]), "model").unwrap_err();
        assert!(e.message.contains("dynamicMaxMounts is set but dynamic is not"), "{}", e.message);
        assert!(DYNAMIC_LIMIT_KEYS.iter().all(|k| is_reserved(k)), "plugins never see them");
    }
}
