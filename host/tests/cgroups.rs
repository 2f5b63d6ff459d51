//! Per-volume cgroups on this machine's real hierarchy (hybrid here: v1 memory; v2 where the
//! unified hierarchy has the memory controller). Each test uses a parent of its own and
//! removes it.

use std::path::Path;
use std::time::{Duration, Instant};

use mounthost::exec::cgroup::Cgroups;
use mounthost::exec::process::{self, ProcessId, Spec};

/// A parent of its own for one test, removed on drop (after its groups).
struct Parent {
    cgroups: Cgroups,
}

impl Parent {
    fn new(test: &str) -> Parent {
        let cgroups = Cgroups::detect(&format!("mounthost-test-{test}-{}", std::process::id()));
        assert!(cgroups.version().is_some(), "this machine has a memory cgroup controller (BACKENDS.md)");
        Parent { cgroups }
    }

    /// The group `name` below this parent, as groups are named (relative to the hierarchy).
    fn g(&self, name: &str) -> String {
        self.cgroups.group(name)
    }

    fn spawn(&self, name: &str, limit: Option<u64>, script: &str, log: &Path) -> ProcessId {
        let procs = self.cgroups.prepare(&self.g(name), limit).unwrap();
        let args = vec!["-c".to_string(), script.to_string()];
        let env = [("PATH".to_string(), "/usr/bin:/bin".to_string())];
        process::spawn(&Spec { executable: Path::new("/bin/sh"), args: &args, env: &env, log }, procs.as_ref()).unwrap()
    }
}

impl Drop for Parent {
    fn drop(&mut self) {
        for g in self.cgroups.groups().unwrap_or_default() {
            let _ = self.cgroups.release(&g);
        }
        self.cgroups.remove_parent();
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < until, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_process_and_everything_it_forks_live_in_the_group_and_die_with_it() {
    let p = Parent::new("members");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    // A helper that leaves the session (like a daemonizing FUSE program) is still in the group.
    let id = p.spawn("vol-a", None, "setsid sleep 300 & echo started; exec sleep 300", &log);
    // Both in the group, and the helper already in a session of its own (setsid done).
    let session = |pid: i32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(3)?.parse::<i32>().ok())
    };
    wait_until("both processes are in the group, the helper in its own session", || {
        let members = p.cgroups.procs(&p.g("vol-a")).unwrap();
        members.len() == 2 && members.iter().any(|m| *m != id.pid && session(*m) == Some(*m))
    });
    let members = p.cgroups.procs(&p.g("vol-a")).unwrap();
    assert!(members.contains(&id.pid), "{members:?}");
    let own = std::fs::read_to_string(format!("/proc/{}/cgroup", id.pid)).unwrap();
    assert!(own.contains("/vol-a"), "the kernel places it in the group: {own}");
    assert_eq!(p.cgroups.groups().unwrap(), vec![p.g("vol-a")]);
    // In every hierarchy the kernel lists for it (v1: each controller, `name=systemd`, the
    // hybrid layout's unified one): a container runtime that kills its own group, whichever
    // hierarchy it reads, cannot reach it.
    let group = format!("/{}", p.g("vol-a"));
    let lines: Vec<&str> = own.lines().collect();
    assert!(
        lines.iter().all(|l| l.rsplit_once(':').is_some_and(|(_, path)| path == group)),
        "not in {group} in every hierarchy: {own}"
    );
    let hierarchies = p.cgroups.other_hierarchies();
    if p.cgroups.version() == Some(mounthost::exec::cgroup::Version::V1) {
        assert!(!hierarchies.is_empty() && lines.len() == hierarchies.len() + 1, "{hierarchies:?}\n{own}");
    }

    // Stopping the session leader leaves the escaped helper; releasing the group kills it.
    process::stop(&id, Duration::from_secs(2)).unwrap();
    let left = p.cgroups.procs(&p.g("vol-a")).unwrap();
    assert_eq!(left.len(), 1, "the helper outlived its session leader: {left:?}");
    assert_eq!(p.cgroups.release(&p.g("vol-a")).unwrap(), 1);
    assert!(!Path::new(&format!("/proc/{}", left[0])).exists() || !alive(left[0]), "helper killed");
    assert!(p.cgroups.groups().unwrap().is_empty(), "the group is removed");
    for h in &hierarchies {
        assert!(!h.join(p.g("vol-a")).exists(), "removed in {} too", h.display());
    }
    assert_eq!(p.cgroups.release(&p.g("vol-a")).unwrap(), 0, "releasing a missing group is fine");
    println!(
        "cgroups checked: 2 members in {} hierarchies, 1 escaped helper killed, 0 groups left",
        hierarchies.len() + 1
    );
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

#[test]
fn an_oom_in_one_volume_kills_only_that_volume() {
    let p = Parent::new("oom");
    let dir = tempfile::tempdir().unwrap();
    let limit = 32 << 20;
    // The neighbour has no limit and keeps running.
    let neighbour = p.spawn("vol-b", None, "exec sleep 300", &dir.path().join("b.log"));
    // Allocates and touches 256 MiB, 8 times its limit.
    let hog = p.spawn(
        "vol-a",
        Some(limit),
        "exec python3 -c 'b = bytearray(256 << 20); print(\"survived\", flush=True)'",
        &dir.path().join("a.log"),
    );
    wait_until("the hog is gone", || {
        let _ =
            nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(hog.pid), Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        !process::is_alive(&hog)
    });
    let oom = p.cgroups.oom_kills(&p.g("vol-a")).unwrap();
    assert!(oom >= 1, "the OOM killer struck in vol-a's group");
    assert!(!std::fs::read_to_string(dir.path().join("a.log")).unwrap().contains("survived"));
    assert!(process::is_alive(&neighbour), "the other volume's process is untouched");
    assert_eq!(p.cgroups.oom_kills(&p.g("vol-b")), Some(0));
    process::stop(&neighbour, Duration::from_secs(2)).unwrap();
    println!("cgroups checked: limit {limit} bytes, {oom} OOM kill(s) in vol-a, 0 in vol-b, neighbour alive");
}

#[test]
fn a_limit_is_set_and_cleared_on_the_group() {
    let p = Parent::new("limit");
    let version = p.cgroups.version().unwrap();
    let file = match version {
        mounthost::exec::cgroup::Version::V2 => "memory.max",
        mounthost::exec::cgroup::Version::V1 => "memory.limit_in_bytes",
    };
    let read = || std::fs::read_to_string(p.cgroups.parent_dir().unwrap().join("vol").join(file)).unwrap();
    drop(p.cgroups.prepare(&p.g("vol"), Some(64 << 20)).unwrap());
    assert_eq!(read().trim(), (64u64 << 20).to_string());
    // A restage without a limit must not keep the old one.
    drop(p.cgroups.prepare(&p.g("vol"), None).unwrap());
    let unlimited = read();
    assert!(unlimited.trim() == "max" || unlimited.trim().parse::<u64>().unwrap() > 1 << 50, "{unlimited}");
    assert_eq!(p.cgroups.release(&p.g("vol")).unwrap(), 0);
}
