//! Constructors and `with_*` setters for the contract's records.
//!
//! Every record a contract version may grow is `#[non_exhaustive]`, so a plugin cannot write it
//! as a struct literal: it calls `new` with the fields that have no sensible default and sets the
//! others with `with_*` methods, each taking anything that converts into the field's type
//! (`&str` for a `String`, an array for a `Vec`, a `T` or an `Option<T>` for an `Option<T>`).
//! Fields stay public for reading and assignment. A field a later contract adds gets a default here, so code written
//! against an earlier SDK release keeps compiling:
//!
//! ```
//! use mounthost_plugin_sdk::*;
//!
//! let bind = Bind::new(staging(""), target("")).with_readonly(true);
//! let plan = Plan::new([Step::Bind(bind)]).with_attributes([kv("mounted", "yes")]);
//! assert_eq!(plan.steps.len(), 1);
//! ```
//!
//! Requests (which the host builds and a plugin's own tests build) implement `Default` and have
//! a `with_*` setter for every field.
//!
//! Two records are complete as they are and stay exhaustive: [`Kv`] and [`PathRef`].

use crate::*;

/// `with_*` setters, one per `$setter => $field: $type` row: a `String` or `Vec` field takes
/// anything that converts into it (`&str`, an array; a `Vec<String>` any texts), an `Option<T>`
/// field a `T` or an `Option<T>`, any other field its own type (so number literals need no
/// suffix).
macro_rules! setters {
    ($ty:ident { $($setter:ident => $field:ident: $kind:ident $(<$inner:ident>)?),* $(,)? }) => {
        impl $ty {
            $( setters!(@one $setter $field $kind $(<$inner>)?); )*
        }
    };
    (@one $setter:ident $field:ident String) => {
        #[doc = concat!("Sets `", stringify!($field), "`.")]
        #[must_use]
        pub fn $setter(mut self, value: impl Into<String>) -> Self {
            self.$field = value.into();
            self
        }
    };
    (@one $setter:ident $field:ident Vec<String>) => {
        #[doc = concat!("Sets `", stringify!($field), "` (any texts: `[\"a\", \"b\"]`, a `Vec<String>`).")]
        #[must_use]
        pub fn $setter(mut self, value: impl IntoIterator<Item = impl Into<String>>) -> Self {
            self.$field = value.into_iter().map(Into::into).collect();
            self
        }
    };
    (@one $setter:ident $field:ident Vec<$t:ident>) => {
        #[doc = concat!("Sets `", stringify!($field), "`.")]
        #[must_use]
        pub fn $setter(mut self, value: impl Into<Vec<$t>>) -> Self {
            self.$field = value.into();
            self
        }
    };
    (@one $setter:ident $field:ident Option<$t:ident>) => {
        #[doc = concat!("Sets `", stringify!($field), "` (a value or an `Option`).")]
        #[must_use]
        pub fn $setter(mut self, value: impl Into<Option<$t>>) -> Self {
            self.$field = value.into();
            self
        }
    };
    (@one $setter:ident $field:ident $t:ident) => {
        #[doc = concat!("Sets `", stringify!($field), "`.")]
        #[must_use]
        pub fn $setter(mut self, value: $t) -> Self {
            self.$field = value;
            self
        }
    };
}

// ---- plugin-info and parameters ---------------------------------------------------------------

impl PluginInfo {
    /// A plugin's name, version and one-line description; no parameters, programs or fstypes.
    pub fn new(name: impl Into<String>, version: impl Into<String>, description: impl Into<String>) -> Self {
        PluginInfo {
            name: name.into(),
            version: version.into(),
            description: description.into(),
            parameters: Vec::new(),
            programs: Vec::new(),
            fstypes: Vec::new(),
        }
    }
}
setters!(PluginInfo {
    with_parameters => parameters: Vec<ParamDoc>,
    with_programs => programs: Vec<String>,
    with_fstypes => fstypes: Vec<String>,
});

impl ParamDoc {
    /// An optional StorageClass parameter without a default.
    pub fn new(name: impl Into<String>, kind: ParamKind, doc: impl Into<String>) -> Self {
        ParamDoc {
            name: name.into(),
            doc: doc.into(),
            kind,
            source: ParamSource::Parameter,
            required: false,
            default_value: None,
        }
    }
}
setters!(ParamDoc {
    with_source => source: ParamSource,
    with_required => required: bool,
    with_default_value => default_value: Option<String>,
});

// ---- capabilities -------------------------------------------------------------------------------

impl VolumeCapability {
    /// A mount capability with this access mode, no fstype and no mount flags.
    pub fn new(access_mode: AccessMode) -> Self {
        VolumeCapability { access_mode, fs_type: String::new(), mount_flags: Vec::new() }
    }
}
/// `single-node-writer`, no fstype, no flags.
impl Default for VolumeCapability {
    fn default() -> Self {
        VolumeCapability::new(AccessMode::SingleNodeWriter)
    }
}
setters!(VolumeCapability {
    with_fs_type => fs_type: String,
    with_mount_flags => mount_flags: Vec<String>,
});

// ---- arguments and values ------------------------------------------------------------------------

impl FuseFdArg {
    /// `/dev/fd/N` with nothing around it.
    pub fn new() -> Self {
        FuseFdArg { prefix: String::new(), suffix: String::new() }
    }
}
impl Default for FuseFdArg {
    fn default() -> Self {
        FuseFdArg::new()
    }
}
setters!(FuseFdArg { with_prefix => prefix: String, with_suffix => suffix: String });

impl PathArg {
    /// The path alone.
    pub fn new(path: PathRef) -> Self {
        PathArg { prefix: String::new(), path, suffix: String::new() }
    }
}
setters!(PathArg { with_prefix => prefix: String, with_suffix => suffix: String });

impl SecretFileArg {
    /// The path of the file holding secret `key`, alone.
    pub fn new(key: impl Into<String>) -> Self {
        SecretFileArg { prefix: String::new(), key: key.into(), suffix: String::new() }
    }
}
setters!(SecretFileArg { with_prefix => prefix: String, with_suffix => suffix: String });

impl SecretTemplate {
    /// Secret `key`'s value alone.
    pub fn new(key: impl Into<String>) -> Self {
        SecretTemplate { prefix: String::new(), key: key.into(), suffix: String::new() }
    }
}
setters!(SecretTemplate { with_prefix => prefix: String, with_suffix => suffix: String });

impl EnvVar {
    /// An environment variable.
    pub fn new(name: impl Into<String>, value: Value) -> Self {
        EnvVar { name: name.into(), value }
    }
}

impl Header {
    /// An HTTP header.
    pub fn new(name: impl Into<String>, value: Value) -> Self {
        Header { name: name.into(), value }
    }
}

// ---- steps ---------------------------------------------------------------------------------------

/// [`SpawnFuse::new`]'s wait for the mount, in milliseconds.
pub const DEFAULT_READY_TIMEOUT_MS: u32 = 30_000;

impl SpawnFuse {
    /// Run granted `program` with `args`, mounting by itself at `mountpoint` with `fstype`; no
    /// environment, no memory limit, a wait of [`DEFAULT_READY_TIMEOUT_MS`].
    pub fn new(
        program: impl Into<String>,
        args: impl Into<Vec<Arg>>,
        mountpoint: PathRef,
        fstype: impl Into<String>,
    ) -> Self {
        SpawnFuse {
            program: program.into(),
            args: args.into(),
            env: Vec::new(),
            mountpoint,
            fstype: fstype.into(),
            ready_timeout_ms: DEFAULT_READY_TIMEOUT_MS,
            memory_limit_bytes: None,
            mount: FuseMount::ByProgram,
        }
    }
}
setters!(SpawnFuse {
    with_env => env: Vec<EnvVar>,
    with_ready_timeout_ms => ready_timeout_ms: u32,
    with_memory_limit_bytes => memory_limit_bytes: Option<u64>,
    with_mount => mount: FuseMount,
});

impl HostFdMount {
    /// A read-write `host-fd` mount showing `source`, without extra options.
    pub fn new(source: impl Into<String>) -> Self {
        HostFdMount { source: source.into(), options: Vec::new(), readonly: false }
    }
}
setters!(HostFdMount { with_options => options: Vec<String>, with_readonly => readonly: bool });

impl Mount {
    /// A read-write mount without options.
    pub fn new(fstype: impl Into<String>, source: MountSource, target: PathRef) -> Self {
        Mount { fstype: fstype.into(), source, target, options: Vec::new(), readonly: false }
    }
}
setters!(Mount { with_options => options: Vec<Arg>, with_readonly => readonly: bool });

impl Bind {
    /// A read-write bind without options.
    pub fn new(source: PathRef, target: PathRef) -> Self {
        Bind { source, target, readonly: false, options: Vec::new() }
    }
}
setters!(Bind { with_readonly => readonly: bool, with_options => options: Vec<String> });

impl Fetch {
    /// Fetch `url`, which must have `digest` and `size`, without headers.
    pub fn new(url: impl Into<String>, digest: impl Into<String>, size: u64) -> Self {
        Fetch { url: url.into(), headers: Vec::new(), digest: digest.into(), size }
    }
}
setters!(Fetch { with_headers => headers: Vec<Header> });

impl BasicAuth {
    /// Basic credentials from these two secrets.
    pub fn new(username_key: impl Into<String>, password_key: impl Into<String>) -> Self {
        BasicAuth { username_key: username_key.into(), password_key: password_key.into() }
    }
}

impl Resolve {
    /// Resolve `reference` anonymously over TLS, without a mirror.
    pub fn new(reference: impl Into<String>) -> Self {
        Resolve { reference: reference.into(), mirror: None, auth: RegistryAuth::Anonymous, insecure: false }
    }
}
setters!(Resolve {
    with_mirror => mirror: Option<String>,
    with_auth => auth: RegistryAuth,
    with_insecure => insecure: bool,
});

impl Resolved {
    /// A resolution, as the host reports it.
    pub fn new(
        reference: impl Into<String>,
        manifest_digest: impl Into<String>,
        manifest: impl Into<String>,
        config: impl Into<String>,
    ) -> Self {
        Resolved {
            reference: reference.into(),
            manifest_digest: manifest_digest.into(),
            manifest: manifest.into(),
            config: config.into(),
        }
    }
}

setters!(Resolved {
    with_reference => reference: String,
    with_manifest_digest => manifest_digest: String,
    with_manifest => manifest: String,
    with_config => config: String,
});

impl FetchBlob {
    /// A blob of the resolved artifact.
    pub fn new(digest: impl Into<String>, size: u64, media_type: impl Into<String>) -> Self {
        FetchBlob { digest: digest.into(), size, media_type: media_type.into() }
    }
}

impl Unpack {
    /// Unpack a fetched blob into `dest`.
    pub fn new(digest: impl Into<String>, format: Archive, dest: PathRef) -> Self {
        Unpack { digest: digest.into(), format, dest }
    }
}

impl HttpCall {
    /// A call tried at each of `urls` in turn, without headers or body, succeeding on a status
    /// of `ok_status`.
    pub fn new(
        method: impl Into<String>,
        urls: impl IntoIterator<Item = impl Into<String>>,
        ok_status: impl Into<Vec<u16>>,
    ) -> Self {
        HttpCall {
            method: method.into(),
            urls: urls.into_iter().map(Into::into).collect(),
            headers: Vec::new(),
            body: Vec::new(),
            ok_status: ok_status.into(),
        }
    }
}
setters!(HttpCall { with_headers => headers: Vec<Header>, with_body => body: Vec<u8> });

impl Lookup {
    /// A planning-time request answered under `key`, without headers.
    pub fn new(
        key: impl Into<String>,
        method: impl Into<String>,
        urls: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Lookup {
            key: key.into(),
            method: method.into(),
            urls: urls.into_iter().map(Into::into).collect(),
            headers: Vec::new(),
        }
    }
}
setters!(Lookup { with_headers => headers: Vec<Header> });

impl LookedUp {
    /// The answer to lookup `key`, complete.
    pub fn new(key: impl Into<String>, status: u16, body: impl Into<Vec<u8>>) -> Self {
        LookedUp { key: key.into(), status, body: body.into(), truncated: false }
    }
}
setters!(LookedUp { with_truncated => truncated: bool });

/// [`SocketCall::new`]'s timeout, in milliseconds.
pub const DEFAULT_SOCKET_CALL_TIMEOUT_MS: u32 = 10_000;

impl SocketCall {
    /// A unary gRPC call of `method` with `message` over `socket`, within
    /// [`DEFAULT_SOCKET_CALL_TIMEOUT_MS`].
    pub fn new(socket: PathRef, method: impl Into<String>, message: impl Into<Vec<u8>>) -> Self {
        SocketCall {
            socket,
            method: method.into(),
            message: message.into(),
            timeout_ms: DEFAULT_SOCKET_CALL_TIMEOUT_MS,
        }
    }
}
setters!(SocketCall { with_timeout_ms => timeout_ms: u32 });

// ---- plans and answers ---------------------------------------------------------------------------

impl Plan {
    /// These steps, no attributes.
    pub fn new(steps: impl Into<Vec<Step>>) -> Self {
        Plan { steps: steps.into(), attributes: Vec::new() }
    }
}
/// No steps, no attributes.
impl Default for Plan {
    fn default() -> Self {
        Plan::new(Vec::new())
    }
}
setters!(Plan { with_attributes => attributes: Vec<Kv> });

impl ProvisionPlan {
    /// A created volume's id and capacity, without context or steps.
    pub fn new(volume_id: impl Into<String>, capacity_bytes: u64) -> Self {
        ProvisionPlan { volume_id: volume_id.into(), capacity_bytes, context: Vec::new(), steps: Vec::new() }
    }
}
setters!(ProvisionPlan { with_context => context: Vec<Kv>, with_steps => steps: Vec<Step> });

impl ExpandPlan {
    /// The new capacity, no node expansion, no steps.
    pub fn new(capacity_bytes: u64) -> Self {
        ExpandPlan { capacity_bytes, node_expansion_required: false, steps: Vec::new() }
    }
}
setters!(ExpandPlan {
    with_node_expansion_required => node_expansion_required: bool,
    with_steps => steps: Vec<Step>,
});

/// Nothing known.
impl Default for CapacityAnswer {
    fn default() -> Self {
        CapacityAnswer {
            available_bytes: None,
            maximum_volume_bytes: None,
            minimum_volume_bytes: None,
            steps: Vec::new(),
        }
    }
}
setters!(CapacityAnswer {
    with_available_bytes => available_bytes: Option<u64>,
    with_maximum_volume_bytes => maximum_volume_bytes: Option<u64>,
    with_minimum_volume_bytes => minimum_volume_bytes: Option<u64>,
    with_steps => steps: Vec<Step>,
});

impl ListedVolume {
    /// A listed volume without context.
    pub fn new(volume_id: impl Into<String>, capacity_bytes: u64) -> Self {
        ListedVolume { volume_id: volume_id.into(), capacity_bytes, context: Vec::new() }
    }
}
setters!(ListedVolume { with_context => context: Vec<Kv> });

impl ListAnswer {
    /// These volumes, the last page, no steps.
    pub fn new(volumes: impl Into<Vec<ListedVolume>>) -> Self {
        ListAnswer { volumes: volumes.into(), next_token: String::new(), steps: Vec::new() }
    }
}
/// No volumes.
impl Default for ListAnswer {
    fn default() -> Self {
        ListAnswer::new(Vec::new())
    }
}
setters!(ListAnswer { with_next_token => next_token: String, with_steps => steps: Vec<Step> });

impl DescribeAnswer {
    /// This answer, no steps.
    pub fn new(existence: Existence) -> Self {
        DescribeAnswer { existence, steps: Vec::new() }
    }
}
setters!(DescribeAnswer { with_steps => steps: Vec<Step> });

// ---- requests ------------------------------------------------------------------------------------

/// Requests: every field empty, zero or false, capabilities [`VolumeCapability::default`].
macro_rules! requests {
    ($($ty:ident { $($setter:ident => $field:ident: $kind:ident $(<$inner:ident>)?),* $(,)? })*) => {$(
        impl Default for $ty {
            fn default() -> Self {
                $ty { $($field: Default::default()),* }
            }
        }
        setters!($ty { $($setter => $field: $kind $(<$inner>)?),* });
    )*};
}

requests! {
    ValidateRequest {
        with_parameters => parameters: Vec<Kv>,
        with_secrets => secrets: Vec<Kv>,
        with_capabilities => capabilities: Vec<VolumeCapability>,
    }
    ProvisionRequest {
        with_name => name: String,
        with_parameters => parameters: Vec<Kv>,
        with_secrets => secrets: Vec<Kv>,
        with_capabilities => capabilities: Vec<VolumeCapability>,
        with_required_bytes => required_bytes: u64,
        with_limit_bytes => limit_bytes: u64,
        with_looked_up => looked_up: Vec<LookedUp>,
    }
    DeleteRequest {
        with_volume_id => volume_id: String,
        with_secrets => secrets: Vec<Kv>,
    }
    StageRequest {
        with_volume_id => volume_id: String,
        with_context => context: Vec<Kv>,
        with_secrets => secrets: Vec<Kv>,
        with_capability => capability: VolumeCapability,
        with_ephemeral => ephemeral: bool,
        with_resolved => resolved: Option<Resolved>,
        with_looked_up => looked_up: Vec<LookedUp>,
        with_node_id => node_id: String,
    }
    PublishRequest {
        with_volume_id => volume_id: String,
        with_context => context: Vec<Kv>,
        with_secrets => secrets: Vec<Kv>,
        with_capability => capability: VolumeCapability,
        with_readonly => readonly: bool,
        with_recorded => recorded: Vec<Kv>,
    }
    UnstageRequest {
        with_volume_id => volume_id: String,
        with_context => context: Vec<Kv>,
        with_recorded => recorded: Vec<Kv>,
    }
    DynamicMountRequest {
        with_volume_id => volume_id: String,
        with_context => context: Vec<Kv>,
        with_request => request: Vec<Kv>,
        with_subdir => subdir: String,
        with_recorded => recorded: Vec<Kv>,
    }
    ExpandRequest {
        with_volume_id => volume_id: String,
        with_side => side: ExpandSide,
        with_required_bytes => required_bytes: u64,
        with_limit_bytes => limit_bytes: u64,
        with_secrets => secrets: Vec<Kv>,
        with_capability => capability: Option<VolumeCapability>,
        with_context => context: Vec<Kv>,
        with_recorded => recorded: Vec<Kv>,
        with_looked_up => looked_up: Vec<LookedUp>,
    }
    CapacityRequest {
        with_parameters => parameters: Vec<Kv>,
        with_capabilities => capabilities: Vec<VolumeCapability>,
        with_looked_up => looked_up: Vec<LookedUp>,
    }
    ListRequest {
        with_hosts => hosts: Vec<String>,
        with_starting_token => starting_token: String,
        with_max_entries => max_entries: u32,
        with_looked_up => looked_up: Vec<LookedUp>,
    }
    DescribeRequest {
        with_volume_id => volume_id: String,
        with_context => context: Vec<Kv>,
        with_secrets => secrets: Vec<Kv>,
        with_looked_up => looked_up: Vec<LookedUp>,
    }
}

/// `controller`.
#[allow(clippy::derivable_impls)]
impl Default for ExpandSide {
    fn default() -> Self {
        ExpandSide::Controller
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_fill_defaults_and_setters_convert() {
        let spawn = SpawnFuse::new("weed", [arg("mount")], staging(""), "fuse.seaweedfs")
            .with_memory_limit_bytes(1u64 << 20)
            .with_mount(host_fd("s", &[], true));
        assert_eq!(spawn.ready_timeout_ms, DEFAULT_READY_TIMEOUT_MS);
        assert_eq!(spawn.memory_limit_bytes, Some(1 << 20));
        assert!(spawn.env.is_empty());
        let req = StageRequest::default().with_volume_id("v").with_context([kv("a", "1")]);
        assert_eq!(req.volume_id, "v");
        assert_eq!(req.capability.access_mode, AccessMode::SingleNodeWriter);
        assert_eq!(req.resolved, None);
        let plan = Plan::new([Step::Mkdir(staging("d"))]).with_attributes([kv("k", "v")]);
        let info = PluginInfo::new("p", "1", "d").with_programs(["weed"]).with_fstypes(vec!["tmpfs".to_string()]);
        assert_eq!((info.programs, info.fstypes), (vec!["weed".to_string()], vec!["tmpfs".to_string()]));
        let call = HttpCall::new("GET", ["http://f:8888/"], [200]).with_body(b"x".to_vec());
        assert_eq!((call.urls, call.ok_status), (vec!["http://f:8888/".to_string()], vec![200]));
        assert_eq!(plan.attributes, vec![kv("k", "v")]);
    }
}
