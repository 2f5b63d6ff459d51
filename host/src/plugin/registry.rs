//! Finding plugins by name (optionally pinned by digest): the folder, then the stock plugins.
//!
//! A lookup by name rescans the folder when it changed since the last scan (the folder is
//! watched; where it cannot be, every lookup rescans), which costs a directory read and one
//! `stat` per file: a file whose size, mtime or inode changed is read, hashed and loaded again,
//! so a new or replaced `.wasm` is used for the next volume without a restart. Every digest
//! ever loaded stays resolvable by digest for the life of the process, so volumes staged with
//! an older version keep planning with it, and a lookup pinned to a loaded digest (every call
//! after a volume's stage) touches no file at all.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{info, warn};

use super::calls::InfoCall;
use super::contract::{Contract, PLUGIN_PACKAGE};
use super::digest::Digest;
use super::file_access::Stamp;
use super::info::{self, PluginInfo};
use super::plugin_error::PluginError;
use super::{LoadedPlugin, PlannerPre, PluginRuntime, bindings, bindings_v010, imports};

/// What the runtime has loaded.
#[derive(Default)]
pub(super) struct Index {
    by_digest: HashMap<Digest, Arc<LoadedPlugin>>,
    stock: HashMap<&'static str, Arc<LoadedPlugin>>,
    files: BTreeMap<PathBuf, FileEntry>,
}

struct FileEntry {
    stamp: Stamp,
    loaded: Result<Arc<LoadedPlugin>, String>,
}

impl PluginRuntime {
    /// The current plugin called `name`, or the one at `digest` when pinned.
    pub async fn resolve(&self, name: &str, digest: Option<&str>) -> Result<Arc<LoadedPlugin>, PluginError> {
        let pinned = match digest {
            Some(d) => Some(Digest::parse(d).ok_or_else(|| PluginError::BadDigest(d.into()))?),
            None => None,
        };
        let mut index = self.index.lock().await;
        // Pinned to a digest already loaded: no file is looked at.
        if let Some(p) = pinned.as_ref().and_then(|d| index.by_digest.get(d)).filter(|p| p.info.name == name) {
            return Ok(p.clone());
        }
        self.rescan(&mut index).await;
        let current = self.current(&mut index, name).await?;
        let Some(pinned) = pinned else {
            return current.ok_or_else(|| self.unknown(&index, name));
        };
        match index.by_digest.get(&pinned) {
            Some(p) if p.info.name == name => Ok(p.clone()),
            _ if current.is_none() => Err(self.unknown(&index, name)),
            _ => {
                let known: BTreeSet<String> =
                    index.by_digest.values().filter(|p| p.info.name == name).map(|p| p.digest.to_string()).collect();
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
        let known = self.known_names(index).into_iter().collect::<Vec<_>>().join(", ");
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

    /// Compile (or fetch from cache), check, and describe one component.
    async fn load(&self, index: &mut Index, bytes: Vec<u8>, origin: String) -> Result<Arc<LoadedPlugin>, PluginError> {
        let digest = Digest::of(&bytes);
        if let Some(p) = index.by_digest.get(&digest) {
            return Ok(p.clone());
        }
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
        let pre = match contract {
            Contract::V010 => PlannerPre::V010(bindings_v010::PluginPre::new(pre).map_err(not_world)?),
            Contract::V020 => PlannerPre::V020(bindings::PluginPre::new(pre).map_err(not_world)?),
        };
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
        let plugin = Arc::new(LoadedPlugin { info, digest: digest.clone(), origin, limits, obtained, pre });
        index.by_digest.insert(digest, plugin.clone());
        Ok(plugin)
    }
}
