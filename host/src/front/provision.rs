//! The controller pipeline (CreateVolume, DeleteVolume, ValidateVolumeCapabilities). It needs
//! no privilege: plugins plan HTTP calls to their backend, the policy checks them, and the
//! controller executes them itself.
//!
//! Volume ids are `<plugin>~<plugin's id>`, so DeleteVolume, which gets only the id, knows
//! which plugin to ask. The hosts a delete plan may reach are those granted by config plus
//! those named in the id: mounthost minted that id at CreateVolume, from an endpoint the
//! StorageClass granted.
//!
//! CSI answers this pipeline owes the CO beyond "it worked":
//! - CreateVolume of an existing name with other properties is ALREADY_EXISTS. The controller
//!   keeps no state, so the plugin plans a conditional request against what the backend
//!   recorded, and an `http` step answered **412 Precondition Failed** (not in its accepted
//!   statuses) means exactly that; later steps do not run.
//! - CreateVolume's capacity must be compatible with `capacity_range`: a negative range, or
//!   `required_bytes` above `limit_bytes`, is INVALID_ARGUMENT; a capacity the plugin answers
//!   above `limit_bytes`, or nonzero and below `required_bytes` (0 is a volume of no fixed
//!   size), is OUT_OF_RANGE ("Unsupported capacity_range"), as is the plugin's `out-of-range`.
//! - DeleteVolume of a volume that does not exist is OK (CSI: "If a volume corresponding to the
//!   specified volume_id does not exist or the artifacts associated with the volume do not exist
//!   anymore, the Plugin MUST reply 0 OK"): an id not of the `<plugin>~<id>` form (or naming
//!   something that cannot be a plugin) was never ours, a plugin's `not-found` for its part of
//!   the id means the same, and so does an id whose plugin no loaded plugin is when this
//!   controller holds no note for it (never noted, or its notes were lost): it knows no such
//!   volume. That answer is logged as a warning, since a plugin not installed here may have made
//!   it. ValidateVolumeCapabilities answers the same ids NOT_FOUND, and so ids whose plugin's
//!   `describe` finds the volume missing (once it would confirm the request).
//! - A volume created with a plugin pulled by OCI reference (`plugin: oci://…`): CreateVolume
//!   notes, for that volume id, the pinned reference before it answers, and DeleteVolume runs
//!   exactly that build with its own secrets (never another StorageClass's plugin that reports
//!   the same name). A noted build that cannot be pulled again is an error (the volume is known
//!   and the call cannot complete); once deleted, the note becomes a tombstone so a repeated
//!   DeleteVolume answers OK.
//! - One operation per volume id at a time in this process (a second is ABORTED), so two
//!   CreateVolume calls for one name cannot interleave their check and their write.
//! - ListVolumes carries no StorageClass: before CreateVolume answers, the backends the new
//!   volume is on (the hosts of its id its StorageClass granted) are recorded
//!   ([`super::backends`]), and after DeleteVolume a recorded one that lists no volume left is
//!   forgotten.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tracing::{info, warn};

use super::backends::Backends;
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::plan::policy::{self, Context, Operation};
use crate::plan::{Plan, Step};
use crate::plan::{resolve, secret_refs};
use crate::plugin::bindings::types as wit;
use crate::plugin::pulled::{self, PluginPuller, VolumeNote};
use crate::plugin::{BackendError, LoadedPlugin, PluginError, PluginRuntime};
use crate::proto::csi;
use crate::secrets::Secrets;
use crate::unpriv::http::{Call, HttpClient, HttpError};
use crate::unpriv::lookup::{Rounds, as_plan};
use crate::volume::VolumeDirs;
use crate::volume::lock::VolumeLocks;
use crate::volume::request;

/// The status an `http` step of a provision plan answers when the backend already holds the
/// volume with other properties (a failed `If-Match`): CreateVolume answers ALREADY_EXISTS.
pub const CONFLICT_STATUS: u16 = 412;

/// The controller service's logic.
#[derive(Clone)]
pub struct Controller {
    pub(super) config: Config,
    pub(super) runtime: Arc<PluginRuntime>,
    pub(super) http: HttpClient,
    /// Volume ids with a CreateVolume or DeleteVolume in flight.
    pub(super) locks: Arc<VolumeLocks>,
    /// Where plugins selected by OCI reference come from (none: such a StorageClass is refused).
    puller: Option<Arc<dyn PluginPuller>>,
    /// The backends CreateVolume provisioned on, which ListVolumes lists besides the granted
    /// hosts (none: only the granted hosts).
    pub(super) backends: Option<Arc<Backends>>,
}

impl Controller {
    /// A controller over `runtime`.
    pub fn new(config: Config, runtime: Arc<PluginRuntime>) -> Self {
        Controller {
            config,
            runtime,
            http: HttpClient::default(),
            locks: VolumeLocks::new(),
            puller: None,
            backends: None,
        }
    }

    /// Record the backends CreateVolume provisioned on in `backends`, for ListVolumes.
    pub fn with_backends(mut self, backends: Backends) -> Self {
        self.backends = Some(Arc::new(backends));
        self
    }

    /// Let StorageClasses select plugins by OCI reference (`plugin: oci://…`), pulled by `puller`.
    pub fn with_puller(mut self, puller: Arc<dyn PluginPuller>) -> Self {
        self.puller = Some(puller);
        self
    }

    /// CreateVolume.
    pub async fn create(&self, req: csi::CreateVolumeRequest) -> Result<csi::CreateVolumeResponse, Error> {
        let name = request::identifier("name", &req.name)?;
        if req.volume_capabilities.is_empty() {
            return Err(Error::invalid("volume_capabilities is required"));
        }
        let capabilities =
            req.volume_capabilities.iter().map(|c| request::capability(Some(c))).collect::<Result<Vec<_>, _>>()?;
        request::map("parameters", &req.parameters)?;
        let secrets = request::secrets(&req.secrets)?;
        if req.volume_content_source.is_some() {
            return Err(Error::invalid("volume_content_source (cloning, snapshots) is not supported"));
        }
        let (required, limit) =
            req.capacity_range.as_ref().map(|r| (r.required_bytes, r.limit_bytes)).unwrap_or((0, 0));
        // CSI: "The value of this field MUST NOT be negative"; a range with nothing in it is no range.
        if required < 0 || limit < 0 {
            return Err(Error::invalid(format!(
                "capacity_range is invalid: required_bytes {required} and limit_bytes {limit} must not be negative"
            )));
        }
        if limit > 0 && required > limit {
            return Err(Error::invalid(format!(
                "capacity_range is invalid: required_bytes {required} is more than limit_bytes {limit}"
            )));
        }
        let (plugin, source) = self.plugin(&req.parameters, &secrets, &name).await?;
        request::dynamic_plugins(&req.parameters, &plugin.info.name)?;
        request::lazy(&req.parameters)?;
        request::signed_by(&req.parameters)?;
        request::chunk_index_required(&req.parameters)?;
        request::platform(&req.parameters)?;
        let params = request::plugin_attrs(&req.parameters);
        let hosts = policy::endpoint_hosts(&plugin.info, params.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut rounds = Rounds::default();
        let (out, plan) = loop {
            let wreq = wit::ProvisionRequest {
                name: name.clone(),
                parameters: request::kvs(&params),
                secrets: request::secret_kvs(&secrets),
                capabilities: capabilities.clone(),
                required_bytes: required as u64,
                limit_bytes: limit as u64,
                looked_up: rounds.looked_up(),
            };
            let mut out = self.runtime.call(&plugin, &name, wreq).await?;
            let steps = std::mem::take(&mut out.steps);
            let mut plan = self.check(&plugin, Operation::Provision, hosts.clone(), &secrets, as_plan(steps))?;
            if rounds.settle(&self.http, &secrets, &plugin.info.name, &mut plan).await? {
                break (out, plan);
            }
        };
        // The capacity a volume gets must fit the range asked for (CSI: "Volume MUST be at least
        // this big", "Volume MUST not be bigger than this"; 0 is a volume of no fixed size). A
        // size the backend cannot make fit is "Unsupported capacity_range 11 OUT_OF_RANGE".
        let outside = if limit > 0 && out.capacity_bytes > limit as u64 {
            Some(format!("more than capacity_range.limit_bytes {limit}"))
        } else if out.capacity_bytes > 0 && out.capacity_bytes < required as u64 {
            Some(format!("less than capacity_range.required_bytes {required}"))
        } else {
            None
        };
        if let Some(outside) = outside {
            return Err(Error::new(
                ErrorKind::OutOfRange,
                format!(
                    "plugin {} would give the volume {} bytes, {outside}; ask for a range that holds that size",
                    plugin.info.name, out.capacity_bytes
                ),
            ));
        }
        let volume_id = format!("{}~{}", plugin.info.name, out.volume_id);
        request::volume_id(&volume_id).map_err(|e| {
            Error::internal(format!("plugin {} made an unusable volume id: {}", plugin.info.name, e.message))
        })?;
        let _guard = self.locks.try_lock(&volume_id)?;
        self.execute(&plan, &secrets).await.map_err(|e| match e {
            Failure::Conflict(e) => Error::exists(format!(
                "a volume named {name:?} already exists ({volume_id}) but not as this request asks, \
                 for example with another capacity; the backend refused the plugin's conditional \
                 request: {e}"
            )),
            Failure::Other(e) => e,
        })?;
        // ListVolumes carries no StorageClass: record the backend the volume is on, before
        // answering (a crash before this makes the CO retry, which records it).
        self.record_backends(&plugin.info.name, &out.volume_id, &hosts).await?;
        // DeleteVolume gets only the id: note, for this very volume, where its plugin came from.
        // Before answering, so a volume the CO knows of always has its note (a crash before
        // this makes the CO retry, which creates nothing new and writes the note).
        if let Some(source) = &source {
            self.puller()?.remember(&volume_id, source)?;
        }
        let mut context: HashMap<String, String> = params.into_iter().collect();
        // The plugin's context never sets the host's own keys.
        context
            .extend(out.context.into_iter().filter(|kv| !request::is_reserved(&kv.key)).map(|kv| (kv.key, kv.value)));
        context.insert(request::PLUGIN_KEY.into(), plugin.info.name.clone());
        // The host's own settings (a pinned build, a dynamic volume's) travel with the volume.
        for key in [
            request::DIGEST_KEY,
            request::DYNAMIC_KEY,
            request::DYNAMIC_PLUGINS_KEY,
            request::LAZY_KEY,
            request::SIGNED_BY_KEY,
            request::CHUNK_INDEX_KEY,
            request::PLATFORM_KEY,
        ]
        .into_iter()
        .chain(request::DYNAMIC_LIMIT_KEYS)
        {
            if let Some(v) = req.parameters.get(key) {
                context.insert(key.into(), v.clone());
            }
        }
        // A plugin pulled by reference: the node pulls the manifest this call resolved (a tag
        // resolved here once) and runs exactly this build.
        if let Some(source) = source {
            context.insert(request::PLUGIN_KEY.into(), source);
            context.insert(request::DIGEST_KEY.into(), plugin.digest.to_string());
        }
        info!(volume.id = %volume_id, name = %name, "volume created");
        Ok(csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                capacity_bytes: i64::try_from(out.capacity_bytes).unwrap_or(i64::MAX),
                volume_id,
                volume_context: context,
                content_source: None,
                accessible_topology: Vec::new(),
            }),
        })
    }

    /// DeleteVolume. Ids this driver cannot have made, ids of a plugin that is not loaded and
    /// that no note names, and ids the plugin does not know, are volumes that do not exist: OK.
    /// A volume created with a plugin pulled by reference runs exactly the build noted for it
    /// at CreateVolume, with this call's secrets.
    pub async fn delete(&self, req: csi::DeleteVolumeRequest) -> Result<(), Error> {
        let id = request::volume_id(&req.volume_id)?;
        let secrets = request::secrets(&req.secrets)?;
        let Some((plugin_name, inner)) = split_id(&id).ok().filter(|(p, _)| crate::plugin::info::valid_name(p)) else {
            info!(volume.id = %id, "DeleteVolume of an id mounthost never makes (<plugin>~<id>): nothing to delete");
            return Ok(());
        };
        let note = self.note(&id)?;
        if let VolumeNote::Deleted(source) = &note {
            info!(volume.id = %id, %source, "DeleteVolume of a volume deleted before: nothing to delete");
            return Ok(());
        }
        let loaded = self.volume_plugin(&id, plugin_name, &note, &secrets).await.map_err(|e| {
            if e.kind == ErrorKind::Unavailable {
                return e;
            }
            Error::precondition(format!(
                "volume {id} belongs to plugin {plugin_name}, which cannot be loaded, so its data cannot be \
                 deleted: {e}. Otherwise install the plugin again (its .wasm in the controller's plugin \
                 folder), or delete the data by hand and remove the PersistentVolume with reclaimPolicy Retain"
            ))
        })?;
        // No plugin of that name and no note (never noted, or the notes were lost): this
        // controller knows no such volume, and CSI answers a volume that does not exist with OK.
        let Some(plugin) = loaded else {
            warn!(
                volume.id = %id,
                plugin = plugin_name,
                "DeleteVolume of an id no loaded plugin can have made, and of which this controller holds no note: \
                 OK, as for a volume that does not exist. If a plugin not installed here made it (or one pulled \
                 by OCI reference, whose note was lost with the controller's state), its data is still in that \
                 plugin's backend: delete it there by hand"
            );
            return Ok(());
        };
        let wreq = wit::DeleteRequest { volume_id: inner.to_string(), secrets: request::secret_kvs(&secrets) };
        match self.runtime.call(&plugin, &id, wreq).await {
            Ok(wplan) => {
                let plan = self.check(&plugin, Operation::Delete, hosts_in_id(inner), &secrets, wplan)?;
                let _guard = self.locks.try_lock(&id)?;
                self.execute(&plan, &secrets).await.map_err(Failure::into_error)?;
                info!(volume.id = %id, "volume deleted");
            }
            Err(PluginError::Backend { error: BackendError::NotFound(why), .. }) => {
                info!(volume.id = %id, %why, "the plugin does not know this volume id: nothing to delete");
            }
            Err(e) => return Err(e.into()),
        }
        if matches!(note, VolumeNote::Source(_)) {
            self.puller()?.deleted(&id)?;
        }
        self.forget_backends(&plugin, inner).await;
        Ok(())
    }

    /// ValidateVolumeCapabilities: the plugin's `validate` over the volume's attributes, then,
    /// for what it would confirm, the plugin's `describe` (a volume it finds missing is
    /// NOT_FOUND). An unsupported capability or attribute is answered without `confirmed`
    /// whether or not the volume exists.
    pub async fn validate(
        &self,
        req: csi::ValidateVolumeCapabilitiesRequest,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse, Error> {
        let id = request::volume_id(&req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(Error::invalid("volume_capabilities is required"));
        }
        request::map("volume_context", &req.volume_context)?;
        request::map("parameters", &req.parameters)?;
        let secrets = request::secrets(&req.secrets)?;
        // CSI: "Volume does not exist 5 NOT_FOUND". An id mounthost never makes is no volume of
        // this driver's.
        let (plugin_name, _) =
            split_id(&id).ok().filter(|(p, _)| crate::plugin::info::valid_name(p)).ok_or_else(|| {
                Error::not_found(format!(
                    "volume {id:?} does not exist: mounthost never makes such an id (<plugin>~<id>)"
                ))
            })?;
        let unknown = || {
            Error::not_found(format!(
                "volume {id} does not exist here: no plugin called {plugin_name} is loaded in this controller, and it \
                 holds no note of a plugin pulled by OCI reference for it"
            ))
        };
        let mut capabilities = Vec::new();
        for c in &req.volume_capabilities {
            match request::capability(Some(c)) {
                Ok(c) => capabilities.push(c),
                Err(e) => return Ok(unconfirmed(e.message)),
            }
        }
        // A volume whose plugin was pulled by reference names it (pinned) in its context.
        let named = req.volume_context.get(request::PLUGIN_KEY);
        let plugin = match named.filter(|v| pulled::is_reference(v)) {
            Some(source) => {
                let allow_tags = self.config.allow_plugin_tags;
                pulled::select(&self.runtime, self.puller()?, source, allow_tags, &secrets, &id).await?.plugin
            }
            None => match (self.note(&id)?, req.volume_context.get(request::DIGEST_KEY)) {
                // A folder or stock plugin pinned to a build: that build validates.
                (VolumeNote::None, Some(digest)) => match self.runtime.resolve(plugin_name, Some(digest)).await {
                    Ok(p) => p,
                    Err(e @ (PluginError::UnknownDigest { .. } | PluginError::BadDigest(_))) => {
                        return Ok(unconfirmed(format!(
                            "volume_context pins a build of plugin {plugin_name} this controller cannot confirm: {e}"
                        )));
                    }
                    Err(PluginError::UnknownPlugin { .. }) => return Err(unknown()),
                    Err(e) => return Err(e.into()),
                },
                (note, _) => self.volume_plugin(&id, plugin_name, &note, &secrets).await?.ok_or_else(unknown)?,
            },
        };
        // The host's own keys are the host's to check: what is confirmed must have been checked.
        if let Some(why) = Self::host_keys_refused(&req, plugin_name, &plugin) {
            return Ok(unconfirmed(why));
        }
        let mut attrs = request::plugin_attrs(&req.volume_context);
        attrs.extend(request::plugin_attrs(&req.parameters));
        let wreq = wit::ValidateRequest {
            parameters: request::kvs(&attrs),
            secrets: request::secret_kvs(&secrets),
            capabilities,
        };
        if let Err(e) = self.runtime.call(&plugin, &id, wreq).await {
            let e = Error::from(e);
            return if e.kind == ErrorKind::InvalidArgument { Ok(unconfirmed(e.message)) } else { Err(e) };
        }
        // What would be confirmed is confirmed of a volume that exists. CSI: "Volume does not
        // exist 5 NOT_FOUND" (a plugin that cannot tell says so, and the volume is confirmed).
        if self.existence(&plugin, &id, &req.volume_context, &secrets).await? == wit::Existence::Missing {
            return Err(Error::not_found(format!("volume {id} does not exist: its plugin finds no such volume")));
        }
        Ok(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
                mutable_parameters: HashMap::new(),
            }),
            message: String::new(),
        })
    }

    /// Why ValidateVolumeCapabilities cannot confirm the host's own keys of a request for a
    /// volume of `plugin` (named `name` in its id), if it cannot: a context that names another
    /// plugin or pins another build than the one that validates, dynamic settings
    /// CreateVolume would refuse.
    fn host_keys_refused(
        req: &csi::ValidateVolumeCapabilitiesRequest,
        name: &str,
        plugin: &LoadedPlugin,
    ) -> Option<String> {
        let context = &req.volume_context;
        if let Some(named) = context.get(request::PLUGIN_KEY).filter(|v| !pulled::is_reference(v))
            && named != name
        {
            return Some(format!(
                "volume_context names plugin {}, but the volume id belongs to plugin {name}",
                request::shown(named)
            ));
        }
        // A reference's build calls itself by its own name.
        if plugin.info.name != name {
            return Some(format!(
                "the volume's plugin build calls itself {}, but the volume id belongs to plugin {name}",
                plugin.info.name
            ));
        }
        if let Some(digest) = context.get(request::DIGEST_KEY)
            && *digest != plugin.digest.to_string()
        {
            return Some(format!(
                "volume_context pins build {} of plugin {name}, but the volume's plugin is build {}",
                request::shown(digest),
                plugin.digest
            ));
        }
        for (what, attrs) in [("volume_context", context), ("parameters", &req.parameters)] {
            if let Err(e) = request::dynamic_plugins(attrs, name).and_then(|_| request::lazy(attrs)) {
                return Some(format!("{what}: {}", e.message));
            }
        }
        None
    }

    /// The plugin `params` select for CreateVolume of `volume`, and for one selected by OCI
    /// reference, that reference pinned to the manifest it resolved to.
    pub(super) async fn plugin(
        &self,
        params: &HashMap<String, String>,
        secrets: &Secrets,
        volume: &str,
    ) -> Result<(Arc<LoadedPlugin>, Option<String>), Error> {
        let Some(name) = params.get(request::PLUGIN_KEY) else {
            let known: Vec<String> = self.runtime.list().await.iter().map(|p| p.info.name.clone()).collect();
            return Err(Error::invalid(format!(
                "the StorageClass parameter `{}` is required; known plugins: {}",
                request::PLUGIN_KEY,
                known.join(", ")
            )));
        };
        let asked_digest = params.get(request::DIGEST_KEY);
        if pulled::is_reference(name) {
            let selected = pulled::select(
                &self.runtime,
                self.puller()?,
                name,
                self.config.allow_plugin_tags,
                secrets,
                &format!("CreateVolume {volume}"),
            )
            .await?;
            if let Some(d) = asked_digest
                && *d != selected.plugin.digest.to_string()
            {
                return Err(Error::invalid(format!(
                    "digest mismatch: parameter {} expects plugin build {d}, but {} holds build {}",
                    request::DIGEST_KEY,
                    selected.source,
                    selected.plugin.digest
                )));
            }
            return Ok((selected.plugin, Some(selected.source)));
        }
        let name = request::identifier("parameter plugin", name)?;
        Ok((self.runtime.resolve(&name, asked_digest.map(String::as_str)).await?, None))
    }

    fn puller(&self) -> Result<&dyn PluginPuller, Error> {
        self.puller.as_deref().ok_or_else(|| {
            Error::precondition("this CSI controller cannot pull plugins by OCI reference (it has no blob cache)")
        })
    }

    /// What this controller noted at CreateVolume about volume `id`'s pulled plugin.
    pub(super) fn note(&self, id: &str) -> Result<VolumeNote, Error> {
        match self.puller.as_deref() {
            Some(p) => p.recall(id),
            None => Ok(VolumeNote::None),
        }
    }

    /// The plugin of volume `id` (`<name>~…`) when the call names no reference (DeleteVolume,
    /// validation): the build pulled from the reference noted for exactly this volume at
    /// CreateVolume (pulled again with `secrets` when not loaded), else the folder's or the
    /// stock plugin called `name`; `None` when there is neither (no plugin of that name and no
    /// note: this controller knows no such volume).
    pub(super) async fn volume_plugin(
        &self,
        id: &str,
        name: &str,
        note: &VolumeNote,
        secrets: &Secrets,
    ) -> Result<Option<Arc<LoadedPlugin>>, Error> {
        if let (VolumeNote::Source(source), Some(puller)) = (note, self.puller.as_deref()) {
            let selected = pulled::select(&self.runtime, puller, source, false, secrets, id).await?;
            if selected.plugin.info.name != name {
                return Err(Error::precondition(format!(
                    "volume {id} was created with {source}, whose plugin now calls itself {}, not {name}",
                    selected.plugin.info.name
                )));
            }
            return Ok(Some(selected.plugin));
        }
        match self.runtime.resolve(name, None).await {
            Err(PluginError::UnknownPlugin { .. }) => Ok(None),
            other => Ok(Some(other?)),
        }
    }

    pub(super) fn check(
        &self,
        plugin: &LoadedPlugin,
        operation: Operation,
        hosts: BTreeSet<String>,
        secrets: &Secrets,
        wplan: wit::Plan,
    ) -> Result<Plan, Error> {
        let grant = self.config.grant(&plugin.info.name);
        let dirs = VolumeDirs::default();
        let ctx = Context {
            operation,
            plugin: &plugin.info.name,
            digest: plugin.digest.to_string(),
            grant: &grant,
            programs: &self.config.programs,
            program_args: &self.config.program_args,
            rules: &self.config.program_rules,
            endpoint_hosts: hosts,
            dirs: &dirs,
            secrets,
        };
        let plan = policy::check(&ctx, wplan)?;
        if secret_refs(&plan).iter().any(|k| k == crate::plugin::pulled::AUTH_SECRET_KEY) {
            return Err(Error::invalid(format!(
                "plugin {} references the secret {}, the host's credentials for pulling plugins, which plugins never get",
                plugin.info.name,
                crate::plugin::pulled::AUTH_SECRET_KEY
            )));
        }
        if let Some(key) = secret_refs(&plan).into_iter().find(|k| secrets.get(k).is_none()) {
            return Err(Error::invalid(format!(
                "plugin {} needs the secret {key:?}, which the request does not carry",
                plugin.info.name
            )));
        }
        Ok(plan)
    }

    /// Run a plan's `http` steps in order; the first refused one ends it.
    pub(super) async fn execute(&self, plan: &Plan, secrets: &Secrets) -> Result<(), Failure> {
        for step in &plan.steps {
            let Step::Http { method, urls, headers, body, ok_status } = step else {
                return Err(Failure::Other(Error::internal(format!("a {} step reached the controller", step.kind()))));
            };
            let call = Call {
                method: method.clone(),
                urls: urls.clone(),
                headers: headers.iter().map(|h| (h.name.clone(), resolve(&h.value, secrets))).collect(),
                body: body.clone(),
                ok_status: ok_status.clone(),
            };
            self.http.call(&call).await.map_err(|e| {
                let message = secrets.scrub(&format!("plugin {}: {e}", plan.plugin));
                match e {
                    HttpError::Status { status: CONFLICT_STATUS, .. } => Failure::Conflict(message),
                    HttpError::Unreachable { .. } => Failure::Other(Error::unavailable(message)),
                    HttpError::Status { status, .. } if status >= 500 => Failure::Other(Error::unavailable(message)),
                    // CSI's general rows: "does not carry secrets that are valid for
                    // authentication", and an identity "that does not have permission".
                    HttpError::Status { status: 401, .. } => {
                        Failure::Other(Error::new(ErrorKind::Unauthenticated, message))
                    }
                    HttpError::Status { status: 403, .. } => {
                        Failure::Other(Error::new(ErrorKind::PermissionDenied, message))
                    }
                    HttpError::Status { .. } => Failure::Other(Error::precondition(message)),
                    HttpError::Invalid(_) => Failure::Other(Error::internal(message)),
                }
            })?;
        }
        Ok(())
    }
}

/// How executing a plan failed.
pub(super) enum Failure {
    /// A step was answered 412: the backend holds the volume with other properties.
    Conflict(String),
    /// Anything else, already classified.
    Other(Error),
}

impl Failure {
    /// Outside CreateVolume a 412 is just a status the plan did not accept.
    pub(super) fn into_error(self) -> Error {
        match self {
            Failure::Conflict(message) => Error::precondition(message),
            Failure::Other(e) => e,
        }
    }
}

fn unconfirmed(message: String) -> csi::ValidateVolumeCapabilitiesResponse {
    csi::ValidateVolumeCapabilitiesResponse { confirmed: None, message }
}

/// `<plugin>~<id>` → its parts.
pub fn split_id(id: &str) -> Result<(&str, &str), Error> {
    match id.split_once('~') {
        Some((p, rest)) if !p.is_empty() && !rest.is_empty() => Ok((p, rest)),
        _ => Err(Error::invalid(format!("volume id {id:?} was not made by mounthost (expected <plugin>~<id>)"))),
    }
}

/// Hosts named in a volume id: every `/`, `,`-separated token that reads as `host:port`.
pub fn hosts_in_id(id: &str) -> BTreeSet<String> {
    id.split(['/', ','])
        .filter(|t| {
            t.rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_ascii_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_plugin_and_hosts() {
        assert_eq!(
            split_id("seaweedfs~127.0.0.1:8888/buckets/pvc-1").unwrap(),
            ("seaweedfs", "127.0.0.1:8888/buckets/pvc-1")
        );
        for bad in ["plain", "~x", "p~"] {
            assert_eq!(split_id(bad).unwrap_err().kind, ErrorKind::InvalidArgument, "{bad}");
        }
        let hosts = hosts_in_id("a:1,Filer.example:8888/k8s/pvc-2");
        assert_eq!(hosts.into_iter().collect::<Vec<_>>(), vec!["a:1".to_string(), "filer.example:8888".to_string()]);
        assert!(hosts_in_id("/buckets/pvc:x").is_empty());
    }

    #[test]
    fn a_412_is_already_exists_only_for_create_volume() {
        // CreateVolume maps Failure::Conflict itself; everywhere else it is a refused status.
        assert_eq!(Failure::Conflict("412".into()).into_error().kind, ErrorKind::FailedPrecondition);
        let other = Error::unavailable("down");
        assert_eq!(Failure::Other(other.clone()).into_error(), other);
    }
}
