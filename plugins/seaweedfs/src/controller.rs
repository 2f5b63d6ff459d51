//! The controller side: CreateVolume makes one filer directory per volume, DeleteVolume removes it.
//!
//! CSI DeleteVolume gets nothing but the volume id and secrets ("The CO MUST NOT pass volume
//! context to DeleteVolume"), so the id itself says where the volume lives: `<filers><dir>`,
//! for example `127.0.0.1:8888/buckets/pvc-1`. The plugin's part of an id is at most 100 bytes
//! of printable ASCII without spaces.
//!
//! Both planners emit one `http` step against the filer's HTTP API, measured on SeaweedFS 4.48:
//! `POST /dir/` (trailing slash, empty body) creates a directory and its parents, answering 201,
//! or 409 when the path already exists; `DELETE /dir?recursive=true` answers 204 whether or not
//! the directory existed.

use mounthost_plugin_sdk::params::invalid;
use mounthost_plugin_sdk::{
    BackendError, DeleteRequest, HttpCall, Kv, ParamSource, Plan, ProvisionPlan, ProvisionRequest, Step, kv,
};

use crate::mount_options;
use crate::params::{self, SPECS, Settings};
use crate::values;

/// Longest plugin part of a volume id (WIT `provision-plan.volume-id`).
pub const MAX_VOLUME_ID: usize = 100;

/// Longest volume name accepted (one path component).
const MAX_NAME: usize = 128;

/// Status codes that mean "the directory is there now": created, or already existed.
const CREATE_OK: &[u16] = &[201, 409];
/// Status codes that mean "the directory is gone now".
const DELETE_OK: &[u16] = &[200, 202, 204, 404];

/// Mode of the volume's root directory. SeaweedFS's own `Mkdir` helper (used by `weed shell` and
/// the upstream CSI driver) uses 0777; the filer's HTTP default for a POSTed directory is 0660,
/// which non-root pods could not even enter.
const DIR_MODE: &str = "0777";

/// Plan CreateVolume.
pub fn provision(req: &ProvisionRequest) -> Result<ProvisionPlan, BackendError> {
    let params = params::open(&req.parameters, ParamSource::Parameter)?;
    let settings = Settings::parse(&params)?;
    params::secret_env(&req.secrets)?;
    for cap in &req.capabilities {
        let flags = mount_options::check_capability(cap)?;
        mount_options::merge(settings.mount_options.clone(), flags.options)?;
    }
    check_name(&req.name)?;

    let dir = if settings.parent_dir == "/" {
        format!("/{}", req.name)
    } else {
        format!("{}/{}", settings.parent_dir, req.name)
    };
    let collection = settings.collection_for(&dir)?;
    let volume_id = format!("{}{dir}", settings.filer_list());
    check_volume_id(&volume_id, settings.parent_dir)?;

    // Every non-secret parameter, in table order, then what provisioning resolved.
    let mut context: Vec<Kv> = SPECS
        .iter()
        .filter(|s| s.source == ParamSource::Parameter && s.name != "collection")
        .filter_map(|s| params.get(s.name).map(|v| kv(s.name, v)))
        .collect();
    context.push(kv("path", dir.as_str()));
    if let Some(c) = &collection {
        context.push(kv("collection", c.as_str()));
    }

    let encoded = encode_path(&dir);
    Ok(ProvisionPlan {
        volume_id,
        capacity_bytes: req.required_bytes,
        context,
        steps: vec![Step::Http(HttpCall {
            method: "POST".into(),
            urls: settings.filers.iter().map(|f| format!("http://{f}{encoded}/?mode={DIR_MODE}")).collect(),
            headers: Vec::new(),
            body: Vec::new(),
            ok_status: CREATE_OK.to_vec(),
        })],
    })
}

/// Plan DeleteVolume: remove the volume's directory tree; an absent one counts as deleted.
pub fn delete(req: &DeleteRequest) -> Result<Plan, BackendError> {
    params::secret_env(&req.secrets)?;
    let (filers, dir) = parse_volume_id(&req.volume_id)?;
    let encoded = encode_path(dir);
    Ok(Plan {
        steps: vec![Step::Http(HttpCall {
            method: "DELETE".into(),
            urls: filers.iter().map(|f| format!("http://{f}{encoded}?recursive=true")).collect(),
            headers: Vec::new(),
            body: Vec::new(),
            ok_status: DELETE_OK.to_vec(),
        })],
        attributes: Vec::new(),
    })
}

/// A volume name must be one safe path component.
fn check_name(name: &str) -> Result<(), BackendError> {
    if is_component(name) {
        Ok(())
    } else {
        Err(invalid(format!(
            "volume name {name:?} cannot be a directory name: use [A-Za-z0-9._-], at most \
             {MAX_NAME} characters, not . or .."
        )))
    }
}

fn is_component(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn check_volume_id(id: &str, parent_dir: &str) -> Result<(), BackendError> {
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(format!(
            "parameter \"parentDir\" ({parent_dir:?}) must be printable ASCII without spaces \
             for provisioning, because the volume id <filer><parentDir>/<name> carries it"
        )));
    }
    if id.len() > MAX_VOLUME_ID {
        return Err(invalid(format!(
            "the volume id {id:?} would be {} bytes, more than {MAX_VOLUME_ID}: use a shorter \
             parameter \"parentDir\" (now {parent_dir:?}) or fewer or shorter filer addresses",
            id.len()
        )));
    }
    Ok(())
}

/// Split a volume id into its filers and directory. The directory must be one the provisioner
/// could have made: absolute, not `/`, its last component a valid volume name.
pub fn parse_volume_id(id: &str) -> Result<(Vec<&str>, &str), BackendError> {
    let bad = |why: &str| {
        invalid(format!(
            "volume id {id:?} is not one this plugin made ({why}); expected \
             <filer host:port>[,<filer>...]/<parentDir>/<name>, such as 127.0.0.1:8888/buckets/pvc-1"
        ))
    };
    if id.len() > MAX_VOLUME_ID || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad("longer than 100 bytes or not printable ASCII"));
    }
    let slash = id.find('/').ok_or_else(|| bad("no directory"))?;
    let (filers, dir) = id.split_at(slash);
    let filers = values::parse_filers("volume id", filers).map_err(|_| bad("bad filer list"))?;
    values::check_remote_path("volume id", dir).map_err(|_| bad("bad directory"))?;
    match dir.rsplit('/').next() {
        Some(last) if is_component(last) => Ok((filers, dir)),
        _ => Err(bad("bad volume name")),
    }
}

/// Percent-encode a remote path for a URL, keeping `/` and RFC 3986 unreserved characters.
fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_reserved_characters() {
        assert_eq!(encode_path("/a b/c?d#e%f/ü"), "/a%20b/c%3Fd%23e%25f/%C3%BC");
        assert_eq!(encode_path("/buckets/pvc-1.x_y~"), "/buckets/pvc-1.x_y~");
    }
}
