//! File writes with modes for unprivileged callers (the plugin compile cache, socket
//! directories): atomic replacement and private directories. The host daemon writes through
//! its executor instead ([`crate::exec::beneath`]).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Create `dir` (and parents) with mode 0700, and make sure an existing one is 0700 too.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let meta = fs::metadata(dir)?;
    if meta.permissions().mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Write `bytes` to `path` so that a reader (or a crash) sees either the old content or the
/// new, never a mix: write a temporary file beside it (mode `mode`), fsync it, rename it over
/// `path`, then fsync the directory. (A writer killed before the rename leaves its temporary,
/// `.<name>.tmp.<pid>.<n>`; the folder's files are looked up by exact name, so it is inert.)
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().ok_or_else(|| io::Error::other("path has no parent directory"))?;
    let name = path.file_name().ok_or_else(|| io::Error::other("path has no file name"))?;
    // Unique per write: two writers of one file never share (and never rename) a half-written
    // temporary file.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{}.tmp.{}.{n}", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Read `path` whole, if it is at most `max` bytes: `None` when it does not exist, an
/// `InvalidData` error when it is longer (nothing past `max + 1` bytes is read).
pub fn read_capped(path: &Path, max: u64) -> io::Result<Option<Vec<u8>>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("longer than {max} bytes")));
    }
    Ok(Some(bytes))
}

/// The kernel's hostname, if it has one.
pub fn hostname() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).ok().filter(|s| !s.is_empty())
}

/// Remove a file; a file that is already gone is not an error (every caller is idempotent).
pub fn remove_file(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_sets_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
        remove_file(&p).unwrap();
        remove_file(&p).expect("already gone is fine");
        assert!(!p.exists());
    }

    #[test]
    fn capped_reads_stop_past_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        assert!(read_capped(&p, 4).unwrap().is_none(), "missing: None");
        fs::write(&p, b"four").unwrap();
        assert_eq!(read_capped(&p, 4).unwrap().as_deref(), Some(&b"four"[..]));
        fs::write(&p, b"fives").unwrap();
        assert_eq!(read_capped(&p, 4).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn private_dir_tightens_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a/b");
        fs::create_dir_all(&p).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&p).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o700);
    }
}
