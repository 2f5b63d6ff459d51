//! Plugin runtime benchmark: `cargo bench -p mounthost --bench plugin_runtime`.
//!
//! Prints, each against a baseline measured in the same run:
//! 1. loading the stock seaweedfs plugin cold (compile) vs from the on-disk cache;
//! 2. per-call latency of a stage plan (fresh Store + instantiate + plan) p50/p99 over 1,000
//!    calls, vs the same planner called natively;
//! 3. wall time of 1,000 concurrent calls on a 2-worker runtime, vs the same calls one by one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mounthost::plugin::bindings::types as wit;
use mounthost::plugin::{PluginRuntime, RuntimeConfig};
use mounthost_plugin_sdk::Plugin as _;

/// Calls per measurement; `MOUNTHOST_BENCH_CALLS` raises it (e.g. to profile the call path).
fn calls() -> usize {
    std::env::var("MOUNTHOST_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
}

fn runtime(cache: &std::path::Path) -> PluginRuntime {
    PluginRuntime::new(RuntimeConfig { cache_dir: Some(cache.to_path_buf()), ..RuntimeConfig::default() })
        .expect("runtime")
}

fn params() -> Vec<(&'static str, &'static str)> {
    vec![
        ("filer", "10.0.0.1:8888,10.0.0.2:8888"),
        ("path", "/buckets/pvc-0b6c7a4e-1f0e-4d8e-9a51-3c1f0e9d2b7a"),
        ("replication", "001"),
        ("cacheCapacityMB", "1024"),
        ("concurrentWriters", "64"),
        ("uidMap", "1000:2000"),
        ("mountOptions", "writebackCache,dirIdleEvictSec=300"),
    ]
}

fn wit_request() -> wit::StageRequest {
    wit::StageRequest {
        volume_id: "pvc-0b6c7a4e".into(),
        context: params().into_iter().map(|(k, v)| wit::Kv { key: k.into(), value: v.into() }).collect(),
        secrets: vec![wit::Kv { key: "jwtSigningKey".into(), value: "bench-signing-key".into() }],
        capability: wit::VolumeCapability {
            access_mode: wit::AccessMode::MultiNodeMultiWriter,
            fs_type: String::new(),
            mount_flags: vec![],
        },
        ephemeral: false,
        resolved: None,
        looked_up: vec![],
        node_id: "node-1".into(),
    }
}

fn sdk_request() -> mounthost_plugin_sdk::StageRequest {
    use mounthost_plugin_sdk as sdk;
    sdk::StageRequest {
        volume_id: "pvc-0b6c7a4e".into(),
        context: params().into_iter().map(|(k, v)| sdk::kv(k, v)).collect(),
        secrets: vec![sdk::kv("jwtSigningKey", "bench-signing-key")],
        capability: sdk::VolumeCapability {
            access_mode: sdk::AccessMode::MultiNodeMultiWriter,
            fs_type: String::new(),
            mount_flags: vec![],
        },
        ephemeral: false,
        resolved: None,
        looked_up: vec![],
        node_id: "node-1".into(),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let calls = calls();
    rt.block_on(async {
        // 1. cold compile vs cached load (resolve = load + info call).
        let (mut cold, mut cached) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let t = Instant::now();
            runtime(dir.path()).resolve("seaweedfs", None).await.unwrap();
            cold.push(t.elapsed());
            let t = Instant::now();
            runtime(dir.path()).resolve("seaweedfs", None).await.unwrap();
            cached.push(t.elapsed());
        }
        let (cold, cached) = (median(cold), median(cached));
        println!(
            "load seaweedfs: cold compile {:.1} ms, cached {:.2} ms -> cached/cold = {:.3} (target <= 0.10)",
            ms(cold),
            ms(cached),
            cached.as_secs_f64() / cold.as_secs_f64()
        );

        // 2. per-call latency vs native.
        let dir = tempfile::tempdir().unwrap();
        let runtime = Arc::new(runtime(dir.path()));
        let plugin = runtime.resolve("seaweedfs", None).await.unwrap();
        for _ in 0..50 {
            runtime.call(&plugin, "bench", wit_request()).await.unwrap();
        }
        let mut wasm = Vec::with_capacity(calls);
        for _ in 0..calls {
            let t = Instant::now();
            let plan = runtime.call(&plugin, "bench", wit_request()).await.unwrap();
            wasm.push(t.elapsed());
            assert_eq!(plan.steps.len(), 1);
        }
        let mut native = Vec::with_capacity(calls);
        for _ in 0..calls {
            let t = Instant::now();
            let plan = mounthost_plugin_seaweedfs::Seaweedfs::stage(sdk_request()).unwrap();
            native.push(t.elapsed());
            assert_eq!(plan.steps.len(), 1);
        }
        let mut fixed = Vec::with_capacity(calls);
        for _ in 0..calls {
            let t = Instant::now();
            runtime.call(&plugin, "bench", mounthost::plugin::calls::InfoCall).await.unwrap();
            fixed.push(t.elapsed());
        }
        wasm.sort();
        native.sort();
        fixed.sort();
        println!(
            "stage call (fresh Store + plan), {calls} calls: p50 {:.1} us, p99 {:.1} us (target p50 <= 50 us)",
            us(percentile(&wasm, 0.5)),
            us(percentile(&wasm, 0.99))
        );
        println!(
            "  baseline native planner:           p50 {:.1} us, p99 {:.1} us -> sandboxed/native p50 = {:.1}x",
            us(percentile(&native, 0.5)),
            us(percentile(&native, 0.99)),
            percentile(&wasm, 0.5).as_secs_f64() / percentile(&native, 0.5).as_secs_f64()
        );
        println!(
            "  breakdown: fresh Store + instantiate + info call: p50 {:.1} us (the fixed cost of a call)",
            us(percentile(&fixed, 0.5))
        );

        // 3. 1,000 concurrent calls vs serial.
        let t = Instant::now();
        for _ in 0..calls {
            runtime.call(&plugin, "bench", wit_request()).await.unwrap();
        }
        let serial = t.elapsed();
        let t = Instant::now();
        let tasks: Vec<_> = (0..calls)
            .map(|_| {
                let (runtime, plugin) = (runtime.clone(), plugin.clone());
                tokio::spawn(async move { runtime.call(&plugin, "bench", wit_request()).await.map(|p| p.steps.len()) })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.unwrap().unwrap(), 1);
        }
        let concurrent = t.elapsed();
        println!(
            "{calls} concurrent calls on 2 workers: {:.1} ms (target <= 150 ms); serial {:.1} ms -> speed-up {:.2}x",
            ms(concurrent),
            ms(serial),
            serial.as_secs_f64() / concurrent.as_secs_f64()
        );
    });
}
