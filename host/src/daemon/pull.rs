//! Stage plans that name an OCI artifact, and why a stage that needs a download answers at once.
//!
//! A planner that wants an artifact plans a single `resolve` step. The host resolves the
//! reference (manifest and config, over the distribution protocol, from a registry the policy
//! granted) and calls the planner again with what it found; that plan carries the same
//! `resolve` step, a `fetch-blob` step per blob and the steps that use them. Before anything
//! is executed, every blob must be in the node's cache ([`crate::oci`]):
//!
//! - all there: the plan runs like any other (unpack links files from the cache);
//! - some missing: their downloads start (or keep going) in the host, and the stage answers
//!   UNAVAILABLE at once with the progress. kubelet retries NodeStageVolume with backoff; a
//!   later retry finds the blobs and stages. A 15 GB model never holds a call past kubelet's
//!   deadline, and a retry never starts a second download of a blob;
//! - a download failed for good (unknown blob, credentials, digest mismatch, disk full): that
//!   retry gets the error naming the reference; the next one starts over.
//!
//! Why UNAVAILABLE: it is the gRPC code for "transient, retry with backoff", and kubelet treats
//! it as a non-final error, so the volume stays "maybe mounted" and kubelet calls
//! NodeUnstageVolume if the pod goes away meanwhile, which cancels this volume's wait.

use std::collections::{BTreeMap, BTreeSet};

use super::Node;
use super::lazy::IndexChoice;
use super::stage::StageAsk;
use crate::error::Error;
use crate::exec::artifacts::Prepared;
use crate::oci::{BlobRef, Credentials, Ensure, OciError, Progress, Source};
use crate::plan::oci_ref::OciRef;
use crate::plan::policy::Operation;
use crate::plan::{Plan, RegistryAuth, Step};
use crate::plugin::LoadedPlugin;
use crate::plugin::bindings::types as wit;
use crate::secrets::Secrets;
use crate::unpriv::lookup::Rounds;
use crate::volume::VolumeDirs;
use crate::volume::request;
use crate::volume::state::Verification;

impl Node {
    /// The checked stage plan of `plugin` for `ask`: one planner call, or two when the first
    /// plan asks to resolve an OCI reference (then every blob the second names is in the cache,
    /// or the call ends with UNAVAILABLE while they download), and what its signature policy
    /// verified ([`super::signed`]; `earlier`: what an earlier stage of the volume verified, and
    /// its plan).
    pub(super) async fn stage_plan(
        &self,
        plugin: &LoadedPlugin,
        ask: &StageAsk,
        attrs: &BTreeMap<String, String>,
        dirs: &VolumeDirs,
        earlier: Option<(&Verification, &Plan)>,
    ) -> Result<(Plan, Option<Verification>), Error> {
        let pinned = earlier.map(|(v, _)| v);
        let plan = self.planned_stage(plugin, ask, attrs, dirs, None).await?;
        let lazy = request::lazy(&ask.context)?;
        let policy = self.policy(&request::signed_by(&ask.context)?, request::chunk_index_required(&ask.context)?);
        let Some(first) = resolve_step(&plan).cloned() else {
            if lazy {
                return Err(Error::invalid(format!(
                    "volume {}: volume attribute {} is \"true\", but plugin {} plans no OCI artifact to serve lazily",
                    ask.id,
                    request::LAZY_KEY,
                    plugin.info.name
                )));
            }
            if policy.required && (!policy.signers.is_empty() || super::signed::names_artifact(&plan)) {
                let asked = if policy.signers.is_empty() {
                    "--require-signature".to_string()
                } else {
                    format!("{} {}", request::SIGNED_BY_KEY, policy.signers.join(","))
                };
                return Err(super::signed::refusal(
                    &format!("volume {}", ask.id),
                    "unsupported",
                    "model",
                    format!(
                        "it must be signed ({asked}), but plugin {} resolves no OCI artifact whose signature the host could check",
                        plugin.info.name
                    ),
                ));
            }
            return Ok((plan, None));
        };
        let mut source = self.source(&first, &ask.secrets)?;
        source.platform = crate::volume::request::platform(&ask.context)?;
        let reference = source_name(&first);
        let found = self.inner.artifacts.resolve(&source).await.map_err(|e| oci_error(e, &reference))?;
        let asked = match &first {
            Step::Resolve { reference, .. } => reference,
            _ => return Ok((plan, None)),
        };
        let manifest_digest = found.manifest_digest.clone();
        let manifest = found.manifest.clone();
        let resolved = wit::Resolved {
            reference: asked.clone(),
            manifest_digest: found.manifest_digest,
            manifest: found.manifest,
            config: found.config,
        };
        let plan = self.planned_stage(plugin, ask, attrs, dirs, Some(resolved)).await?;
        if resolve_step(&plan) != Some(&first) {
            return Err(Error::internal(format!(
                "plugin {} answered the resolved {reference} with a plan that does not resolve it again unchanged",
                plugin.info.name
            )));
        }
        // Before any layer is fetched: the signature, the raw layers' files, a lazy volume's index.
        let served = earlier.map(|(v, p)| (v, super::signed::layout(p).unwrap_or_default()));
        let checked = self
            .check_signature(&policy, &plan, lazy, &source, &reference, &manifest, &manifest_digest, served)
            .await?;
        if lazy {
            if checked.needs_trees() {
                // Under a policy, a lazy volume's tar layers are fetched and checked before it
                // serves anything (a raw layer's chunks are checked against the signed index).
                let tars: BTreeSet<&str> = checked.tar_digests().collect();
                let steps = plan
                    .steps
                    .iter()
                    .filter(|s| match s {
                        Step::FetchBlob { digest, .. } | Step::Unpack { digest, .. } => tars.contains(digest.as_str()),
                        _ => false,
                    })
                    .cloned()
                    .collect();
                self.pull_ready(&ask.id, &source, &reference, Plan { steps, ..plan.clone() }).await?;
                self.checked_trees(&ask.id, &checked).await?;
            }
            let index = match (&checked.verification.index, pinned) {
                (Some(d), _) => IndexChoice::Use(d.clone(), checked.verification.index_size),
                (None, Some(p)) if p.manifest == manifest_digest && p.index.is_some() => {
                    IndexChoice::Use(p.index.clone().unwrap_or_default(), p.index_size)
                }
                _ => IndexChoice::Lookup,
            };
            // Nothing waits for the blobs: the host's server reads them as its readers ask.
            let control = crate::plan::lazy::STAGE_CONTROL.to_string();
            let plan = self
                .lazy_plan(&ask.id, plan, &source, &reference, &manifest_digest, index, control, &|_| Ok(()))
                .await?;
            self.lazy_register(&ask.id, &plan);
            let mut verification = checked.verification;
            verification.index = crate::plan::lazy::layers(&plan).and_then(|l| l.index.clone());
            if verification.index.is_none() {
                verification.index_size = 0;
            } else if verification.index_size == 0 {
                verification.index_size = pinned.map(|p| p.index_size).unwrap_or_default();
            }
            let record = verification.signer.is_some() || verification.index.is_some();
            return Ok((plan, record.then_some(verification)));
        }
        let mut plan = self.pull_ready(&ask.id, &source, &reference, plan).await?;
        self.checked_trees(&ask.id, &checked).await?;
        if policy.required
            && let Some(root) = super::signed::layout_root(&plan)
            && let Some(first) = plan.steps.iter().position(|s| matches!(s, Step::Unpack { .. }))
        {
            // What an earlier stage left in the layers' directory is not what was verified now:
            // it goes before the layers are linked in again.
            plan.steps.insert(first, Step::Remove { path: root });
        }
        let record = checked.verification.signer.is_some();
        Ok((plan, record.then_some(checked.verification)))
    }

    /// Round 2 of the signature check (off the async workers: it reads every byte of the tar
    /// layers); a refusal lets go of the volume's blobs.
    async fn checked_trees(&self, id: &str, checked: &super::signed::Checked) -> Result<(), Error> {
        let (c, id) = (checked.clone(), id.to_string());
        self.blocking(move |n| n.check_trees(&c).inspect_err(|_| n.inner.artifacts.forget(&id))).await
    }

    /// `plan` once every blob it fetches is in the node's cache and every archive it unpacks
    /// has its tree there; UNAVAILABLE while they download or unpack.
    async fn pull_ready(&self, id: &str, source: &Source, reference: &str, plan: Plan) -> Result<Plan, Error> {
        let blobs = plan_blobs(&plan);
        // A blob some other volume brought into the cache is this volume's only if its
        // credentials may read it from its registry (asked once per source and blob).
        self.inner.artifacts.authorize(source, &blobs).await.map_err(|e| oci_error(e, reference))?;
        match self.inner.artifacts.ensure(id, source, &blobs) {
            // A blob another source brought between the check above and now is proven too.
            Ensure::Ready => {
                self.inner.artifacts.authorize(source, &blobs).await.map_err(|e| oci_error(e, reference))?;
                self.trees_ready(id, plan, reference)
            }
            Ensure::Pulling(p) => {
                // A download that stopped retriably (the registry down, stalled) says why.
                let errors = self.inner.artifacts.last_errors();
                let last = p
                    .blobs
                    .iter()
                    .find_map(|b| errors.get(&b.digest))
                    .map(|e| format!("; its last attempt stopped: {e}"))
                    .unwrap_or_default();
                Err(Error::unavailable(format!(
                    "pulling {reference}: {}; the download goes on in the host daemon, retry later{last}",
                    describe(&p)
                )))
            }
            Ensure::Failed(e) => {
                // kubelet treats most of these codes as final and may never unstage: the volume
                // waits no more (and leaves ListVolumes); its next stage starts over.
                self.inner.artifacts.forget(id);
                Err(oci_error(e, reference))
            }
        }
    }

    /// One checked stage plan, the lookups the planner asks for answered (`unpriv::lookup`).
    pub(super) async fn planned_stage(
        &self,
        plugin: &LoadedPlugin,
        ask: &StageAsk,
        attrs: &BTreeMap<String, String>,
        dirs: &VolumeDirs,
        resolved: Option<wit::Resolved>,
    ) -> Result<Plan, Error> {
        let mut rounds = Rounds::default();
        loop {
            let request = wit::StageRequest {
                volume_id: ask.id.clone(),
                context: request::kvs(attrs),
                secrets: request::secret_kvs(&ask.secrets),
                capability: ask.capability.clone(),
                ephemeral: ask.ephemeral,
                resolved: resolved.clone(),
                looked_up: rounds.looked_up(),
                node_id: self.inner.config.node_id.clone(),
            };
            let wplan = self.inner.runtime.call(plugin, &ask.id, request).await?;
            let mut plan = self.check(plugin, Operation::Stage, dirs, attrs, ask.ephemeral, &ask.secrets, wplan)?;
            if rounds.settle(&self.inner.http, &ask.secrets, &plugin.info.name, &mut plan).await? {
                return Ok(plan);
            }
        }
    }

    /// `plan` once every archive it unpacks has its tree in the cache: unpacking a large tar
    /// layer runs in the background like its download, so the stage only links files.
    fn trees_ready(&self, id: &str, plan: Plan, reference: &str) -> Result<Plan, Error> {
        let mut working = 0;
        for step in &plan.steps {
            if let Step::Unpack { digest, format, layering, .. } = step {
                match self.inner.assembler.prepare(digest, *format, *layering) {
                    Prepared::Ready => {}
                    Prepared::Working => working += 1,
                    Prepared::Failed(e) => {
                        self.inner.artifacts.forget(id);
                        return Err(oci_error(e, reference));
                    }
                }
            }
        }
        if working > 0 {
            return Err(Error::unavailable(format!(
                "unpacking {reference}: {working} archive layer(s) still being unpacked into the node's cache; retry later"
            )));
        }
        Ok(plan)
    }

    /// What the cache needs to reach the artifact of a `resolve` step: registry, repository,
    /// tag or digest, mirror (the step's, else the node's for that registry), credentials read
    /// from the request's secrets (for the host contacted).
    ///
    /// Through the node's mirror (`--registry-mirror`), which the volume never named, only
    /// credentials meant for that mirror go there: the dockerconfigjson entry for the mirror's
    /// host; a username and password or a token (given for the registry the reference names)
    /// are not sent, the pull is anonymous. Plain HTTP to the node's mirror when the node lists it
    /// as insecure, unless credentials would cross it and the volume did not ask for plain HTTP.
    pub(super) fn source(&self, step: &Step, secrets: &Secrets) -> Result<Source, Error> {
        let Step::Resolve { reference, mirror, auth, insecure } = step else {
            return Err(Error::internal("not a resolve step"));
        };
        let parsed = OciRef::parse(reference).map_err(|e| Error::invalid(format!("reference {reference:?}: {e}")))?;
        let registry = parsed.registry().to_string();
        let own_mirror = mirror.is_some();
        let mirror = self.inner.artifacts.mirror_for(&registry, mirror.as_deref());
        let node_mirror = !own_mirror && mirror.is_some();
        let reached = mirror.clone().unwrap_or_else(|| registry.clone());
        let credentials = self.credentials(auth, secrets, &reached, node_mirror, reference)?;
        let insecure = match &mirror {
            Some(m) if node_mirror => {
                self.inner.artifacts.plain_http_allowed(m)
                    && (*insecure || matches!(credentials, Credentials::Anonymous))
            }
            _ => *insecure,
        };
        if insecure && !self.inner.config.registries.insecure.contains(&reached.to_ascii_lowercase()) {
            return Err(Error::precondition(format!(
                "{reference} asks for plain HTTP to {reached}, which this node does not allow; list it with \
                 --insecure-registry on the host daemon, or serve the registry over TLS"
            )));
        }
        Ok(Source {
            registry,
            repository: parsed.repository().to_string(),
            reference: parsed.digest().or(parsed.tag()).unwrap_or("latest").to_string(),
            mirror,
            credentials,
            insecure,
            platform: None,
        })
    }

    /// The credentials a `resolve` step's `auth` names, for the host `reached` (see
    /// [`Node::source`] for the node's mirror).
    fn credentials(
        &self,
        auth: &RegistryAuth,
        secrets: &Secrets,
        reached: &str,
        node_mirror: bool,
        reference: &str,
    ) -> Result<Credentials, Error> {
        let secret = |key: &str| {
            secrets.get(key).map(str::to_string).ok_or_else(|| {
                Error::invalid(format!(
                    "the credentials for {reached} name the secret {key:?}, which the request does not carry"
                ))
            })
        };
        Ok(match auth {
            RegistryAuth::Anonymous => Credentials::Anonymous,
            // Given for the registry the reference names: never to a mirror the volume did not name.
            RegistryAuth::Basic { .. } | RegistryAuth::Token(_) if node_mirror => Credentials::Anonymous,
            RegistryAuth::Basic { username_key, password_key } => {
                Credentials::Basic { username: secret(username_key)?, password: secret(password_key)? }
            }
            RegistryAuth::Token(key) => Credentials::Bearer(secret(key)?),
            RegistryAuth::DockerConfig(key) => crate::oci::credentials_from_docker_config(&secret(key)?, reached)
                .map_err(|e| oci_error(e, reference))?,
        })
    }

    /// The plugin a volume's first stage selects by OCI reference (`plugin: oci://…`): pulled
    /// through the node's cache with the stage's secrets, verified, compiled once. An inline
    /// volume may not (its attributes are the pod author's), and a `pluginDigest` must name the
    /// build the reference holds.
    pub(super) async fn select_pulled(
        &self,
        ask: &StageAsk,
        value: &str,
        asked_digest: Option<&String>,
    ) -> Result<crate::plugin::pulled::Selected, Error> {
        if ask.ephemeral {
            return Err(Error::invalid(format!(
                "volume {}: an inline (ephemeral) volume cannot select its plugin by OCI reference ({value}): its \
                 attributes are the pod author's, and would make the node pull and run code of their choosing; \
                 use a StorageClass or a PersistentVolume, or a plugin name",
                ask.id
            )));
        }
        let puller = self.puller();
        let allow_tags = self.inner.config.allow_plugin_tags;
        let selected =
            crate::plugin::pulled::select(&self.inner.runtime, &puller, value, allow_tags, &ask.secrets, &ask.id)
                .await?;
        if let Some(d) = asked_digest
            && *d != selected.plugin.digest.to_string()
        {
            return Err(Error::invalid(format!(
                "volume {}: digest mismatch: volume attribute {} expects plugin build {d}, but {} holds build {}",
                ask.id,
                request::DIGEST_KEY,
                selected.source,
                selected.plugin.digest
            )));
        }
        Ok(selected)
    }

    /// Volumes waiting for their blobs, with progress (ListVolumes).
    pub fn pulls(&self) -> BTreeMap<String, Progress> {
        self.inner.artifacts.progress()
    }
}

/// The blobs a plan's `fetch-blob` steps name, and those its lazy server serves.
pub(super) fn plan_blobs(plan: &Plan) -> Vec<BlobRef> {
    let lazy = crate::plan::lazy::layers(plan).into_iter().flat_map(|l| {
        l.layers.iter().map(|l| BlobRef { digest: l.digest.clone(), size: l.size, media_type: l.media_type.clone() })
    });
    plan.steps
        .iter()
        .filter_map(|s| match s {
            Step::FetchBlob { digest, size, media_type } => {
                Some(BlobRef { digest: digest.clone(), size: *size, media_type: media_type.clone() })
            }
            _ => None,
        })
        .chain(lazy)
        .collect()
}

/// The plan's `resolve` step, if any (the policy allows one).
fn resolve_step(plan: &Plan) -> Option<&Step> {
    plan.steps.iter().find(|s| matches!(s, Step::Resolve { .. }))
}

/// The reference of a `resolve` step, with the mirror it goes through.
fn source_name(step: &Step) -> String {
    match step {
        Step::Resolve { reference, mirror: Some(m), .. } => format!("{reference} (through mirror {m})"),
        Step::Resolve { reference, .. } => reference.clone(),
        other => other.kind().to_string(),
    }
}

/// `1.2 GiB of 15.0 GiB (8%), 3 of 7 blobs`.
pub fn describe(p: &Progress) -> String {
    let pct = (p.done_bytes * 100).checked_div(p.total_bytes).unwrap_or(0);
    let complete = p.blobs.iter().filter(|b| b.done >= b.total).count();
    format!(
        "{} of {} ({pct}%), {complete} of {} blobs",
        human_bytes(p.done_bytes),
        human_bytes(p.total_bytes),
        p.blobs.len()
    )
}

/// Bytes in the largest binary unit that keeps the number at or above 1.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}

/// A cache or registry failure as the caller sees it, naming what was asked for.
pub fn oci_error(e: OciError, reference: &str) -> Error {
    e.into_error(reference)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_a_person_writes_them() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(256 << 20), "256.0 MiB");
        assert_eq!(human_bytes(15 << 30), "15.0 GiB");
    }
}
