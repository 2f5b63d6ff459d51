//! The adapter between contracts `mounthost:plugin@0.2.0` and 0.3.0, which keeps plugins built
//! against 0.2.0 working; their calls pass through [`super::adapter_v030`] (0.4.0, the host's
//! own, ↔ 0.3.0) first, and a 0.1.0 plugin's through [`super::adapter`] after.
//!
//! 0.3.0 only adds to 0.2.0 (a `spawn-fuse` says who mounts its filesystem, and the `fuse-fd`
//! argument names a connection the host mounted), and changes no request. So both directions
//! are total: every 0.3.0 request has a 0.2.0 form, and a 0.2.0 `spawn-fuse` is one whose
//! program mounts its filesystem itself (`fuse-mount.by-program`), as it always did.

use super::adapter::{AdapterError, Downgrade, Upgrade};
use super::bindings_v020::types as old;
use super::bindings_v030::types as new;

// ---- Requests: 0.3.0 → 0.2.0 ----

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
        Ok(old::StageRequest {
            volume_id: self.volume_id.clone(),
            context: kvs_down(&self.context),
            secrets: kvs_down(&self.secrets),
            capability: capability_down(&self.capability),
            ephemeral: self.ephemeral,
            resolved: self.resolved.as_ref().map(|r| old::Resolved {
                reference: r.reference.clone(),
                manifest_digest: r.manifest_digest.clone(),
                manifest: r.manifest.clone(),
                config: r.config.clone(),
            }),
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

// ---- Answers: 0.2.0 → 0.3.0 ----

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
                old::ParamKind::OciReference => new::ParamKind::OciReference,
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
                new::Arg::Path(new::PathArg { prefix: p.prefix, path: p.path.upgrade(), suffix: p.suffix })
            }
            old::Arg::SecretFile(f) => {
                new::Arg::SecretFile(new::SecretFileArg { prefix: f.prefix, key: f.key, suffix: f.suffix })
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
            old::Value::SecretTemplate(t) => {
                new::Value::SecretTemplate(new::SecretTemplate { prefix: t.prefix, key: t.key, suffix: t.suffix })
            }
            old::Value::Path(p) => new::Value::Path(p.upgrade()),
            old::Value::SecretFile(k) => new::Value::SecretFile(k),
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

impl Upgrade for old::RegistryAuth {
    type New = new::RegistryAuth;
    fn upgrade(self) -> new::RegistryAuth {
        match self {
            old::RegistryAuth::Anonymous => new::RegistryAuth::Anonymous,
            old::RegistryAuth::Basic(b) => {
                new::RegistryAuth::Basic(new::BasicAuth { username_key: b.username_key, password_key: b.password_key })
            }
            old::RegistryAuth::Token(k) => new::RegistryAuth::Token(k),
            old::RegistryAuth::DockerConfig(k) => new::RegistryAuth::DockerConfig(k),
        }
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
                // Before 0.3.0 every FUSE program mounted its filesystem itself.
                mount: new::FuseMount::ByProgram,
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
            old::Step::Resolve(r) => new::Step::Resolve(new::Resolve {
                reference: r.reference,
                mirror: r.mirror,
                auth: r.auth.upgrade(),
                insecure: r.insecure,
            }),
            old::Step::FetchBlob(f) => {
                new::Step::FetchBlob(new::FetchBlob { digest: f.digest, size: f.size, media_type: f.media_type })
            }
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
            access_mode: new::AccessMode::SingleNodeMultiWriter,
            fs_type: "xfs".into(),
            mount_flags: vec!["noatime".into()],
        }
    }

    #[test]
    fn a_resolved_stage_request_keeps_its_resolution() {
        let req = new::StageRequest {
            volume_id: "v".into(),
            context: vec![new::Kv { key: "a".into(), value: "1".into() }],
            secrets: vec![new::Kv { key: "token".into(), value: "t".into() }],
            capability: capability(),
            ephemeral: true,
            resolved: Some(new::Resolved {
                reference: "r.io/m:1".into(),
                manifest_digest: format!("sha256:{}", "b".repeat(64)),
                manifest: "{}".into(),
                config: "{\"c\":1}".into(),
            }),
        };
        let down = req.downgrade().unwrap();
        assert_eq!(down.capability.access_mode, old::AccessMode::SingleNodeMultiWriter);
        assert_eq!((down.ephemeral, down.secrets.len(), down.context[0].key.as_str()), (true, 1, "a"));
        let r = down.resolved.unwrap();
        assert_eq!((r.reference.as_str(), r.config.as_str()), ("r.io/m:1", "{\"c\":1}"));
        let publish = new::PublishRequest {
            volume_id: "v".into(),
            context: vec![],
            secrets: vec![],
            capability: capability(),
            readonly: true,
            recorded: vec![new::Kv { key: "r".into(), value: "x".into() }],
        };
        let down = publish.downgrade().unwrap();
        assert_eq!((down.readonly, down.recorded.len()), (true, 1));
    }

    #[test]
    fn every_0_2_0_step_upgrades_and_programs_mount_themselves() {
        let header = old::Header {
            name: "Authorization".into(),
            value: old::Value::SecretTemplate(old::SecretTemplate {
                prefix: "Bearer ".into(),
                key: "token".into(),
                suffix: String::new(),
            }),
        };
        let plan = old::Plan {
            steps: vec![
                old::Step::Mkdir(p(old::DirRoot::Cache, "c")),
                old::Step::SpawnFuse(old::SpawnFuse {
                    program: "weed".into(),
                    args: vec![
                        old::Arg::Literal("mount".into()),
                        old::Arg::Path(old::PathArg {
                            prefix: "-dir=".into(),
                            path: p(old::DirRoot::Staging, ""),
                            suffix: ",x".into(),
                        }),
                        old::Arg::SecretFile(old::SecretFileArg {
                            prefix: "-k=".into(),
                            key: "key".into(),
                            suffix: String::new(),
                        }),
                    ],
                    env: vec![
                        old::EnvVar { name: "T".into(), value: old::Value::Path(p(old::DirRoot::Cache, "tmp")) },
                        old::EnvVar { name: "F".into(), value: old::Value::SecretFile("key".into()) },
                    ],
                    mountpoint: p(old::DirRoot::Staging, ""),
                    fstype: "fuse.seaweedfs".into(),
                    ready_timeout_ms: 7,
                    memory_limit_bytes: None,
                }),
                old::Step::Resolve(old::Resolve {
                    reference: "r.io/m:1".into(),
                    mirror: Some("mirror:5000".into()),
                    auth: old::RegistryAuth::Basic(old::BasicAuth {
                        username_key: "u".into(),
                        password_key: "p".into(),
                    }),
                    insecure: true,
                }),
                old::Step::FetchBlob(old::FetchBlob { digest: "sha256:x".into(), size: 3, media_type: "m".into() }),
                old::Step::Fetch(old::Fetch {
                    url: "https://h/b".into(),
                    headers: vec![header],
                    digest: "sha256:y".into(),
                    size: 1,
                }),
                old::Step::Socket(p(old::DirRoot::Runtime, "s.sock")),
            ],
            attributes: vec![old::Kv { key: "k".into(), value: "v".into() }],
        };
        let up = plan.upgrade();
        let [mkdir, spawn, resolve, blob, fetch, socket] = &up.steps[..] else { panic!("{up:?}") };
        assert_eq!(mkdir, &new::Step::Mkdir(np(new::DirRoot::Cache, "c")));
        let new::Step::SpawnFuse(s) = spawn else { panic!("{spawn:?}") };
        assert_eq!(s.mount, new::FuseMount::ByProgram);
        assert!(matches!(&s.args[1], new::Arg::Path(a) if a.suffix == ",x" && a.prefix == "-dir="));
        assert!(matches!(&s.args[2], new::Arg::SecretFile(f) if f.key == "key" && f.prefix == "-k="));
        assert_eq!(s.env[0].value, new::Value::Path(np(new::DirRoot::Cache, "tmp")));
        assert_eq!(s.env[1].value, new::Value::SecretFile("key".into()));
        let new::Step::Resolve(r) = resolve else { panic!("{resolve:?}") };
        assert!(r.insecure && r.mirror.as_deref() == Some("mirror:5000"));
        assert!(matches!(&r.auth, new::RegistryAuth::Basic(b) if b.username_key == "u" && b.password_key == "p"));
        assert!(matches!(blob, new::Step::FetchBlob(f) if f.size == 3 && f.media_type == "m"));
        assert!(matches!(fetch, new::Step::Fetch(f)
            if matches!(&f.headers[0].value, new::Value::SecretTemplate(t) if t.prefix == "Bearer " && t.key == "token")));
        assert_eq!(socket, &new::Step::Socket(np(new::DirRoot::Runtime, "s.sock")));
        assert_eq!(up.attributes, vec![new::Kv { key: "k".into(), value: "v".into() }]);
    }

    #[test]
    fn info_keeps_oci_reference_parameters() {
        let info = old::PluginInfo {
            name: "model".into(),
            version: "1.0.0".into(),
            description: "d".into(),
            parameters: vec![old::ParamDoc {
                name: "reference".into(),
                doc: "what".into(),
                kind: old::ParamKind::OciReference,
                source: old::ParamSource::Parameter,
                required: true,
                default_value: None,
            }],
            programs: vec![],
            fstypes: vec!["fuse".into()],
        };
        let up = info.upgrade();
        assert_eq!(up.parameters[0].kind, new::ParamKind::OciReference);
        assert_eq!(up.fstypes, vec!["fuse".to_string()]);
        assert_eq!(old::BackendError::Internal("x".into()).upgrade(), new::BackendError::Internal("x".into()));
    }
}
