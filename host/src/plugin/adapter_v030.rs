//! The adapter between contracts `mounthost:plugin@0.3.0` and 0.4.0, which keeps plugins built
//! against 0.3.0 working (after [`super::adapter_v040`], 0.5.0 ↔ 0.4.0); a 0.2.0 plugin's calls
//! pass through here before
//! [`super::adapter_v020`], a 0.1.0 plugin's before [`super::adapter`] too.
//!
//! 0.4.0 only adds to 0.3.0: the operations `expand`, `capacity`, `list-volumes` and `describe`
//! (a 0.3.0 plugin has none of them; the host answers for it as the SDK's defaults do, see
//! [`super::calls`]), the `lookup` and `socket-call` steps, the errors `out-of-range` and
//! `already-exists`, and the request fields `looked-up` (provision, stage) and
//! `stage-request.node-id`. Every type 0.3.0 has is spelled the same way in 0.4.0, so both
//! directions convert through their serde form, field by field and case by case:
//!
//! - up (a 0.3.0 plugin's answers) it is total: every 0.3.0 value is a 0.4.0 value;
//! - down (requests) the added fields are left out. `node-id` is information the plugin did not
//!   ask for; `looked-up` the host fills only for a plan that named a lookup, which a 0.3.0 plan
//!   cannot: such a request reaching a 0.3.0 plugin is a host bug, refused with
//!   [`AdapterError`].

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::adapter::{AdapterError, Downgrade, Upgrade};
use super::bindings_v030::types as old;
use super::bindings_v040::types as new;

/// `value` in the other contract's type of the same shape.
fn convert<A: Serialize, B: DeserializeOwned>(value: &A) -> Result<B, serde_json::Error> {
    serde_json::to_value(value).and_then(serde_json::from_value)
}

/// Down: a request of 0.4.0 as 0.3.0 spells it (the fields 0.4.0 added dropped).
fn down<A: Serialize, B: DeserializeOwned>(value: &A) -> Result<B, AdapterError> {
    convert(value).map_err(|e| AdapterError::Shape { detail: e.to_string() })
}

/// Up: what a 0.3.0 plugin answers, in 0.4.0's terms. Total, since 0.4.0 only adds.
fn up<A: Serialize, B: DeserializeOwned>(value: A) -> B {
    convert(&value).expect("every 0.3.0 value is a 0.4.0 value (0.4.0 only adds)")
}

/// A request with answers to lookups, which a 0.3.0 plan cannot have named.
fn no_lookups(looked_up: &[new::LookedUp]) -> Result<(), AdapterError> {
    match looked_up.first() {
        None => Ok(()),
        Some(l) => Err(AdapterError::LookedUpForLegacy { key: l.key.clone() }),
    }
}

macro_rules! down_as_is {
    ($($t:ident),* $(,)?) => {$(
        impl Downgrade for new::$t {
            type Old = old::$t;
            fn downgrade(&self) -> Result<old::$t, AdapterError> {
                down(self)
            }
        }
    )*};
}

down_as_is!(ValidateRequest, DeleteRequest, PublishRequest, UnstageRequest, DynamicMountRequest);

impl Downgrade for new::ProvisionRequest {
    type Old = old::ProvisionRequest;
    fn downgrade(&self) -> Result<old::ProvisionRequest, AdapterError> {
        no_lookups(&self.looked_up)?;
        down(self)
    }
}

impl Downgrade for new::StageRequest {
    type Old = old::StageRequest;
    fn downgrade(&self) -> Result<old::StageRequest, AdapterError> {
        no_lookups(&self.looked_up)?;
        down(self)
    }
}

macro_rules! up_as_is {
    ($($t:ident),* $(,)?) => {$(
        impl Upgrade for old::$t {
            type New = new::$t;
            fn upgrade(self) -> new::$t {
                up(self)
            }
        }
    )*};
}

up_as_is!(BackendError, PluginInfo, ProvisionPlan, Plan);

#[cfg(test)]
mod tests {
    use super::*;

    fn capability() -> new::VolumeCapability {
        new::VolumeCapability {
            access_mode: new::AccessMode::MultiNodeReaderOnly,
            fs_type: String::new(),
            mount_flags: vec!["noatime".into()],
        }
    }

    fn stage(looked_up: Vec<new::LookedUp>) -> new::StageRequest {
        new::StageRequest {
            volume_id: "v".into(),
            context: vec![new::Kv { key: "a".into(), value: "1".into() }],
            secrets: vec![new::Kv { key: "token".into(), value: "t".into() }],
            capability: capability(),
            ephemeral: true,
            resolved: Some(new::Resolved {
                reference: "r.io/m:1".into(),
                manifest_digest: format!("sha256:{}", "b".repeat(64)),
                manifest: "{}".into(),
                config: "{}".into(),
            }),
            looked_up,
            node_id: "node-1".into(),
        }
    }

    #[test]
    fn a_request_goes_down_field_by_field_without_what_0_4_0_added() {
        let down = stage(Vec::new()).downgrade().unwrap();
        assert_eq!(down.capability.access_mode, old::AccessMode::MultiNodeReaderOnly);
        assert_eq!(down.capability.mount_flags, vec!["noatime".to_string()]);
        assert_eq!((down.ephemeral, down.secrets[0].value.as_str(), down.context[0].key.as_str()), (true, "t", "a"));
        assert_eq!(down.resolved.unwrap().reference, "r.io/m:1");
        let looked = new::LookedUp { key: "capacity".into(), status: 200, body: b"{}".to_vec(), truncated: false };
        let err = stage(vec![looked]).downgrade().unwrap_err();
        assert!(err.to_string().contains("\"capacity\""), "{err}");
        let provision = new::ProvisionRequest {
            name: "pvc-1".into(),
            parameters: vec![],
            secrets: vec![],
            capabilities: vec![capability()],
            required_bytes: 1 << 30,
            limit_bytes: u64::MAX,
            looked_up: vec![],
        };
        let down = provision.downgrade().unwrap();
        assert_eq!((down.required_bytes, down.limit_bytes), (1 << 30, u64::MAX), "u64s keep every bit");
    }

    #[test]
    fn every_0_3_0_answer_comes_up_as_it_was() {
        let plan = old::Plan {
            steps: vec![
                old::Step::SpawnFuse(old::SpawnFuse {
                    program: "sshfs".into(),
                    args: vec![
                        old::Arg::FuseFd(old::FuseFdArg { prefix: String::new(), suffix: String::new() }),
                        old::Arg::Path(old::PathArg {
                            prefix: "-o".into(),
                            path: old::PathRef { root: old::DirRoot::Runtime, rel: "k".into() },
                            suffix: ",x".into(),
                        }),
                    ],
                    env: vec![old::EnvVar {
                        name: "T".into(),
                        value: old::Value::SecretTemplate(old::SecretTemplate {
                            prefix: "Bearer ".into(),
                            key: "token".into(),
                            suffix: String::new(),
                        }),
                    }],
                    mountpoint: old::PathRef { root: old::DirRoot::Staging, rel: String::new() },
                    fstype: "fuse.sshfs".into(),
                    ready_timeout_ms: 7,
                    memory_limit_bytes: Some(64 << 20),
                    mount: old::FuseMount::HostFd(old::HostFdMount {
                        source: "u@h:/p".into(),
                        options: vec!["noatime".into()],
                        readonly: true,
                    }),
                }),
                old::Step::Http(old::HttpCall {
                    method: "PUT".into(),
                    urls: vec!["http://f:8888/x".into()],
                    headers: vec![],
                    body: vec![0, 255, 10],
                    ok_status: vec![201],
                }),
                old::Step::Resolve(old::Resolve {
                    reference: "r.io/m:1".into(),
                    mirror: None,
                    auth: old::RegistryAuth::DockerConfig(".dockerconfigjson".into()),
                    insecure: false,
                }),
                old::Step::Socket(old::PathRef { root: old::DirRoot::Target, rel: "csi.sock".into() }),
            ],
            attributes: vec![old::Kv { key: "k".into(), value: "v".into() }],
        };
        let up: new::Plan = plan.upgrade();
        let [spawn, http, resolve, socket] = &up.steps[..] else { panic!("{up:?}") };
        let new::Step::SpawnFuse(s) = spawn else { panic!("{spawn:?}") };
        assert_eq!(s.memory_limit_bytes, Some(64 << 20));
        assert!(matches!(&s.mount, new::FuseMount::HostFd(h) if h.readonly && h.source == "u@h:/p"));
        assert!(matches!(&s.args[0], new::Arg::FuseFd(_)));
        assert!(matches!(&s.args[1], new::Arg::Path(a) if a.suffix == ",x" && a.path.root == new::DirRoot::Runtime));
        assert!(matches!(&s.env[0].value, new::Value::SecretTemplate(t) if t.prefix == "Bearer "));
        assert!(matches!(http, new::Step::Http(h) if h.body == [0, 255, 10] && h.ok_status == [201]));
        assert!(
            matches!(resolve, new::Step::Resolve(r) if matches!(&r.auth, new::RegistryAuth::DockerConfig(k) if k == ".dockerconfigjson"))
        );
        assert_eq!(socket, &new::Step::Socket(new::PathRef { root: new::DirRoot::Target, rel: "csi.sock".into() }));
        assert_eq!(up.attributes, vec![new::Kv { key: "k".into(), value: "v".into() }]);
        let e: new::BackendError = old::BackendError::NotFound("gone".into()).upgrade();
        assert_eq!(e, new::BackendError::NotFound("gone".into()));
        let info: new::PluginInfo = old::PluginInfo {
            name: "x".into(),
            version: "1".into(),
            description: String::new(),
            parameters: vec![old::ParamDoc {
                name: "p".into(),
                doc: "d".into(),
                kind: old::ParamKind::Endpoint,
                source: old::ParamSource::Secret,
                required: true,
                default_value: Some("z".into()),
            }],
            programs: vec!["weed".into()],
            fstypes: vec![],
        }
        .upgrade();
        assert_eq!(info.parameters[0].kind, new::ParamKind::Endpoint);
        assert_eq!(info.parameters[0].default_value.as_deref(), Some("z"));
    }
}
