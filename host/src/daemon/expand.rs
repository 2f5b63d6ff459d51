//! NodeExpandVolume: what differs from the other RPCs.
//!
//! - The volume must be staged here, and `volume_path` must be where it is staged or published
//!   (CSI: "Volume does not exist ... on specified volume_path": NOT_FOUND).
//! - The plugin's `expand` planner (side `node`) plans what enforces the new size on this node:
//!   `socket-call` steps to the volume's running program (`weed mount` told its new quota over
//!   its `-localSocket`), after any lookups it asked for. Its answer's capacity must fit
//!   `capacity_range` (OUT_OF_RANGE otherwise); a plugin that cannot expand answers
//!   `out-of-range` itself.
//! - Before anything runs, the stage is planned again (with the kept secrets), so the record
//!   holds what a restart of the program must run from now on (the new quota): a FUSE process
//!   healed after the expansion keeps the new size. The diff runs the socket calls; the record
//!   is written after them. A failure changes nothing recorded; kubelet retries.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tracing::info;

use super::Node;
use super::diff::Desired;
use super::pipeline::{Job, Persist};
use super::stage::StageAsk;
use crate::error::Error;
use crate::plan::policy::Operation;
use crate::plan::{Plan, Step};
use crate::plugin::bindings::types as wit;
use crate::proto::csi;
use crate::secrets::Secrets;
use crate::unpriv::lookup::{Rounds, as_plan};
use crate::volume::request;
use crate::volume::size::{fits, node_expansion_range};
use crate::volume::state::{Phase, StagedCapability, VolumeState};

impl Node {
    /// NodeExpandVolume (to completion, see [`Node::detached`]).
    pub async fn expand(&self, req: csi::NodeExpandVolumeRequest) -> Result<csi::NodeExpandVolumeResponse, Error> {
        self.detached(|n| async move { n.expand_now(req).await }).await
    }

    async fn expand_now(&self, req: csi::NodeExpandVolumeRequest) -> Result<csi::NodeExpandVolumeResponse, Error> {
        let id = request::volume_id(&req.volume_id)?;
        if req.volume_path.is_empty() {
            return Err(Error::invalid("volume_path is required"));
        }
        let (required, limit) = node_expansion_range(req.capacity_range.as_ref())?;
        let asked = req.volume_capability.as_ref().map(|c| request::capability(Some(c))).transpose()?;
        let secrets = request::secrets(&req.secrets)?;
        let _guard = self.inner.locks.try_lock(&id)?;
        let shown = request::shown(&req.volume_path);
        let Some(st) = self.inner.store.load(&id)? else {
            return Err(Error::not_found(format!("volume {id} is not staged on this node")));
        };
        let path = PathBuf::from(&req.volume_path);
        if st.staging_path != path && !st.published.contains_key(&path) {
            return Err(Error::not_found(format!("volume {id} is neither staged nor published at {shown}")));
        }
        if !req.staging_target_path.is_empty() && Path::new(&req.staging_target_path) != st.staging_path {
            return Err(Error::not_found(format!(
                "volume {id} is staged at {}, not at {}",
                st.staging_path.display(),
                request::shown(&req.staging_target_path)
            )));
        }
        if st.phase != Phase::Staged {
            return Err(Error::unavailable(format!(
                "volume {id} is being staged or unstaged (phase {}); retry",
                st.phase.as_str()
            )));
        }
        let staged = st.capability.as_ref().and_then(capability_of_record);
        let capability = match (asked, staged) {
            (Some(a), Some(s)) if a.access_mode != s.access_mode => {
                return Err(Error::invalid(format!(
                    "volume_capability asks for access mode {}, but volume {id} is staged {}",
                    request::access_mode_name(a.access_mode),
                    request::access_mode_name(s.access_mode)
                )));
            }
            (_, Some(s)) => s,
            (Some(a), None) => a,
            (None, None) => {
                return Err(Error::invalid(format!(
                    "volume {id} was staged by a daemon that recorded no capability: give volume_capability"
                )));
            }
        };
        let plugin = self.resolve_build(&id, &st.plugin, Some(&st.digest), st.pinned).await?;
        let dirs = self.dirs(&id, Some(&st.staging_path), None);
        let recorded: Vec<wit::Kv> =
            st.plan.attributes.iter().map(|(k, v)| wit::Kv { key: k.clone(), value: v.clone() }).collect();
        let mut rounds = Rounds::default();
        let (capacity, plan) = loop {
            let wreq = wit::ExpandRequest {
                volume_id: id.clone(),
                side: wit::ExpandSide::Node,
                required_bytes: required,
                limit_bytes: limit,
                secrets: request::secret_kvs(&secrets),
                capability: Some(capability.clone()),
                context: request::kvs(&st.context),
                recorded: recorded.clone(),
                looked_up: rounds.looked_up(),
            };
            let mut out = self.inner.runtime.call(&plugin, &id, wreq).await?;
            let steps = std::mem::take(&mut out.steps);
            let mut plan =
                self.check(&plugin, Operation::NodeExpand, &dirs, &st.context, st.ephemeral, &secrets, as_plan(steps))?;
            if rounds.settle(&self.inner.http, &secrets, &plugin.info.name, &mut plan).await? {
                break (out.capacity_bytes, plan);
            }
        };
        fits(&plugin.info.name, capacity, required, limit)?;
        let restart_plan = self.restage_plan(&st, &capability).await?;
        let steps: Vec<Step> = plan.steps;
        let calls = steps.len();
        let mut state = st;
        if let Some(p) = restart_plan {
            state.plan = p;
        }
        let job = Job::plain(&id, Desired::Expand { steps }, move |_| Persist::Save(Box::new(state)));
        self.blocking(move |n| n.run_job(job).map(|_| ())).await?;
        info!(volume.id = %id, capacity_bytes = capacity, calls, "expanded on the node");
        Ok(csi::NodeExpandVolumeResponse { capacity_bytes: i64::try_from(capacity).unwrap_or(i64::MAX) })
    }

    /// The stage plan a restart of `st`'s program runs once the expansion is made, planned again
    /// with the secrets kept for restarts. `None` for a plan that resolves an OCI artifact (its
    /// stage depends on the registry, and its size on the artifact: it keeps its plan).
    async fn restage_plan(&self, st: &VolumeState, capability: &wit::VolumeCapability) -> Result<Option<Plan>, Error> {
        if st.plan.steps.iter().any(|s| matches!(s, Step::Resolve { .. } | Step::FetchBlob { .. })) {
            return Ok(None);
        }
        let kept: BTreeMap<String, String> = self.inner.store.load_secrets(&st.volume_id)?;
        let secrets: Secrets = kept.into_iter().collect();
        let plugin = self.resolve_build(&st.volume_id, &st.plugin, Some(&st.digest), st.pinned).await?;
        let ask = StageAsk {
            id: st.volume_id.clone(),
            staging: st.staging_path.clone(),
            staging_below: st.staging_path.clone(),
            capability: capability.clone(),
            context: st.context.clone().into_iter().collect(),
            secrets,
            ephemeral: st.ephemeral,
        };
        let dirs = self.dirs(&st.volume_id, Some(&st.staging_path), None);
        let plan = self.planned_stage(&plugin, &ask, &st.context, &dirs, None).await?;
        Ok(Some(plan))
    }
}

/// The capability a volume record holds, in the planners' terms (`None` for an access mode
/// name this version does not know).
fn capability_of_record(c: &StagedCapability) -> Option<wit::VolumeCapability> {
    use wit::AccessMode as M;
    let access_mode = [
        M::SingleNodeWriter,
        M::SingleNodeReaderOnly,
        M::MultiNodeReaderOnly,
        M::MultiNodeSingleWriter,
        M::MultiNodeMultiWriter,
        M::SingleNodeSingleWriter,
        M::SingleNodeMultiWriter,
    ]
    .into_iter()
    .find(|m| request::access_mode_name(*m) == c.access_mode)?;
    Some(wit::VolumeCapability { access_mode, fs_type: c.fs_type.clone(), mount_flags: c.mount_flags.clone() })
}
