//! [`Disk`]: the plugin runtime's files on the real filesystem. The folder is watched with
//! inotify, so a lookup rescans it only when something in it changed; the events are read at
//! the lookup itself (non-blocking), so a file written before a lookup is always seen by it.

use std::collections::HashMap;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::{artifact, private_files};
use crate::plugin::file_access::{PluginFiles, Stamp};

/// The real filesystem.
#[derive(Debug, Default)]
pub struct Disk {
    /// An inotify descriptor per watched folder.
    watches: Mutex<HashMap<PathBuf, OwnedFd>>,
}

impl Disk {
    /// No folder watched yet.
    pub fn new() -> Self {
        Self::default()
    }
}

fn watch(dir: &Path) -> io::Result<OwnedFd> {
    let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?;
    let what = WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::ONLYDIR;
    inotify::add_watch(&fd, dir, what)?;
    Ok(fd)
}

impl PluginFiles for Disk {
    fn scan(&self, dir: &Path) -> io::Result<Vec<(PathBuf, Stamp)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.extension().is_none_or(|e| e != "wasm") {
                continue;
            }
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            if !meta.is_file() {
                continue;
            }
            let mtime_ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
            out.push((path, Stamp { len: meta.len(), mtime_ns, ino: meta.ino() }));
        }
        Ok(out)
    }

    fn changed(&self, dir: &Path) -> Option<bool> {
        let mut watches = self.watches.lock().unwrap_or_else(|p| p.into_inner());
        let Some(fd) = watches.get(dir) else {
            // First look (or the folder was replaced): watch it, and rescan once.
            return watch(dir).ok().map(|fd| {
                watches.insert(dir.to_path_buf(), fd);
                true
            });
        };
        let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = inotify::Reader::new(fd, &mut buf);
        let (mut any, mut gone) = (false, false);
        loop {
            match reader.next() {
                Ok(event) => {
                    any = true;
                    let e = event.events();
                    gone |= e.intersects(
                        ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF | ReadFlags::IGNORED | ReadFlags::QUEUE_OVERFLOW,
                    );
                }
                Err(rustix::io::Errno::AGAIN) => break,
                Err(_) => {
                    gone = true;
                    break;
                }
            }
        }
        if gone {
            watches.remove(dir);
        }
        Some(any || gone)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn load_compiled(&self, engine: &Engine, path: &Path) -> Option<Result<Component, String>> {
        if !path.exists() {
            return None;
        }
        Some(artifact::load_component(engine, path).map_err(|e| e.to_string()))
    }

    fn save_compiled(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let dir = path.parent().ok_or_else(|| io::Error::other("a cache file has a directory"))?;
        private_files::private_dir(dir)?;
        private_files::write_atomic(path, bytes, 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_folder_reports_changes_made_before_the_look() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Disk::new();
        assert_eq!(disk.changed(dir.path()), Some(true), "the first look rescans");
        assert_eq!(disk.changed(dir.path()), Some(false));
        std::fs::write(dir.path().join("a.wasm"), b"1").unwrap();
        assert_eq!(disk.changed(dir.path()), Some(true), "a new file");
        assert_eq!(disk.changed(dir.path()), Some(false));
        std::fs::write(dir.path().join("a.wasm"), b"22").unwrap();
        assert_eq!(disk.changed(dir.path()), Some(true), "rewritten in place");
        std::fs::rename(dir.path().join("a.wasm"), dir.path().join("b.wasm")).unwrap();
        assert_eq!(disk.changed(dir.path()), Some(true), "renamed");
        std::fs::remove_file(dir.path().join("b.wasm")).unwrap();
        assert_eq!(disk.changed(dir.path()), Some(true), "removed");
        assert_eq!(disk.changed(dir.path()), Some(false));
        assert_eq!(disk.changed(&dir.path().join("missing")), None, "cannot watch: rescan every time");
        assert_eq!(disk.scan(dir.path()).unwrap(), vec![]);
    }
}
