//! Each volume whose FUSE program the host mounts for (WIT `fuse-mount.host-fd`) runs it as a
//! user and group of its own, so a compromised program of one volume can neither read another
//! volume's secret files or `/proc/<pid>/environ` nor signal or trace its program, and no
//! other software on the node (`nobody`'s, say) shares its id.
//!
//! The id is the lowest of `--fuse-ids` that no other volume's record holds, no other stage in
//! flight has claimed and no live process has as a user or group id (what an earlier holder
//! left running, say where no cgroup killed it, or a volume whose record cannot be read). It is chosen at stage under the volume's lock and goes into the
//! stage's record, which the pipeline saves before the first action: the program never runs
//! with an id that is not recorded, so a daemon killed at any moment leaves no two volumes
//! with one id (an id claimed but not yet recorded dies with the daemon, unused). A restart,
//! a restage and a restarted daemon reuse the recorded id; unstage forgets the record, and
//! with it the id. A record written before volumes had ids gets one at its next (re)stage.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use super::Node;
use crate::error::{Error, ErrorKind};
use crate::plan::{Plan, Step};
use crate::volume::state::VolumeState;

/// Ids chosen for stages in flight, by volume, until their records hold them.
pub(super) type Claims = Arc<Mutex<BTreeMap<String, u32>>>;

/// An id claimed for a volume's stage; dropped once the stage's job has recorded it (or
/// forgotten the volume).
#[must_use = "the claim must last until the stage's record is saved"]
pub(super) struct Claim {
    claims: Claims,
    volume: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.claims.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.volume);
    }
}

/// Does the plan run a program the host mounts for?
pub(super) fn host_mounted(plan: &Plan) -> bool {
    plan.steps.iter().any(|s| matches!(s, Step::SpawnFuse { host_mount: Some(_), .. }))
}

impl Node {
    /// Give `st` (a stage's record, before the job saves it) the FUSE id its plan needs: the
    /// one it holds, or the lowest free one, claimed until the returned [`Claim`] drops (keep
    /// it until the job has run). A plan without a host-mounted program needs none.
    /// RESOURCE_EXHAUSTED when every id of the range is taken. Blocking (reads the store's
    /// index).
    pub(super) fn assign_fuse_id(&self, st: &mut VolumeState) -> Result<Option<Claim>, Error> {
        if !host_mounted(&st.plan) {
            // Its lazy dynamic mounts' servers keep the id they run as.
            if !st.dynamic.values().any(|m| m.process.is_some()) {
                st.fuse_id = None;
            }
            return Ok(None);
        }
        if st.fuse_id.is_some() {
            return Ok(None);
        }
        let claims = self.inner.fuse_claims.clone();
        let mut claimed = claims.lock().unwrap_or_else(|p| p.into_inner());
        let id = self.free_fuse_id(&st.volume_id, &claimed)?;
        claimed.insert(st.volume_id.clone(), id);
        st.fuse_id = Some(id);
        Ok(Some(Claim { claims: claims.clone(), volume: st.volume_id.clone() }))
    }

    /// Give volume `volume` (staged, its lock held) a FUSE id for a lazy dynamic mount's server
    /// when its record has none yet (a volume whose own plan runs no host-mounted program):
    /// the lowest free one, recorded before it is returned. Blocking.
    pub(super) fn mount_fuse_id(&self, volume: &str) -> Result<u32, Error> {
        let mut st = self
            .inner
            .store
            .load(volume)?
            .ok_or_else(|| Error::unavailable(format!("volume {volume} is not staged here any more")))?;
        if let Some(id) = st.fuse_id {
            return Ok(id);
        }
        let claims = self.inner.fuse_claims.clone();
        let claimed = claims.lock().unwrap_or_else(|p| p.into_inner());
        let id = self.free_fuse_id(volume, &claimed)?;
        st.fuse_id = Some(id);
        self.inner.store.save(&st)?;
        Ok(id)
    }

    /// The lowest id of `--fuse-ids` that no other volume's record holds, no other stage in
    /// flight has claimed (`claimed`, held by the caller) and no live process has.
    fn free_fuse_id(&self, volume: &str, claimed: &BTreeMap<String, u32>) -> Result<u32, Error> {
        let range = self.inner.config.fuse_ids;
        let records = self.inner.store.all()?;
        // An id some process still runs as (one an earlier holder left behind, the program of a
        // volume whose record cannot be read) is not free either.
        let running = self
            .inner
            .exec
            .ids_in_use()
            .map_err(|e| Error::internal(format!("listing the user and group ids of running processes: {e}")))?;
        // And the ids of records of a newer schema (after a rollback), read leniently.
        let refused = self.inner.store.refused_claims()?.fuse_ids;
        let taken: BTreeSet<u32> = records
            .iter()
            .filter(|r| r.volume_id != volume)
            .filter_map(|r| r.fuse_id)
            .chain(claimed.iter().filter(|(v, _)| v.as_str() != volume).map(|(_, id)| *id))
            .chain(running)
            .chain(refused)
            .collect();
        range.ids().find(|i| !taken.contains(i)).ok_or_else(|| {
            Error::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "every FUSE id of {}-{} (--fuse-ids) is taken by a staged volume or a running process; unstage a \
                     volume or widen the range",
                    range.first, range.last
                ),
            )
        })
    }

    /// The FUSE id recorded for volume `id`: what its host-mounted program runs as. Refused
    /// when none is recorded, so a program never runs with an id its record does not hold.
    pub(super) fn recorded_fuse_id(&self, id: &str) -> Result<u32, Error> {
        self.inner.store.load(id)?.and_then(|st| st.fuse_id).ok_or_else(|| {
            Error::internal(format!("volume {id} has no FUSE id recorded; its host-mounted program is not started"))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;
    use crate::config::{Config, FuseIds};
    use crate::exec::recording::Recording;
    use crate::plan::HostMount;
    use crate::plugin::PluginRuntime;
    use crate::volume::state::{Phase, SCHEMA_VERSION};

    fn node(ids: &str) -> (tempfile::TempDir, Node) {
        let (dir, node, _) = node_with(ids);
        (dir, node)
    }

    fn node_with(ids: &str) -> (tempfile::TempDir, Node, Arc<Recording>) {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let mut config = Config::new(root.join("state"));
        config.kubelet_dir = root.join("kubelet");
        config.fuse_ids = FuseIds::parse(ids).unwrap();
        let runtime = Arc::new(PluginRuntime::new(config.runtime()).unwrap());
        let rec = Arc::new(Recording::new());
        let node = Node::new(config, runtime, rec.clone()).unwrap();
        (dir, node, rec)
    }

    fn record(id: &str, host_fd: bool) -> VolumeState {
        let step = Step::SpawnFuse {
            program: "sshfs".into(),
            executable: "/usr/bin/sshfs".into(),
            args: vec![],
            env: vec![],
            mountpoint: "/m".into(),
            fstype: "fuse.sshfs".into(),
            ready_timeout_ms: 1,
            memory_limit_bytes: None,
            host_mount: host_fd.then(|| HostMount { source: "s".into(), options: vec![], readonly: false }),
            lazy: None,
        };
        VolumeState {
            version: SCHEMA_VERSION,
            volume_id: id.into(),
            plugin: "sshfs".into(),
            digest: "sha256:00".into(),
            pinned: false,
            source: None,
            boot_id: "b".into(),
            phase: Phase::Staging,
            staging_path: PathBuf::from("/k").join(id),
            context: Default::default(),
            plan: Plan { plugin: "sshfs".into(), digest: "sha256:00".into(), steps: vec![step], attributes: vec![] },
            process: None,
            published: Default::default(),
            ephemeral: false,
            restarts: 0,
            oom_kills: 0,
            capability: None,
            dynamic: Default::default(),
            fuse_id: None,
            signed_by: Vec::new(),
            chunk_index_required: false,
            verified: None,
            cgroup: format!("mounthost/{}", crate::volume::dirs::volume_key(id)),
        }
    }

    #[test]
    fn each_volume_gets_the_lowest_id_no_record_or_claim_holds() {
        let (_dir, n) = node("100000-100002");
        // A stage in flight: claimed, not yet recorded.
        let mut a = record("a", true);
        let claim_a = n.assign_fuse_id(&mut a).unwrap().expect("claimed");
        assert_eq!(a.fuse_id, Some(100000));
        let mut b = record("b", true);
        let claim_b = n.assign_fuse_id(&mut b).unwrap().expect("claimed");
        assert_eq!(b.fuse_id, Some(100001), "a's claim is respected before a's record exists");
        // a's job recorded it and dropped its claim: still taken, by the record.
        n.store().save(&a).unwrap();
        drop(claim_a);
        let mut c = record("c", true);
        let _claim_c = n.assign_fuse_id(&mut c).unwrap();
        assert_eq!(c.fuse_id, Some(100002));
        // Every id taken.
        let mut d = record("d", true);
        let err = n.assign_fuse_id(&mut d).err().expect("exhausted");
        assert_eq!(err.kind, ErrorKind::ResourceExhausted, "{}", err.message);
        assert_eq!(d.fuse_id, None);
        // b's stage failed (no record): its id is free again once its claim drops.
        drop(claim_b);
        assert!(n.assign_fuse_id(&mut d).unwrap().is_some());
        assert_eq!(d.fuse_id, Some(100001));
        // A recorded id is kept (restage, restart); a volume without a host-mounted program has none.
        let mut again = a.clone();
        assert!(n.assign_fuse_id(&mut again).unwrap().is_none());
        assert_eq!(again.fuse_id, Some(100000));
        let mut plain = record("plain", false);
        plain.fuse_id = Some(7);
        assert!(n.assign_fuse_id(&mut plain).unwrap().is_none());
        assert_eq!(plain.fuse_id, None);
        // Unstage forgets the record and frees its id.
        n.store().remove("a").unwrap();
        let mut e = record("e", true);
        let _claim_e = n.assign_fuse_id(&mut e).unwrap();
        assert_eq!(e.fuse_id, Some(100000));
        assert_eq!(n.recorded_fuse_id("a").unwrap_err().kind, ErrorKind::Internal);
    }

    #[test]
    fn an_id_a_live_process_still_has_is_not_handed_out() {
        let (_dir, n, rec) = node_with("100000-100002");
        // Left running as 100000 by a volume that is gone (no cgroup killed it), and 100001 a
        // group id of another.
        rec.hold_id(100000);
        rec.hold_id(100001);
        let mut a = record("a", true);
        let _claim = n.assign_fuse_id(&mut a).unwrap();
        assert_eq!(a.fuse_id, Some(100002));
        rec.hold_id(100002);
        let mut b = record("b", true);
        assert_eq!(n.assign_fuse_id(&mut b).err().expect("exhausted").kind, ErrorKind::ResourceExhausted);
    }
}
