//! A hostile plugin against the real daemons (issue 32), with real FUSE processes (the `bindfs`
//! test plugin, whose `env` parameter sets whatever environment a test asks for). Root, each
//! test in a private mount namespace.
//!
//! - The environment is closed by default: a plan setting a variable of the deny list (`PATH`,
//!   `http_proxy`, `GIT_SSH_COMMAND`, ...) is refused at NodeStageVolume with nothing spawned
//!   or mounted, a harmless one reaches the program exactly, and host config allows a denied one
//!   by name (after which the program gets only the names its rules allow).

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::{NodeDirs, guarded, in_private_namespace, mounts_below, pids_of, stage_req};
use mounthost::proto::csi;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::unpriv::grpc::{UnixChannel, channel};
use tonic::Code;

fn ctx(env: &str) -> HashMap<String, String> {
    [("plugin".to_string(), "bindfs".to_string()), ("env".into(), env.into())].into()
}

/// The environment of process `pid`, sorted.
fn environ(pid: i32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let mut vars: Vec<String> =
        raw.split(|b| *b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect();
    vars.sort();
    vars
}

async fn unstage(node: &mut NodeClient<UnixChannel>, id: &str, staging: &Path) {
    let req =
        csi::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: staging.display().to_string() };
    node.node_unstage_volume(req).await.unwrap();
}

/// Stage `id` with `env`, expecting INVALID_ARGUMENT (twice: kubelet retries) with nothing
/// spawned or mounted; returns the message.
async fn refused(node: &mut NodeClient<UnixChannel>, id: &str, staging: &Path, env: &str) -> String {
    std::fs::create_dir_all(staging).unwrap();
    let mut message = String::new();
    for _ in 0..2 {
        let status = node.node_stage_volume(stage_req(id, staging, &ctx(env))).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{env}: {status:?}");
        message = status.message().to_string();
        assert!(pids_of("bindfs", &staging.display().to_string()).is_empty(), "{env}: bindfs spawned");
        assert!(mounts_below(staging).is_empty(), "{env}: something mounted");
    }
    message
}

/// Stage `id` with `env`, and return the environment its bindfs runs with.
async fn staged_env(node: &mut NodeClient<UnixChannel>, id: &str, staging: &Path, env: &str) -> Vec<String> {
    std::fs::create_dir_all(staging).unwrap();
    node.node_stage_volume(stage_req(id, staging, &ctx(env))).await.unwrap();
    let pids = pids_of("bindfs", &staging.display().to_string());
    assert_eq!(pids.len(), 1, "{pids:?}");
    let seen = environ(pids[0]);
    unstage(node, id, staging).await;
    seen
}

#[test]
fn a_plans_environment_passes_the_deny_list_only_where_host_config_allows_it() {
    if !in_private_namespace("a_plans_environment_passes_the_deny_list_only_where_host_config_allows_it") {
        return;
    }
    let dirs = NodeDirs::new();
    let args = dirs.bindfs_args();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (id, staging) = ("bindfs~pv-env", dirs.staging("pv-env"));
    {
        let _host = dirs.start_host(&args);
        let _front = dirs.start_front(&args);
        guarded(&dirs, || {
            rt.block_on(async {
                let ch = channel(&dirs.csi_sock);
                common::wait_ready(&ch).await;
                let mut node = NodeClient::new(ch);
                for (env, name, why) in [
                    ("TZ=UTC;PATH=/tmp/evil-bin", "PATH", "names a program or library the program would run or load"),
                    ("http_proxy=http://10.0.0.1:3128", "http_proxy", "sends the program's connections"),
                    ("GIT_SSH_COMMAND=sh -c id", "GIT_SSH_COMMAND", "names a program or library"),
                    ("OPENSSL_CONF=/tmp/evil.cnf", "OPENSSL_CONF", "names a program or library"),
                    ("HOME=/tmp/pod-writable", "HOME", "moves where the program reads its configuration from"),
                    ("RCLONE_RC=true", "RCLONE_RC", "names a program or library"),
                ] {
                    let m = refused(&mut node, id, &staging, env).await;
                    assert!(m.contains("refused at step 2 (spawn-fuse)"), "{m}");
                    assert!(m.contains(&format!("program \"bindfs\": environment variable {name:?} {why}")), "{m}");
                    assert!(m.contains(&format!("(--program-args bindfs:env={name})")), "{m}");
                }
                // The loader's variables cannot be allowed at all; the message says so.
                let m = refused(&mut node, id, &staging, "LD_PRELOAD=/tmp/x.so").await;
                assert!(m.contains("would change what the dynamic loader runs"), "{m}");
                // A harmless variable reaches bindfs exactly, and nothing of the daemon's own.
                assert_eq!(
                    staged_env(&mut node, id, &staging, "TZ=UTC;LANG=C.UTF-8").await,
                    ["LANG=C.UTF-8", "TZ=UTC"]
                );
            })
        });
    }
    // Host config allows PATH by name: it passes, and bindfs now has rules, so only the names
    // they allow pass.
    let mut allowing = args.clone();
    allowing.extend(["--program-args=bindfs:env=PATH".to_string(), "--program-args=bindfs:env=TZ".to_string()]);
    let _host = dirs.start_host(&allowing);
    let _front = dirs.start_front(&allowing);
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            common::wait_ready(&ch).await;
            let mut node = NodeClient::new(ch);
            assert_eq!(
                staged_env(&mut node, id, &staging, "PATH=/usr/bin:/bin;TZ=UTC").await,
                ["PATH=/usr/bin:/bin", "TZ=UTC"]
            );
            let m = refused(&mut node, id, &staging, "LANG=C.UTF-8").await;
            assert!(
                m.contains("program \"bindfs\": environment variable \"LANG\" is not allowed by host config (allowed: PATH, TZ)"),
                "{m}"
            );
            assert!(mounts_below(&staging).is_empty());
        })
    });
}
