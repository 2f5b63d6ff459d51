//! A host daemon's claim on its state directory, and the instance id that names what it owns
//! outside it.
//!
//! - **One daemon per state directory.** `mounthost host` (and `local`) holds an exclusive
//!   `flock` on `<state-dir>/host.lock` for its whole life; the kernel releases it when the
//!   process ends, kill -9 included. A second daemon started on the same directory (the surge
//!   pod of a rolling update with `maxSurge: 1`) stands by until the lock is free instead of
//!   reconciling, listening or sweeping beside a live writer of the same records.
//! - **An instance id per state directory.** `<state-dir>/instance.json`
//!   (`{"version":1,"instance":"<16 hex>"}`, mode 0600) is made once, from the kernel's random
//!   source, by the first daemon that holds the lock, and read by every later one. The daemon's
//!   cgroup parent is derived from it (`<cgroup-parent>-<instance>`, `Config::own_cgroup_parent`),
//!   so two daemons with different state directories (a test run beside a node's daemon, a second
//!   driver instance) never list, sweep or kill each other's FUSE processes, even when both are
//!   given the same `--cgroup-parent` or the same state directory *path* in different mount
//!   namespaces. The id follows the directory's content: the next pod of a rolling update reads
//!   the same file and owns what the last one recorded.
//!
//! The lock file holds the holder's pid, for the standby's log line only; the lock itself is the
//! `flock`. Both files are opened without following links (`O_NOFOLLOW`) in the daemon's
//! private state directory.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;
use serde::{Deserialize, Serialize};

/// The lock file, in the state directory.
pub const LOCK_FILE: &str = "host.lock";
/// The instance id's file, in the state directory.
pub const INSTANCE_FILE: &str = "instance.json";
/// The instance file's schema version.
pub const INSTANCE_SCHEMA_VERSION: u32 = 1;

/// The held lock: released when dropped, or when the process ends.
#[derive(Debug)]
pub struct StateDirLock {
    _file: File,
    path: PathBuf,
}

impl StateDirLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What [`try_lock`] found.
#[derive(Debug)]
pub enum Claim {
    /// This process holds the state directory now.
    Held(StateDirLock),
    /// Another process holds it; its pid, as it wrote it.
    Busy { path: PathBuf, holder: Option<u32> },
}

fn open_nofollow(path: &Path, create: bool) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(create)
        .create(create)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
}

/// Try to take `<state_dir>/host.lock` (created if missing) without waiting.
pub fn try_lock(state_dir: &Path) -> io::Result<Claim> {
    let path = state_dir.join(LOCK_FILE);
    let mut file = open_nofollow(&path, true)
        .map_err(|e| io::Error::new(e.kind(), format!("opening the state directory's lock {}: {e}", path.display())))?;
    match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {
            file.set_len(0)?;
            file.write_all(format!("{}\n", std::process::id()).as_bytes())?;
            Ok(Claim::Held(StateDirLock { _file: file, path }))
        }
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let mut text = String::new();
            let holder = file.read_to_string(&mut text).ok().and_then(|_| text.trim().parse().ok());
            Ok(Claim::Busy { path, holder })
        }
        Err(e) => Err(io::Error::new(
            io::Error::from(e).kind(),
            format!("locking the state directory's lock {}: {e}", path.display()),
        )),
    }
}

/// The instance file's content.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct InstanceFile {
    version: u32,
    instance: String,
}

fn valid_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The instance id kept in `state_dir`, if one was made.
pub fn read_instance_id(state_dir: &Path) -> io::Result<Option<String>> {
    let path = state_dir.join(INSTANCE_FILE);
    let mut text = String::new();
    match open_nofollow(&path, false) {
        Ok(mut f) => f.read_to_string(&mut text)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io::Error::new(e.kind(), format!("reading {}: {e}", path.display()))),
    };
    let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {why}", path.display()));
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    match doc.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) if v > u64::from(INSTANCE_SCHEMA_VERSION) => {
            return Err(bad(format!(
                "schema version {v}, written by a newer mounthost; this daemon reads version {INSTANCE_SCHEMA_VERSION}"
            )));
        }
        _ => {}
    }
    let file: InstanceFile = serde_json::from_value(doc).map_err(|e| bad(e.to_string()))?;
    if !valid_id(&file.instance) {
        return Err(bad(format!("{:?} is not an instance id (16 lowercase hex digits)", file.instance)));
    }
    Ok(Some(file.instance))
}

/// The instance id of `state_dir`, made (and written atomically) the first time. Call it only
/// while holding the state directory's lock, so two daemons never make two ids.
pub fn instance_id(_held: &StateDirLock, state_dir: &Path) -> io::Result<String> {
    if let Some(id) = read_instance_id(state_dir)? {
        return Ok(id);
    }
    let mut random = [0u8; 8];
    File::open("/dev/urandom")?.read_exact(&mut random)?;
    let id = hex::encode(random);
    let json = serde_json::to_vec(&InstanceFile { version: INSTANCE_SCHEMA_VERSION, instance: id.clone() })
        .expect("plain data serializes");
    let path = state_dir.join(INSTANCE_FILE);
    let tmp = state_dir.join(format!(".{INSTANCE_FILE}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&tmp)?;
    f.write_all(&json)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    File::open(state_dir)?.sync_all()?;
    Ok(id)
}

/// The cgroups of the host daemon whose state directory is `state_dir` and whose
/// `--cgroup-parent` is `parent`, for tests, benchmarks and tools that look at or clean up after
/// a daemon: its own parent once it has made its instance id; none before.
pub fn daemon_cgroups(state_dir: &Path, parent: &str) -> super::cgroup::Cgroups {
    match read_instance_id(state_dir) {
        Ok(Some(id)) => super::cgroup::Cgroups::detect(&format!("{parent}-{id}")),
        _ => super::cgroup::Cgroups::none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_the_lock_goes_with_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let Claim::Held(held) = try_lock(dir.path()).unwrap() else { panic!("a free directory is taken") };
        // flock locks belong to the open file: a second open, even in this process, is refused.
        match try_lock(dir.path()).unwrap() {
            Claim::Busy { holder, path } => {
                assert_eq!(holder, Some(std::process::id()));
                assert_eq!(path, dir.path().join(LOCK_FILE));
            }
            Claim::Held(_) => panic!("two holders"),
        }
        drop(held);
        assert!(matches!(try_lock(dir.path()).unwrap(), Claim::Held(_)), "free again once dropped");
    }

    #[test]
    fn a_link_planted_as_the_lock_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(LOCK_FILE)).unwrap();
        assert!(try_lock(dir.path()).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }

    #[test]
    fn the_instance_id_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_instance_id(dir.path()).unwrap(), None);
        let Claim::Held(held) = try_lock(dir.path()).unwrap() else { panic!() };
        let id = instance_id(&held, dir.path()).unwrap();
        assert!(valid_id(&id), "{id}");
        assert_eq!(instance_id(&held, dir.path()).unwrap(), id, "read back, not made again");
        assert_eq!(read_instance_id(dir.path()).unwrap(), Some(id.clone()));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(INSTANCE_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let other = tempfile::tempdir().unwrap();
        let Claim::Held(held2) = try_lock(other.path()).unwrap() else { panic!() };
        assert_ne!(instance_id(&held2, other.path()).unwrap(), id, "another directory, another instance");
    }

    #[test]
    fn a_newer_or_damaged_instance_file_stops_the_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(INSTANCE_FILE);
        std::fs::write(&path, br#"{"version":2,"instance":"0123456789abcdef","more":true}"#).unwrap();
        let err = read_instance_id(dir.path()).unwrap_err().to_string();
        assert!(err.contains("schema version 2, written by a newer mounthost"), "{err}");
        std::fs::write(&path, br#"{"version":1,"instance":"../../x"}"#).unwrap();
        assert!(read_instance_id(dir.path()).unwrap_err().to_string().contains("is not an instance id"));
        std::fs::write(&path, b"{").unwrap();
        assert_eq!(read_instance_id(dir.path()).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
