//! Spawning and stopping real processes through the executor room.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use mounthost::exec::process::{self, ProcessError, ProcessId, Spec, Stopped};

fn sh(script: &str, env: &[(String, String)], log: &Path) -> ProcessId {
    let args = vec!["-c".to_string(), script.to_string()];
    process::spawn(&Spec { executable: Path::new("/bin/sh"), args: &args, env, log }, None).unwrap()
}

fn wait_for(log: &Path, needle: &str) -> String {
    for _ in 0..500 {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{needle:?} never appeared in {}", log.display());
}

#[test]
fn a_spawned_program_has_its_own_session_only_its_env_and_a_private_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("volume.log");
    let env = [("WEED_JWT_SIGNING_KEY".to_string(), "k".to_string())];
    let id = sh("/usr/bin/env; pwd; echo to-stderr >&2; echo ready; exec sleep 30", &env, &log);
    let text = wait_for(&log, "ready");
    assert!(text.contains("WEED_JWT_SIGNING_KEY=k"), "{text}");
    assert!(!text.contains("HOME=") && !text.contains("CARGO"), "nothing inherited: {text}");
    assert!(text.contains("\n/\n") && text.contains("to-stderr"), "{text}");
    assert_eq!(std::fs::metadata(&log).unwrap().permissions().mode() & 0o777, 0o600);
    let sid = nix::unistd::getsid(Some(nix::unistd::Pid::from_raw(id.pid))).unwrap();
    assert_eq!(sid.as_raw(), id.pid, "session leader");
    assert!(process::is_alive(&id));

    assert_eq!(process::stop(&id, Duration::from_secs(5)).unwrap(), Stopped::Terminated);
    assert!(!process::is_alive(&id));
    assert!(!Path::new(&format!("/proc/{}", id.pid)).exists(), "reaped, no zombie");
    assert_eq!(process::stop(&id, Duration::from_secs(1)).unwrap(), Stopped::AlreadyGone);
}

#[test]
fn a_spawned_program_gets_stdin_stdout_and_stderr_only() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("volume.log");
    // A descriptor of this process without close-on-exec, as a careless library leaves one.
    let leaked = nix::fcntl::open(dir.path(), nix::fcntl::OFlag::O_RDONLY, nix::sys::stat::Mode::empty()).unwrap();
    // At a number of its own (dup2 leaves close-on-exec clear on the copy).
    // SAFETY: a plain syscall on descriptors this test owns.
    let high = unsafe { nix::libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&leaked), 77) };
    assert_eq!(high, 77);
    let flags = nix::fcntl::fcntl(&leaked, nix::fcntl::FcntlArg::F_GETFD).unwrap();
    assert_eq!(flags & nix::libc::FD_CLOEXEC, 0);
    // The shell lists its descriptors (the glob's own directory descriptor among them).
    let id = sh("for f in /proc/$$/fd/*; do echo \"fd ${f##*/}\"; done; echo ready; exec sleep 30", &[], &log);
    let text = wait_for(&log, "ready");
    let fds: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("fd ")).collect();
    assert!(!fds.contains(&"77"), "the daemon's descriptor reached the program: {text}");
    assert_eq!(&fds[..3], ["0", "1", "2"], "{text}");
    assert!(fds.len() <= 4, "stdin, stdout, stderr and the glob's directory at most: {text}");
    // SAFETY: closing the copy this test made.
    unsafe { nix::libc::close(77) };
    assert_eq!(process::stop(&id, Duration::from_secs(5)).unwrap(), Stopped::Terminated);
    drop(leaked);
}

#[test]
fn a_program_ignoring_sigterm_is_killed_with_its_helpers() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stubborn.log");
    // The shell ignores SIGTERM; its `sleep` helper is in the same process group.
    let id = sh("trap '' TERM; sleep 60 & echo helper=$!; wait; wait", &[], &log);
    let text = wait_for(&log, "helper=");
    let helper: i32 = text.trim().trim_start_matches("helper=").parse().unwrap();
    let helper_id = ProcessId { pid: helper, start_time: process::start_time(helper).unwrap() };
    assert_eq!(process::stop(&id, Duration::from_millis(300)).unwrap(), Stopped::Killed);
    assert!(!process::is_alive(&id));
    for _ in 0..200 {
        if !process::is_alive(&helper_id) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!process::is_alive(&helper_id), "the helper died with its group");
}

#[test]
fn a_recycled_pid_is_never_signalled() {
    let dir = tempfile::tempdir().unwrap();
    let id = sh("exec sleep 30", &[], &dir.path().join("l"));
    let stale = ProcessId { pid: id.pid, start_time: id.start_time - 1 };
    assert!(!process::is_alive(&stale));
    assert_eq!(process::stop(&stale, Duration::from_secs(1)).unwrap(), Stopped::AlreadyGone);
    assert!(process::is_alive(&id), "the real process was left alone");
    assert_eq!(process::stop(&id, Duration::from_secs(5)).unwrap(), Stopped::Terminated);
}

#[test]
fn spawn_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let spec = Spec { executable: Path::new("/nonexistent/weed"), args: &[], env: &[], log: &dir.path().join("l") };
    let err = process::spawn(&spec, None).unwrap_err();
    assert!(matches!(err, ProcessError::Spawn { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/weed"), "{err}");
    let spec = Spec { executable: Path::new("/bin/true"), args: &[], env: &[], log: &dir.path().join("no/such/dir/l") };
    assert!(matches!(process::spawn(&spec, None).unwrap_err(), ProcessError::Log { .. }));
}

/// `/bin/sh -c SCRIPT [ARG0 ARGS...]` (`sh_args`) as `uid`:`gid` with no groups, through
/// setpriv, logging to `log`.
fn spawn_as(uid: u32, gid: u32, sh_args: &[&str], log: &Path) -> process::ProcessId {
    let mut args: Vec<String> =
        ["--reuid", &uid.to_string(), "--regid", &gid.to_string(), "--clear-groups", "/bin/sh", "-c"]
            .map(str::to_string)
            .to_vec();
    args.extend(sh_args.iter().map(|a| a.to_string()));
    let spec = Spec { executable: Path::new("/usr/bin/setpriv"), args: &args, env: &[], log };
    process::spawn(&spec, None).unwrap()
}

#[test]
fn ids_in_use_lists_the_ids_live_processes_run_as() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("volume.log");
    let (uid, gid) = (2_147_400_001u32, 2_147_400_002u32);
    assert!(!process::ids_in_use().unwrap().contains(&uid));
    let id = spawn_as(uid, gid, &["echo ready; exec sleep 30"], &log);
    wait_for(&log, "ready");
    let ids = process::ids_in_use().unwrap();
    assert!(ids.contains(&uid) && ids.contains(&gid) && ids.contains(&0), "{uid} and {gid} among {} ids", ids.len());
    assert_eq!(process::stop(&id, Duration::from_secs(5)).unwrap(), Stopped::Terminated);
    assert!(!process::ids_in_use().unwrap().contains(&uid));
    // A zombie (exited, not reaped yet: its parent has not waited) holds no id.
    let zombie = spawn_as(uid, gid, &["exit 0"], &log);
    let stat = || std::fs::read_to_string(format!("/proc/{}/stat", zombie.pid)).unwrap_or_default();
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while !stat().rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')) {
        assert!(std::time::Instant::now() < until, "no zombie: {}", stat());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!process::ids_in_use().unwrap().contains(&uid), "a zombie's id counted as in use");
    process::reap_exited_children();
}

/// A process whose name is not UTF-8 (it names itself: here by the file it runs) still counts:
/// its ids are in use, and it is alive.
#[test]
fn a_process_named_with_bytes_that_are_not_utf8_still_counts() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("volume.log");
    let (uid, gid) = (2_147_400_011u32, 2_147_400_012u32);
    let script = r#"p="$1/$(printf 'sl\377eep')"; cp /bin/sleep "$p"; echo ready; exec "$p" 30"#;
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let id = spawn_as(uid, gid, &[script, "sh", &dir.path().display().to_string()], &log);
    wait_for(&log, "ready");
    // The name is the file's: wait until the exec has happened.
    let status = format!("/proc/{}/status", id.pid);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read(&status).unwrap().windows(6).any(|w| w == b"sl\xffeep") {
        assert!(std::time::Instant::now() < deadline, "the process never ran the renamed file");
        std::thread::sleep(Duration::from_millis(10));
    }
    let ids = process::ids_in_use().unwrap();
    assert!(ids.contains(&uid) && ids.contains(&gid), "{uid} and {gid} among {} ids", ids.len());
    assert!(process::is_alive(&id), "a live process named with a byte that is not UTF-8");
    assert_eq!(process::stop(&id, Duration::from_secs(5)).unwrap(), Stopped::Terminated);
}
