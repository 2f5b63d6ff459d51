//! The file access the plugin runtime needs, supplied by its owner: the runtime itself has no
//! effects of its own (it compiles and runs sandboxed planners), so the folder it loads
//! plugins from and the cache it keeps compiled ones in are reached through [`PluginFiles`].
//! `unpriv::plugin_files::Disk` is the real one.

use std::io;
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

/// What identifies one version of a plugin file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Size in bytes.
    pub len: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Inode.
    pub ino: u64,
}

/// Plugin files and compiled artifacts.
pub trait PluginFiles: Send + Sync + 'static {
    /// The `.wasm` files in `dir` (regular files, links followed) with their stamps.
    fn scan(&self, dir: &Path) -> io::Result<Vec<(PathBuf, Stamp)>>;
    /// Whether `dir` may have changed since the last call: `Some(false)` only when a watch on
    /// it reported nothing; `None` when it cannot be watched (the caller rescans every time).
    fn changed(&self, dir: &Path) -> Option<bool>;
    /// A file's bytes.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// A compiled artifact this host wrote earlier: `None` if there is none, an error if one
    /// exists but is not trusted or does not fit this engine.
    fn load_compiled(&self, engine: &Engine, path: &Path) -> Option<Result<Component, String>>;
    /// Keep a compiled artifact: mode 0600 in a private directory, replaced atomically.
    fn save_compiled(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
}
