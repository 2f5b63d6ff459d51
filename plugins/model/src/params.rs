//! The parameter table, the typed settings read from it, and the registry credentials.
//!
//! One table, [`SPECS`], lists every StorageClass parameter (or inline volume attribute) and
//! secret the plugin reads. `info()` documents exactly that table and the unknown-key checks
//! accept exactly that table, so the documentation and the behaviour cannot drift apart.
//! Every refusal is `invalid-argument` and names the parameter and what would be accepted.
//!
//! Secrets never enter a plan by value: [`registry_auth`] turns them into the `resolve`
//! step's `registry-auth`, which names the CSI secret *keys*; the host reads the values when
//! it talks to the registry.

use mounthost_plugin_sdk::net::{Port, check_host_port};
use mounthost_plugin_sdk::params::{ParamSpec, invalid, known};
use mounthost_plugin_sdk::{BackendError, BasicAuth, Kv, ParamKind, ParamSource, Params, RegistryAuth};

use crate::filters::{self, Filters};
use crate::reference::Reference;

/// The secret key of a username (with [`PASSWORD`]).
pub const USERNAME: &str = "username";
/// The secret key of a password (with [`USERNAME`]).
pub const PASSWORD: &str = "password";
/// The secret key of a bearer token.
pub const TOKEN: &str = "token";
/// The secret key of a `kubernetes.io/dockerconfigjson` Secret.
pub const DOCKER_CONFIG: &str = ".dockerconfigjson";

/// Every key the plugin reads, in the order `info()` lists them.
pub const SPECS: &[ParamSpec] = &[
    ParamSpec::parameter(
        "reference",
        ParamKind::OciReference,
        None,
        "The model: registry[:port]/repository[:tag][@sha256:<hex>]; the tag defaults to \
         latest, a digest pins the content.",
    )
    .required(),
    ParamSpec::parameter(
        "mirror",
        ParamKind::Endpoint,
        None,
        "Pull through this registry instead (host[:port], same repository); default: the \
         reference's registry.",
    ),
    ParamSpec::parameter(
        "include",
        ParamKind::CommaList,
        None,
        "Only files whose path matches one of these globs (*.safetensors,tokenizer/**); \
         default: every file.",
    ),
    ParamSpec::parameter(
        "exclude",
        ParamKind::CommaList,
        None,
        "Leave out files whose path matches one of these globs; wins over include.",
    ),
    ParamSpec::parameter(
        "weights",
        ParamKind::Choice,
        Some("include"),
        "Weight layers: include (like any other file), only (weights alone) or exclude \
         (everything but the weights).",
    ),
    ParamSpec::parameter(
        "types",
        ParamKind::CommaList,
        Some(filters::ALL_TYPES),
        "Layer classes to mount, comma-separated: weight, config, doc, code, dataset.",
    ),
    ParamSpec::parameter(
        "path",
        ParamKind::Text,
        None,
        "An ordinary container image only: mount this directory of the image's tree \
         (/models) instead of its root.",
    ),
    ParamSpec::parameter(
        "insecure",
        ParamKind::Boolean,
        Some("false"),
        "Pull over plain HTTP; the host refuses it unless its configuration lists the registry \
         as insecure.",
    ),
    ParamSpec::secret(USERNAME, "Registry username, with password (HTTP basic or the registry's token exchange)."),
    ParamSpec::secret(PASSWORD, "Registry password or access token, with username."),
    ParamSpec::secret(TOKEN, "A bearer token sent as is (Authorization: Bearer <token>)."),
    ParamSpec::secret(
        DOCKER_CONFIG,
        "A .dockerconfigjson document (a kubernetes.io/dockerconfigjson Secret); its entry for \
         the registry, or the mirror, is used.",
    ),
];

/// Open a StorageClass parameter list (or a volume context, `source` = `Context`) and refuse
/// keys the table does not document.
pub fn open<'a>(kvs: &'a [Kv], source: ParamSource) -> Result<Params<'a>, BackendError> {
    let params = Params::new("parameter", kvs)?;
    params.check_known(known(SPECS), source)?;
    Ok(params)
}

/// Every parameter, parsed and validated.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The model.
    pub reference: Reference,
    /// The registry to pull through, `host[:port]`.
    pub mirror: Option<String>,
    /// Which files.
    pub filters: Filters,
    /// Plain HTTP.
    pub insecure: bool,
    /// `path`: the directory of an image's tree to mount, relative (`models`); `None` for the
    /// root.
    pub path: Option<String>,
    /// The filter parameters given (`include`, `exclude`, `weights`, `types`), which an
    /// ordinary image refuses: its layers have no classes and its files are laid out whole.
    pub filter_keys: Vec<&'static str>,
}

impl Settings {
    /// Parse and validate every parameter in `p` (unknown keys are checked by [`open`]).
    pub fn parse(p: &Params<'_>) -> Result<Self, BackendError> {
        let reference = reference(p)?;
        let mirror = mirror(p)?;
        let filters = filters(p)?;
        Ok(Settings { reference, mirror, filters, insecure: insecure(p)?, path: path(p)?, filter_keys: filter_keys(p) })
    }

    /// A dynamic mount's settings: the model and its filters from the pod's `request` (only
    /// the [`DYNAMIC`] keys; filters it leaves out select everything, whatever the volume's
    /// own filters are), the registry settings `mirror` and `insecure` from the volume's
    /// `context`. Nothing else of the context applies, and nothing of the context is
    /// checked but those two: stage checked it all.
    pub fn dynamic(request: &[Kv], context: &[Kv]) -> Result<Self, BackendError> {
        let pod = open_dynamic(request)?;
        let volume = Params::new("parameter", context)?;
        let reference = reference(&pod)?;
        let filters = filters(&pod)?;
        Ok(Settings {
            reference,
            mirror: mirror(&volume)?,
            filters,
            insecure: insecure(&volume)?,
            path: path(&pod)?,
            filter_keys: filter_keys(&pod),
        })
    }
}

/// The keys a pod's dynamic-mount request may hold, in the order `SPECS` lists them: the model
/// and its filters. The registry settings (`mirror`, `insecure`) are the volume's, and so are
/// the credentials, which the host adds (the plan's `resolve` step names none).
pub const DYNAMIC: &[&str] = &["reference", "include", "exclude", "weights", "types", "path"];

/// Open a pod's dynamic-mount request and refuse any key but [`DYNAMIC`] ones. Strict: unlike
/// [`open`], keys with a `/` are refused too (a pod's request carries no orchestrator keys).
fn open_dynamic(request: &[Kv]) -> Result<Params<'_>, BackendError> {
    let params = Params::new("parameter", request)?;
    if let Some(kv) = request.iter().find(|kv| !DYNAMIC.contains(&kv.key.as_str())) {
        let mut accepted = DYNAMIC.to_vec();
        accepted.sort_unstable();
        let why = match SPECS.iter().find(|s| s.name == kv.key).map(|s| s.source) {
            Some(ParamSource::Secret) => {
                " (a pod's request carries no credentials: the host gives the mount the volume's own, for the registries its StorageClass names)"
            }
            Some(_) => " (the volume's registry settings apply: mirror and insecure come from its StorageClass)",
            None => "",
        };
        return Err(invalid(format!(
            "unknown parameter {:?} for a dynamic mount{why}; accepted: {}",
            kv.key,
            accepted.join(", ")
        )));
    }
    Ok(params)
}

/// `reference`, required.
fn reference(p: &Params<'_>) -> Result<Reference, BackendError> {
    Reference::parse("parameter \"reference\"", p.required("reference")?)
}

/// `mirror`, one `host[:port]`.
fn mirror(p: &Params<'_>) -> Result<Option<String>, BackendError> {
    p.text("mirror")?
        .map(|v| {
            check_host_port(v, Port::Optional).map(|()| v.to_string()).map_err(|why| {
                invalid(format!(
                    "parameter \"mirror\" {v:?} is not a registry endpoint ({why}); give one \
                     host[:port] without a scheme or path, host a DNS name, an IPv4 address or an \
                     [IPv6] address, such as mirror.example.com:5000"
                ))
            })
        })
        .transpose()
}

/// `include`, `exclude`, `weights` and `types`.
fn filters(p: &Params<'_>) -> Result<Filters, BackendError> {
    Filters::parse(filters::Raw {
        include: p.text("include")?,
        exclude: p.text("exclude")?,
        weights: p.choice("weights", filters::WEIGHTS)?,
        types: p.text("types")?,
    })
}

/// The filter parameters given, in table order.
fn filter_keys(p: &Params<'_>) -> Vec<&'static str> {
    ["include", "exclude", "weights", "types"].into_iter().filter(|k| p.get(k).is_some()).collect()
}

/// `path`: `/models`, `models/` or `models` name the directory `models` of the image's tree;
/// `/` (or nothing) its root. Components are checked as a model's file paths are.
fn path(p: &Params<'_>) -> Result<Option<String>, BackendError> {
    let Some(raw) = p.text("path")? else { return Ok(None) };
    let rel = raw.trim_start_matches('/').trim_end_matches('/');
    if rel.is_empty() {
        return Ok(None);
    }
    crate::manifest::check_file_path(rel).map_err(|why| {
        invalid(format!(
            "parameter \"path\" {raw:?} is not a directory of an image ({why}); give a path such as \
             /models, without . or .. components"
        ))
    })?;
    Ok(Some(rel.to_string()))
}

/// `insecure`, default `false`.
fn insecure(p: &Params<'_>) -> Result<bool, BackendError> {
    Ok(p.boolean("insecure")?.unwrap_or(false))
}

/// Check the secrets (known keys, non-empty values, one kind of credential) and name them in
/// a `registry-auth`. No secret at all is anonymous access.
pub fn registry_auth(secrets: &[Kv]) -> Result<RegistryAuth, BackendError> {
    let s = Params::new("secret", secrets)?;
    s.check_known(known(SPECS), ParamSource::Secret)?;
    let (user, pass) = (s.text(USERNAME)?.is_some(), s.text(PASSWORD)?.is_some());
    let token = s.text(TOKEN)?.is_some();
    // Not `text`: a pretty-printed document has line breaks.
    let docker = match s.get(DOCKER_CONFIG) {
        Some("") => return Err(invalid("secret \".dockerconfigjson\" is empty; remove it or give a document")),
        other => other,
    };
    if user != pass {
        let (given, missing) = if user { (USERNAME, PASSWORD) } else { (PASSWORD, USERNAME) };
        return Err(invalid(format!(
            "secret {given:?} is given without secret {missing:?}: registry basic credentials need both"
        )));
    }
    let kinds: Vec<&str> = [(user, "username/password"), (token, TOKEN), (docker.is_some(), DOCKER_CONFIG)]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect();
    if kinds.len() > 1 {
        return Err(invalid(format!(
            "the secret holds more than one kind of registry credential ({}); give exactly one of \
             username and password, token, or .dockerconfigjson",
            kinds.join(", ")
        )));
    }
    if let Some(doc) = docker {
        check_docker_config(doc)?;
        return Ok(RegistryAuth::DockerConfig(DOCKER_CONFIG.into()));
    }
    if user {
        return Ok(RegistryAuth::Basic(BasicAuth::new(USERNAME, PASSWORD)));
    }
    if token {
        return Ok(RegistryAuth::Token(TOKEN.into()));
    }
    Ok(RegistryAuth::Anonymous)
}

/// A `.dockerconfigjson` is a JSON object with an `auths` object. Messages never quote it:
/// it holds credentials.
fn check_docker_config(doc: &str) -> Result<(), BackendError> {
    let value: serde_json::Value = serde_json::from_str(doc).map_err(|e| {
        invalid(format!(
            "secret \".dockerconfigjson\" is not JSON (at line {}, column {}); give the content of \
             a kubernetes.io/dockerconfigjson Secret, {{\"auths\": {{\"<registry>\": {{...}}}}}}",
            e.line(),
            e.column()
        ))
    })?;
    if !value.get("auths").is_some_and(serde_json::Value::is_object) {
        return Err(invalid(
            "secret \".dockerconfigjson\" has no \"auths\" object; give the content of a \
             kubernetes.io/dockerconfigjson Secret, {\"auths\": {\"<registry>\": {...}}}",
        ));
    }
    Ok(())
}
