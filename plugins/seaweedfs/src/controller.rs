//! The controller side: CreateVolume makes one filer directory per volume, DeleteVolume removes it.
//!
//! CSI DeleteVolume gets nothing but the volume id and secrets ("The CO MUST NOT pass volume
//! context to DeleteVolume"), so the id itself says where the volume lives: `<filers><dir>`,
//! for example `127.0.0.1:8888/buckets/pvc-1`. The plugin's part of an id is at most 100 bytes
//! of printable ASCII without spaces. The directory's name comes from the CSI name through
//! [`names::directory_name`], so every name the CO may send gives a directory SeaweedFS takes.
//!
//! The controller keeps no state, so a volume's capacity is recorded where the volume lives: a
//! small file per volume in the filer, `/.mounthost/capacity<dir>`, outside the volume's own
//! directory, holding `{"capacityBytes":N,"parameters":{...}}` (the volume's context but its
//! `path`, keys sorted; records of earlier versions hold no `parameters`). CreateVolume plans
//! in two rounds:
//!
//! 1. a `lookup` (`GET <record>`), which the host makes while planning;
//! 2. with its answer, CSI's rule "compatible with the specified `capacity_range`": a recorded
//!    capacity N is compatible when `required_bytes <= N` (or no `required_bytes`) and
//!    `N <= limit_bytes` (or no `limit_bytes`). Compatible: the volume is that one, of N bytes;
//!    incompatible: `already-exists` (gRPC ALREADY_EXISTS), and nothing runs. The same for a
//!    record whose parameters differ from the request's (a record without any matches every
//!    request). No record (404):
//!    a new volume of `required_bytes`, else of `limit_bytes` (the most it may be), else of no
//!    fixed size (0, nothing recorded).
//!
//! The plan then guards what the lookup saw, because the host executes it later, under the
//! volume's lock: the filer's ETag of a file written in one request is the MD5 of its content,
//! so `HEAD <record>` with `If-Match: "<md5>"` answers 200 for that content, 404 for no record
//! and **412** for another one, which the host answers with ALREADY_EXISTS before any later step
//! runs:
//!
//! - a compatible record: `HEAD <record>` `If-Match` the content looked up (200 only), then
//!   `POST <dir>/?mode=0777` (201 created, 409 already there);
//! - a new volume with a size: `HEAD <record>` `If-Match` the content it will write (200 or
//!   404), `PUT <record>` with that content, then the `POST`;
//! - a new volume without a size: the `POST` only.
//!
//! Last, CreateVolume writes the volume's list entry (`crate::volumes::index_entry`) with the
//! capacity it answers, which DeleteVolume removes after the record.
//!
//! A lookup no filer answered, or answered with anything but 200 or 404, is `unavailable`
//! (UNAVAILABLE: retry later). Two CreateVolume calls for one name with different
//! capacities can both succeed only from two controller processes at the same instant (the last
//! `PUT` wins). DeleteVolume removes the directory, then the record. Every step was measured on
//! SeaweedFS 4.48: `DELETE /dir?recursive=true` answers 204 whether or not the directory
//! existed, `DELETE <file>` 204 likewise.

use mounthost_plugin_sdk::params::invalid;
use mounthost_plugin_sdk::{
    BackendError, DeleteRequest, Header, HttpCall, Kv, LookedUp, Lookup, ParamSource, Plan, ProvisionPlan,
    ProvisionRequest, Step, Value, kv, looked_up,
};

use std::collections::BTreeMap;

use md5::{Digest, Md5};

use crate::mount_options;
use crate::names;
use crate::params::{self, SPECS, Settings};
use crate::values;

/// Longest plugin part of a volume id (WIT `provision-plan.volume-id`).
pub const MAX_VOLUME_ID: usize = 100;

/// Longest last component of a directory in a volume id: the CSI name limit, so ids made by
/// earlier versions (which used the name as it came, `[A-Za-z0-9._-]`) still parse.
const MAX_NAME: usize = 128;

/// Status codes that mean "the directory is there now": created, or already existed.
const CREATE_OK: &[u16] = &[201, 409];
/// Status codes that mean "the directory (or record) is gone now".
const DELETE_OK: &[u16] = &[200, 202, 204, 404];
/// `If-Match` on the record: same capacity, or no record yet. 412 (another capacity) is not
/// accepted; the host maps it to ALREADY_EXISTS.
const RECORD_CHECK_OK: &[u16] = &[200, 404];
/// The record was stored (4.48 answers 201 to a new file and to an overwrite).
pub const RECORD_WRITE_OK: &[u16] = &[200, 201, 204];
/// `If-Match` on the record the lookup found: still the same. 412 (rewritten since) is
/// ALREADY_EXISTS, 404 (deleted since) a refused status: a retry plans anew.
const RECORD_SAME_OK: &[u16] = &[200];
/// The key of the capacity record's lookup.
pub const RECORD_LOOKUP: &str = "capacity-record";

/// Where capacity records live in the filer: `<RECORD_ROOT><volume directory>`.
pub const RECORD_ROOT: &str = "/.mounthost/capacity";

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
    if req.name.is_empty() {
        return Err(invalid("the volume name is empty"));
    }
    values::check_bucket_path(&values::label("parentDir"), settings.parent_dir)?;

    let dir = volume_dir(settings.parent_dir, &req.name);
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

    let urls = |path: &str, query: &str| -> Vec<String> {
        let encoded = encode_path(path);
        settings.filers.iter().map(|f| format!("http://{f}{encoded}{query}")).collect()
    };
    let record = record_path(&dir);
    let lookup = Step::Lookup(Lookup::new(RECORD_LOOKUP, "GET", urls(&record, "")));
    let Some(found) = looked_up(&req.looked_up, RECORD_LOOKUP) else {
        // First round: read the record; the answer comes in the next call.
        return Ok(ProvisionPlan::new(volume_id, 0).with_context(context).with_steps([lookup]));
    };
    let mut steps = vec![lookup];
    let capacity_bytes = match recorded(found, &record)? {
        Some((capacity, body)) => {
            if !compatible(capacity, req.required_bytes, req.limit_bytes) {
                return Err(BackendError::AlreadyExists(format!(
                    "a volume named {:?} already exists ({dir} in the filer) with {capacity} bytes, outside the \
                     capacity_range asked for ({}); ask for a range that holds {capacity}, or use another name",
                    req.name,
                    range_text(req.required_bytes, req.limit_bytes)
                )));
            }
            // CSI: an existing volume must also be compatible with the parameters asked for.
            // Records of earlier versions hold none: any parameters match them.
            if let Some(recorded) = parameters_of_record(body.as_bytes()) {
                let differ = differences(&recorded, &recorded_parameters(&context));
                if !differ.is_empty() {
                    return Err(BackendError::AlreadyExists(format!(
                        "a volume named {:?} already exists ({dir} in the filer) with other parameters ({}); \
                         use another name, or the parameters it was created with",
                        req.name,
                        differ.join("; ")
                    )));
                }
            }
            // Still the record looked up when the host executes the plan (under the volume's lock).
            steps.push(http("HEAD", urls(&record, ""), vec![header("If-Match", &etag(&body))], "", RECORD_SAME_OK));
            capacity
        }
        None => {
            let capacity = new_capacity(req.required_bytes, req.limit_bytes);
            // Without a size there is nothing to record (any range is compatible with it).
            if capacity > 0 {
                let content = record_content(capacity, &recorded_parameters(&context));
                steps.push(http(
                    "HEAD",
                    urls(&record, ""),
                    vec![header("If-Match", &etag(&content))],
                    "",
                    RECORD_CHECK_OK,
                ));
                steps.push(http(
                    "PUT",
                    urls(&record, ""),
                    vec![header("Content-Type", "application/json")],
                    &content,
                    RECORD_WRITE_OK,
                ));
            }
            capacity
        }
    };
    steps.push(http("POST", urls(&dir, &format!("/?mode={DIR_MODE}")), Vec::new(), "", CREATE_OK));
    // What ListVolumes reads (crate::volumes).
    steps.push(crate::volumes::index_entry(&settings.filers, &volume_id, capacity_bytes));
    Ok(ProvisionPlan::new(volume_id, capacity_bytes).with_context(context).with_steps(steps))
}

/// CSI: "Volume MUST be at least this big" (`required_bytes`), "Volume MUST not be bigger than
/// this" (`limit_bytes`); 0 is "unspecified".
pub fn compatible(capacity: u64, required: u64, limit: u64) -> bool {
    capacity >= required && (limit == 0 || capacity <= limit)
}

/// The size a new volume gets: what is required, else the most it may be, else no fixed size.
pub fn new_capacity(required: u64, limit: u64) -> u64 {
    if required > 0 { required } else { limit }
}

fn range_text(required: u64, limit: u64) -> String {
    match (required, limit) {
        (0, 0) => "any size".into(),
        (r, 0) => format!("at least {r} bytes"),
        (0, l) => format!("at most {l} bytes"),
        (r, l) => format!("{r} to {l} bytes"),
    }
}

/// The capacity a record lookup found and the record's bytes; `None` for no record (404). A
/// lookup no filer answered (status 0) or answered otherwise is `unavailable` (retry later), and
/// a record that is not one this plugin writes is an error naming it.
fn recorded(found: &LookedUp, record: &str) -> Result<Option<(u64, String)>, BackendError> {
    match found.status {
        200 => {}
        404 => return Ok(None),
        0 => {
            return Err(BackendError::Unavailable(format!(
                "no filer answered the read of the capacity record {record}; is the filer up?"
            )));
        }
        status => {
            return Err(BackendError::Unavailable(format!(
                "the filer answered {status} to the read of the capacity record {record} (200 or 404 expected)"
            )));
        }
    }
    let body = String::from_utf8_lossy(&found.body).into_owned();
    let capacity = if found.truncated {
        Err(BackendError::Internal(format!("the capacity record of {record} is longer than any record")))
    } else {
        crate::volumes::record_bytes(found, record)
    };
    match capacity {
        Ok(capacity) => Ok(Some((capacity, body))),
        Err(BackendError::Internal(why)) => Err(BackendError::Internal(format!(
            "{why}: it holds {:?}, not {{\"capacityBytes\":<bytes>}}; fix or remove it (it is the recorded size of \
             one volume)",
            body.chars().take(80).collect::<String>()
        ))),
        Err(e) => Err(e),
    }
}

/// Plan DeleteVolume: remove the volume's directory tree, then its capacity record; absent
/// ones count as deleted. An id this plugin could not have made is `not-found`: the host
/// answers OK, as CSI asks for a volume that does not exist.
pub fn delete(req: &DeleteRequest) -> Result<Plan, BackendError> {
    params::secret_env(&req.secrets)?;
    let (filers, dir) = parse_volume_id(&req.volume_id)?;
    let urls = |path: &str, query: &str| -> Vec<String> {
        let encoded = encode_path(path);
        filers.iter().map(|f| format!("http://{f}{encoded}{query}")).collect()
    };
    Ok(Plan::new([
        http("DELETE", urls(dir, "?recursive=true"), Vec::new(), "", DELETE_OK),
        http("DELETE", urls(&record_path(dir), ""), Vec::new(), "", DELETE_OK),
        http("DELETE", urls(&crate::volumes::index_path(&req.volume_id), ""), Vec::new(), "", DELETE_OK),
    ]))
}

/// `<parentDir>/<directory name of the CSI name>`.
pub fn volume_dir(parent_dir: &str, name: &str) -> String {
    let leaf = names::directory_name(name);
    if parent_dir == "/" { format!("/{leaf}") } else { format!("{parent_dir}/{leaf}") }
}

/// Where the capacity record of the volume at `dir` lives.
pub fn record_path(dir: &str) -> String {
    format!("{RECORD_ROOT}{dir}")
}

/// A capacity record's content: one line of JSON, always the same bytes for one capacity and
/// one set of parameters (keys sorted; written by hand so no serializer feature can reorder
/// them, since the record's ETag is compared byte for byte). No parameters: the record of
/// earlier versions, `{"capacityBytes":N}`.
pub fn record_content(capacity_bytes: u64, parameters: &BTreeMap<String, String>) -> String {
    if parameters.is_empty() {
        return format!("{{\"capacityBytes\":{capacity_bytes}}}\n");
    }
    let json = |v: &str| serde_json::Value::String(v.to_string()).to_string();
    let fields: Vec<String> = parameters.iter().map(|(k, v)| format!("{}:{}", json(k), json(v))).collect();
    format!("{{\"capacityBytes\":{capacity_bytes},\"parameters\":{{{}}}}}\n", fields.join(","))
}

/// What a record keeps of a volume's context to tell a CreateVolume of the same name with other
/// parameters: everything but `path`, which the name decides.
pub fn recorded_parameters(context: &[Kv]) -> BTreeMap<String, String> {
    context.iter().filter(|kv| kv.key != "path").map(|kv| (kv.key.clone(), kv.value.clone())).collect()
}

/// The parameters a record holds: `None` for a record of an earlier version, which holds none.
pub fn parameters_of_record(body: &[u8]) -> Option<BTreeMap<String, String>> {
    let doc: serde_json::Value = serde_json::from_slice(body).ok()?;
    let map = doc.get("parameters")?.as_object()?;
    Some(map.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
}

/// The parameters that differ between a record and a request, as `key: recorded → asked`.
fn differences(recorded: &BTreeMap<String, String>, asked: &BTreeMap<String, String>) -> Vec<String> {
    let keys: std::collections::BTreeSet<&String> = recorded.keys().chain(asked.keys()).collect();
    keys.into_iter()
        .filter(|k| recorded.get(*k) != asked.get(*k))
        .map(|k| {
            let show = |v: Option<&String>| v.map_or_else(|| "(unset)".to_string(), |v| format!("{v:?}"));
            format!("{k}: {} recorded, {} asked", show(recorded.get(k)), show(asked.get(k)))
        })
        .collect()
}

/// The filer's ETag of a file with this content: its MD5 in hex, quoted.
pub fn etag(content: &str) -> String {
    let digest = Md5::digest(content.as_bytes());
    format!("\"{}\"", digest.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

pub fn header(name: &str, value: &str) -> Header {
    Header::new(name, Value::Literal(value.into()))
}

pub fn http(method: &str, urls: Vec<String>, headers: Vec<Header>, body: &str, ok: &[u16]) -> Step {
    Step::Http(HttpCall::new(method, urls, ok).with_headers(headers).with_body(body.as_bytes()))
}

/// A directory name some version of this plugin made: `[A-Za-z0-9._-]`, 1 to 128 bytes, not
/// `.` or `..` (today's names are a subset of that).
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
/// could have made: absolute, not `/`, its last component a directory name it makes. Anything
/// else is `not-found`: no volume of this plugin has that id.
pub fn parse_volume_id(id: &str) -> Result<(Vec<&str>, &str), BackendError> {
    let unknown = |why: &str| {
        BackendError::NotFound(format!(
            "volume id {id:?} is not one this plugin made ({why}); its ids are \
             <filer host:port>[,<filer>...]/<parentDir>/<name>, such as 127.0.0.1:8888/buckets/pvc-1"
        ))
    };
    if id.len() > MAX_VOLUME_ID || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(unknown("longer than 100 bytes or not printable ASCII"));
    }
    let slash = id.find('/').ok_or_else(|| unknown("no directory"))?;
    let (filers, dir) = id.split_at(slash);
    let filers = values::parse_filers("volume id", filers).map_err(|_| unknown("bad filer list"))?;
    values::check_remote_path("volume id", dir).map_err(|_| unknown("bad directory"))?;
    match dir.rsplit('/').next() {
        Some(last) if is_component(last) => Ok((filers, dir)),
        _ => Err(unknown("bad volume name")),
    }
}

/// Percent-encode a remote path for a URL, keeping `/` and RFC 3986 unreserved characters.
pub fn encode_path(path: &str) -> String {
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
