//! The SDK's promise to plugin authors (plugins/sdk/CHANGELOG.md), through the real binary: the
//! fixture `sdk1`, written against SDK 1.0.0 and never changed, builds against the current SDK
//! (contract 0.5.0) and against the frozen 1.0.0 copy (`sdk1-frozen`, contract 0.4.0, loaded
//! through the adapter); both plan the same on this host. And `plugin check` fails a plugin
//! whose dry plans are refused, its own example values included, while an operation the plugin
//! does not offer stays a note.

use std::process::{Command, Output};

use serde_json::Value;

fn mounthost(state: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mounthost"))
        .arg("--state-dir")
        .arg(state)
        .args(["--log", "warn", "--grant", "sdk1:fstype=tmpfs"])
        .args(args)
        .env_remove("MOUNTHOST_PLUGIN_DIR")
        .output()
        .expect("running mounthost")
}

fn fixture(name: &str) -> String {
    mounthost::stock::fixtures::path(name).to_str().unwrap().to_string()
}

fn check(state: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let out = mounthost(state, &[&["plugin", "check"], args].concat());
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn a_plugin_written_against_sdk_1_0_builds_against_both_sdks_and_plans_the_same() {
    let state = tempfile::tempdir().unwrap();
    let plan = |name: &str| {
        let args = [
            "plugin",
            "plan",
            &fixture(name),
            "--op",
            "stage",
            "--param",
            "sizeMiB=4",
            "--param",
            "readonly=true",
            "--param",
            "site=https://files.example/",
        ];
        let out = mounthost(state.path(), &args);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let (current, frozen) = (plan("sdk1"), plan("sdk1-frozen"));
    // The same source plans the same through either SDK (the components differ, so their digests).
    assert_ne!(current["digest"], frozen["digest"]);
    assert_eq!((&current["steps"], &current["attributes"]), (&frozen["steps"], &frozen["attributes"]));
    assert_eq!(current["steps"][0]["fstype"], "tmpfs", "{current}");
    assert_eq!(current["steps"][0]["readonly"], true, "{current}");
    assert_eq!(current["attributes"][0], serde_json::json!(["accessMode", "single-node-writer"]), "{current}");

    // Which contract each build speaks, and that both are usable by this host.
    for (name, contract) in [
        ("sdk1", "ok    contract   mounthost:plugin@0.5.0 (current)"),
        ("sdk1-frozen", "note  contract   mounthost:plugin@0.4.0: older than the current 0.5.0, adapted by the host"),
    ] {
        let (code, text) = check(state.path(), &[&fixture(name), "--param", "site=https://files.example/"]);
        assert_eq!(code, Some(0), "{name}: {text}");
        assert!(text.contains(contract), "{name}: {text}");
        assert!(text.contains("ok    stage      planned and passes the policy"), "{name}: {text}");
        assert!(text.ends_with("sdk1: usable by this host\n"), "{name}: {text}");
    }
    // SDK 1.1's default says the operation is not offered; 1.0's could only refuse it.
    let (_, text) = check(state.path(), &[&fixture("sdk1"), "--param", "site=https://files.example/"]);
    assert!(text.contains("note  provision  not offered: plugin sdk1 does not provision volumes"), "{text}");
    let (_, text) = check(state.path(), &[&fixture("sdk1-frozen"), "--param", "site=https://files.example/"]);
    assert!(text.contains("note  provision  plugin sdk1 refused provision: invalid argument"), "{text}");
    assert!(text.contains("(contract 0.4.0 cannot say an operation is not offered: taken as not offered)"), "{text}");
}

#[test]
fn plugin_check_fails_when_a_dry_plan_is_refused_its_own_example_values_included() {
    let state = tempfile::tempdir().unwrap();
    for name in ["sdk1", "sdk1-frozen"] {
        // `site` is documented as text, so the made-up example is "example", which the plugin
        // itself refuses: before, this printed "usable".
        let (code, text) = check(state.path(), &[&fixture(name)]);
        assert_eq!(code, Some(1), "{name}: {text}");
        assert!(text.contains("ok    examples   site=example"), "{name}: {text}");
        for op in ["validate", "stage"] {
            let line = format!("FAIL  {op:<9}  plugin sdk1 refused {op}: invalid argument: parameter \"site\"");
            assert!(text.contains(&line), "{name} {op}: {text}");
        }
        assert!(text.contains("(refused the example values? give real ones with --param"), "{name}: {text}");
        assert!(text.ends_with("sdk1: not usable: 2 check(s) failed\n"), "{name}: {text}");

        // A value given with --param that the plugin refuses fails the check as well.
        let (code, text) =
            check(state.path(), &[&fixture(name), "--param", "site=https://files.example/", "--param", "sizeMiB=13"]);
        assert_eq!(code, Some(1), "{name}: {text}");
        assert!(
            text.contains("FAIL  stage      plugin sdk1 refused stage: invalid argument: sizeMiB 13 is unlucky"),
            "{text}"
        );
    }
    // `unsupported` is "not offered" for provision only: a stage answered so fails the check.
    let (code, text) = check(state.path(), &[&fixture("misbehave"), "--param", "mode=unsupported"]);
    assert_eq!(code, Some(1), "{text}");
    let stage = "FAIL  stage      plugin misbehave refused stage: not supported: misbehave does not stage today";
    assert!(text.contains(stage), "{text}");
    assert!(text.contains("note  provision  not offered: plugin misbehave does not provision volumes"), "{text}");
}

/// A `url` parameter (contract 0.5.0): the SDK reads it, and a StorageClass value grants its host
/// and port as an `endpoint` value does (the policy's unit tests show it grants nothing else).
#[test]
fn a_url_parameter_grants_its_host_and_nothing_else() {
    let state = tempfile::tempdir().unwrap();
    let misbehave = fixture("misbehave");
    let plan = |url: &str| {
        let url = format!("url={url}");
        mounthost(
            state.path(),
            &["plugin", "plan", &misbehave, "--op", "provision", "--param", "mode=http", "--param", &url],
        )
    };
    let out = plan("http://files.example:8080/health");
    let json: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(json["plan"]["steps"][0]["urls"][0], "http://files.example:8080/health", "{json}");
    // The SDK refuses credentials in it before the host sees it.
    let out = plan("http://user:pw@files.example:8080/");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("without credentials"), "{out:?}");
    // `plugin check` with the same value: the provision plan's HTTP step passes the policy on
    // the grant the value itself gives.
    let args = [misbehave.as_str(), "--param", "mode=http", "--param", "url=http://files.example:8080/health"];
    let (code, text) = check(state.path(), &args);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("ok    provision  planned and passes the policy"), "{text}");
    assert!(!text.contains("misbehave:host="), "no host grant is asked for: {text}");
}
