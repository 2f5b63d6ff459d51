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
    // A dry run shows the first round: the capacity record's read, which a real call makes
    // before it plans the filer's writes.
    let steps = out["plan"]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!((steps[0]["step"].as_str(), steps[0]["method"].as_str()), (Some("lookup"), Some("GET")), "{steps:?}");
    let url = steps[0]["urls"][0].as_str().unwrap();
    assert_eq!(url, "http://127.0.0.1:8888/.mounthost/capacity/buckets/pvc-1", "{steps:?}");

    let plugin_id = id.trim_start_matches("seaweedfs~");
    let del = mounthost(state.path(), &["plugin", "plan", "seaweedfs", "--op", "delete", "--volume-id", plugin_id]);
    // DeleteVolume gets no parameters, so the filer host must be granted from the volume id;
    // until the daemon lands (which grants it from the id), the CLI needs --grant.
    let stderr = String::from_utf8_lossy(&del.stderr);
    assert!(
        !del.status.success()
            && stderr.contains("does not grant it: host 127.0.0.1:8888\n")
            && stderr.contains("host flags: --grant seaweedfs:host=127.0.0.1:8888\n"),
        "{stderr}"
    );
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

/// The `bindfs` test plugin, which the host grants nothing: its stage plan spawns `bindfs`,
/// waiting for fstype `fuse`.
fn bindfs_wasm() -> String {
    mounthost::stock::fixtures::path("bindfs").display().to_string()
}

#[test]
fn plan_lists_every_missing_grant_with_the_flags_that_give_them() {
    let state = tempfile::tempdir().unwrap();
    let wasm = bindfs_wasm();
    let out = mounthost(state.path(), &["plugin", "plan", &wasm]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty());
    let flags = "--grant bindfs:program=bindfs --program bindfs=/absolute/path/to/bindfs --grant bindfs:fstype=fuse";
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error (InvalidArgument): plan from plugin bindfs needs what the host config does not grant it: \
             program \"bindfs\", a binary for program \"bindfs\", fstype \"fuse\"\n\
             grant it with the host flags: {flags}"
        )
    );
    // Given those flags (with a real path), the plan is printed.
    let granted =
        ["--grant", "bindfs:program=bindfs", "--program", "bindfs=/usr/bin/bindfs", "--grant", "bindfs:fstype=fuse"];
    let plan = json(&mounthost(state.path(), &[&granted[..], &["plugin", "plan", &wasm]].concat()));
    assert_eq!(plan["steps"][1]["program"], "bindfs");
    // One grant still missing: only that one.
    let out = mounthost(state.path(), &[&granted[..4], &["plugin", "plan", &wasm]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("does not grant it: fstype \"fuse\"\ngrant it with the host flags: --grant bindfs:fstype=fuse\n"),
        "{stderr}"
    );
}

#[test]
fn program_args_constrain_the_plan_and_bad_values_stop_at_start() {
    let state = tempfile::tempdir().unwrap();
    let wasm = bindfs_wasm();
    let granted =
        ["--grant", "bindfs:program=bindfs", "--program", "bindfs=/usr/bin/bindfs", "--grant", "bindfs:fstype=fuse"];
    // bindfs's plan runs `bindfs -f <cache>/data <staging>`.
    let out = mounthost(
        state.path(),
        &[&granted[..], &["--program-args", "bindfs:deny=-f", "plugin", "plan", &wasm]].concat(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with(
            "error (InvalidArgument): plan from plugin bindfs refused at step 2 (spawn-fuse): \
             program \"bindfs\": option \"-f\" is denied by host config"
        ),
        "{stderr}"
    );
    // An allow-list without -f (from the environment) refuses it too; with it, the plan passes.
    let env = Command::new(env!("CARGO_BIN_EXE_mounthost"))
        .arg("--state-dir")
        .arg(state.path())
        .args(["--log", "warn"])
        .args(granted)
        .args(["plugin", "plan", &wasm])
        .env_remove("MOUNTHOST_PLUGIN_DIR")
        .env("MOUNTHOST_PROGRAM_ARGS", "bindfs:allow=o,bindfs:allow=-d")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&env.stderr);
    assert!(stderr.contains("option \"-f\" is not allowed by host config (allowed: -d, o)"), "{stderr}");
    let args = ["--program-args", "bindfs:allow=-f", "--program-args", "sshfs:deny=@sshfs"];
    json(&mounthost(state.path(), &[&granted[..], &args, &["plugin", "plan", &wasm]].concat()));
    // Malformed values are refused by the flag parser, before anything runs.
    for (bad, needle) in [
        ("sshfs:deny=--ssh_command", "write long and -o option names without dashes"),
        (
            "sshfs:forbid=ssh_command",
            "expected PROGRAM:deny=OPTION, PROGRAM:deny=@sshfs, PROGRAM:allow=OPTION or PROGRAM:env=NAME",
        ),
        ("sshfs:env=LD_PRELOAD", "would change what the dynamic loader runs"),
        ("sshfs:deny=@ssh", "unknown option set @ssh (known: @sshfs)"),
        ("bindfs:allow=-o", "-o introduces an option list"),
    ] {
        let out = mounthost(state.path(), &["--program-args", bad, "plugin", "list"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--program-args") && stderr.contains(needle), "{bad}: {stderr}");
        assert!(out.stdout.is_empty());
    }
}

fn check(state: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let out = mounthost(state, &[&["plugin", "check"], args].concat());
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn plugin_check_plans_every_operation_and_fails_on_what_would_break_a_node() {
    let state = tempfile::tempdir().unwrap();
    let sshfs = mounthost::stock::fixtures::path("sshfs");
    let (code, text) = check(state.path(), &[sshfs.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("ok    contract   mounthost:plugin@0.5.0 (current)"), "{text}");
    assert!(text.contains("ok    exports    mounthost:plugin/planner@0.5.0"), "{text}");
    for op in ["validate", "provision", "stage", "publish", "unstage", "delete"] {
        assert!(
            text.lines().any(|l| (l.starts_with("ok ") || l.starts_with("note ")) && l[6..].starts_with(op)),
            "{op}: {text}"
        );
    }
    // It does not provision: an answer, not a defect. Its stage needs grants this host lacks.
    assert!(text.contains("note  provision  not offered: plugin sshfs does not provision volumes"), "{text}");
    assert!(text.contains("--grant sshfs:program=sshfs --program sshfs=/absolute/path/to/sshfs"), "{text}");
    assert!(text.ends_with("sshfs: usable by this host\n"), "{text}");

    // Granted, the stage plans.
    let granted = [
        "--grant",
        "sshfs:program=sshfs",
        "--program",
        "sshfs=/usr/bin/sshfs",
        "--grant",
        "sshfs:fstype=fuse.sshfs",
        // The SSH server the example value names (@sshfs judges the remote's host).
        "--grant",
        "sshfs:host=example",
    ];
    let (code, text) = check(state.path(), &[&granted[..], &[sshfs.to_str().unwrap()]].concat());
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("ok    stage      planned and passes the policy"), "{text}");
    assert!(!text.contains("needs the host flags"), "{text}");
    // Which libfuse the granted binary links: Debian 12's sshfs, libfuse 3.
    assert!(text.contains("ok    program    sshfs: /usr/bin/sshfs links libfuse3.so.3 (libfuse 3:"), "{text}");

    // A planner that traps, and one whose plan the policy refuses: failures, exit 1.
    let misbehave = mounthost::stock::fixtures::path("misbehave");
    let (code, text) = check(state.path(), &[misbehave.to_str().unwrap(), "--param", "mode=trap"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("FAIL  stage      plugin misbehave crashed in stage"), "{text}");
    assert!(text.ends_with("misbehave: not usable: 1 check(s) failed\n"), "{text}");
    let (code, text) = check(state.path(), &[misbehave.to_str().unwrap(), "--param", "mode=escape"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.lines().any(|l| l.starts_with("FAIL  stage")), "{text}");

    // Not a component at all.
    let junk = state.path().join("junk.wasm");
    std::fs::write(&junk, b"not wasm").unwrap();
    let (code, text) = check(state.path(), &[junk.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("FAIL  load       cannot load plugin"), "{text}");
}

#[test]
fn the_recommended_sshfs_rules_refuse_an_option_that_runs_a_command_naming_it() {
    let state = tempfile::tempdir().unwrap();
    let sshfs = mounthost::stock::fixtures::path("sshfs");
    let rules = [
        "--grant",
        "sshfs:program=sshfs",
        "--program",
        "sshfs=/usr/bin/sshfs",
        "--grant",
        "sshfs:fstype=fuse.sshfs",
        "--grant",
        "sshfs:host=files.example",
        "--program-args",
        "sshfs:deny=@sshfs",
        // The deny set alone, without the rule set @sshfs (which refuses these first).
        "--program-rules",
        "sshfs=none",
    ];
    let plan = |options: &str| {
        let params = ["--param", "host=files.example", "--param", "user=u", "--param"];
        let secrets = ["--secret", "sshPrivateKey=k", "--secret", "sshKnownHosts=files.example ssh-ed25519 AAAA"];
        let options = format!("options={options}");
        let args =
            [&rules[..], &["plugin", "plan", sshfs.to_str().unwrap()], &params[..], &[options.as_str()], &secrets[..]];
        mounthost(state.path(), &args.concat())
    };
    // The plugin's own plan passes the rules.
    let ok = json(&plan("cache=yes"));
    assert_eq!(ok["steps"][0]["program"], "sshfs");
    for evil in ["ssh_command=/bin/sh", "SSH_COMMAND=/bin/sh", "ProxyCommand=nc\\040x\\0401", "ssh\\_command=/x"] {
        let out = plan(evil);
        assert_eq!(out.status.code(), Some(2), "{evil}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(r#"program "sshfs": option"#) && err.contains("is denied by host config"),
            "{evil}: {err}"
        );
        let name = if evil.to_lowercase().starts_with("proxy") { "proxycommand" } else { "ssh_command" };
        assert!(err.to_lowercase().contains(&format!("option \"{name}\"")), "{evil}: {err}");
        // Under @sshfs (the default) each is refused before: no rule names it.
        let options = format!("options={evil}");
        let args = [
            &rules[..rules.len() - 2],
            &[
                "plugin",
                "plan",
                sshfs.to_str().unwrap(),
                "--param",
                "host=files.example",
                "--param",
                "user=u",
                "--param",
                &options,
                "--secret",
                "sshPrivateKey=k",
                "--secret",
                "sshKnownHosts=files.example ssh-ed25519 AAAA",
            ],
        ]
        .concat();
        let out = mounthost(state.path(), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{evil}: {err}");
        assert!(err.contains("(rule set @sshfs, rule "), "{evil}: {err}");
    }
}

#[test]
fn a_program_with_rules_gets_only_the_environment_they_allow() {
    let state = tempfile::tempdir().unwrap();
    let key_file = state.path().join("jwt");
    std::fs::write(&key_file, "very-secret-signing-key\n").unwrap();
    let secret = format!("jwtSigningKey=@{}", key_file.display());
    // The stock seaweedfs plugin gives weed its JWT key as WEED_JWT_SIGNING_KEY.
    let plan = |rules: &[&str]| {
        let params = ["--param", "filer=f:8888", "--param", "path=/p", "--secret", &secret];
        // Without its rule set (which allows weed's JWT variables): --program-args alone.
        let unruled = ["--program-rules", "weed=none"];
        mounthost(state.path(), &[&unruled[..], rules, &["plugin", "plan", "seaweedfs"], &params[..]].concat())
    };
    let env_names = |out: &Output| -> Vec<String> {
        json(out)["steps"][0]["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap().into()).collect()
    };
    // No rule for weed: today's behaviour.
    assert_eq!(env_names(&plan(&[])), ["WEED_JWT_SIGNING_KEY"]);
    // Any rule for weed, even one about its arguments only: no environment variable unless allowed.
    let out = plan(&["--program-args", "weed:deny=debug"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with(
            "error (InvalidArgument): plan from plugin seaweedfs refused at step 1 (spawn-fuse): program \"weed\": \
             environment variable \"WEED_JWT_SIGNING_KEY\" is not allowed by host config (allowed: none)"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("very-secret-signing-key"), "{stderr}");
    let out = plan(&["--program-args", "weed:deny=debug,weed:env=PATH"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("(allowed: PATH)"));
    // Allowed by name (also from the environment variable), it passes.
    assert_eq!(env_names(&plan(&["--program-args", "weed:env=WEED_JWT_SIGNING_KEY"])), ["WEED_JWT_SIGNING_KEY"]);
    let out = Command::new(env!("CARGO_BIN_EXE_mounthost"))
        .arg("--state-dir")
        .arg(state.path())
        .args(["--log", "warn", "plugin", "plan", "seaweedfs", "--param", "filer=f:8888", "--param", "path=/p"])
        .args(["--secret", &secret])
        .env_remove("MOUNTHOST_PLUGIN_DIR")
        .env("MOUNTHOST_PROGRAM_ARGS", "weed:deny=debug,weed:env=WEED_JWT_SIGNING_KEY")
        .env("MOUNTHOST_PROGRAM_RULES", "weed=none")
        .output()
        .unwrap();
    assert_eq!(env_names(&out), ["WEED_JWT_SIGNING_KEY"]);
    // Under @weed (the default) its JWT variables pass, and --program-args rules add to it.
    let params = ["--param", "filer=f:8888", "--param", "path=/p", "--secret", &secret];
    let ruled = mounthost(
        state.path(),
        &[&["--program-args", "weed:deny=debug", "plugin", "plan", "seaweedfs"], &params[..]].concat(),
    );
    assert_eq!(env_names(&ruled), ["WEED_JWT_SIGNING_KEY"]);
}

/// The `--program-args` flags docs/policy.md recommends for sshfs (its first code block after
/// "### Recommended for `sshfs`"), one value per flag.
fn recommended_sshfs_rules() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/policy.md")).unwrap();
    let section = &doc[doc.find("### Recommended for `sshfs`").expect("the section")..];
    let block = section.split("```").nth(1).expect("a code block");
    let values: Vec<&str> = block.split_whitespace().filter(|w| *w != "--program-args" && *w != "\\").collect();
    assert!(values.iter().all(|v| v.starts_with("sshfs:")), "{values:?}");
    values.iter().flat_map(|v| ["--program-args".to_string(), v.to_string()]).collect()
}

#[test]
fn the_recommended_sshfs_allow_list_passes_the_example_plugins_plan() {
    let state = tempfile::tempdir().unwrap();
    let sshfs = mounthost::stock::fixtures::path("sshfs");
    let rules = recommended_sshfs_rules();
    let values: Vec<&str> = rules.iter().flat_map(|r| r.split(',')).collect();
    assert!(values.contains(&"sshfs:deny=@sshfs") && values.contains(&"sshfs:allow=reconnect"), "{values:?}");
    let granted = [
        "--grant",
        "sshfs:program=sshfs",
        "--program",
        "sshfs=/usr/bin/sshfs",
        "--grant",
        "sshfs:fstype=fuse.sshfs",
        "--grant",
        "sshfs:host=files.example",
        // The block as it works alone, for a program run without its rule set.
        "--program-rules",
        "sshfs=none",
    ];
    let plan = |options: &str| {
        let mut args: Vec<String> = granted.iter().map(|s| s.to_string()).collect();
        args.extend(rules.iter().cloned());
        args.extend(["plugin", "plan", sshfs.to_str().unwrap()].map(String::from));
        args.extend(["--param", "host=files.example", "--param", "user=u", "--param", "port=2222"].map(String::from));
        if !options.is_empty() {
            args.extend(["--param".to_string(), format!("options={options}")]);
        }
        args.extend(
            ["--secret", "sshPrivateKey=k", "--secret", "sshKnownHosts=files.example ssh-ed25519 AAAA"]
                .map(String::from),
        );
        mounthost(state.path(), &args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    // The plugin's own options, and the tuning options the docs list.
    let ok = json(&plan(""));
    assert_eq!(ok["steps"][0]["program"], "sshfs");
    assert_eq!(ok["steps"][0]["env"], serde_json::json!([]));
    json(&plan(
        "cache=yes,Compression=yes,dir_cache=yes,dcache_timeout=60,kernel_cache,auto_cache,attr_timeout=5,\
         entry_timeout=5,max_conns=4,idmap=user,ServerAliveCountMax=3,ConnectTimeout=10",
    ));
    // Denied by @sshfs, or simply not on the list: refused, naming the option.
    for (option, why) in [
        ("SmartcardDevice=/k/x.so", "option \"SmartcardDevice\" is denied by host config"),
        ("ssh_command=/bin/sh", "option \"ssh_command\" is denied by host config"),
        ("ProxyUseFdpass=yes", "option \"ProxyUseFdpass\" is denied by host config"),
        ("follow_symlinks", "option \"follow_symlinks\" is not allowed by host config (allowed: "),
        ("CertificateFile=/k/c", "option \"CertificateFile\" is not allowed by host config (allowed: "),
    ] {
        let out = plan(option);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{option}: {stderr}");
        assert!(stderr.contains(&format!("program \"sshfs\": {why}")), "{option}: {stderr}");
    }
}

/// `plugin check` shows a plan that breaks its program's rule set before anything runs, naming
/// the argument, its position and the rule, and passes the same plugin under rules it keeps.
#[test]
fn plugin_check_names_the_rule_a_plan_breaks_and_passes_one_that_keeps_them() {
    let state = tempfile::tempdir().unwrap();
    let argv = mounthost::stock::fixtures::path("argv");
    let grants = [
        "--grant",
        "argv:program=weed",
        "--program",
        "weed=/usr/local/bin/weed",
        "--grant",
        "argv:fstype=fuse.seaweedfs",
    ];
    let check_with = |args: &str| {
        let params = ["--param", "program=weed", "--param", "fstype=fuse.seaweedfs", "--param", "hosts=127.0.0.1:8888"];
        let args = format!("args={args}");
        let all = [&grants[..], &["plugin", "check", argv.to_str().unwrap()], &params[..], &["--param", args.as_str()]];
        let out = mounthost(state.path(), &all.concat());
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let honest =
        "-logtostderr\nmount\n-filer=127.0.0.1:8888\n-filer.path=/buckets/v\n-dir={staging}\n-cacheDir={cache}";
    let (code, text) = check_with(honest);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("ok    stage      planned and passes the policy"), "{text}");
    let (code, text) = check_with(&honest.replace("-cacheDir={cache}", "-cacheDir=/etc"));
    assert_eq!(code, Some(1), "{text}");
    let stage = text.lines().find(|l| l.starts_with("FAIL  stage")).unwrap_or_else(|| panic!("{text}"));
    assert!(
        stage.contains(r#"program "weed", argument 6 "-cacheDir=/etc": option -cacheDir: "/etc" is not the volume's cache directory"#)
            && stage.contains("(rule set @weed, rule options.-cacheDir)"),
        "{stage}"
    );
    // A filer nobody granted is a grant the node could give: listed with its flag, not a failure.
    let (code, text) = check_with(&honest.replace("-filer=127.0.0.1:8888", "-filer=filer.example:8888"));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("--grant argv:host=filer.example:8888"), "{text}");
}
