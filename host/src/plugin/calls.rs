//! One typed entry point per planner export: the request type says which export to call and
//! what it returns, so callers write `runtime.call(&plugin, volume, stage_request)`. Requests
//! and answers are always in the current contract's terms; a plugin of contract 0.4.0 is
//! called through [`super::adapter_v040`], one of 0.3.0 through it and [`super::adapter_v030`],
//! one of 0.2.0 through those and [`super::adapter_v020`], one of 0.1.0 through all of them and
//! [`super::adapter`]. What a contract before 0.4.0 does not export
//! (`expand`, `capacity`, `list-volumes`, `describe`, new in 0.4.0) is answered by the host for
//! it, as the SDK's defaults answer: no expansion (`out-of-range`), capacity unknown, no
//! volumes listed, existence unknown.

use std::future::Future;

use wasmtime::Store;

use super::adapter::{Downgrade, Upgrade};
use super::bindings::planner::Guest;
use super::bindings::types as wit;
use super::bindings_v010::planner::Guest as GuestV010;
use super::bindings_v020::planner::Guest as GuestV020;
use super::bindings_v030::planner::Guest as GuestV030;
use super::bindings_v040::planner::Guest as GuestV040;
use super::plugin_error::BackendError;
use super::store::CallState;
use crate::secrets::Secrets;

/// A request for one planner export.
pub trait PlannerCall: Send + Sync {
    /// What the export returns on success.
    type Output: Send;
    /// The export's name, for messages.
    const NAME: &'static str;
    /// The request's secrets, scrubbed from anything the plugin says back.
    fn secrets(&self) -> Secrets {
        Secrets::default()
    }
    /// Call the export.
    fn invoke<'a>(
        &'a self,
        planner: &'a Guest,
        store: &'a mut Store<CallState>,
    ) -> impl Future<Output = wasmtime::Result<Result<Self::Output, wit::BackendError>>> + Send + 'a;
    /// Call the export of a contract 0.4.0 plugin: the request goes down to 0.4.0, the answer
    /// comes back up.
    fn invoke_v040<'a>(
        &'a self,
        planner: &'a GuestV040,
        store: &'a mut Store<CallState>,
    ) -> impl Future<Output = wasmtime::Result<Result<Self::Output, wit::BackendError>>> + Send + 'a;
    /// Call the export of a contract 0.3.0 plugin: the request goes down to 0.4.0 and 0.3.0, the
    /// answer comes back up.
    fn invoke_v030<'a>(
        &'a self,
        planner: &'a GuestV030,
        store: &'a mut Store<CallState>,
    ) -> impl Future<Output = wasmtime::Result<Result<Self::Output, wit::BackendError>>> + Send + 'a;
    /// Call the export of a contract 0.2.0 plugin: the request goes down to 0.4.0, 0.3.0 and
    /// 0.2.0, the answer comes back up.
    fn invoke_v020<'a>(
        &'a self,
        planner: &'a GuestV020,
        store: &'a mut Store<CallState>,
    ) -> impl Future<Output = wasmtime::Result<Result<Self::Output, wit::BackendError>>> + Send + 'a;
    /// Call the export of a contract 0.1.0 plugin: the request goes down to 0.4.0, 0.3.0, 0.2.0
    /// and on to 0.1.0, the answer comes back up the same way. A request 0.1.0 cannot carry is an
    /// `internal` error of the call.
    fn invoke_v010<'a>(
        &'a self,
        planner: &'a GuestV010,
        store: &'a mut Store<CallState>,
    ) -> impl Future<Output = wasmtime::Result<Result<Self::Output, wit::BackendError>>> + Send + 'a;
}

/// The `info` export (it cannot fail in the plugin's own terms).
#[derive(Debug, Clone, Copy)]
pub struct InfoCall;

impl PlannerCall for InfoCall {
    type Output = wit::PluginInfo;
    const NAME: &'static str = "info";
    async fn invoke<'a>(
        &'a self,
        planner: &'a Guest,
        store: &'a mut Store<CallState>,
    ) -> wasmtime::Result<Result<wit::PluginInfo, wit::BackendError>> {
        planner.call_info(store).await.map(Ok)
    }
    async fn invoke_v040<'a>(
        &'a self,
        planner: &'a GuestV040,
        store: &'a mut Store<CallState>,
    ) -> wasmtime::Result<Result<wit::PluginInfo, wit::BackendError>> {
        planner.call_info(store).await.map(|info| Ok(info.upgrade()))
    }
    async fn invoke_v030<'a>(
        &'a self,
        planner: &'a GuestV030,
        store: &'a mut Store<CallState>,
    ) -> wasmtime::Result<Result<wit::PluginInfo, wit::BackendError>> {
        planner.call_info(store).await.map(|info| Ok(info.upgrade().upgrade()))
    }
    async fn invoke_v020<'a>(
        &'a self,
        planner: &'a GuestV020,
        store: &'a mut Store<CallState>,
    ) -> wasmtime::Result<Result<wit::PluginInfo, wit::BackendError>> {
        planner.call_info(store).await.map(|info| Ok(info.upgrade().upgrade().upgrade()))
    }
    async fn invoke_v010<'a>(
        &'a self,
        planner: &'a GuestV010,
        store: &'a mut Store<CallState>,
    ) -> wasmtime::Result<Result<wit::PluginInfo, wit::BackendError>> {
        planner.call_info(store).await.map(|info| Ok(info.upgrade().upgrade().upgrade().upgrade()))
    }
}

fn secrets_of(kvs: &[wit::Kv]) -> Secrets {
    kvs.iter().map(|kv| (kv.key.clone(), kv.value.clone())).collect()
}

macro_rules! planner_call {
    ($req:ty, $out:ty, $name:literal, $method:ident, $secrets:expr) => {
        impl PlannerCall for $req {
            type Output = $out;
            const NAME: &'static str = $name;
            fn secrets(&self) -> Secrets {
                let get: fn(&$req) -> Secrets = $secrets;
                get(self)
            }
            async fn invoke<'a>(
                &'a self,
                planner: &'a Guest,
                store: &'a mut Store<CallState>,
            ) -> wasmtime::Result<Result<$out, wit::BackendError>> {
                planner.$method(store, self).await
            }
            async fn invoke_v040<'a>(
                &'a self,
                planner: &'a GuestV040,
                store: &'a mut Store<CallState>,
            ) -> wasmtime::Result<Result<$out, wit::BackendError>> {
                let req = match self.downgrade() {
                    Ok(req) => req,
                    Err(e) => return Ok(Err(wit::BackendError::Internal(e.to_string()))),
                };
                let out = planner.$method(store, &req).await?;
                Ok(out.map(Upgrade::upgrade).map_err(Upgrade::upgrade))
            }
            async fn invoke_v030<'a>(
                &'a self,
                planner: &'a GuestV030,
                store: &'a mut Store<CallState>,
            ) -> wasmtime::Result<Result<$out, wit::BackendError>> {
                let req = match self.downgrade().and_then(|r| r.downgrade()) {
                    Ok(req) => req,
                    Err(e) => return Ok(Err(wit::BackendError::Internal(e.to_string()))),
                };
                let out = planner.$method(store, &req).await?;
                Ok(out.map(|o| o.upgrade().upgrade()).map_err(|e| e.upgrade().upgrade()))
            }
            async fn invoke_v020<'a>(
                &'a self,
                planner: &'a GuestV020,
                store: &'a mut Store<CallState>,
            ) -> wasmtime::Result<Result<$out, wit::BackendError>> {
                let req = match self.downgrade().and_then(|r| r.downgrade()).and_then(|r| r.downgrade()) {
                    Ok(req) => req,
                    Err(e) => return Ok(Err(wit::BackendError::Internal(e.to_string()))),
                };
                let out = planner.$method(store, &req).await?;
                Ok(out.map(|o| o.upgrade().upgrade().upgrade()).map_err(|e| e.upgrade().upgrade().upgrade()))
            }
            async fn invoke_v010<'a>(
                &'a self,
                planner: &'a GuestV010,
                store: &'a mut Store<CallState>,
            ) -> wasmtime::Result<Result<$out, wit::BackendError>> {
                let req = match self
                    .downgrade()
                    .and_then(|r| r.downgrade())
                    .and_then(|r| r.downgrade())
                    .and_then(|r| r.downgrade())
                {
                    Ok(req) => req,
                    Err(e) => return Ok(Err(wit::BackendError::Internal(e.to_string()))),
                };
                let out = planner.$method(store, &req).await?;
                Ok(out
                    .map(|o| o.upgrade().upgrade().upgrade().upgrade())
                    .map_err(|e| e.upgrade().upgrade().upgrade().upgrade()))
            }
        }
    };
}

planner_call!(wit::ValidateRequest, (), "validate", call_validate, |r| secrets_of(&r.secrets));
planner_call!(wit::ProvisionRequest, wit::ProvisionPlan, "provision", call_provision, |r| secrets_of(&r.secrets));
planner_call!(wit::DeleteRequest, wit::Plan, "delete", call_delete, |r| secrets_of(&r.secrets));
planner_call!(wit::StageRequest, wit::Plan, "stage", call_stage, |r| secrets_of(&r.secrets));
planner_call!(wit::PublishRequest, wit::Plan, "publish", call_publish, |r| secrets_of(&r.secrets));
planner_call!(wit::UnstageRequest, wit::Plan, "unstage", call_unstage, |_| Secrets::default());
planner_call!(wit::DynamicMountRequest, wit::Plan, "dynamic-mount", call_dynamic_mount, |_| Secrets::default());

/// An export contract 0.4.0 added: a 0.4.0 plugin is called through [`super::adapter_v040`]; a
/// plugin of an earlier contract is not called, the host answers for it with `$earlier` (what
/// the SDK's default answers).
macro_rules! planner_call_since_0_4 {
    ($req:ty, $out:ty, $name:literal, $method:ident, $secrets:expr, $earlier:expr) => {
        impl PlannerCall for $req {
            type Output = $out;
            const NAME: &'static str = $name;
            fn secrets(&self) -> Secrets {
                let get: fn(&$req) -> Secrets = $secrets;
                get(self)
            }
            async fn invoke<'a>(
                &'a self,
                planner: &'a Guest,
                store: &'a mut Store<CallState>,
            ) -> wasmtime::Result<Result<$out, wit::BackendError>> {
                planner.$method(store, self).await
            }
            async fn invoke_v040<'a>(
                &'a self,
                planner: &'a GuestV040,
                store: &'a mut Store<CallState>,
            ) -> wasmtime::Result<Result<$out, wit::BackendError>> {
                let req = match self.downgrade() {
                    Ok(req) => req,
                    Err(e) => return Ok(Err(wit::BackendError::Internal(e.to_string()))),
                };
                let out = planner.$method(store, &req).await?;
                Ok(out.map(Upgrade::upgrade).map_err(Upgrade::upgrade))
            }
            async fn invoke_v030<'a>(
                &'a self,
                _planner: &'a GuestV030,
                _store: &'a mut Store<CallState>,
            ) -> wasmtime::Result<Result<$out, wit::BackendError>> {
                let earlier: fn(&$req) -> Result<$out, wit::BackendError> = $earlier;
                Ok(earlier(self))
            }
            async fn invoke_v020<'a>(
                &'a self,
                _planner: &'a GuestV020,
                _store: &'a mut Store<CallState>,
            ) -> wasmtime::Result<Result<$out, wit::BackendError>> {
                let earlier: fn(&$req) -> Result<$out, wit::BackendError> = $earlier;
                Ok(earlier(self))
            }
            async fn invoke_v010<'a>(
                &'a self,
                _planner: &'a GuestV010,
                _store: &'a mut Store<CallState>,
            ) -> wasmtime::Result<Result<$out, wit::BackendError>> {
                let earlier: fn(&$req) -> Result<$out, wit::BackendError> = $earlier;
                Ok(earlier(self))
            }
        }
    };
}

planner_call_since_0_4!(wit::ExpandRequest, wit::ExpandPlan, "expand", call_expand, |r| secrets_of(&r.secrets), |_| {
    Err(wit::BackendError::OutOfRange(
        "this plugin's contract is older than 0.4.0: its volumes cannot be expanded".into(),
    ))
});
planner_call_since_0_4!(
    wit::CapacityRequest,
    wit::CapacityAnswer,
    "capacity",
    call_capacity,
    |_| Secrets::default(),
    |_| {
        Ok(wit::CapacityAnswer {
            available_bytes: None,
            maximum_volume_bytes: None,
            minimum_volume_bytes: None,
            steps: Vec::new(),
        })
    }
);
planner_call_since_0_4!(
    wit::ListRequest,
    wit::ListAnswer,
    "list-volumes",
    call_list_volumes,
    |_| Secrets::default(),
    |_| { Ok(wit::ListAnswer { volumes: Vec::new(), next_token: String::new(), steps: Vec::new() }) }
);
planner_call_since_0_4!(
    wit::DescribeRequest,
    wit::DescribeAnswer,
    "describe",
    call_describe,
    |r| secrets_of(&r.secrets),
    |_| { Ok(wit::DescribeAnswer { existence: wit::Existence::Unknown, steps: Vec::new() }) }
);

/// A plugin's error, with secret values scrubbed from its message.
pub fn backend_error(e: wit::BackendError, secrets: &Secrets) -> BackendError {
    match e {
        wit::BackendError::InvalidArgument(m) => BackendError::InvalidArgument(secrets.scrub(&m)),
        wit::BackendError::NotFound(m) => BackendError::NotFound(secrets.scrub(&m)),
        wit::BackendError::Unavailable(m) => BackendError::Unavailable(secrets.scrub(&m)),
        wit::BackendError::Internal(m) => BackendError::Internal(secrets.scrub(&m)),
        wit::BackendError::OutOfRange(m) => BackendError::OutOfRange(secrets.scrub(&m)),
        wit::BackendError::AlreadyExists(m) => BackendError::AlreadyExists(secrets.scrub(&m)),
        wit::BackendError::Unsupported(m) => BackendError::Unsupported(secrets.scrub(&m)),
    }
}
