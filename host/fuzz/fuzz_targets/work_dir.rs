//! A work directory of one fuzz process, on tmpfs where there is one (included by the targets
//! that write files: `#[path = "work_dir.rs"] mod work_dir;`).
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `mounthost-fuzz-<name>-<pid>` below /dev/shm (or the temp dir), emptied once per process,
/// with the sub-directories `subdirs` made.
pub fn work(name: &str, subdirs: &[&str]) -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        let dir = base.join(format!("mounthost-fuzz-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for sub in subdirs {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        dir
    })
}
