//! `mounthost cache`: the node's OCI blob cache for operators, through the host daemon's
//! socket. `pull` warms a node before pods arrive (a live progress bar on a terminal, plain
//! lines on a pipe), `ls` lists blobs with their sizes and the volumes that use them, `prune`
//! evicts what no staged volume uses.

use std::collections::HashMap;
use std::path::Path;

use clap::Subcommand;
use serde_json::json;

use super::client::ClientError;
use super::plugin::{parse_kv, read_secrets};
use crate::proto::host::host_client::HostClient;
use crate::proto::host::{CacheListRequest, CachePruneRequest, CachePullRequest};

/// Cache subcommands.
#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// Download every blob of an OCI artifact into the node's cache and wait until done.
    Pull {
        /// registry[:port]/repository[:tag][@sha256:<hex>]
        reference: String,
        /// Pull through this registry (host[:port]) instead.
        #[arg(long)]
        mirror: Option<String>,
        /// Plain HTTP (the host daemon must list the registry with --insecure-registry).
        #[arg(long)]
        insecure: bool,
        /// Credential, KEY=VALUE or KEY=@FILE: `username` and `password`, `token`, or
        /// `.dockerconfigjson` (repeatable).
        #[arg(long = "secret", value_parser = parse_kv)]
        secrets: Vec<(String, String)>,
    },
    /// List cached blobs: digest, size, last use, the staged volumes that use each.
    Ls,
    /// Evict blobs that no staged volume uses, least recently used first.
    Prune {
        /// Stop once the cache holds at most this many MiB [default: evict every unused blob].
        #[arg(long, default_value_t = 0)]
        keep_mib: u64,
    },
}

/// Run a cache subcommand against the host daemon at `host_socket`; returns what to print.
pub async fn run(host_socket: &Path, cmd: CacheCommand) -> Result<String, ClientError> {
    let mut host = HostClient::new(crate::unpriv::grpc::channel(host_socket));
    let out = match cmd {
        CacheCommand::Pull { reference, mirror, insecure, secrets } => {
            let secrets: HashMap<String, String> = read_secrets(&secrets)
                .map_err(|e| ClientError { code: tonic::Code::InvalidArgument, message: e.to_string() })?
                .into_iter()
                .collect();
            let req = CachePullRequest {
                reference: reference.clone(),
                mirror: mirror.unwrap_or_default(),
                insecure,
                secrets,
            };
            let mut stream = host.cache_pull(req).await?.into_inner();
            let mut shown = super::progress::Shown::new(None);
            let mut last = None;
            while let Some(update) = stream.message().await? {
                shown.update(update.done_bytes, update.total_bytes);
                last = Some(update);
            }
            shown.finish(true);
            let last = last.ok_or_else(|| ClientError {
                code: tonic::Code::Internal,
                message: "the host daemon ended the pull without a word".into(),
            })?;
            json!({
                "reference": reference,
                "manifestDigest": last.manifest_digest,
                "bytes": last.total_bytes,
                "blobs": last.blobs.iter().map(|b| json!({"digest": b.digest, "size": b.total_bytes})).collect::<Vec<_>>(),
                "done": last.done,
            })
        }
        CacheCommand::Ls => {
            let r = host.cache_list(CacheListRequest {}).await?.into_inner();
            let total: u64 = r.blobs.iter().map(|b| b.size).sum();
            json!({
                "totalBytes": total,
                "blobs": r.blobs.iter().map(|b| json!({"digest": b.digest, "size": b.size, "lastUsed": b.last_used, "volumes": b.volumes})).collect::<Vec<_>>(),
            })
        }
        CacheCommand::Prune { keep_mib } => {
            let r = host.cache_prune(CachePruneRequest { keep_bytes: keep_mib << 20 }).await?.into_inner();
            json!({"evictedBlobs": r.blobs, "evictedBytes": r.bytes})
        }
    };
    Ok(serde_json::to_string_pretty(&out).expect("JSON values serialize"))
}
