//! `mounthost client`: drive any CSI socket by hand the way kubelet and the provisioner do
//! (like `csc`), and list what a host daemon holds. Prints JSON; errors print their gRPC code.

use std::collections::HashMap;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::plugin::{AccessModeArg, parse_kv, read_secrets};
use crate::proto::csi;
use crate::proto::csi::controller_client::ControllerClient;
use crate::proto::csi::identity_client::IdentityClient;
use crate::proto::csi::node_client::NodeClient;
use crate::proto::host::host_client::HostClient;

/// Arguments of `mounthost client`.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// The CSI socket to drive, unix:///path or a path [default: <state-dir>/csi.sock].
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: Option<String>,
    #[command(subcommand)]
    pub command: ClientCommand,
}

/// What the volume calls carry.
#[derive(Debug, Args, Clone)]
pub struct VolumeArgs {
    /// Volume attribute / StorageClass parameter, KEY=VALUE (repeatable).
    #[arg(long = "param", value_parser = parse_kv)]
    pub params: Vec<(String, String)>,
    /// Secret, KEY=VALUE or KEY=@FILE (repeatable).
    #[arg(long = "secret", value_parser = parse_kv)]
    pub secrets: Vec<(String, String)>,
    /// Access mode.
    #[arg(long, value_enum, default_value = "single-node-multi-writer")]
    pub access_mode: AccessModeArg,
    /// Mount flag (repeatable).
    #[arg(long = "mount-flag")]
    pub mount_flags: Vec<String>,
}

/// Client calls.
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// GetPluginInfo, GetPluginCapabilities, Probe, and NodeGetInfo when served.
    Info,
    /// CreateVolume.
    Create {
        /// The volume name (the PVC's PV name).
        #[arg(long)]
        name: String,
        #[command(flatten)]
        volume: VolumeArgs,
    },
    /// DeleteVolume.
    Delete {
        /// The volume id (as CreateVolume returned it, or any for a static volume).
        #[arg(long)]
        volume_id: String,
        #[arg(long = "secret", value_parser = parse_kv)]
        secrets: Vec<(String, String)>,
    },
    /// NodeStageVolume.
    Stage {
        /// The volume id (as CreateVolume returned it, or any for a static volume).
        #[arg(long)]
        volume_id: String,
        /// The staging path (kubelet's `.../globalmount`).
        #[arg(long)]
        staging: PathBuf,
        #[command(flatten)]
        volume: VolumeArgs,
    },
    /// NodePublishVolume.
    Publish {
        /// The volume id (as CreateVolume returned it, or any for a static volume).
        #[arg(long)]
        volume_id: String,
        /// The staging path (omit with --ephemeral).
        #[arg(long)]
        staging: Option<PathBuf>,
        /// The pod's target path (its parent must exist).
        #[arg(long)]
        target: PathBuf,
        /// Ask for a read-only publication.
        #[arg(long)]
        readonly: bool,
        /// A CSI ephemeral inline volume.
        #[arg(long)]
        ephemeral: bool,
        #[command(flatten)]
        volume: VolumeArgs,
    },
    /// NodeUnpublishVolume.
    Unpublish {
        /// The volume id (as CreateVolume returned it, or any for a static volume).
        #[arg(long)]
        volume_id: String,
        /// The pod's target path (already gone is OK).
        #[arg(long)]
        target: PathBuf,
    },
    /// NodeUnstageVolume.
    Unstage {
        /// The volume id (as CreateVolume returned it, or any for a static volume).
        #[arg(long)]
        volume_id: String,
        /// The staging path (kubelet's `.../globalmount`).
        #[arg(long)]
        staging: PathBuf,
    },
    /// NodeGetVolumeStats.
    Stats {
        /// The volume id (as CreateVolume returned it, or any for a static volume).
        #[arg(long)]
        volume_id: String,
        /// The staging path or a target.
        #[arg(long)]
        path: PathBuf,
    },
    /// The host daemon's volumes (over the host socket, not CSI).
    List,
}

/// A failed call.
#[derive(Debug, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ClientError {
    pub code: tonic::Code,
    pub message: String,
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError { code: s.code(), message: s.message().to_string() }
    }
}

fn capability(v: &VolumeArgs) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode { mode: v.access_mode.csi() as i32 }),
        access_type: Some(csi::volume_capability::AccessType::Mount(csi::volume_capability::MountVolume {
            fs_type: String::new(),
            mount_flags: v.mount_flags.clone(),
            volume_mount_group: String::new(),
        })),
    }
}

/// Volume attributes and secrets of a call.
type Maps = (HashMap<String, String>, HashMap<String, String>);

fn maps(v: &VolumeArgs) -> Result<Maps, ClientError> {
    let secrets = read_secrets(&v.secrets)
        .map_err(|e| ClientError { code: tonic::Code::InvalidArgument, message: e.to_string() })?;
    Ok((v.params.iter().cloned().collect(), secrets.into_iter().collect()))
}

fn path(p: &std::path::Path) -> String {
    p.display().to_string()
}

/// Run one client call; returns the JSON to print.
pub async fn run(socket: PathBuf, host_socket: PathBuf, cmd: ClientCommand) -> Result<String, ClientError> {
    let channel = crate::unpriv::grpc::channel(&socket);
    let mut node = NodeClient::new(channel.clone());
    let out: Value = match cmd {
        ClientCommand::Info => {
            let mut id = IdentityClient::new(channel.clone());
            let info = id.get_plugin_info(csi::GetPluginInfoRequest {}).await?.into_inner();
            let caps = id.get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {}).await?.into_inner();
            let probe = id.probe(csi::ProbeRequest {}).await?.into_inner();
            let node_info = node.node_get_info(csi::NodeGetInfoRequest {}).await.ok().map(|r| r.into_inner().node_id);
            json!({
                "name": info.name,
                "version": info.vendor_version,
                "controllerService": !caps.capabilities.is_empty(),
                "ready": probe.ready,
                "nodeId": node_info,
            })
        }
        ClientCommand::Create { name, volume } => {
            let (parameters, secrets) = maps(&volume)?;
            let req = csi::CreateVolumeRequest {
                name,
                parameters,
                secrets,
                volume_capabilities: vec![capability(&volume)],
                ..Default::default()
            };
            let v = ControllerClient::new(channel).create_volume(req).await?.into_inner().volume.unwrap_or_default();
            json!({"volumeId": v.volume_id, "capacityBytes": v.capacity_bytes, "volumeContext": v.volume_context})
        }
        ClientCommand::Delete { volume_id, secrets } => {
            let secrets = read_secrets(&secrets)
                .map_err(|e| ClientError { code: tonic::Code::InvalidArgument, message: e.to_string() })?;
            let req = csi::DeleteVolumeRequest { volume_id: volume_id.clone(), secrets: secrets.into_iter().collect() };
            ControllerClient::new(channel).delete_volume(req).await?;
            json!({"deleted": volume_id})
        }
        ClientCommand::Stage { volume_id, staging, volume } => {
            let (volume_context, secrets) = maps(&volume)?;
            let req = csi::NodeStageVolumeRequest {
                volume_id: volume_id.clone(),
                staging_target_path: path(&staging),
                volume_capability: Some(capability(&volume)),
                secrets,
                volume_context,
                publish_context: HashMap::new(),
            };
            node.node_stage_volume(req).await?;
            json!({"staged": volume_id, "stagingPath": path(&staging)})
        }
        ClientCommand::Publish { volume_id, staging, target, readonly, ephemeral, volume } => {
            let (mut volume_context, secrets) = maps(&volume)?;
            if ephemeral {
                volume_context.insert(crate::volume::request::EPHEMERAL_KEY.into(), "true".into());
            }
            let req = csi::NodePublishVolumeRequest {
                volume_id: volume_id.clone(),
                publish_context: HashMap::new(),
                staging_target_path: staging.as_deref().map(path).unwrap_or_default(),
                target_path: path(&target),
                volume_capability: Some(capability(&volume)),
                readonly,
                secrets,
                volume_context,
            };
            node.node_publish_volume(req).await?;
            json!({"published": volume_id, "target": path(&target), "readonly": readonly})
        }
        ClientCommand::Unpublish { volume_id, target } => {
            node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: volume_id.clone(),
                target_path: path(&target),
            })
            .await?;
            json!({"unpublished": volume_id, "target": path(&target)})
        }
        ClientCommand::Unstage { volume_id, staging } => {
            node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: volume_id.clone(),
                staging_target_path: path(&staging),
            })
            .await?;
            json!({"unstaged": volume_id})
        }
        ClientCommand::Stats { volume_id, path: p } => {
            let req =
                csi::NodeGetVolumeStatsRequest { volume_id, volume_path: path(&p), staging_target_path: String::new() };
            let r = node.node_get_volume_stats(req).await?.into_inner();
            let usage: Vec<Value> = r
                .usage
                .iter()
                .map(|u| json!({"unit": if u.unit == csi::volume_usage::Unit::Inodes as i32 { "inodes" } else { "bytes" }, "total": u.total, "used": u.used, "available": u.available}))
                .collect();
            let cond = r.volume_condition.unwrap_or_default();
            json!({"usage": usage, "abnormal": cond.abnormal, "message": cond.message})
        }
        ClientCommand::List => {
            let r = HostClient::new(crate::unpriv::grpc::channel(&host_socket))
                .list_volumes(crate::proto::host::ListVolumesRequest {})
                .await?
                .into_inner();
            Value::Array(
                r.volumes
                    .into_iter()
                    .map(|v| json!({"volumeId": v.volume_id, "plugin": v.plugin, "digest": v.digest, "phase": v.phase, "stagingPath": v.staging_path, "targets": v.targets, "pid": v.pid, "healthy": v.healthy, "condition": v.condition, "restarts": v.restarts, "oomKills": v.oom_kills, "pull": pull_json(&v), "lazy": lazy_json(&v), "trust": trust_json(&v)}))
                    .collect(),
            )
        }
    };
    Ok(serde_json::to_string_pretty(&out).expect("JSON values serialize"))
}

/// A volume's download progress (`null` unless it waits for OCI blobs).
fn pull_json(v: &crate::proto::host::VolumeStatus) -> Value {
    if v.pull_total_bytes == 0 {
        return Value::Null;
    }
    let blobs: Vec<Value> = v
        .pull_blobs
        .iter()
        .map(|b| json!({"digest": b.digest, "done": b.done_bytes, "total": b.total_bytes}))
        .collect();
    json!({"doneBytes": v.pull_done_bytes, "totalBytes": v.pull_total_bytes, "blobs": blobs})
}

/// What a volume's stage verified (docs/signing.md): `signed` (by which trust entry, with
/// which bundle), `indexed` (which chunk index), or both; `null` when neither and no policy.
fn trust_json(v: &crate::proto::host::VolumeStatus) -> Value {
    let Some(t) = &v.verification else { return Value::Null };
    let text = |s: &str| if s.is_empty() { Value::Null } else { Value::from(s) };
    let signed = (!t.signer.is_empty())
        .then(|| json!({"by": t.signer, "identity": text(&t.identity), "bundle": t.bundle, "foundIn": t.found_in}));
    let indexed =
        (!t.chunk_index.is_empty()).then(|| json!({"digest": t.chunk_index, "signedBy": text(&t.index_signer)}));
    json!({
        "manifest": text(&t.manifest),
        "signed": signed,
        "indexed": indexed,
        "policy": {"signedBy": t.signed_by, "chunkIndexRequired": t.chunk_index_required},
    })
}

/// A lazy volume's progress (`null` for other volumes).
fn lazy_json(v: &crate::proto::host::VolumeStatus) -> Value {
    let Some(l) = &v.lazy else { return Value::Null };
    let text = |s: &str| if s.is_empty() { Value::Null } else { Value::from(s) };
    json!({
        "totalBytes": l.total_bytes,
        "verifiedBytes": l.verified_bytes,
        "presentBytes": l.present_bytes,
        "demandRequests": l.demand_requests,
        "demandBytes": l.demand_bytes,
        "fillBytes": l.fill_bytes,
        "layers": l.layers,
        "layersComplete": l.layers_complete,
        "layersPending": l.layers_pending,
        "passthroughFiles": l.passthrough_files,
        "indexed": l.indexed,
        "connected": l.connected,
        "failed": text(&l.failed),
        "stalled": text(&l.stalled),
    })
}
