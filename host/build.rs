//! Generates the gRPC code of `proto/` (with protox, a pure-Rust protobuf compiler: no system
//! `protoc` needed), and builds the plugin crates for `wasm32-wasip2` so the stock plugins can
//! be embedded in the `mounthost` binary and the test fixtures are at hand for the tests.
//!
//! A nested `cargo build` runs with its own target directory (`<target>/wasm-plugins`), so it
//! never waits on the outer build's lock. Set `MOUNTHOST_PLUGIN_WASM_DIR` to a folder of
//! prebuilt `mounthost_plugin_*.wasm` files to skip it (packaging, Docker).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Plugin crates built here: the stock plugins, then the test fixtures (`sdk1-frozen` against the
/// frozen SDK 1.0.0 of `plugins/sdk-releases`) and the example plugin of `examples/plugins/sshfs`
/// (tests only, like the fixtures).
const PLUGINS: &[&str] = &[
    "seaweedfs",
    "model",
    "misbehave",
    "fs-reader",
    "tmpfs",
    "bindfs",
    "argv",
    "paths",
    "legacy",
    "legacy030",
    "sdk1",
    "sdk1-frozen",
    "sshfs",
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-env-changed=MOUNTHOST_PLUGIN_WASM_DIR");
    for watched in ["plugins", "examples/plugins", "wit", "Cargo.lock", "Cargo.toml", ".cargo/config.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    compile_protos(&root);

    let built = match env::var_os("MOUNTHOST_PLUGIN_WASM_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => build_plugins(&root),
    };
    for name in PLUGINS {
        let file = format!("mounthost_plugin_{}.wasm", name.replace('-', "_"));
        let from = built.join(&file);
        fs::copy(&from, out.join(&file))
            .unwrap_or_else(|e| panic!("plugin component {} is missing ({e}); see host/build.rs", from.display()));
    }
    println!("cargo:rustc-env=MOUNTHOST_PLUGIN_WASM={}", out.display());
}

fn build_plugins(root: &Path) -> PathBuf {
    let target_dir =
        env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target")).join("wasm-plugins");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args(["build", "--locked", "--target", "wasm32-wasip2", "--profile", "plugin"])
        .arg("--target-dir")
        .arg(&target_dir);
    for name in PLUGINS {
        cmd.args(["-p", &format!("mounthost-plugin-{name}")]);
    }
    // Flags meant for the host build (and clippy's wrapper) must not leak into the guests.
    for var in ["RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "RUSTC_WORKSPACE_WRAPPER", "CARGO_BUILD_TARGET"] {
        cmd.env_remove(var);
    }
    let status = cmd.status().expect("running cargo to build the plugins");
    if !status.success() {
        panic!(
            "building the plugins for wasm32-wasip2 failed (is the target installed? \
             `rustup target add wasm32-wasip2`)"
        );
    }
    target_dir.join("wasm32-wasip2").join("plugin")
}

fn compile_protos(root: &Path) {
    let proto = root.join("proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let files = [proto.join("csi.proto"), proto.join("host.proto")];
    let fds = protox::compile(&files, [&proto]).unwrap_or_else(|e| panic!("compiling proto/: {e}"));
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating gRPC code: {e}"));
}
