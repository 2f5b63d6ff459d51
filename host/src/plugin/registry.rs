//! Finding plugins by name (optionally pinned by digest): the folder, then the stock plugins.
//!
//! A lookup by name rescans the folder when it changed since the last scan (the folder is
//! watched; where it cannot be, every lookup rescans), which costs a directory read and one
//! `stat` per file: a file whose size, mtime or inode changed is read, hashed and loaded again,
//! so a new or replaced `.wasm` is used for the next volume without a restart. Every digest
//! ever loaded stays resolvable by digest for the life of the process, so volumes staged with
//! an older version keep planning with it, and a lookup pinned to a loaded digest (every call
//! after a volume's stage) touches no file at all. Builds pulled by OCI reference are indexed
//! too, but a name never finds one ([`PluginRuntime::resolve`]): only their reference does.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{info, warn};

use super::calls::InfoCall;
use super::contract::{Contract, PLUGIN_PACKAGE};
use super::digest::Digest;
use super::file_access::Stamp;
use super::info::{self, PluginInfo};
use super::plugin_error::PluginError;
use super::{LoadedPlugin, PlannerPre, PluginRuntime, imports};

/// What the runtime has loaded.
#[derive(Default)]
pub(super) struct Index {
    by_digest: HashMap<Digest, Arc<LoadedPlugin>>,
    /// Builds loaded only because they were pulled by OCI reference (no folder file or stock
    /// plugin has those bytes): resolvable by their digest through [`PluginRuntime::loaded_pulled`]
    /// alone, never by name.
    pulled_only: HashSet<Digest>,
    stock: HashMap<&'static str, Arc<LoadedPlugin>>,
    files: BTreeMap<PathBuf, FileEntry>,
}

struct FileEntry {
    stamp: Stamp,
    loaded: Result<Arc<LoadedPlugin>, String>,
}

impl PluginRuntime {
    /// The current plugin called `name`, or the one at `digest` when pinned. Never a build that
    /// was only pulled by OCI reference: those are selected by their reference (a volume records
    /// it as its `source`), so a name, with or without a digest, cannot reach one, and what a
    /// volume selected by name runs is found again by name after a restart.
    pub async fn resolve(&self, name: &str, digest: Option<&str>) -> Result<Arc<LoadedPlugin>, PluginError> {
        let pinned = match digest {
            Some(d) => Some(Digest::parse(d).ok_or_else(|| PluginError::BadDigest(d.into()))?),
            None => None,
        };
        let mut index = self.index.lock().await;
        let by_name = |index: &Index, d: &Digest| {
            index.by_digest.get(d).filter(|p| p.info.name == name && !index.pulled_only.contains(d)).cloned()
        };
        // Pinned to a digest already loaded: no file is looked at.
        if let Some(p) = pinned.as_ref().and_then(|d| by_name(&index, d)) {
            return Ok(p);
        }
        self.rescan(&mut index).await;
        let current = self.current(&mut index, name).await?;
        let Some(pinned) = pinned else {
            return current.ok_or_else(|| self.unknown(&index, name));
        };
        match by_name(&index, &pinned) {
            Some(p) => Ok(p),
            _ if current.is_none() => Err(self.unknown(&index, name)),
            _ => {
                let known: BTreeSet<String> = index
                    .by_digest
                    .iter()
                    .filter(|(d, p)| p.info.name == name && !index.pulled_only.contains(*d))
                    .map(|(d, _)| d.to_string())
                    .collect();
                Err(PluginError::UnknownDigest {
                    name: name.into(),
                    digest: pinned.to_string(),
                    known: known.into_iter().collect::<Vec<_>>().join(", "),
                })
            }
        }
    }

    /// Every plugin a StorageClass can select now, by name (loads the stock ones).
    pub async fn list(&self) -> Vec<Arc<LoadedPlugin>> {
        let mut index = self.index.lock().await;
        self.rescan(&mut index).await;
        let mut out = Vec::new();
        for name in self.known_names(&index) {
            match self.current(&mut index, &name).await {
                Ok(Some(p)) => out.push(p),
                Ok(None) => {}
                Err(e) => warn!(%e, "stock plugin does not load"),
            }
        }
        out
    }

    /// Load one `.wasm` file outside the folder (for `mounthost plugin info FILE`).
    pub async fn load_file(&self, path: &Path) -> Result<Arc<LoadedPlugin>, PluginError> {
        let bytes = self
            .read(path)
            .await
            .map_err(|e| PluginError::Load { origin: path.display().to_string(), reason: e.to_string() })?;
        let mut index = self.index.lock().await;
        self.load(&mut index, bytes, path.display().to_string()).await
    }

    fn known_names(&self, index: &Index) -> BTreeSet<String> {
        let files = index.files.values().filter_map(|f| f.loaded.as_ref().ok());
        files.map(|p| p.info.name.clone()).chain(self.config.stock.iter().map(|s| s.name.to_string())).collect()
    }

    fn unknown(&self, index: &Index, name: &str) -> PluginError {
        let mut known = self.known_names(index).into_iter().collect::<Vec<_>>().join(", ");
        if index.pulled_only.iter().filter_map(|d| index.by_digest.get(d)).any(|p| p.info.name == name) {
            known.push_str(&format!(
                " (a plugin called {name:?} was pulled by OCI reference, but such a plugin is selected only by \
                 its reference, plugin: oci://REGISTRY/REPOSITORY@sha256:<manifest>, never by its name)"
            ));
        }
        if !self.config.stock.iter().any(|s| s.name == name) && crate::stock::names().contains(&name) {
            known.push_str(&format!(" ({name:?} is a stock plugin this host does not offer: see --stock-plugins)"));
        }
        PluginError::UnknownPlugin { name: name.into(), known }
    }

    /// The folder's plugin called `name` (first file in name order), else the stock one.
    async fn current(&self, index: &mut Index, name: &str) -> Result<Option<Arc<LoadedPlugin>>, PluginError> {
        let from_folder = index.files.values().find_map(|f| match &f.loaded {
            Ok(p) if p.info.name == name => Some(p.clone()),
            _ => None,
        });
        if from_folder.is_some() {
            return Ok(from_folder);
        }
        if let Some(p) = index.stock.get(name) {
            return Ok(Some(p.clone()));
        }
        let Some(stock) = self.config.stock.iter().find(|s| s.name == name).copied() else {
            return Ok(None);
        };
        let p = self.load(index, stock.wasm.to_vec(), format!("stock:{}", stock.name)).await?;
        if p.info.name != stock.name {
            return Err(PluginError::Load {
                origin: p.origin.clone(),
                reason: format!("it calls itself {:?}, expected {:?}", p.info.name, stock.name),
            });
        }
        index.stock.insert(stock.name, p.clone());
        Ok(Some(p))
    }

    /// A file's bytes, read off the async workers.
    async fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        let (files, path) = (self.config.files.clone(), path.to_path_buf());
        tokio::task::spawn_blocking(move || files.read(&path)).await.map_err(std::io::Error::other)?
    }

    /// Bring `index.files` in line with the folder, if it changed since the last scan.
    async fn rescan(&self, index: &mut Index) {
        let Some(dir) = &self.config.plugin_dir else { return };
        if self.config.files.changed(dir) == Some(false) {
            return;
        }
        // The readdir and stats stay inline: they cost less than a blocking-pool hop.
        let entries = match self.config.files.scan(dir) {
            Ok(e) => e,
            Err(e) => {
                if !index.files.is_empty() || e.kind() != std::io::ErrorKind::NotFound {
                    warn!(dir = %dir.display(), %e, "cannot read the plugin folder");
                }
                index.files.clear();
                return;
            }
        };
        let mut seen = BTreeSet::new();
        for (path, stamp) in entries {
            seen.insert(path.clone());
            if index.files.get(&path).is_some_and(|f| f.stamp == stamp) {
                continue;
            }
            // A changed file is read in full (hundreds of KiB): off the async workers.
            let loaded = match self.read(&path).await {
                Ok(bytes) => self.load(index, bytes, path.display().to_string()).await,
                Err(e) => Err(PluginError::Load { origin: path.display().to_string(), reason: e.to_string() }),
            };
            let loaded = match loaded {
                Ok(p) => {
                    info!(path = %path.display(), plugin = %p.info.name, version = %p.info.version,
                        digest = %p.digest, contract = %p.contract(), "plugin loaded from folder");
                    Ok(p)
                }
                Err(e) => {
                    warn!(%e, "plugin in folder not loaded");
                    Err(e.to_string())
                }
            };
            index.files.insert(path, FileEntry { stamp, loaded });
        }
        index.files.retain(|path, _| seen.contains(path));
    }

    /// The build at `digest` for a volume that pulled it by OCI reference, if loaded, checked
    /// against the folder and the stock plugins now (see [`Self::load_pulled`]).
    pub async fn loaded_pulled(&self, digest: &Digest) -> Result<Option<Arc<LoadedPlugin>>, PluginError> {
        let mut index = self.index.lock().await;
        self.rescan(&mut index).await;
        let Some(p) = index.by_digest.get(digest).cloned() else { return Ok(None) };
        self.not_shadowing(&index, &p)?;
        Ok(Some(p))
    }

    /// Load a plugin pulled from a registry (`origin`: its pinned reference), already verified
    /// by the caller. It is resolvable by its digest through [`Self::loaded_pulled`] from then
    /// on, never by its name (a name selects the folder's or the stock plugin). Grants are by
    /// name, so one whose `info` reports the name of a stock plugin or of a plugin in the
    /// folder is refused: it would run with that plugin's grants. The check runs on every call,
    /// also for a build loaded before: a folder plugin of that name that appeared since makes
    /// it refused from then on. Bytes that are a folder or stock build are that plugin.
    ///
    /// The component is compiled (or fetched from the compile cache) and described without the
    /// index's lock, so other lookups go on meanwhile; two first loads of one build at once may
    /// both compile it, and the first to finish is indexed.
    pub async fn load_pulled(&self, bytes: Vec<u8>, origin: String) -> Result<Arc<LoadedPlugin>, PluginError> {
        let digest = Digest::of(&bytes);
        if let Some(p) = self.loaded_pulled(&digest).await? {
            return Ok(p);
        }
        let prepared = self.prepare(bytes, digest.clone(), origin).await?;
        let mut index = self.index.lock().await;
        self.rescan(&mut index).await;
        if let Some(p) = index.by_digest.get(&digest).cloned() {
            // Indexed meanwhile (another load, or a folder file with these bytes).
            self.not_shadowing(&index, &p)?;
            return Ok(p);
        }
        index.pulled_only.insert(digest.clone());
        if let Err(e) = self.not_shadowing(&index, &prepared) {
            index.pulled_only.remove(&digest);
            return Err(e);
        }
        index.by_digest.insert(digest, prepared.clone());
        Ok(prepared)
    }

    /// Refuse a build only pulled whose name is that of a stock plugin or of a folder plugin.
    fn not_shadowing(&self, index: &Index, plugin: &LoadedPlugin) -> Result<(), PluginError> {
        if !index.pulled_only.contains(&plugin.digest) {
            // The folder's or a stock build itself.
            return Ok(());
        }
        let name = plugin.info.name.as_str();
        let owner = if self.config.stock.iter().any(|s| s.name == name) {
            Some("a stock plugin".to_string())
        } else {
            index.files.iter().find_map(|(path, f)| match &f.loaded {
                Ok(p) if p.info.name == name => Some(format!("the plugin folder's {}", path.display())),
                _ => None,
            })
        };
        match owner {
            Some(owner) => Err(PluginError::Shadows { origin: plugin.origin.clone(), name: name.to_string(), owner }),
            None => Ok(()),
        }
    }

    /// Compile (or fetch from cache), check, describe and index one component.
    /// A build pulled before is, from now on, also this file's or stock plugin's.
    async fn load(&self, index: &mut Index, bytes: Vec<u8>, origin: String) -> Result<Arc<LoadedPlugin>, PluginError> {
        let digest = Digest::of(&bytes);
        if let Some(p) = index.by_digest.get(&digest) {
            index.pulled_only.remove(&digest);
            return Ok(p.clone());
        }
        let plugin = self.prepare(bytes, digest, origin).await?;
        index.by_digest.insert(plugin.digest.clone(), plugin.clone());
        Ok(plugin)
    }

    /// Compile (or fetch from cache), check, and describe one component (`digest` is its
    /// bytes' own, hashed once by the caller), without indexing it.
    async fn prepare(&self, bytes: Vec<u8>, digest: Digest, origin: String) -> Result<Arc<LoadedPlugin>, PluginError> {
        let load_err = |reason: String| PluginError::Load { origin: origin.clone(), reason };
        let (engine, cache, d) = (self.engine.clone(), self.cache.clone(), digest.clone());
        let (component, obtained) = tokio::task::spawn_blocking(move || cache.load_or_compile(&engine, &d, &bytes))
            .await
            .map_err(|e| load_err(e.to_string()))?
            .map_err(|e| load_err(format!("not a valid component: {e:#}")))?;
        let contract = Contract::detect(&self.engine, &component);
        // Imports first: a component importing what plugins may not is refused for that alone.
        let refused = imports::refused(&self.engine, &component, contract.unwrap_or(Contract::CURRENT));
        if !refused.is_empty() {
            return Err(PluginError::ForbiddenImports { origin, imports: refused });
        }
        let Some(contract) = contract else {
            return Err(load_err(format!(
                "it is not a mounthost plugin: it exports no {} interface",
                Contract::known_exports()
            )));
        };
        let not_world = |e: wasmtime::Error| {
            load_err(format!("it does not implement world {PLUGIN_PACKAGE}/plugin@{contract}: {e:#}"))
        };
        let pre = self.linker.instantiate_pre(&component).map_err(not_world)?;
        let pre = PlannerPre::new(contract, pre).map_err(not_world)?;
        let defaults = self.config.default_limits;
        let info: PluginInfo =
            self.invoke(&pre, &origin, defaults, "", InfoCall).await.map_err(|e| load_err(e.to_string()))?.into();
        if !info::valid_name(&info.name) {
            return Err(load_err(format!(
                "its name {:?} is not 1-63 lowercase letters, digits or dashes starting with a letter",
                info.name
            )));
        }
        let limits = self.config.limits.get(&info.name).copied().unwrap_or(defaults);
        crate::metrics::global().plugin_loaded(&info.name, matches!(obtained, super::cache::Obtained::Cached));
        Ok(Arc::new(LoadedPlugin { info, digest, origin, limits, obtained, pre }))
    }
}
