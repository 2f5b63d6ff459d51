//! The adapter between contracts `mounthost:plugin@0.4.0` and 0.5.0 (the host's own), which
//! keeps plugins built against 0.4.0 working; a plugin of an earlier contract's calls pass
//! through here before [`super::adapter_v030`] and the adapters after it.
//!
//! 0.5.0 only adds two cases, both on the plugin's side: the parameter kind `url` and the error
//! `unsupported` (an operation the plugin does not offer). Every request type is spelled the same
//! way in both contracts, so both directions convert through their serde form and are total: a
//! 0.4.0 plugin never says `url` nor `unsupported`, and no request carries either.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::adapter::{AdapterError, Downgrade, Upgrade};
use super::bindings::types as new;
use super::bindings_v040::types as old;

/// `value` in the other contract's type of the same shape.
fn convert<A: Serialize, B: DeserializeOwned>(value: &A) -> Result<B, serde_json::Error> {
    serde_json::to_value(value).and_then(serde_json::from_value)
}

macro_rules! down_as_is {
    ($($t:ident),* $(,)?) => {$(
        impl Downgrade for new::$t {
            type Old = old::$t;
            fn downgrade(&self) -> Result<old::$t, AdapterError> {
                convert(self).map_err(|e| AdapterError::Shape { detail: e.to_string() })
            }
        }
    )*};
}

down_as_is!(
    ValidateRequest,
    ProvisionRequest,
    DeleteRequest,
    StageRequest,
    PublishRequest,
    UnstageRequest,
    DynamicMountRequest,
    ExpandRequest,
    CapacityRequest,
    ListRequest,
    DescribeRequest,
);

macro_rules! up_as_is {
    ($($t:ident),* $(,)?) => {$(
        impl Upgrade for old::$t {
            type New = new::$t;
            fn upgrade(self) -> new::$t {
                convert(&self).expect("every 0.4.0 value is a 0.5.0 value (0.5.0 only adds)")
            }
        }
    )*};
}

up_as_is!(BackendError, PluginInfo, ProvisionPlan, Plan, ExpandPlan, CapacityAnswer, ListAnswer, DescribeAnswer);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_go_down_and_answers_come_up_unchanged() {
        let req = new::ExpandRequest {
            volume_id: "v".into(),
            side: new::ExpandSide::Node,
            required_bytes: 1 << 40,
            limit_bytes: u64::MAX,
            secrets: vec![new::Kv { key: "k".into(), value: "s".into() }],
            capability: Some(new::VolumeCapability {
                access_mode: new::AccessMode::SingleNodeWriter,
                fs_type: "ext4".into(),
                mount_flags: vec![],
            }),
            context: vec![],
            recorded: vec![new::Kv { key: "r".into(), value: "1".into() }],
            looked_up: vec![new::LookedUp { key: "l".into(), status: 200, body: vec![0, 255], truncated: true }],
        };
        let down = req.downgrade().unwrap();
        assert_eq!((down.side, down.limit_bytes), (old::ExpandSide::Node, u64::MAX));
        assert_eq!(down.looked_up[0].body, vec![0, 255]);
        assert_eq!(serde_json::to_value(&down).unwrap(), serde_json::to_value(&req).unwrap());

        let info = old::PluginInfo {
            name: "x".into(),
            version: "1".into(),
            description: String::new(),
            parameters: vec![old::ParamDoc {
                name: "p".into(),
                doc: "d".into(),
                kind: old::ParamKind::OciReference,
                source: old::ParamSource::Context,
                required: true,
                default_value: None,
            }],
            programs: vec![],
            fstypes: vec![],
        };
        let up: new::PluginInfo = info.upgrade();
        assert_eq!(up.parameters[0].kind, new::ParamKind::OciReference);
        let e: new::BackendError = old::BackendError::AlreadyExists("there".into()).upgrade();
        assert_eq!(e, new::BackendError::AlreadyExists("there".into()));
        let d: new::DescribeAnswer =
            old::DescribeAnswer { existence: old::Existence::Missing, steps: vec![] }.upgrade();
        assert_eq!(d.existence, new::Existence::Missing);
    }
}
