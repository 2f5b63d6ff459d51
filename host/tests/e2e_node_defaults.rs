//! The defaults that protect a node, end to end, as root in a private mount namespace, through
//! the real front and host daemon and a real `docker-registry`: the node cache's cap measured
//! from the state directory's filesystem at start, the memory limit of each lazy server's
//! cgroup, and (ignored, run by `bench/node-memory.sh`) the measurement those limits are sized
//! from.

mod common;

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::dynamic::*;
use common::model::{ModelNode, small_model_with_weights};
use common::registry::{PushedModel, Registry, RegistryOptions};
use common::{NodeDirs, in_private_namespace};
use mounthost::proto::csi;
use serde_json::json;

fn volume_key(id: &str) -> String {
    mounthost::volume::dirs::volume_key(id)
}

fn lazy_ctx(reference: &str) -> HashMap<String, String> {
    common::model::model_ctx(reference, &[("insecure", "true"), ("lazy", "true")])
}

/// The directory of volume `pv`'s cgroup in the memory hierarchy.
fn memory_group(dirs: &NodeDirs, pv: &str) -> PathBuf {
    dirs.cgroups().parent_dir().expect("this node has a memory cgroup hierarchy").join(volume_key(pv))
}

/// The memory limit of a group directory, in bytes (v2 `memory.max`, v1 `memory.limit_in_bytes`).
fn memory_limit(group: &Path) -> u64 {
    let read = |f: &str| std::fs::read_to_string(group.join(f)).ok().map(|s| s.trim().to_string());
    let raw = read("memory.max").or_else(|| read("memory.limit_in_bytes")).expect("a memory limit file");
    raw.parse().unwrap_or_else(|_| panic!("{}: {raw}", group.display()))
}

/// The peak memory use of a group directory (v2 `memory.peak`, v1 `memory.max_usage_in_bytes`):
/// page cache included.
fn memory_peak(group: &Path) -> Option<u64> {
    ["memory.peak", "memory.max_usage_in_bytes"]
        .iter()
        .find_map(|f| std::fs::read_to_string(group.join(f)).ok())
        .and_then(|s| s.trim().parse().ok())
}

/// A `VmXXX:` line of `/proc/<pid>/status`, in KiB.
fn vm(pid: i32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse().ok())
}

/// The memory cgroup of a process, as `/proc/<pid>/cgroup` names it (v1's memory line, else v2's).
fn cgroup_of(pid: i32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let memory = text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == "memory").then(|| path.to_string())
    });
    memory.or_else(|| text.lines().find_map(|l| l.strip_prefix("0::").map(str::to_string))).unwrap()
}

/// Stage and publish a volume (until its pull is done): its target.
async fn publish(node: &DynNode, csi: &mut Node, pv: &str, pod: &str, ctx: &HashMap<String, String>) -> PathBuf {
    let staging = node.dirs.staging(pv);
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        match csi.node_stage_volume(common::stage_req(pv, &staging, ctx)).await {
            Ok(_) => break,
            Err(s) if s.code() == tonic::Code::Unavailable && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(s) => panic!("staging {pv}: {s:?}\n{}", node.dirs.logs()),
        }
    }
    let target = node.dirs.target(pod, pv);
    csi.node_publish_volume(common::publish_req(pv, &staging, &target, true, ctx)).await.unwrap();
    target
}

/// POST a lazy dynamic mount and wait until it is ready.
fn lazy_mount(dir: &Path, id: &str, reference: &str) {
    let body = json!({"id": id, "parameters": {"reference": reference, "lazy": "true"}});
    let (status, v) = call(dir, "POST", "/mounts", Some(body));
    assert!(matches!(status, 200..=202), "create {id}: {status} {v}");
    wait_state(dir, id, "ready");
}

fn run(node: &DynNode, body: impl AsyncFnOnce()) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    common::guarded(&node.dirs, || rt.block_on(body()));
}

/// Without `--cache-max-mib`, the node's blob cache is capped at half of the state directory's
/// filesystem, measured at start: the host logs the cap and where it came from, and a stage
/// past it evicts what no volume uses. The state directory is a 128 MiB tmpfs here: a 64 MiB
/// cap, and a 32 MiB cap on each dynamic volume (half the cache's).
#[test]
fn the_cache_cap_defaults_to_half_the_state_filesystem() {
    if !in_private_namespace("the_cache_cap_defaults_to_half_the_state_filesystem") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let models: Vec<PushedModel> = ["a", "b", "c"]
        .iter()
        .map(|n| small_model_with_weights(&registry, work.path(), &format!("models/{n}"), 24 << 20).0)
        .collect();
    let dirs = NodeDirs::new();
    std::fs::create_dir_all(&dirs.state).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &dirs.state,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=128m,mode=0700"),
    )
    .unwrap();
    let node = ModelNode::start_in(dirs, vec![format!("--insecure-registry={}", registry.host())]);
    let log = std::fs::read_to_string(node.dirs.root.path().join("host.log")).unwrap();
    // Written to a file, not a terminal: no colour codes (issue 43).
    assert!(!log.contains('\u{1b}'), "escape codes in a log written to a file:\n{log}");
    let line = log.lines().find(|l| l.contains("byte caps")).unwrap_or_else(|| panic!("no byte caps line:\n{log}"));
    assert!(
        line.contains("cache_max=64 MiB")
            && line.contains("cache_max_from=half of the state directory's filesystem (128 MiB), measured at start")
            && line.contains("dynamic_max=32 MiB")
            && line.contains("dynamic_max_from=half of the cache's cap"),
        "{line}"
    );
    let cached = |m: &PushedModel| m.cached(&node.dirs.state, "model.safetensors");
    common::model::run(&node, &registry, async || {
        let mut csi = node.node().await;
        let stage = |pv: &str, m: &PushedModel| {
            common::model::stage_req(
                pv,
                &node.dirs.staging(pv),
                &common::model::model_ctx(&m.reference, &[("insecure", "true")]),
            )
        };
        let unstage = |pv: &str| csi::NodeUnstageVolumeRequest {
            volume_id: pv.into(),
            staging_target_path: node.dirs.staging(pv).display().to_string(),
        };
        let (_, r) =
            common::model::stage_until_done(&mut csi, &stage("pv-a", &models[0]), Duration::from_secs(60)).await;
        r.unwrap();
        csi.node_unstage_volume(unstage("pv-a")).await.unwrap();
        let (_, r) =
            common::model::stage_until_done(&mut csi, &stage("pv-b", &models[1]), Duration::from_secs(60)).await;
        r.unwrap();
        assert!(cached(&models[0]) && cached(&models[1]), "48 MiB: under the cap, nothing evicted");
        let (_, r) =
            common::model::stage_until_done(&mut csi, &stage("pv-c", &models[2]), Duration::from_secs(60)).await;
        r.unwrap();
        assert!(!cached(&models[0]), "72 MiB past the 64 MiB cap: a's weights, used by no volume, were evicted");
        assert!(cached(&models[1]) && cached(&models[2]), "what volumes use stays");
        for pv in ["pv-b", "pv-c"] {
            csi.node_unstage_volume(unstage(pv)).await.unwrap();
        }
        println!("checked: {line}; a stage past the measured cap evicted what no volume uses");
    });
}

/// Each lazy server runs in its volume's cgroup, whose memory limit is `--lazy-memory-mib`
/// for each lazy server the group runs: a lazy volume's lone server gets exactly that; a lazy
/// dynamic volume with two lazy mounts (three servers) three times that.
#[test]
fn a_lazy_server_runs_in_a_cgroup_limited_to_its_memory() {
    if !in_private_namespace("a_lazy_server_runs_in_a_cgroup_limited_to_its_memory") {
        return;
    }
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let (model, weights) = small_model_with_weights(&registry, work.path(), "models/lazy", 8 << 20);
    let node = DynNode::start_with(&registry, &["--lazy-memory-mib=96"]);
    run(&node, async || {
        let mut csi = node.node().await;
        let target = publish(&node, &mut csi, "pv-lazy", "pod-1", &lazy_ctx(&model.reference)).await;
        let group = memory_group(&node.dirs, "pv-lazy");
        assert_eq!(memory_limit(&group), 96 << 20, "{}", group.display());
        let servers = node.dirs.group_procs(&volume_key("pv-lazy"));
        assert_eq!(servers.len(), 1, "the volume's server: {servers:?}");
        let exe = std::fs::read_link(format!("/proc/{}/exe", servers[0])).unwrap();
        assert_eq!(exe, PathBuf::from(env!("CARGO_BIN_EXE_mounthost")), "mounthost lazyfs");
        assert!(group.ends_with(cgroup_of(servers[0]).trim_start_matches('/')), "{}", cgroup_of(servers[0]));
        // It serves under the limit.
        let mut buf = vec![0u8; 1 << 20];
        std::fs::File::open(target.join("model.safetensors")).unwrap().read_exact_at(&mut buf, 4 << 20).unwrap();
        let mut want = vec![0u8; 1 << 20];
        std::fs::File::open(&weights).unwrap().read_exact_at(&mut want, 4 << 20).unwrap();
        assert!(buf == want, "the lazy volume reads its weights");

        // A lazy dynamic volume: its own server and one per lazy mount share its group.
        let mut ctx = dynamic_ctx(&model.reference);
        ctx.insert("lazy".into(), "true".into());
        let dir = node.dynamic_volume(&mut csi, "pv-dyn", "pod-2", &ctx).await;
        let group = memory_group(&node.dirs, "pv-dyn");
        assert_eq!(memory_limit(&group), 96 << 20);
        lazy_mount(&dir, "one", &model.reference);
        lazy_mount(&dir, "two", &model.reference);
        assert_eq!(node.dirs.group_procs(&volume_key("pv-dyn")).len(), 3, "three servers");
        assert_eq!(memory_limit(&group), 3 * (96 << 20), "three servers' worth");
        let mut text = String::new();
        std::fs::File::open(dir.join("mounts/two/config.json")).unwrap().read_to_string(&mut text).unwrap();
        assert!(!text.is_empty());
        println!("checked: a lazy server's group limited to 96 MiB, three servers' group to 288 MiB");
    });
}

/// Sizing (`bench/node-memory.sh`, not part of the suite): the peak memory of the host daemon
/// and of each lazy server under load, with no lazy memory limit. A model of `MEM_MIB` MiB of
/// weights (default 512) is pulled eagerly into one volume; `MEM_VOLUMES` lazy volumes (default
/// 3) of another model of that size are staged at once and each read through while it fills
/// (4 MiB sequential reads and 64 random 1 MiB reads at once); a dynamic volume's pod mounts a
/// third model lazily twice and reads both mounts. It prints the host daemon's VmHWM, each lazy
/// server's VmHWM and its group's peak (page cache included).
#[test]
#[ignore = "a benchmark: bench/node-memory.sh"]
fn memory_benchmark() {
    if !in_private_namespace("memory_benchmark") {
        return;
    }
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (mib, volumes) = (env("MEM_MIB", 512), env("MEM_VOLUMES", 3) as usize);
    let registry = Registry::start(RegistryOptions::default());
    let work = tempfile::tempdir().unwrap();
    let push = |repo: &str| small_model_with_weights(&registry, work.path(), repo, mib << 20);
    let (eager, _) = push("models/eager");
    let (lazy, lazy_weights) = push("models/lazy");
    let (dynamic, _) = push("models/dynamic");
    let node = DynNode::start_with(&registry, &["--lazy-memory-mib=0"]);
    let host = node.host_pid() as i32;
    run(&node, async || {
        let mut csi = node.node().await;
        let t = Instant::now();
        publish(
            &node,
            &mut csi,
            "pv-eager",
            "pod-eager",
            &common::model::model_ctx(&eager.reference, &[("insecure", "true")]),
        )
        .await;
        println!(
            "bench: eager pull of {mib} MiB in {:?}: host daemon VmHWM {} KiB",
            t.elapsed(),
            vm(host, "VmHWM:").unwrap()
        );
        let mut targets = Vec::new();
        for i in 0..volumes {
            let pv = format!("pv-lazy-{i}");
            targets.push((
                pv.clone(),
                publish(&node, &mut csi, &pv, &format!("pod-lazy-{i}"), &lazy_ctx(&lazy.reference)).await,
            ));
        }
        let size = std::fs::metadata(&lazy_weights).unwrap().len();
        let readers: Vec<_> = targets
            .iter()
            .flat_map(|(_, t)| {
                let file = t.join("model.safetensors");
                let random = file.clone();
                [
                    std::thread::spawn(move || {
                        let mut f = std::fs::File::open(&file).unwrap();
                        let mut buf = vec![0u8; 4 << 20];
                        while f.read(&mut buf).unwrap() > 0 {}
                    }),
                    std::thread::spawn(move || {
                        let f = std::fs::File::open(&random).unwrap();
                        let mut buf = vec![0u8; 1 << 20];
                        let mut x: u64 = 0x9e3779b97f4a7c15;
                        for _ in 0..64 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let at = (x % (size - (1 << 20))) & !4095;
                            f.read_exact_at(&mut buf, at).unwrap();
                        }
                    }),
                ]
            })
            .collect();
        // The pod of a dynamic volume mounts the third model lazily, twice, meanwhile.
        let dir = node.dynamic_volume(&mut csi, "pv-dyn", "pod-dyn", &dynamic_ctx(&eager.reference)).await;
        lazy_mount(&dir, "one", &dynamic.reference);
        lazy_mount(&dir, "two", &dynamic.reference);
        for m in ["one", "two"] {
            let file = dir.join(format!("mounts/{m}/model.safetensors"));
            let mut f = std::fs::File::open(&file).unwrap();
            let mut buf = vec![0u8; 4 << 20];
            while f.read(&mut buf).unwrap() > 0 {}
        }
        for r in readers {
            r.join().unwrap();
        }
        println!(
            "bench: host daemon VmHWM {} KiB (VmRSS now {} KiB)",
            vm(host, "VmHWM:").unwrap(),
            vm(host, "VmRSS:").unwrap()
        );
        for pv in targets.iter().map(|(pv, _)| pv.as_str()).chain(["pv-dyn"]) {
            let group = memory_group(&node.dirs, pv);
            for pid in node.dirs.group_procs(&volume_key(pv)) {
                println!("bench: {pv}: lazy server {pid} VmHWM {} KiB", vm(pid, "VmHWM:").unwrap_or(0));
            }
            println!(
                "bench: {pv}: its group's peak {} KiB (page cache included)",
                memory_peak(&group).unwrap_or(0) >> 10
            );
        }
    });
}
