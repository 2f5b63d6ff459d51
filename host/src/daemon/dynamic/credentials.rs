//! The registry credentials of a dynamic volume's mounts.
//!
//! A pod's request carries no secret, and the plugin's `dynamic-mount` plan gets none (its
//! `resolve` step is anonymous). The host gives a mount the volume's own CSI secrets, the
//! secrets of its NodePublishVolume or, when that carried none, of its NodeStageVolume, but
//! only for the registries the volume's StorageClass names:
//!
//! - the hosts its attributes grant ([`crate::plan::policy::endpoint_hosts`]: for `model`, the
//!   registry of `reference` and the `mirror`), of a volume whose attributes an administrator
//!   wrote (a StorageClass or PersistentVolume; an inline volume's are the pod author's and
//!   name none), for a mount of the volume's own plugin (another plugin sees none of them);
//! - a mount whose reference's registry and the host the pull reaches (its mirror, or the
//!   node's `--registry-mirror` for it) are both named gets them, read as a model volume's
//!   secrets are (`username` and `password`, `token`, or `.dockerconfigjson`); any other is
//!   pulled anonymously, from wherever the node's grants allow.
//!
//! CSI hands secrets over only with the call: kubelet sends NodeStageVolume's once per stage
//! and NodePublishVolume's at each publish (again and again only with `requiresRepublish`). A
//! mount planned after a host daemon restart, and a lazy mount's fetches, need them later, so
//! they are kept as lazy volumes keep theirs: `<state-dir>/secrets/<key>.dynamic.json`, 0600 in
//! a 0700 directory, written by the executor (a fresh file, fsync'd, renamed in place; no copy
//! of an earlier content stays). A publish replaces the publish part and a stage the stage part
//! (a rotated Secret reaches the next mount), an unpublish forgets the publish part, an unstage
//! the file; at start, a file no volume record claims goes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use super::super::Node;
use crate::error::Error;
use crate::oci::Source;
use crate::plan::Step;
use crate::plan::oci_ref::OciRef;
use crate::plan::url::HostGrant;
use crate::secrets::Secrets;
use crate::volume::state::VolumeState;

/// The file name of a volume's kept dynamic credentials: `<key>` + this.
const SUFFIX: &str = ".dynamic.json";
/// Its schema.
const VERSION: u32 = 1;

/// Which call's secrets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Given {
    /// NodeStageVolume's (`nodeStageSecretRef`).
    Stage,
    /// NodePublishVolume's (`nodePublishSecretRef`).
    Publish,
}

/// The kept file.
#[derive(serde::Serialize, serde::Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct Kept {
    version: u32,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    stage: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    publish: BTreeMap<String, String>,
}

/// What a volume's mounts may be given: its secrets, and the registries they go to.
#[derive(Clone, Default)]
pub(super) struct MountCredentials {
    /// The registries the volume's StorageClass names (normalised as grants are).
    named: BTreeSet<String>,
    secrets: Secrets,
}

impl std::fmt::Debug for MountCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountCredentials").field("named", &self.named).field("secrets", &self.secrets).finish()
    }
}

/// A kept file's content. A newer daemon's (after a rollback) is refused by its version, since
/// its fields may not be these; what does not parse is never quoted (it holds secrets).
fn parse_kept(bytes: &[u8]) -> Result<Kept, Error> {
    #[derive(serde::Deserialize)]
    struct Versioned {
        version: u32,
    }
    if let Ok(Versioned { version }) = serde_json::from_slice::<Versioned>(bytes)
        && version > VERSION
    {
        return Err(Error::precondition(format!(
            "are of schema {version}, newer than this daemon's {VERSION}: a newer mounthost wrote them"
        )));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| Error::internal(format!("do not parse (at line {}, column {})", e.line(), e.column())))
}

/// Do a volume's credentials go with a pull of an artifact of `registry` that reaches the host
/// `reached` (the registry, or a mirror)? Only when its StorageClass names both (`named`:
/// normalised as grants are), host and port alike: a registry named without a port is not
/// the same registry on another port.
fn entitled(named: &BTreeSet<String>, registry: &str, reached: &str) -> bool {
    let names = |host: &str| HostGrant::parse(host).is_ok_and(|g| named.contains(&g.to_string()));
    names(registry) && names(reached)
}

impl Node {
    fn dynamic_secrets_dir(&self) -> PathBuf {
        self.state_dir().join("secrets")
    }

    fn dynamic_secrets_path(&self, volume: &str) -> PathBuf {
        self.dynamic_secrets_dir().join(format!("{}{SUFFIX}", crate::volume::dirs::volume_key(volume)))
    }

    fn read_kept(&self, volume: &str) -> Result<Kept, Error> {
        let path = self.dynamic_secrets_path(volume);
        match self.inner.exec.read_file(&path).map_err(|e| super::super::pipeline::io_error(e, &path))? {
            None => Ok(Kept::default()),
            Some(bytes) => parse_kept(&bytes).map_err(|e| {
                Error::new(
                    e.kind,
                    format!("the kept credentials of volume {volume} ({}) {}", path.display(), e.message),
                )
            }),
        }
    }

    fn write_kept(&self, volume: &str, kept: &Kept) -> Result<(), Error> {
        let path = self.dynamic_secrets_path(volume);
        let exec = &self.inner.exec;
        if kept.stage.is_empty() && kept.publish.is_empty() {
            return exec.remove_entry(&path).map_err(|e| super::super::pipeline::io_error(e, &path));
        }
        let dir = self.dynamic_secrets_dir();
        exec.private_dir(&dir).map_err(|e| super::super::pipeline::io_error(e, &dir))?;
        let json = serde_json::to_vec(&Kept { version: VERSION, ..kept.clone() }).expect("strings serialize");
        exec.write_secret_file(&path, &json, 0o600).map_err(|e| super::super::pipeline::io_error(e, &path))
    }

    /// Keep `secrets` as `given` for the dynamic mounts of `volume` (replacing what that call
    /// gave before; none given forgets them). A volume whose attributes name no registry
    /// (inline) keeps nothing. Blocking, with the volume's lock held.
    pub(in crate::daemon) fn keep_dynamic_secrets(
        &self,
        volume: &str,
        ephemeral: bool,
        given: Given,
        secrets: &Secrets,
    ) -> Result<(), Error> {
        let mut kept = self.read_kept(volume)?;
        let map: BTreeMap<String, String> =
            if ephemeral { BTreeMap::new() } else { secrets.iter().map(|(k, v)| (k.into(), v.into())).collect() };
        let part = match given {
            Given::Stage => &mut kept.stage,
            Given::Publish => &mut kept.publish,
        };
        if *part == map {
            return Ok(());
        }
        *part = map;
        self.write_kept(volume, &kept)
    }

    /// Forget what `given` kept for `volume` (`None`: everything).
    pub(in crate::daemon) fn forget_dynamic_secrets(&self, volume: &str, given: Option<Given>) -> Result<(), Error> {
        let path = self.dynamic_secrets_path(volume);
        let io = |e| super::super::pipeline::io_error(e, &path);
        match given {
            // Most volumes have none: nothing is done for them.
            None if self.inner.exec.exists(&path).map_err(io)? => self.inner.exec.remove_entry(&path).map_err(io),
            None => Ok(()),
            Some(g) => self.keep_dynamic_secrets(volume, false, g, &Secrets::default()),
        }
    }

    /// At start: remove the kept credentials of volumes no record claims (`claimed`: their
    /// keys), left by a crash or by records discarded at start. Returns how many.
    pub(in crate::daemon) fn sweep_dynamic_secrets(&self, claimed: &BTreeSet<String>) -> Result<usize, Error> {
        let dir = self.dynamic_secrets_dir();
        let Ok(entries) = self.inner.exec.list_dir(&dir) else { return Ok(0) };
        let mut removed = 0;
        for e in entries.iter().filter(|e| e.is_file) {
            let name = e.name.to_string_lossy();
            let Some(key) = name.strip_suffix(SUFFIX) else { continue };
            if key.starts_with('.') || claimed.contains(key) {
                continue;
            }
            let path = dir.join(&e.name);
            tracing::warn!(path = %path.display(), "removing kept dynamic-mount credentials no volume claims");
            self.inner.exec.remove_entry(&path).map_err(|err| super::super::pipeline::io_error(err, &path))?;
            removed += 1;
        }
        Ok(removed)
    }

    /// What a mount of plugin `plugin` of the volume `st` may be given: for the volume's own
    /// plugin and a volume whose attributes name registries, its kept publish secrets, else its
    /// kept stage secrets.
    pub(super) fn mount_credentials(
        &self,
        st: &VolumeState,
        plugin: &crate::plugin::LoadedPlugin,
        own: bool,
    ) -> Result<MountCredentials, Error> {
        if !own || st.ephemeral {
            return Ok(MountCredentials::default());
        }
        let named =
            crate::plan::policy::endpoint_hosts(&plugin.info, st.context.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if named.is_empty() {
            return Ok(MountCredentials::default());
        }
        let kept = self.read_kept(&st.volume_id)?;
        let secrets = if kept.publish.is_empty() { kept.stage } else { kept.publish };
        Ok(MountCredentials { named, secrets: Secrets::new(secrets) })
    }

    /// [`Node::mount_credentials`] for mount plugin `plugin` of `st`, its build looked up.
    pub(super) async fn mount_credentials_of(&self, st: &VolumeState, plugin: &str) -> Result<MountCredentials, Error> {
        if plugin != st.plugin || st.ephemeral {
            return Ok(MountCredentials::default());
        }
        let build = self.resolve_build(&st.volume_id, &st.plugin, Some(&st.digest), st.pinned).await?;
        self.mount_credentials(st, &build, true)
    }

    /// The source of a `resolve` step of a mount of plugin `plugin` of the volume `st`
    /// ([`Node::mount_source`]): a lazy mount's session connecting again.
    pub(in crate::daemon) async fn dynamic_mount_source(
        &self,
        st: &VolumeState,
        plugin: &str,
        step: &Step,
    ) -> Result<Source, Error> {
        let creds = self.mount_credentials_of(st, plugin).await?;
        self.mount_source(step, &creds)
    }

    /// The source of a dynamic mount's `resolve` step: with the volume's credentials when the
    /// reference's registry and the host the pull reaches are both named by its StorageClass,
    /// else anonymous (the plan's own `auth`, which names no secret the mount has).
    pub(super) fn mount_source(&self, step: &Step, creds: &MountCredentials) -> Result<Source, Error> {
        let Step::Resolve { reference, mirror, insecure, .. } = step else {
            return Err(Error::internal("not a resolve step"));
        };
        let none = Secrets::default();
        if creds.secrets == none {
            return self.source(step, &none);
        }
        let parsed = OciRef::parse(reference).map_err(|e| Error::invalid(format!("reference {reference:?}: {e}")))?;
        let registry = parsed.registry();
        let reached = self.inner.artifacts.mirror_for(registry, mirror.as_deref());
        if !entitled(&creds.named, registry, reached.as_deref().unwrap_or(registry)) {
            return self.source(step, &none);
        }
        let auth = super::super::cache::pull_auth(&creds.secrets)
            .map_err(|e| Error::invalid(format!("the volume's secrets, for {registry}: {}", e.message)))?;
        let step = Step::Resolve { reference: reference.clone(), mirror: mirror.clone(), auth, insecure: *insecure };
        self.source(&step, &creds.secrets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(hosts: &[&str]) -> BTreeSet<String> {
        hosts.iter().map(|h| HostGrant::parse(h).unwrap().to_string()).collect()
    }

    #[test]
    fn credentials_go_only_where_the_storage_class_names_both_the_registry_and_the_host_reached() {
        let n = named(&["registry.example.com", "mirror.example.com:5000", "127.0.0.1:5001"]);
        assert!(entitled(&n, "registry.example.com", "registry.example.com"));
        assert!(entitled(&n, "Registry.Example.COM", "registry.example.com"), "host names are compared normalised");
        assert!(entitled(&n, "registry.example.com", "mirror.example.com:5000"), "through the named mirror");
        assert!(entitled(&n, "127.0.0.1:5001", "127.0.0.1:5001"));
        // Another registry, also through the named mirror; another port of a named host.
        assert!(!entitled(&n, "other.example.com", "other.example.com"));
        assert!(!entitled(&n, "other.example.com", "mirror.example.com:5000"));
        assert!(!entitled(&n, "127.0.0.1:5002", "127.0.0.1:5002"));
        assert!(!entitled(&n, "registry.example.com:444", "registry.example.com:444"));
        // The named registry through a mirror the StorageClass does not name (the node's).
        assert!(!entitled(&n, "registry.example.com", "node-mirror.example.com"));
        assert!(!entitled(&named(&[]), "registry.example.com", "registry.example.com"));
        assert!(!entitled(&n, "not a host", "not a host"));
    }

    #[test]
    fn the_kept_file_holds_each_call_s_secrets_apart_and_no_empty_part() {
        let kept = Kept {
            version: VERSION,
            stage: [("username".to_string(), "u".to_string())].into(),
            publish: BTreeMap::new(),
        };
        let json = serde_json::to_string(&kept).unwrap();
        assert_eq!(json, r#"{"version":1,"stage":{"username":"u"}}"#);
        let back = parse_kept(json.as_bytes()).unwrap();
        assert_eq!((back.stage, back.publish.len()), (kept.stage, 0));
        let Err(other) = parse_kept(br#"{"version":1,"other":{"password":"hunter22"}}"#) else { panic!("parsed") };
        assert_eq!(other.kind, crate::error::ErrorKind::Internal);
        let Err(newer) = parse_kept(br#"{"version":2,"publish":{"password":"hunter22"},"more":1}"#) else {
            panic!("parsed")
        };
        assert_eq!(newer.kind, crate::error::ErrorKind::FailedPrecondition);
        assert!(newer.message.contains("schema 2, newer than this daemon's 1"), "{}", newer.message);
        for e in [other, newer] {
            assert!(!e.message.contains("hunter22"), "{}", e.message);
        }
    }
}
