//! The controller's RPCs about volumes that exist: ControllerExpandVolume, GetCapacity,
//! ListVolumes, and whether a volume exists (ValidateVolumeCapabilities' NOT_FOUND). Each is a
//! plugin's planning (with the lookups it asks for, `unpriv::lookup`), the policy over what it
//! names, and for an expansion the plan's `http` steps run by the controller itself, as for
//! CreateVolume ([`super::provision`]).
//!
//! - **ControllerExpandVolume.** The volume's plugin is found from its id as for DeleteVolume;
//!   an id mounthost cannot have made, one deleted before, or one the plugin answers `not-found`
//!   for is NOT_FOUND; a capacity the plugin does not allow is OUT_OF_RANGE (the plugin's
//!   `out-of-range`, or an answer above `limit_bytes`).
//! - **GetCapacity.** The plugin the parameters select answers; a request naming no plugin
//!   asks about volumes CreateVolume would refuse, whose capacity is 0. A plugin that cannot
//!   tell is UNIMPLEMENTED, naming it (CSI: "If the plugin is unable to complete the
//!   GetCapacity call successfully, it MUST return a non-ok gRPC code").
//! - **ListVolumes.** Every loaded plugin, by name, lists what its granted hosts and the
//!   backends this controller provisioned on ([`super::backends`]) hold, a page at a time: the CSI token is `<plugin>:<the plugin's own token>`; one that does not parse
//!   or names a plugin not loaded is ABORTED (CSI: "Invalid starting_token"). mounthost never
//!   controller-publishes a volume (it has no PUBLISH_UNPUBLISH_VOLUME), so every entry's
//!   `published_node_ids` is empty, as the spec defines them.

use std::collections::{BTreeSet, HashMap};

use tracing::{debug, info, warn};

use super::backends;
use super::provision::{Controller, Failure, hosts_in_id, split_id};
use crate::error::{Error, ErrorKind};
use crate::plan::policy::{self, Operation};
use crate::plugin::bindings::types as wit;
use crate::plugin::pulled::VolumeNote;
use crate::plugin::{BackendError, LoadedPlugin, PluginError};
use crate::proto::csi;
use crate::secrets::Secrets;
use crate::unpriv::lookup::{Rounds, as_plan};
use crate::volume::request;
use crate::volume::size::{expansion_range, fits};

/// Longest plugin token in a ListVolumes token.
pub const MAX_PLUGIN_TOKEN: usize = 256;

impl Controller {
    /// ControllerExpandVolume.
    pub async fn expand(
        &self,
        req: csi::ControllerExpandVolumeRequest,
    ) -> Result<csi::ControllerExpandVolumeResponse, Error> {
        let id = request::volume_id(&req.volume_id)?;
        let (required, limit) = expansion_range(req.capacity_range.as_ref())?;
        let capability = req.volume_capability.as_ref().map(|c| request::capability(Some(c))).transpose()?;
        let secrets = request::secrets(&req.secrets)?;
        let not_ours = |why: String| Error::not_found(format!("volume {id} does not exist: {why}"));
        let (plugin_name, inner) = split_id(&id).map_err(|e| not_ours(e.message))?;
        if !crate::plugin::info::valid_name(plugin_name) {
            return Err(not_ours(format!("{plugin_name:?} is not a plugin name")));
        }
        let note = self.note(&id)?;
        if let VolumeNote::Deleted(_) = &note {
            return Err(not_ours("it was deleted".into()));
        }
        let plugin = self.volume_plugin(&id, plugin_name, &note, &secrets).await?.ok_or_else(|| {
            not_ours(format!("no plugin called {plugin_name} is loaded here, and this controller holds no note of it"))
        })?;
        let _guard = self.locks.try_lock(&id)?;
        let mut rounds = Rounds::default();
        let (out, plan) = loop {
            let wreq = wit::ExpandRequest {
                volume_id: inner.to_string(),
                side: wit::ExpandSide::Controller,
                required_bytes: required,
                limit_bytes: limit,
                secrets: request::secret_kvs(&secrets),
                capability: capability.clone(),
                context: Vec::new(),
                recorded: Vec::new(),
                looked_up: rounds.looked_up(),
            };
            let mut out = match self.runtime.call(&plugin, &id, wreq).await {
                Ok(out) => out,
                Err(PluginError::Backend { error: BackendError::NotFound(why), .. }) => return Err(not_ours(why)),
                Err(e) => return Err(e.into()),
            };
            let steps = std::mem::take(&mut out.steps);
            let mut plan = self.check(&plugin, Operation::Expand, hosts_in_id(inner), &secrets, as_plan(steps))?;
            if rounds.settle(&self.http, &secrets, &plugin.info.name, &mut plan).await? {
                break (out, plan);
            }
        };
        fits(&plugin.info.name, out.capacity_bytes, required, limit)?;
        self.execute(&plan, &secrets).await.map_err(Failure::into_error)?;
        info!(volume.id = %id, capacity_bytes = out.capacity_bytes, node = out.node_expansion_required, "volume expanded");
        Ok(csi::ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(out.capacity_bytes).unwrap_or(i64::MAX),
            node_expansion_required: out.node_expansion_required,
        })
    }

    /// GetCapacity.
    pub async fn capacity(&self, req: csi::GetCapacityRequest) -> Result<csi::GetCapacityResponse, Error> {
        let capabilities =
            req.volume_capabilities.iter().map(|c| request::capability(Some(c))).collect::<Result<Vec<_>, _>>()?;
        request::map("parameters", &req.parameters)?;
        if req.accessible_topology.is_some() {
            return Err(Error::invalid(
                "accessible_topology is not supported (no VOLUME_ACCESSIBILITY_CONSTRAINTS capability)",
            ));
        }
        if !req.parameters.contains_key(request::PLUGIN_KEY) {
            // CreateVolume refuses such parameters: no volume of them can be made.
            return Ok(csi::GetCapacityResponse::default());
        }
        let (plugin, _) = self.plugin(&req.parameters, &Secrets::default(), "GetCapacity").await?;
        let params = request::plugin_attrs(&req.parameters);
        let hosts = policy::endpoint_hosts(&plugin.info, params.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let secrets = Secrets::default();
        let mut rounds = Rounds::default();
        let out = loop {
            let wreq = wit::CapacityRequest {
                parameters: request::kvs(&params),
                capabilities: capabilities.clone(),
                looked_up: rounds.looked_up(),
            };
            let mut out = self.runtime.call(&plugin, "GetCapacity", wreq).await?;
            let steps = std::mem::take(&mut out.steps);
            let mut plan = self.check(&plugin, Operation::Capacity, hosts.clone(), &secrets, as_plan(steps))?;
            if rounds.settle(&self.http, &secrets, &plugin.info.name, &mut plan).await? {
                break out;
            }
        };
        let Some(available) = out.available_bytes else {
            return Err(Error::new(
                ErrorKind::Unimplemented,
                format!(
                    "plugin {} cannot tell the capacity for these parameters (see its documentation for what it needs)",
                    plugin.info.name
                ),
            ));
        };
        let bytes = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Ok(csi::GetCapacityResponse {
            available_capacity: bytes(available),
            maximum_volume_size: out.maximum_volume_bytes.map(bytes),
            minimum_volume_size: out.minimum_volume_bytes.map(bytes),
        })
    }

    /// ListVolumes.
    pub async fn list(&self, req: csi::ListVolumesRequest) -> Result<csi::ListVolumesResponse, Error> {
        if req.max_entries < 0 {
            return Err(Error::invalid(format!("max_entries {} is negative", req.max_entries)));
        }
        let mut plugins: Vec<std::sync::Arc<LoadedPlugin>> = self.runtime.list().await;
        plugins.sort_by(|a, b| a.info.name.cmp(&b.info.name));
        plugins.dedup_by(|a, b| a.info.name == b.info.name);
        let (mut at, mut token) = match parse_token(&req.starting_token) {
            None => (0, String::new()),
            Some((name, token)) => match plugins.iter().position(|p| p.info.name == name) {
                Some(i) => (i, token.to_string()),
                None => {
                    return Err(Error::new(
                        ErrorKind::Aborted,
                        format!(
                            "starting_token {} names plugin {name:?}, which this controller has not loaded",
                            request::shown(&req.starting_token)
                        ),
                    ));
                }
            },
        };
        if !req.starting_token.is_empty() && parse_token(&req.starting_token).is_none() {
            return Err(Error::new(
                ErrorKind::Aborted,
                format!(
                    "starting_token {} is not one ListVolumes answered (<plugin>:<token>)",
                    request::shown(&req.starting_token)
                ),
            ));
        }
        let max = if req.max_entries == 0 { usize::MAX } else { req.max_entries as usize };
        // Read once per call: every page of one call sees the same hosts.
        let recorded = match &self.backends {
            Some(b) => b.read()?,
            None => Vec::new(),
        };
        let mut entries = Vec::new();
        while at < plugins.len() && entries.len() < max {
            let plugin = &plugins[at];
            let left = u32::try_from(max - entries.len()).unwrap_or(u32::MAX).min(1000);
            let mine = recorded.iter().filter(|b| b.plugin == plugin.info.name).map(|b| b.host.clone()).collect();
            let hosts = backends::listed_hosts(&self.config.grant(&plugin.info.name).hosts, mine);
            let (volumes, next) = self.list_page(plugin, &hosts, &token, left).await?;
            entries.extend(volumes.into_iter().map(|v| entry(&plugin.info.name, v)));
            if !next.is_empty() {
                return Ok(csi::ListVolumesResponse { entries, next_token: format!("{}:{next}", plugin.info.name) });
            }
            at += 1;
            token.clear();
        }
        // A full page: the next one starts with the next plugin, if there is one.
        let next_token = match plugins.get(at) {
            Some(p) if entries.len() >= max => format!("{}:", p.info.name),
            _ => String::new(),
        };
        Ok(csi::ListVolumesResponse { entries, next_token })
    }

    /// One page of `plugin`'s volumes on `hosts` from `token`, at most `max`.
    async fn list_page(
        &self,
        plugin: &LoadedPlugin,
        hosts: &[String],
        token: &str,
        max: u32,
    ) -> Result<(Vec<wit::ListedVolume>, String), Error> {
        // The recorded hosts are reached as the StorageClass that made them granted them.
        let reached: BTreeSet<String> = hosts.iter().cloned().collect();
        let secrets = Secrets::default();
        let mut rounds = Rounds::default();
        let out = loop {
            let wreq = wit::ListRequest {
                hosts: hosts.to_vec(),
                starting_token: token.to_string(),
                max_entries: max,
                looked_up: rounds.looked_up(),
            };
            let mut out = match self.runtime.call(plugin, "ListVolumes", wreq).await {
                Ok(out) => out,
                // A token the plugin does not read as its own (CSI: "Invalid starting_token").
                Err(PluginError::Backend { error: BackendError::InvalidArgument(why), .. }) if !token.is_empty() => {
                    return Err(Error::new(ErrorKind::Aborted, format!("starting_token: {why}")));
                }
                Err(e) => return Err(e.into()),
            };
            let steps = std::mem::take(&mut out.steps);
            let mut plan = self.check(plugin, Operation::List, reached.clone(), &secrets, as_plan(steps))?;
            if rounds.settle(&self.http, &secrets, &plugin.info.name, &mut plan).await? {
                break out;
            }
        };
        let name = &plugin.info.name;
        if out.volumes.len() > max as usize {
            return Err(Error::internal(format!(
                "plugin {name} listed {} volumes when asked for at most {max} (a plugin bug)",
                out.volumes.len()
            )));
        }
        if out.next_token.len() > MAX_PLUGIN_TOKEN || out.next_token.chars().any(char::is_control) {
            return Err(Error::internal(format!(
                "plugin {name} answered a next token longer than {MAX_PLUGIN_TOKEN} bytes or with control characters"
            )));
        }
        if !out.next_token.is_empty() && out.next_token == token {
            return Err(Error::internal(format!("plugin {name} answered the token it was given as the next one")));
        }
        for v in &out.volumes {
            request::volume_id(&format!("{name}~{}", v.volume_id))
                .map_err(|e| Error::internal(format!("plugin {name} listed an unusable volume id: {}", e.message)))?;
        }
        Ok((out.volumes, out.next_token))
    }

    /// Record, for ListVolumes, the backends a volume just made (`inner`, the plugin's part of
    /// its id) is on: the `host:port` parts of its id that the StorageClass's endpoint
    /// parameters granted (`endpoints`) and the configuration does not.
    pub(super) async fn record_backends(
        &self,
        plugin: &str,
        inner: &str,
        endpoints: &BTreeSet<String>,
    ) -> Result<(), Error> {
        let Some(record) = &self.backends else { return Ok(()) };
        let hosts = backends::new_volume_backends(inner, endpoints, &self.config.grant(plugin).hosts);
        if hosts.is_empty() {
            return Ok(());
        }
        for host in record.lock().await.record(plugin, &hosts)? {
            warn!(
                plugin,
                %host,
                max = backends::MAX_BACKENDS,
                "this controller records no more backends: ListVolumes does not list this host's volumes \
                 unless the configuration grants it (--grant {plugin}:host={host})"
            );
        }
        Ok(())
    }

    /// After DeleteVolume of `inner` (the plugin's part of the id): forget each recorded host
    /// the id names that now lists no volume of `plugin` at all. A host that cannot be listed
    /// is kept; nothing here fails the delete.
    pub(super) async fn forget_backends(&self, plugin: &LoadedPlugin, inner: &str) {
        let Some(record) = &self.backends else { return };
        let name = &plugin.info.name;
        // Held while listing: a CreateVolume on one of these hosts records it after this.
        let writer = record.lock().await;
        let recorded = match record.hosts(name) {
            Ok(h) => backends::named_in(inner, &h),
            Err(e) => return warn!(%e, "the backend record could not be read after DeleteVolume"),
        };
        let mut empty = Vec::new();
        for host in recorded {
            match self.list_page(plugin, std::slice::from_ref(&host), "", 1).await {
                Ok((volumes, next)) if volumes.is_empty() && next.is_empty() => empty.push(host),
                Ok(_) => {}
                Err(e) => debug!(plugin = %name, %host, %e, "a recorded backend could not be listed: kept"),
            }
        }
        if empty.is_empty() {
            return;
        }
        match writer.forget(name, &empty) {
            Ok(()) => {
                info!(plugin = %name, hosts = %empty.join(","), "no volume left on these backends: no longer recorded")
            }
            Err(e) => warn!(%e, "a backend with no volume left could not be forgotten"),
        }
    }

    /// Whether the backend holds volume `id` (`<plugin>~<inner>`), as its plugin says.
    pub(super) async fn existence(
        &self,
        plugin: &LoadedPlugin,
        id: &str,
        context: &HashMap<String, String>,
        secrets: &Secrets,
    ) -> Result<wit::Existence, Error> {
        let (_, inner) = split_id(id)?;
        let params = request::plugin_attrs(context);
        let mut hosts = hosts_in_id(inner);
        hosts.extend(policy::endpoint_hosts(&plugin.info, params.iter().map(|(k, v)| (k.as_str(), v.as_str()))));
        let mut rounds = Rounds::default();
        loop {
            let wreq = wit::DescribeRequest {
                volume_id: inner.to_string(),
                context: request::kvs(&params),
                secrets: request::secret_kvs(secrets),
                looked_up: rounds.looked_up(),
            };
            let mut out = self.runtime.call(plugin, id, wreq).await?;
            let steps = std::mem::take(&mut out.steps);
            let mut plan = self.check(plugin, Operation::Describe, hosts.clone(), secrets, as_plan(steps))?;
            if rounds.settle(&self.http, secrets, &plugin.info.name, &mut plan).await? {
                return Ok(out.existence);
            }
        }
    }
}

/// `<plugin>:<plugin's token>` → its parts; `None` for the empty token or a malformed one.
fn parse_token(token: &str) -> Option<(&str, &str)> {
    let (name, rest) = token.split_once(':')?;
    (crate::plugin::info::valid_name(name) && rest.len() <= MAX_PLUGIN_TOKEN).then_some((name, rest))
}

/// A plugin's listed volume as CSI shows it.
fn entry(plugin: &str, v: wit::ListedVolume) -> csi::list_volumes_response::Entry {
    let mut context: HashMap<String, String> =
        v.context.into_iter().filter(|kv| !request::is_reserved(&kv.key)).map(|kv| (kv.key, kv.value)).collect();
    context.insert(request::PLUGIN_KEY.into(), plugin.to_string());
    csi::list_volumes_response::Entry {
        volume: Some(csi::Volume {
            capacity_bytes: i64::try_from(v.capacity_bytes).unwrap_or(i64::MAX),
            volume_id: format!("{plugin}~{}", v.volume_id),
            volume_context: context,
            content_source: None,
            accessible_topology: Vec::new(),
        }),
        status: Some(csi::list_volumes_response::VolumeStatus {
            published_node_ids: Vec::new(),
            volume_condition: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_a_plugin_and_its_own_token() {
        assert_eq!(parse_token("seaweedfs:0:abc"), Some(("seaweedfs", "0:abc")));
        assert_eq!(parse_token("model:"), Some(("model", "")));
        for bad in ["", "seaweedfs", ":x", "Bad_Name:x", &format!("p:{}", "x".repeat(257))] {
            assert_eq!(parse_token(bad), None, "{bad}");
        }
    }

    #[test]
    fn entries_carry_the_plugin_and_no_published_nodes() {
        let e = entry(
            "seaweedfs",
            wit::ListedVolume {
                volume_id: "f:8888/buckets/v".into(),
                capacity_bytes: 1 << 30,
                context: vec![
                    wit::Kv { key: "path".into(), value: "/buckets/v".into() },
                    wit::Kv { key: "plugin".into(), value: "other".into() },
                ],
            },
        );
        let v = e.volume.unwrap();
        assert_eq!(v.volume_id, "seaweedfs~f:8888/buckets/v");
        assert_eq!(v.capacity_bytes, 1 << 30);
        assert_eq!(v.volume_context["plugin"], "seaweedfs");
        assert_eq!(v.volume_context["path"], "/buckets/v");
        assert!(e.status.unwrap().published_node_ids.is_empty());
    }
}
