//! The `mounthost plugin` commands, run as a user runs them: the real binary, JSON on stdout,
//! a precise error and exit code 2 on stderr.

use std::process::{Command, Output};

use serde_json::Value;

fn mounthost(state: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mounthost"))
        .arg("--state-dir")
        .arg(state)
        .args(["--log", "warn"])
        .args(args)
        .env_remove("MOUNTHOST_PLUGIN_DIR")
        .output()
        .expect("running mounthost")
}

fn json(out: &Output) -> Value {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

#[test]
fn plan_seaweedfs_prints_the_weed_mount_step() {
    let state = tempfile::tempdir().unwrap();
    let out = mounthost(
        state.path(),
        &["plugin", "plan", "seaweedfs", "--param", "filer=127.0.0.1:8888", "--param", "path=/buckets/vol1"],
    );
    let plan = json(&out);
    assert_eq!(plan["plugin"], "seaweedfs");
    let steps = plan["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1);
    let spawn = &steps[0];
    assert_eq!(spawn["step"], "spawn-fuse");
    assert_eq!(spawn["program"], "weed");
    assert_eq!(spawn["executable"], "/usr/local/bin/weed");
    assert_eq!(spawn["fstype"], "fuse.seaweedfs");
    let args: Vec<&str> = spawn["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args[..2], ["-logtostderr", "mount"], "weed logs to stderr, never to the node's /tmp");
    assert!(args.contains(&"-filer=127.0.0.1:8888"), "{args:?}");
    assert!(args.contains(&"-filer.path=/buckets/vol1"), "{args:?}");
    // Paths are resolved inside the volume's directories.
    let staging = spawn["mountpoint"].as_str().unwrap();
    assert!(staging.starts_with("/var/lib/kubelet/plugins/kubernetes.io/csi/csi.mounthost.dev/"), "{staging}");
    assert!(args.contains(&format!("-dir={staging}").as_str()), "{args:?}");
    let cache = state.path().join("cache");
    assert!(args.iter().any(|a| a.starts_with(&format!("-cacheDir={}", cache.display()))), "{args:?}");
}

#[test]
fn the_readme_command_works_with_a_relative_state_dir() {
    let cwd = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mounthost"))
        .current_dir(cwd.path())
        .args(["--state-dir", ".local", "plugin", "plan", "seaweedfs"])
        .args(["--param", "filer=127.0.0.1:8888", "--param", "path=/buckets/vol1"])
        .output()
        .unwrap();
    let plan = json(&out);
    let args = plan["steps"][0]["args"].as_array().unwrap();
    let cache = args.iter().filter_map(|a| a.as_str()?.strip_prefix("-cacheDir=")).next().unwrap();
    let local = cwd.path().canonicalize().unwrap().join(".local");
    assert!(std::path::Path::new(cache).starts_with(&local), "{cache} is under {}", local.display());
}

#[test]
fn secrets_never_reach_the_printed_plan_or_argv() {
    let state = tempfile::tempdir().unwrap();
    let key_file = state.path().join("jwt");
    std::fs::write(&key_file, "very-secret-signing-key\n").unwrap();
    let secret = format!("jwtSigningKey=@{}", key_file.display());
    let out = mounthost(
        state.path(),
        &["plugin", "plan", "seaweedfs", "--param", "filer=f:8888", "--param", "path=/p", "--secret", &secret],
    );
    let plan = json(&out);
    let text = plan.to_string();
    assert!(!text.contains("very-secret-signing-key"), "{text}");
    let env = plan["steps"][0]["env"].as_array().unwrap();
    assert!(
        env.iter().any(|e| e["name"] == "WEED_JWT_SIGNING_KEY" && e["value"]["secret"] == "jwtSigningKey"),
        "{env:?}"
    );
}

#[test]
fn bad_input_gets_a_precise_error() {
    let state = tempfile::tempdir().unwrap();
    for (args, needle, kind) in [
        (vec!["plugin", "plan", "nfs"], "unknown plugin \"nfs\"; known plugins: model, seaweedfs", "NotFound"),
        (vec!["plugin", "plan", "seaweedfs", "--param", "path=/p"], "\"filer\"", "InvalidArgument"),
        (
            vec![
                "plugin",
                "plan",
                "seaweedfs",
                "--param",
                "filer=f:8888",
                "--param",
                "path=/p",
                "--param",
                "replication=9",
            ],
            "\"replication\"",
            "InvalidArgument",
        ),
        (
            vec!["plugin", "plan", "seaweedfs", "--param", "filer=f:8888", "--param", "path=/p", "--param", "filr=x"],
            "unknown parameter \"filr\"",
            "InvalidArgument",
        ),
        (vec!["plugin", "info", "/nonexistent/x.wasm"], "cannot load plugin /nonexistent/x.wasm", "FailedPrecondition"),
        (
            vec!["plugin", "plan", "seaweedfs", "--target", "relative/dir"],
            "must be an absolute path",
            "InvalidArgument",
        ),
    ] {
        let out = mounthost(state.path(), &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(stderr.starts_with(&format!("error ({kind})")), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn info_and_list_describe_the_stock_plugin() {
    let state = tempfile::tempdir().unwrap();
    let info = json(&mounthost(state.path(), &["plugin", "info", "seaweedfs"]));
    assert_eq!(info["info"]["name"], "seaweedfs");
    assert!(info["digest"].as_str().unwrap().starts_with("sha256:"));
    let params = info["info"]["parameters"].as_array().unwrap();
    let filer = params.iter().find(|p| p["name"] == "filer").expect("filer is documented");
    assert_eq!((filer["kind"].as_str(), filer["required"].as_bool()), (Some("endpoint"), Some(true)));
    assert!(params.iter().all(|p| !p["doc"].as_str().unwrap().is_empty()), "every parameter has a doc line");
    assert_eq!(info["grant"]["programs"][0], "weed");
    let list = json(&mounthost(state.path(), &["plugin", "list"]));
    let names: Vec<&str> = list.as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["model", "seaweedfs"], "sorted by name");
    for p in list.as_array().unwrap() {
        assert_eq!(p["origin"], format!("stock:{}", p["name"].as_str().unwrap()));
    }
}

#[test]
fn provision_and_delete_plan_filer_calls() {
    let state = tempfile::tempdir().unwrap();
    let out = json(&mounthost(
        state.path(),
        &[
            "plugin",
            "plan",
            "seaweedfs",
            "--op",
            "provision",
            "--volume-id",
            "pvc-1",
            "--param",
            "filer=127.0.0.1:8888",
        ],
    ));
    let id = out["volumeId"].as_str().unwrap();
    assert!(id.starts_with("seaweedfs~"), "{id}");
    assert_eq!(out["context"]["path"], "/buckets/pvc-1");
    let step = &out["plan"]["steps"][0];
    assert_eq!(step["step"], "http");
    assert!(step["urls"][0].as_str().unwrap().starts_with("http://127.0.0.1:8888/buckets/pvc-1"), "{step}");

    let plugin_id = id.trim_start_matches("seaweedfs~");
    let del = mounthost(state.path(), &["plugin", "plan", "seaweedfs", "--op", "delete", "--volume-id", plugin_id]);
    // DeleteVolume gets no parameters, so the filer host must be granted from the volume id;
    // until the daemon lands (which grants it from the id), the CLI needs --grant.
    let stderr = String::from_utf8_lossy(&del.stderr);
    assert!(!del.status.success() && stderr.contains("host 127.0.0.1:8888 is not granted"), "{stderr}");
    let del = json(&mounthost(
        state.path(),
        &[
            "--grant",
            "seaweedfs:host=127.0.0.1:8888",
            "plugin",
            "plan",
            "seaweedfs",
            "--op",
            "delete",
            "--volume-id",
            plugin_id,
        ],
    ));
    assert_eq!(del["steps"][0]["method"], "DELETE");
}

#[test]
fn a_reader_that_goes_away_ends_the_output_quietly() {
    // `mounthost plugin info seaweedfs | head -1`, with the reader gone before anything is
    // written: the write meets EPIPE (Rust ignores SIGPIPE), which ends the output, exit 0,
    // like a reader that stopped early expects; no panic, no backtrace.
    let state = tempfile::tempdir().unwrap();
    for args in [&["plugin", "info", "seaweedfs"][..], &["plugin", "list"]] {
        // The pipe's reading end is closed before the child starts: its first write fails.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let child = Command::new(env!("CARGO_BIN_EXE_mounthost"))
            .arg("--state-dir")
            .arg(state.path())
            .args(["--log", "warn"])
            .args(args)
            .env_remove("MOUNTHOST_PLUGIN_DIR")
            .env("RUST_BACKTRACE", "1")
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("running mounthost");
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: nothing to say on stderr either: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
}
