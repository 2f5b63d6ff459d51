//! The adapter between contracts `mounthost:plugin@0.1.0` and 0.2.0, which keeps plugins built
//! against 0.1.0 working (DESIGN: "the host keeps running plugins built against every earlier
//! version through an adapter"). The host speaks 0.4.0: a 0.1.0 plugin's calls pass through
//! [`super::adapter_v030`] (0.4.0 ↔ 0.3.0), [`super::adapter_v020`] (0.3.0 ↔ 0.2.0) and then this
//! one (0.2.0 ↔ 0.1.0), so each adapter only knows one step and stays as frozen as the versions
//! it joins.
//!
//! [`Downgrade`] turns a 0.2.0 request into its 0.1.0 form before the call, and [`Upgrade`]
//! turns what a 0.1.0 plugin answers (its info, plans, provision plans and errors) into 0.2.0
//! terms, so policy, diff and execution never see the old types. 0.2.0 only *adds* to 0.1.0, so the upward direction is total: a 0.1.0 path
//! argument becomes one with an empty suffix. Downward, everything 0.2.0 adds to a request is
//! `stage-request.resolved`, which the host sets only for a plan that asked to `resolve`, and a
//! 0.1.0 plan cannot ask that: such a request reaching a 0.1.0 plugin is a host bug, refused
//! with [`AdapterError`].

use super::bindings_v010::types as old;
use super::bindings_v020::types as new;

/// Why a request cannot be given to a 0.1.0 plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    /// A stage request carries a resolved OCI reference, which 0.1.0 has no field for.
    #[error(
        "the host asked a contract 0.1.0 plugin to plan stage with the resolved OCI reference {reference:?}, \
         but 0.1.0 plans cannot ask to resolve one (a host bug; report it)"
    )]
    ResolvedForLegacy {
        /// The reference the request carries.
        reference: String,
    },
    /// A request carries answers to lookups, which contracts before 0.4.0 have no field for.
    #[error(
        "the host asked a plugin of a contract before 0.4.0 to plan with the answer to lookup {key:?}, but such \
         plans cannot name lookups (a host bug; report it)"
    )]
    LookedUpForLegacy {
        /// The first lookup's key.
        key: String,
    },
    /// A request did not fit the older contract's shape (a host bug; report it).
    #[error("the request has no form in the plugin's older contract: {detail} (a host bug; report it)")]
    Shape {
        /// What serde said.
        detail: String,
    },
}

/// A request that has a form in the contract before its own (0.4.0 → 0.3.0 → 0.2.0 → 0.1.0).
pub trait Downgrade {
    /// The older request.
    type Old;
    /// The request in the older contract's terms.
    fn downgrade(&self) -> Result<Self::Old, AdapterError>;
}

/// An answer of an older contract, seen in the next one's terms (0.1.0 → 0.2.0 → 0.3.0 → 0.4.0).
pub trait Upgrade {
    /// The newer type.
    type New;
    /// The answer in the newer contract's terms.
    fn upgrade(self) -> Self::New;
}

// ---- Requests: 0.2.0 → 0.1.0 ----

fn kvs_down(kvs: &[new::Kv]) -> Vec<old::Kv> {
    kvs.iter().map(|kv| old::Kv { key: kv.key.clone(), value: kv.value.clone() }).collect()
}

fn access_mode_down(m: new::AccessMode) -> old::AccessMode {
    match m {
        new::AccessMode::SingleNodeWriter => old::AccessMode::SingleNodeWriter,
        new::AccessMode::SingleNodeReaderOnly => old::AccessMode::SingleNodeReaderOnly,
        new::AccessMode::MultiNodeReaderOnly => old::AccessMode::MultiNodeReaderOnly,
        new::AccessMode::MultiNodeSingleWriter => old::AccessMode::MultiNodeSingleWriter,
        new::AccessMode::MultiNodeMultiWriter => old::AccessMode::MultiNodeMultiWriter,
        new::AccessMode::SingleNodeSingleWriter => old::AccessMode::SingleNodeSingleWriter,
        new::AccessMode::SingleNodeMultiWriter => old::AccessMode::SingleNodeMultiWriter,
    }
}

fn capability_down(c: &new::VolumeCapability) -> old::VolumeCapability {
    old::VolumeCapability {
        access_mode: access_mode_down(c.access_mode),
        fs_type: c.fs_type.clone(),
        mount_flags: c.mount_flags.clone(),
    }
}

impl Downgrade for new::ValidateRequest {
    type Old = old::ValidateRequest;
    fn downgrade(&self) -> Result<old::ValidateRequest, AdapterError> {
        Ok(old::ValidateRequest {
            parameters: kvs_down(&self.parameters),
            secrets: kvs_down(&self.secrets),
            capabilities: self.capabilities.iter().map(capability_down).collect(),
        })
    }
}

impl Downgrade for new::ProvisionRequest {
    type Old = old::ProvisionRequest;
    fn downgrade(&self) -> Result<old::ProvisionRequest, AdapterError> {
        Ok(old::ProvisionRequest {
            name: self.name.clone(),
            parameters: kvs_down(&self.parameters),
            secrets: kvs_down(&self.secrets),
            capabilities: self.capabilities.iter().map(capability_down).collect(),
            required_bytes: self.required_bytes,
            limit_bytes: self.limit_bytes,
        })
    }
}

impl Downgrade for new::DeleteRequest {
    type Old = old::DeleteRequest;
    fn downgrade(&self) -> Result<old::DeleteRequest, AdapterError> {
        Ok(old::DeleteRequest { volume_id: self.volume_id.clone(), secrets: kvs_down(&self.secrets) })
    }
}

impl Downgrade for new::StageRequest {
    type Old = old::StageRequest;
    fn downgrade(&self) -> Result<old::StageRequest, AdapterError> {
        if let Some(r) = &self.resolved {
            return Err(AdapterError::ResolvedForLegacy { reference: r.reference.clone() });
        }
        Ok(old::StageRequest {
            volume_id: self.volume_id.clone(),
            context: kvs_down(&self.context),
            secrets: kvs_down(&self.secrets),
            capability: capability_down(&self.capability),
            ephemeral: self.ephemeral,
        })
    }
}

impl Downgrade for new::PublishRequest {
    type Old = old::PublishRequest;
    fn downgrade(&self) -> Result<old::PublishRequest, AdapterError> {
        Ok(old::PublishRequest {
            volume_id: self.volume_id.clone(),
            context: kvs_down(&self.context),
            secrets: kvs_down(&self.secrets),
            capability: capability_down(&self.capability),
            readonly: self.readonly,
            recorded: kvs_down(&self.recorded),
        })
    }
}

impl Downgrade for new::UnstageRequest {
    type Old = old::UnstageRequest;
    fn downgrade(&self) -> Result<old::UnstageRequest, AdapterError> {
        Ok(old::UnstageRequest {
            volume_id: self.volume_id.clone(),
            context: kvs_down(&self.context),
            recorded: kvs_down(&self.recorded),
        })
    }
}

impl Downgrade for new::DynamicMountRequest {
    type Old = old::DynamicMountRequest;
    fn downgrade(&self) -> Result<old::DynamicMountRequest, AdapterError> {
        Ok(old::DynamicMountRequest {
            volume_id: self.volume_id.clone(),
            context: kvs_down(&self.context),
            request: kvs_down(&self.request),
            subdir: self.subdir.clone(),
            recorded: kvs_down(&self.recorded),
        })
    }
}

// ---- Answers: 0.1.0 → 0.2.0 ----

impl Upgrade for () {
    type New = ();
    fn upgrade(self) {}
}

impl<T: Upgrade> Upgrade for Vec<T> {
    type New = Vec<T::New>;
    fn upgrade(self) -> Vec<T::New> {
        self.into_iter().map(Upgrade::upgrade).collect()
    }
}

impl Upgrade for old::Kv {
    type New = new::Kv;
    fn upgrade(self) -> new::Kv {
        new::Kv { key: self.key, value: self.value }
    }
}

impl Upgrade for old::BackendError {
    type New = new::BackendError;
    fn upgrade(self) -> new::BackendError {
        match self {
            old::BackendError::InvalidArgument(m) => new::BackendError::InvalidArgument(m),
            old::BackendError::NotFound(m) => new::BackendError::NotFound(m),
            old::BackendError::Unavailable(m) => new::BackendError::Unavailable(m),
            old::BackendError::Internal(m) => new::BackendError::Internal(m),
        }
    }
}

impl Upgrade for old::PluginInfo {
    type New = new::PluginInfo;
    fn upgrade(self) -> new::PluginInfo {
        new::PluginInfo {
            name: self.name,
            version: self.version,
            description: self.description,
            parameters: self.parameters.upgrade(),
            programs: self.programs,
            fstypes: self.fstypes,
        }
    }
}

impl Upgrade for old::ParamDoc {
    type New = new::ParamDoc;
    fn upgrade(self) -> new::ParamDoc {
        new::ParamDoc {
            name: self.name,
            doc: self.doc,
            kind: match self.kind {
                old::ParamKind::Text => new::ParamKind::Text,
                old::ParamKind::Boolean => new::ParamKind::Boolean,
                old::ParamKind::Integer => new::ParamKind::Integer,
                old::ParamKind::Endpoint => new::ParamKind::Endpoint,
                old::ParamKind::RemotePath => new::ParamKind::RemotePath,
                old::ParamKind::Choice => new::ParamKind::Choice,
                old::ParamKind::CommaList => new::ParamKind::CommaList,
            },
            source: match self.source {
                old::ParamSource::Parameter => new::ParamSource::Parameter,
                old::ParamSource::Secret => new::ParamSource::Secret,
                old::ParamSource::Context => new::ParamSource::Context,
            },
            required: self.required,
            default_value: self.default_value,
        }
    }
}

impl Upgrade for old::ProvisionPlan {
    type New = new::ProvisionPlan;
    fn upgrade(self) -> new::ProvisionPlan {
        new::ProvisionPlan {
            volume_id: self.volume_id,
            capacity_bytes: self.capacity_bytes,
            context: self.context.upgrade(),
            steps: self.steps.upgrade(),
        }
    }
}

impl Upgrade for old::Plan {
    type New = new::Plan;
    fn upgrade(self) -> new::Plan {
        new::Plan { steps: self.steps.upgrade(), attributes: self.attributes.upgrade() }
    }
}

impl Upgrade for old::PathRef {
    type New = new::PathRef;
    fn upgrade(self) -> new::PathRef {
        let root = match self.root {
            old::DirRoot::Staging => new::DirRoot::Staging,
            old::DirRoot::Target => new::DirRoot::Target,
            old::DirRoot::Cache => new::DirRoot::Cache,
            old::DirRoot::Runtime => new::DirRoot::Runtime,
        };
        new::PathRef { root, rel: self.rel }
    }
}

impl Upgrade for old::Arg {
    type New = new::Arg;
    fn upgrade(self) -> new::Arg {
        match self {
            old::Arg::Literal(s) => new::Arg::Literal(s),
            old::Arg::Path(p) => {
                new::Arg::Path(new::PathArg { prefix: p.prefix, path: p.path.upgrade(), suffix: String::new() })
            }
        }
    }
}

impl Upgrade for old::Value {
    type New = new::Value;
    fn upgrade(self) -> new::Value {
        match self {
            old::Value::Literal(s) => new::Value::Literal(s),
            old::Value::Secret(k) => new::Value::Secret(k),
        }
    }
}

impl Upgrade for old::EnvVar {
    type New = new::EnvVar;
    fn upgrade(self) -> new::EnvVar {
        new::EnvVar { name: self.name, value: self.value.upgrade() }
    }
}

impl Upgrade for old::Header {
    type New = new::Header;
    fn upgrade(self) -> new::Header {
        new::Header { name: self.name, value: self.value.upgrade() }
    }
}

impl Upgrade for old::Step {
    type New = new::Step;
    fn upgrade(self) -> new::Step {
        match self {
            old::Step::Mkdir(p) => new::Step::Mkdir(p.upgrade()),
            old::Step::Remove(p) => new::Step::Remove(p.upgrade()),
            old::Step::SpawnFuse(s) => new::Step::SpawnFuse(new::SpawnFuse {
                program: s.program,
                args: s.args.upgrade(),
                env: s.env.upgrade(),
                mountpoint: s.mountpoint.upgrade(),
                fstype: s.fstype,
                ready_timeout_ms: s.ready_timeout_ms,
                memory_limit_bytes: s.memory_limit_bytes,
            }),
            old::Step::Mount(m) => new::Step::Mount(new::Mount {
                fstype: m.fstype,
                source: match m.source {
                    old::MountSource::Named(n) => new::MountSource::Named(n),
                    old::MountSource::Path(p) => new::MountSource::Path(p.upgrade()),
                },
                target: m.target.upgrade(),
                options: m.options.upgrade(),
                readonly: m.readonly,
            }),
            old::Step::Bind(b) => new::Step::Bind(new::Bind {
                source: b.source.upgrade(),
                target: b.target.upgrade(),
                readonly: b.readonly,
                options: b.options,
            }),
            old::Step::Fetch(f) => new::Step::Fetch(new::Fetch {
                url: f.url,
                headers: f.headers.upgrade(),
                digest: f.digest,
                size: f.size,
            }),
            old::Step::Unpack(u) => new::Step::Unpack(new::Unpack {
                digest: u.digest,
                format: match u.format {
                    old::Archive::Raw => new::Archive::Raw,
                    old::Archive::Tar => new::Archive::Tar,
                    old::Archive::TarGzip => new::Archive::TarGzip,
                    old::Archive::TarZstd => new::Archive::TarZstd,
                },
                dest: u.dest.upgrade(),
            }),
            old::Step::Http(h) => new::Step::Http(new::HttpCall {
                method: h.method,
                urls: h.urls,
                headers: h.headers.upgrade(),
                body: h.body,
                ok_status: h.ok_status,
            }),
            old::Step::Socket(p) => new::Step::Socket(p.upgrade()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(root: old::DirRoot, rel: &str) -> old::PathRef {
        old::PathRef { root, rel: rel.into() }
    }

    fn np(root: new::DirRoot, rel: &str) -> new::PathRef {
        new::PathRef { root, rel: rel.into() }
    }

    fn capability() -> new::VolumeCapability {
        new::VolumeCapability {
            access_mode: new::AccessMode::MultiNodeReaderOnly,
            fs_type: "ext4".into(),
            mount_flags: vec!["noatime".into()],
        }
    }

    fn stage(resolved: Option<new::Resolved>) -> new::StageRequest {
        new::StageRequest {
            volume_id: "v".into(),
            context: vec![new::Kv { key: "a".into(), value: "1".into() }],
            secrets: vec![new::Kv { key: "token".into(), value: "t0ken".into() }],
            capability: capability(),
            ephemeral: true,
            resolved,
        }
    }

    #[test]
    fn a_stage_request_keeps_every_field() {
        let down = stage(None).downgrade().unwrap();
        assert_eq!(
            down,
            old::StageRequest {
                volume_id: "v".into(),
                context: vec![old::Kv { key: "a".into(), value: "1".into() }],
                secrets: vec![old::Kv { key: "token".into(), value: "t0ken".into() }],
                capability: old::VolumeCapability {
                    access_mode: old::AccessMode::MultiNodeReaderOnly,
                    fs_type: "ext4".into(),
                    mount_flags: vec!["noatime".into()],
                },
                ephemeral: true,
            }
        );
    }

    #[test]
    fn a_resolved_stage_request_never_reaches_a_legacy_plugin() {
        let resolved = new::Resolved {
            reference: "registry.local/m:1".into(),
            manifest_digest: format!("sha256:{}", "a".repeat(64)),
            manifest: "{}".into(),
            config: "{}".into(),
        };
        let err = stage(Some(resolved)).downgrade().unwrap_err();
        assert_eq!(err, AdapterError::ResolvedForLegacy { reference: "registry.local/m:1".into() });
        assert!(err.to_string().contains("host bug"), "{err}");
    }

    #[test]
    fn other_requests_keep_every_field() {
        let kv = |k: &str| new::Kv { key: k.into(), value: "x".into() };
        let okv = |k: &str| old::Kv { key: k.into(), value: "x".into() };
        let publish = new::PublishRequest {
            volume_id: "v".into(),
            context: vec![kv("c")],
            secrets: vec![kv("s")],
            capability: capability(),
            readonly: true,
            recorded: vec![kv("r")],
        };
        let down = publish.downgrade().unwrap();
        assert_eq!((down.readonly, down.recorded, down.secrets), (true, vec![okv("r")], vec![okv("s")]));
        let dynamic = new::DynamicMountRequest {
            volume_id: "v".into(),
            context: vec![kv("c")],
            request: vec![kv("q")],
            subdir: "sub".into(),
            recorded: vec![],
        };
        let down = dynamic.downgrade().unwrap();
        assert_eq!((down.request, down.subdir.as_str()), (vec![okv("q")], "sub"));
        let provision = new::ProvisionRequest {
            name: "pvc".into(),
            parameters: vec![kv("p")],
            secrets: vec![],
            capabilities: vec![capability()],
            required_bytes: 5,
            limit_bytes: 9,
        };
        let down = provision.downgrade().unwrap();
        assert_eq!((down.required_bytes, down.limit_bytes, down.capabilities.len()), (5, 9, 1));
        let unstage = new::UnstageRequest { volume_id: "v".into(), context: vec![], recorded: vec![kv("r")] };
        assert_eq!(unstage.downgrade().unwrap().recorded, vec![okv("r")]);
    }

    #[test]
    fn every_legacy_step_upgrades() {
        let header = old::Header { name: "Authorization".into(), value: old::Value::Secret("token".into()) };
        let plan = old::Plan {
            steps: vec![
                old::Step::Mkdir(p(old::DirRoot::Cache, "c")),
                old::Step::Remove(p(old::DirRoot::Runtime, "r")),
                old::Step::SpawnFuse(old::SpawnFuse {
                    program: "weed".into(),
                    args: vec![
                        old::Arg::Literal("mount".into()),
                        old::Arg::Path(old::PathArg { prefix: "-dir=".into(), path: p(old::DirRoot::Staging, "") }),
                    ],
                    env: vec![old::EnvVar { name: "A".into(), value: old::Value::Literal("1".into()) }],
                    mountpoint: p(old::DirRoot::Staging, ""),
                    fstype: "fuse.seaweedfs".into(),
                    ready_timeout_ms: 7,
                    memory_limit_bytes: Some(8),
                }),
                old::Step::Mount(old::Mount {
                    fstype: "overlay".into(),
                    source: old::MountSource::Path(p(old::DirRoot::Cache, "l")),
                    target: p(old::DirRoot::Target, ""),
                    options: vec![old::Arg::Path(old::PathArg {
                        prefix: "lowerdir=".into(),
                        path: p(old::DirRoot::Cache, "l"),
                    })],
                    readonly: true,
                }),
                old::Step::Bind(old::Bind {
                    source: p(old::DirRoot::Staging, ""),
                    target: p(old::DirRoot::Target, ""),
                    readonly: true,
                    options: vec!["nosuid".into()],
                }),
                old::Step::Fetch(old::Fetch {
                    url: "https://h/b".into(),
                    headers: vec![header.clone()],
                    digest: "sha256:x".into(),
                    size: 3,
                }),
                old::Step::Unpack(old::Unpack {
                    digest: "sha256:x".into(),
                    format: old::Archive::TarZstd,
                    dest: p(old::DirRoot::Cache, "u"),
                }),
                old::Step::Http(old::HttpCall {
                    method: "PUT".into(),
                    urls: vec!["http://f/".into()],
                    headers: vec![header],
                    body: b"{}".to_vec(),
                    ok_status: vec![201],
                }),
                old::Step::Socket(p(old::DirRoot::Runtime, "s.sock")),
            ],
            attributes: vec![old::Kv { key: "k".into(), value: "v".into() }],
        };
        let up = plan.upgrade();
        assert_eq!(up.attributes, vec![new::Kv { key: "k".into(), value: "v".into() }]);
        let [mkdir, remove, spawn, mount, bind, fetch, unpack, http, socket] = &up.steps[..] else { panic!("{up:?}") };
        assert_eq!(mkdir, &new::Step::Mkdir(np(new::DirRoot::Cache, "c")));
        assert_eq!(remove, &new::Step::Remove(np(new::DirRoot::Runtime, "r")));
        let new::Step::SpawnFuse(s) = spawn else { panic!("{spawn:?}") };
        assert_eq!(
            s.args,
            vec![
                new::Arg::Literal("mount".into()),
                new::Arg::Path(new::PathArg {
                    prefix: "-dir=".into(),
                    path: np(new::DirRoot::Staging, ""),
                    suffix: String::new()
                }),
            ]
        );
        assert_eq!(s.env, vec![new::EnvVar { name: "A".into(), value: new::Value::Literal("1".into()) }]);
        assert_eq!((s.ready_timeout_ms, s.memory_limit_bytes, s.fstype.as_str()), (7, Some(8), "fuse.seaweedfs"));
        let new::Step::Mount(m) = mount else { panic!("{mount:?}") };
        assert_eq!(m.source, new::MountSource::Path(np(new::DirRoot::Cache, "l")));
        assert!(matches!(&m.options[..], [new::Arg::Path(a)] if a.suffix.is_empty() && a.prefix == "lowerdir="));
        assert!(matches!(bind, new::Step::Bind(b) if b.readonly && b.options == ["nosuid"]));
        let secret_header = new::Header { name: "Authorization".into(), value: new::Value::Secret("token".into()) };
        assert!(matches!(fetch, new::Step::Fetch(f) if f.headers == [secret_header.clone()] && f.size == 3));
        assert!(matches!(unpack, new::Step::Unpack(u) if u.format == new::Archive::TarZstd));
        assert!(matches!(http, new::Step::Http(h) if h.ok_status == [201] && h.headers == [secret_header]));
        assert_eq!(socket, &new::Step::Socket(np(new::DirRoot::Runtime, "s.sock")));
    }

    #[test]
    fn info_provision_plans_and_errors_upgrade() {
        let info = old::PluginInfo {
            name: "legacy".into(),
            version: "1.0.0".into(),
            description: "d".into(),
            parameters: vec![old::ParamDoc {
                name: "filer".into(),
                doc: "where".into(),
                kind: old::ParamKind::Endpoint,
                source: old::ParamSource::Parameter,
                required: true,
                default_value: Some("x:1".into()),
            }],
            programs: vec!["weed".into()],
            fstypes: vec!["tmpfs".into()],
        };
        let up = info.upgrade();
        assert_eq!(
            (up.parameters[0].kind, up.parameters[0].source),
            (new::ParamKind::Endpoint, new::ParamSource::Parameter)
        );
        assert_eq!((up.programs, up.fstypes), (vec!["weed".to_string()], vec!["tmpfs".to_string()]));
        let plan = old::ProvisionPlan {
            volume_id: "id".into(),
            capacity_bytes: 4,
            context: vec![old::Kv { key: "k".into(), value: "v".into() }],
            steps: vec![old::Step::Socket(p(old::DirRoot::Runtime, "s"))],
        };
        let up = plan.upgrade();
        assert_eq!((up.volume_id.as_str(), up.capacity_bytes, up.steps.len()), ("id", 4, 1));
        assert_eq!(
            old::BackendError::Unavailable("down".into()).upgrade(),
            new::BackendError::Unavailable("down".into())
        );
        assert_eq!(old::BackendError::NotFound("n".into()).upgrade(), new::BackendError::NotFound("n".into()));
    }
}
