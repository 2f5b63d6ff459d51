//! docs/plugins/authoring.md, followed as written: its `Cargo.toml`, `.cargo/config.toml` and
//! complete `src/lib.rs` go into a crate outside this workspace (next to a `mounthost` that is
//! this checkout, as the guide lays them out), with this checkout's `Cargo.lock` copied in as the
//! guide says; its unit tests pass, it builds for wasm32-wasip2 with the plugin profile, and
//! `mounthost plugin check` finds it usable. So the guide's code cannot rot unnoticed.
//!
//! Offline: every crate it needs is in cargo's cache once this workspace has built. Its target
//! directory is kept below this workspace's (`CARGO_TARGET_TMPDIR`), so a second run is quick.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The first fenced block of `lang` after the line that is exactly `heading`.
fn block_after<'a>(guide: &'a str, heading: &str, lang: &str) -> &'a str {
    let at = guide.find(&format!("\n{heading}\n")).unwrap_or_else(|| panic!("the guide has no {heading:?}"));
    let fence = format!("```{lang}\n");
    let start = guide[at..].find(&fence).map(|i| at + i + fence.len()).expect("a code block");
    let end = guide[start..].find("\n```").map(|i| start + i + 1).expect("the block's end");
    &guide[start..end]
}

fn cargo(dir: &Path, target: &Path, args: &[&str]) {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(dir).args(args).arg("--offline").env("CARGO_TARGET_DIR", target);
    // This test's own build settings are not the plugin author's.
    for var in ["RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "RUSTC_WORKSPACE_WRAPPER", "CARGO_BUILD_TARGET"] {
        cmd.env_remove(var);
    }
    let out = cmd.output().expect("running cargo");
    assert!(
        out.status.success(),
        "cargo {args:?} in {}:\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_guides_plugin_builds_outside_the_workspace_and_passes_plugin_check() {
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let guide = std::fs::read_to_string(root.join("docs/plugins/authoring.md")).unwrap();
    let home = tempfile::tempdir().unwrap();
    // ~/src/mounthost (the clone) and ~/src/scratch-plugin, as the guide has them.
    std::os::unix::fs::symlink(std::fs::canonicalize(&root).unwrap(), home.path().join("mounthost")).unwrap();
    let plugin = home.path().join("scratch-plugin");
    std::fs::create_dir_all(plugin.join("src")).unwrap();
    std::fs::create_dir_all(plugin.join(".cargo")).unwrap();
    std::fs::write(plugin.join("Cargo.toml"), block_after(&guide, "`Cargo.toml`:", "toml")).unwrap();
    std::fs::write(plugin.join(".cargo/config.toml"), block_after(&guide, "`.cargo/config.toml`:", "toml")).unwrap();
    std::fs::write(plugin.join("src/lib.rs"), block_after(&guide, "`src/lib.rs`, complete:", "rust")).unwrap();
    std::fs::copy(root.join("Cargo.lock"), plugin.join("Cargo.lock")).unwrap();

    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("authoring-guide");
    cargo(&plugin, &target, &["test", "--quiet"]);
    cargo(&plugin, &target, &["build", "--quiet", "--target", "wasm32-wasip2", "--profile", "plugin"]);
    let wasm = target.join("wasm32-wasip2/plugin/mounthost_plugin_scratch.wasm");
    assert!(wasm.is_file(), "the guide says the plugin lands at {}", wasm.display());

    let state = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mounthost"))
        .arg("--state-dir")
        .arg(state.path())
        .args(["--log", "warn", "plugin", "check"])
        .arg(&wasm)
        .env_remove("MOUNTHOST_PLUGIN_DIR")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{report}{}", String::from_utf8_lossy(&out.stderr));
    assert!(report.contains("ok    contract   mounthost:plugin@0.5.0 (current)"), "{report}");
    assert!(report.trim_end().ends_with("scratch: usable by this host"), "{report}");
}
