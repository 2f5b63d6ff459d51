//! Secrets handed to a real program as files: the runtime tmpfs the daemon mounts at start,
//! the files it writes there before a spawn, and what the program sees. Needs root; each test
//! re-executes itself in a private mount namespace (see `common::in_private_namespace`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::in_private_namespace;
use mounthost::config::Config;
use mounthost::daemon::Node;
use mounthost::error::ErrorKind;
use mounthost::exec::cgroup::Cgroups;
use mounthost::exec::process::{self, Spec};
use mounthost::exec::{Files, Linux, mountinfo};
use mounthost::plan::{EnvVar, SpawnArg, Step, Value, resolve_env, secret_file_path};
use mounthost::plugin::PluginRuntime;
use mounthost::secrets::Secrets;

const SECRET: &str = "s3cr3t-token-value";
const KEY: &str = "-----BEGIN KEY-----";

/// `<root>/disk`, a ramfs: a filesystem that is not a tmpfs, whatever `/tmp` is here.
fn disk(root: &Path) -> PathBuf {
    let disk = root.join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    nix::mount::mount(Some("mounthost-test"), &disk, Some("ramfs"), nix::mount::MsFlags::empty(), None::<&str>)
        .unwrap();
    disk
}

/// A node whose state directory is `<root>/state`, over the real executor.
fn node(root: &Path) -> (Node, Arc<Linux>, PathBuf) {
    let state = root.join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut config = Config::new(state.clone());
    config.kubelet_dir = root.join("kubelet");
    std::fs::create_dir_all(&config.kubelet_dir).unwrap();
    let exec = Arc::new(Linux::new(Cgroups::none(), [state.clone(), config.kubelet_dir.clone()]));
    let runtime = Arc::new(PluginRuntime::new(config.runtime()).unwrap());
    (Node::new(config, runtime, exec.clone()).unwrap(), exec, state)
}

/// A spawn of `/bin/sh` that prints the secret file named by its argument and by `KEY_FILE`,
/// and the templated `AUTH`.
fn spawn_step() -> Step {
    let script = r#"printf '%s|' "$(cat "$1")" "$(cat "$KEY_FILE")" "$AUTH"; echo; echo "arg=$1""#;
    Step::SpawnFuse {
        program: "sh".into(),
        executable: "/bin/sh".into(),
        args: vec![
            "-c".into(),
            script.into(),
            "sh".into(),
            SpawnArg::SecretFile { prefix: String::new(), key: "token".into(), suffix: String::new() },
        ],
        env: vec![
            EnvVar { name: "KEY_FILE".into(), value: Value::SecretFile("key".into()) },
            EnvVar {
                name: "AUTH".into(),
                value: Value::SecretTemplate { prefix: "Bearer ".into(), key: "token".into(), suffix: String::new() },
            },
        ],
        mountpoint: "/m".into(),
        fstype: "fuse.sh".into(),
        ready_timeout_ms: 1000,
        memory_limit_bytes: None,
        host_mount: None,
        lazy: None,
    }
}

fn secrets() -> Secrets {
    [("token".to_string(), SECRET.to_string()), ("key".to_string(), KEY.to_string())].into_iter().collect()
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

/// Every file below `dir` whose content contains `needle`, skipping `skip`.
fn files_containing(dir: &Path, needle: &str, skip: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.starts_with(skip) {
            continue;
        }
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            found.extend(files_containing(&path, needle, skip));
        } else if kind.is_file() && String::from_utf8_lossy(&std::fs::read(&path).unwrap()).contains(needle) {
            found.push(path);
        }
    }
    found
}

#[test]
fn a_program_reads_its_secrets_from_files_on_the_runtime_tmpfs() {
    if !in_private_namespace("a_program_reads_its_secrets_from_files_on_the_runtime_tmpfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let (node, exec, state) = node(&disk(&root));
    let run = state.join("run");
    node.mount_runtime_tmpfs();
    let entry = mountinfo::at(&mountinfo::read().unwrap(), &run).cloned().expect("a tmpfs at <state>/run");
    assert_eq!((entry.fstype.as_str(), entry.source.as_str()), ("tmpfs", "mounthost-run"));
    assert_eq!(std::fs::metadata(&run).unwrap().permissions().mode() & 0o777, 0o700);
    // A restart finds it in place and mounts nothing over it.
    node.mount_runtime_tmpfs();
    let stacked = mountinfo::read().unwrap().iter().filter(|m| m.mount_point == run).count();
    assert_eq!(stacked, 1, "mounted twice");

    // What the pipeline does for a spawn-fuse step: the runtime directory, the secret files,
    // then the command with their paths.
    let runtime = run.join("0123456789abcdef");
    exec.private_dir(&runtime).unwrap();
    let step = spawn_step();
    let secrets = secrets();
    node.write_secret_files(&runtime.join(mounthost::plan::SECRETS_DIR), &step, &secrets, None).unwrap();
    let Step::SpawnFuse { executable, args, env, .. } = &step else { unreachable!() };
    let args: Vec<String> = args.iter().map(|a| a.render(&runtime)).collect();
    let env: Vec<(String, String)> =
        env.iter().map(|e| (e.name.clone(), resolve_env(&e.value, &secrets, &runtime))).collect();
    assert!(!args.iter().any(|a| a.contains(SECRET)), "no secret in argv: {args:?}");
    assert!(!env.iter().any(|(_, v)| v.contains(KEY)), "no file content in the environment");
    let log = runtime.join("sh.log");
    let id = process::spawn(&Spec { executable, args: &args, env: &env, log: &log }, None).unwrap();
    let text = wait_for(&log, "arg=");
    assert!(text.contains(&format!("{SECRET}|{KEY}|Bearer {SECRET}|")), "{text}");
    let token_file = secret_file_path(&runtime, "token");
    assert!(text.contains(&format!("arg={}", token_file.display())), "{text}");
    let _ = process::stop(&id, Duration::from_secs(5));

    for key in ["token", "key"] {
        let file = secret_file_path(&runtime, key);
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600, "{key}");
        let on = mountinfo::read().unwrap();
        let covering =
            on.iter().filter(|m| file.starts_with(&m.mount_point)).max_by_key(|m| m.mount_point.as_os_str().len());
        assert_eq!(covering.map(|m| m.mount_point.clone()), Some(run.clone()), "{key} is on the runtime tmpfs");
    }
    assert_eq!(
        files_containing(&state, SECRET, &run),
        Vec::<PathBuf>::new(),
        "the state directory proper holds no secret"
    );
    // Unstage removes the runtime directory, and the files with it.
    exec.remove_tree(&runtime).unwrap();
    assert!(!token_file.exists());
    println!("checked: secrets reached the program as files on the runtime tmpfs, never in argv or on disk");
}

#[test]
fn secrets_are_refused_rather_than_written_to_disk() {
    if !in_private_namespace("secrets_are_refused_rather_than_written_to_disk") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let (node, exec, state) = node(&disk(&root));
    let run = state.join("run");
    // A volume staged before the runtime tmpfs existed keeps its runtime directory visible.
    let old = run.join("feedfacefeedface");
    std::fs::create_dir_all(&old).unwrap();
    node.mount_runtime_tmpfs();
    assert!(
        mountinfo::at(&mountinfo::read().unwrap(), &run).is_none_or(|m| m.mount_point != run),
        "not mounted over it"
    );
    assert!(old.exists());

    let runtime = run.join("0123456789abcdef");
    exec.private_dir(&runtime).unwrap();
    let err = node
        .write_secret_files(&runtime.join(mounthost::plan::SECRETS_DIR), &spawn_step(), &secrets(), None)
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::FailedPrecondition, "{}", err.message);
    assert!(!runtime.join("secrets").exists(), "nothing written");
    assert_eq!(files_containing(&state, SECRET, Path::new("/nonexistent")), Vec::<PathBuf>::new());
    println!("checked: a spawn needing secret files is refused while <state>/run is not a tmpfs");
}
