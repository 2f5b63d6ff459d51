//! A plugin's self-description, as the host keeps and prints it.

use serde::Serialize;

use super::bindings::types as wit;

/// What a plugin is and accepts (from its `info` export).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginInfo {
    /// The name StorageClasses select it by.
    pub name: String,
    /// The plugin's own version.
    pub version: String,
    /// One paragraph for humans.
    pub description: String,
    /// Accepted parameters and secrets.
    pub parameters: Vec<ParamDoc>,
    /// Program names its plans spawn.
    pub programs: Vec<String>,
    /// Filesystem types its plans mount.
    pub fstypes: Vec<String>,
}

/// One documented parameter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParamDoc {
    /// Exact key.
    pub name: String,
    /// One line of documentation.
    pub doc: String,
    /// `text`, `boolean`, `integer`, `endpoint`, `remote-path`, `choice`, `comma-list`,
    /// `oci-reference` or `url`.
    pub kind: &'static str,
    /// `parameter`, `secret` or `context`.
    pub source: &'static str,
    /// Whether it must be given.
    pub required: bool,
    /// The default, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

impl ParamDoc {
    /// True for parameters whose StorageClass values grant HTTP access to their hosts.
    pub fn is_endpoint(&self) -> bool {
        self.kind == "endpoint"
    }

    /// True for parameters whose StorageClass values grant their URL's `host:port`, as
    /// endpoint values grant theirs.
    pub fn is_url(&self) -> bool {
        self.kind == "url"
    }

    /// True for parameters whose StorageClass values grant pulls from their registry.
    pub fn is_oci_reference(&self) -> bool {
        self.kind == "oci-reference"
    }
}

impl From<wit::PluginInfo> for PluginInfo {
    fn from(i: wit::PluginInfo) -> Self {
        PluginInfo {
            name: i.name,
            version: i.version,
            description: i.description,
            parameters: i.parameters.into_iter().map(ParamDoc::from).collect(),
            programs: i.programs,
            fstypes: i.fstypes,
        }
    }
}

impl From<wit::ParamDoc> for ParamDoc {
    fn from(p: wit::ParamDoc) -> Self {
        ParamDoc {
            name: p.name,
            doc: p.doc,
            kind: match p.kind {
                wit::ParamKind::Text => "text",
                wit::ParamKind::Boolean => "boolean",
                wit::ParamKind::Integer => "integer",
                wit::ParamKind::Endpoint => "endpoint",
                wit::ParamKind::RemotePath => "remote-path",
                wit::ParamKind::Choice => "choice",
                wit::ParamKind::CommaList => "comma-list",
                wit::ParamKind::OciReference => "oci-reference",
                wit::ParamKind::Url => "url",
            },
            source: match p.source {
                wit::ParamSource::Parameter => "parameter",
                wit::ParamSource::Secret => "secret",
                wit::ParamSource::Context => "context",
            },
            required: p.required,
            default: p.default_value,
        }
    }
}

/// Plugin names: 1-63 of `[a-z0-9-]`, starting with a letter (they appear in volume ids,
/// StorageClass parameters and file names).
pub fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}
