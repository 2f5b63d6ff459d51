//! What the plugin answers about volumes that exist: expansion (controller and node), the
//! capacity left, the volumes the granted filers hold, and whether one exists. Every read of
//! SeaweedFS is a `lookup` the host makes while planning; the answers come back in the next
//! call's `looked-up`.
//!
//! **Size.** SeaweedFS enforces a size only in `weed mount`: `-collectionQuotaMB` makes the
//! mount refuse writes (ENOSPC) once its collection holds that much, as the master counts it,
//! and the mount's local socket takes a new quota while it runs (gRPC
//! `messaging_pb.SeaweedMount/Configure`, `collection_capacity` in bytes). A provisioned
//! volume's collection is its own (the directory name) unless the StorageClass names one, and
//! its size is its capacity record (`controller::RECORD_ROOT`). So:
//!
//! - stage reads the record and starts `weed mount` with the quota (rounded up to MiB);
//! - ControllerExpandVolume checks the directory exists, reads the record, and writes the new
//!   size into it (and into the volume's list entry) when it grows; a smaller size than
//!   recorded is already satisfied. The nodes must expand too;
//! - NodeExpandVolume reads the record (the controller's word on the size) and tells the
//!   running `weed mount` its new quota. A volume staged without a quota (no record when it was
//!   staged) gets none while it runs: `weed mount` checks usage only when started with one.
//!
//! **List entries.** CreateVolume also writes `/.mounthost/volumes/<hex of the volume id>`,
//! an empty file whose `Seaweed-Mounthost-Capacity-Bytes` header the filer keeps as an extended
//! attribute; ListVolumes pages through that directory on each granted filer.
//!
//! **Capacity.** With the `master` parameter, the master's free volume slots (`/dir/status`,
//! `Topology.Free`) times `masterVolumeSizeLimitMB` (SeaweedFS's HTTP API does not report its
//! `-volumeSizeLimitMB`), divided by the copies `replication` makes. Without it, unknown.

use base64::Engine;
use mounthost_plugin_sdk::params::invalid;
use mounthost_plugin_sdk::{
    BackendError, CapacityAnswer, CapacityRequest, DescribeAnswer, DescribeRequest, Existence, ExpandPlan,
    ExpandRequest, ExpandSide, Header, Kv, ListAnswer, ListRequest, ListedVolume, LookedUp, Lookup, ParamSource,
    SocketCall, Step, kv, looked_up, runtime,
};

use crate::controller::{self, RECORD_WRITE_OK};
use crate::params::{self, Settings};

/// Where the list entries live in each filer.
pub const INDEX_ROOT: &str = "/.mounthost/volumes";
/// The header (and extended attribute) carrying a list entry's capacity.
pub const CAPACITY_HEADER: &str = "Seaweed-Mounthost-Capacity-Bytes";
/// The mount's local socket, in the volume's runtime directory.
pub const MOUNT_SOCKET: &str = "weed.sock";
/// `weed mount`'s quota method.
pub const CONFIGURE: &str = "/messaging_pb.SeaweedMount/Configure";
/// The most list entries read from a filer per page (each is about 900 bytes of JSON, and a
/// lookup's answer is cut at 64 KiB).
pub const LIST_PAGE: u32 = 50;
const MIB: u64 = 1024 * 1024;

/// The answer to lookup `key`, if made; an error when the host made it and no filer answered.
fn answer<'a>(looked: &'a [LookedUp], key: &str, what: &str) -> Result<Option<&'a LookedUp>, BackendError> {
    match looked_up(looked, key) {
        Some(a) if a.status == 0 => {
            Err(BackendError::Unavailable(format!("no filer or master answered while reading {what}")))
        }
        other => Ok(other),
    }
}

fn get(key: &str, method: &str, urls: Vec<String>, headers: Vec<Header>) -> Step {
    Step::Lookup(Lookup::new(key, method, urls).with_headers(headers))
}

fn urls(filers: &[&str], path: &str, query: &str) -> Vec<String> {
    let encoded = controller::encode_path(path);
    filers.iter().map(|f| format!("http://{f}{encoded}{query}")).collect()
}

/// A capacity record's size from its body (`{"capacityBytes":N}`).
pub(crate) fn record_bytes(a: &LookedUp, what: &str) -> Result<u64, BackendError> {
    let doc: serde_json::Value = serde_json::from_slice(&a.body)
        .map_err(|e| BackendError::Internal(format!("the capacity record of {what} is not JSON: {e}")))?;
    doc.get("capacityBytes")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| BackendError::Internal(format!("the capacity record of {what} has no capacityBytes")))
}

/// The recorded size of the volume at `dir`: `Some(bytes)`, `None` without a record.
fn recorded_size(a: &LookedUp, dir: &str) -> Result<Option<u64>, BackendError> {
    match a.status {
        200 => record_bytes(a, dir).map(Some),
        404 => Ok(None),
        s => Err(BackendError::Unavailable(format!("reading the capacity record of {dir}: the filer answered {s}"))),
    }
}

/// `weed mount`'s quota for a size: whole MiB, rounded up.
pub fn quota_mb(bytes: u64) -> u64 {
    bytes.div_ceil(MIB)
}

/// The `ConfigureRequest` message: field 1 (`collection_capacity`, int64) as a varint.
pub fn configure_message(bytes: u64) -> Vec<u8> {
    let mut out = vec![0x08];
    let mut v = bytes;
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// Plan ControllerExpandVolume or NodeExpandVolume.
pub fn expand(req: &ExpandRequest) -> Result<ExpandPlan, BackendError> {
    params::secret_env(&req.secrets)?;
    let asked = if req.required_bytes > 0 { req.required_bytes } else { req.limit_bytes };
    match req.side {
        ExpandSide::Controller => expand_controller(req, asked),
        ExpandSide::Node => expand_node(req, asked),
        other => Err(BackendError::Internal(format!("an expansion side this plugin does not know: {other:?}"))),
    }
}

fn expand_controller(req: &ExpandRequest, asked: u64) -> Result<ExpandPlan, BackendError> {
    let (filers, dir) = controller::parse_volume_id(&req.volume_id)?;
    let record = controller::record_path(dir);
    let (Some(found), Some(rec)) =
        (answer(&req.looked_up, "dir", dir)?, answer(&req.looked_up, "record", &format!("the record of {dir}"))?)
    else {
        return Ok(ExpandPlan::new(0).with_node_expansion_required(true).with_steps([
            get("dir", "HEAD", urls(&filers, dir, ""), Vec::new()),
            get("record", "GET", urls(&filers, &record, ""), Vec::new()),
        ]));
    };
    match found.status {
        200 => {}
        404 => return Err(BackendError::NotFound(format!("the filer has no directory {dir}"))),
        s => return Err(BackendError::Unavailable(format!("checking {dir}: the filer answered {s}"))),
    }
    let current = recorded_size(rec, dir)?.unwrap_or(0);
    if current >= asked {
        // Already that large (CSI: an expansion to a size the volume has is OK). The list entry
        // is written again: an earlier call may have grown the record and failed before it.
        let steps = vec![index_entry(&filers, &req.volume_id, current)];
        return Ok(ExpandPlan::new(current).with_node_expansion_required(true).with_steps(steps));
    }
    // The parameters CreateVolume recorded stay (a record of an earlier version holds none).
    let kept = controller::parameters_of_record(&rec.body).unwrap_or_default();
    let content = controller::record_content(asked, &kept);
    let steps = vec![
        controller::http(
            "PUT",
            urls(&filers, &record, ""),
            vec![controller::header("Content-Type", "application/json")],
            &content,
            RECORD_WRITE_OK,
        ),
        index_entry(&filers, &req.volume_id, asked),
    ];
    Ok(ExpandPlan::new(asked).with_node_expansion_required(true).with_steps(steps))
}

fn expand_node(req: &ExpandRequest, asked: u64) -> Result<ExpandPlan, BackendError> {
    let recorded = |k: &str| req.recorded.iter().find(|kv| kv.key == k).map(|kv| kv.value.as_str());
    let (Some(filer), Some(dir)) = (recorded("filer"), recorded("path")) else {
        return Err(invalid("the stage recorded no filer and path for this volume: stage it again"));
    };
    let id = req.volume_id.strip_prefix("seaweedfs~").unwrap_or(&req.volume_id);
    if id != format!("{filer}{dir}") {
        return Err(BackendError::OutOfRange(format!(
            "volume {id} is a static volume of {dir}: it has no size this plugin records, so it cannot be expanded"
        )));
    }
    if recorded("quotaFixed") == Some("true") {
        return Err(BackendError::OutOfRange(format!(
            "volume {id} was staged with collectionQuotaMB={} from the StorageClass's mountOptions: that quota, not \
             the volume's size, bounds it, so it cannot grow here; remove collectionQuotaMB from mountOptions to let \
             its size set the quota",
            recorded("quotaMB").unwrap_or("?")
        )));
    }
    let filers: Vec<&str> = filer.split(',').collect();
    let Some(rec) = answer(&req.looked_up, "record", &format!("the record of {dir}"))? else {
        let steps = vec![get("record", "GET", urls(&filers, &controller::record_path(dir), ""), Vec::new())];
        return Ok(ExpandPlan::new(0).with_steps(steps));
    };
    let Some(size) = recorded_size(rec, dir)? else {
        return Err(BackendError::OutOfRange(format!(
            "volume {id} has no capacity record: expand it through the controller (ControllerExpandVolume) first"
        )));
    };
    if size < asked {
        return Err(BackendError::OutOfRange(format!(
            "the controller recorded {size} bytes for volume {id}, less than the {asked} asked: \
             ControllerExpandVolume must grow it first"
        )));
    }
    // Told only to a mount started with a quota: only that one checks its usage.
    let quota = recorded("quotaMB").and_then(|q| q.parse::<u64>().ok()).unwrap_or(0);
    let collection = recorded("collection").unwrap_or_default();
    let steps = if quota > 0 && !collection.is_empty() {
        // Within the SDK's default timeout, 10 s.
        vec![Step::SocketCall(SocketCall::new(
            runtime(MOUNT_SOCKET),
            CONFIGURE,
            configure_message(quota_mb(size) * MIB),
        ))]
    } else {
        Vec::new()
    };
    Ok(ExpandPlan::new(size).with_steps(steps))
}

/// The list entry of volume `id` with its size: `PUT <INDEX_ROOT>/<hex id>`.
pub fn index_entry(filers: &[&str], id: &str, capacity: u64) -> Step {
    controller::http(
        "PUT",
        urls(filers, &index_path(id), ""),
        vec![controller::header(CAPACITY_HEADER, &capacity.to_string())],
        "",
        RECORD_WRITE_OK,
    )
}

/// Where volume `id`'s list entry lives.
pub fn index_path(id: &str) -> String {
    let hex: String = id.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{INDEX_ROOT}/{hex}")
}

fn unhex(name: &str) -> Option<String> {
    if !name.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..name.len()).step_by(2).map(|i| u8::from_str_radix(name.get(i..i + 2)?, 16).ok()).collect();
    String::from_utf8(bytes?).ok()
}

/// Whether a provisioned volume's directory is there, for its stage: the lookup to make while
/// it is unread (`HEAD <dir>`); `not-found` when the filer has no such directory (the volume was
/// deleted, or its directory removed by hand), where `weed mount` would make an empty one.
pub fn stage_dir(looked: &[LookedUp], provisioned: Option<(&[&str], &str)>) -> Result<Vec<Step>, BackendError> {
    let Some((filers, dir)) = provisioned else {
        return Ok(Vec::new());
    };
    let Some(found) = answer(looked, "dir", dir)? else {
        return Ok(vec![get("dir", "HEAD", urls(filers, dir, ""), Vec::new())]);
    };
    match found.status {
        200 => Ok(Vec::new()),
        404 => Err(BackendError::NotFound(format!(
            "the volume's directory {dir} is not in the filer (was the volume deleted?): staging it would make an \
             empty one"
        ))),
        s => Err(BackendError::Unavailable(format!("checking {dir}: the filer answered {s}"))),
    }
}

/// The stage's quota: the `collectionQuotaMB` mount option when the StorageClass sets one,
/// else the volume's capacity record; `Err(steps)` while the record is still to be read.
pub fn stage_quota(
    req_looked_up: &[LookedUp],
    provisioned: Option<(&[&str], &str)>,
    explicit: Option<u64>,
) -> Result<Result<u64, Vec<Step>>, BackendError> {
    if let Some(q) = explicit {
        return Ok(Ok(q));
    }
    let Some((filers, dir)) = provisioned else {
        return Ok(Ok(0));
    };
    match answer(req_looked_up, "capacity", &format!("the capacity record of {dir}"))? {
        None => Ok(Err(vec![get("capacity", "GET", urls(filers, &controller::record_path(dir), ""), Vec::new())])),
        Some(a) => Ok(Ok(recorded_size(a, dir)?.map(quota_mb).unwrap_or(0))),
    }
}

/// Plan ListVolumes: one page of one granted filer's list entries. The token is
/// `<filer index>:<last entry name>`.
pub fn list(req: &ListRequest) -> Result<ListAnswer, BackendError> {
    let bad = || invalid(format!("starting token {:?} is not one this plugin answered", req.starting_token));
    let (at, after) = match req.starting_token.split_once(':') {
        None if req.starting_token.is_empty() => (0, ""),
        None => return Err(bad()),
        Some((i, after)) => (i.parse::<usize>().map_err(|_| bad())?, after),
    };
    // The entry names this plugin writes are hex; the name goes into the lookup's query as is.
    if !after.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        return Err(bad());
    }
    let Some(host) = req.hosts.get(at) else {
        return Ok(ListAnswer::default());
    };
    let limit = req.max_entries.clamp(1, LIST_PAGE);
    let mut query = format!("?limit={limit}");
    if !after.is_empty() {
        query.push_str("&lastFileName=");
        query.push_str(after);
    }
    let key = format!("list-{at}");
    let Some(page) = answer(&req.looked_up, &key, &format!("the volume list of {host}"))? else {
        let url = format!("http://{host}{INDEX_ROOT}/{query}");
        let steps = vec![get(&key, "GET", vec![url], vec![controller::header("Accept", "application/json")])];
        return Ok(ListAnswer::default().with_next_token(req.starting_token.clone()).with_steps(steps));
    };
    let next_host = || if at + 1 < req.hosts.len() { format!("{}:", at + 1) } else { String::new() };
    match page.status {
        200 => {}
        // No volume was ever created through this filer.
        404 => return Ok(ListAnswer::default().with_next_token(next_host())),
        s => return Err(BackendError::Unavailable(format!("listing {host}{INDEX_ROOT}: the filer answered {s}"))),
    }
    if page.truncated {
        return Err(BackendError::Internal(format!("the list page of {host} was longer than the host reads")));
    }
    let doc: serde_json::Value = serde_json::from_slice(&page.body)
        .map_err(|e| BackendError::Unavailable(format!("the list of {host} is not JSON: {e}")))?;
    let entries = doc.get("Entries").and_then(|e| e.as_array()).cloned().unwrap_or_default();
    let mut volumes = Vec::new();
    let mut last = String::new();
    for e in &entries {
        let Some(name) = e.get("FullPath").and_then(|p| p.as_str()).and_then(|p| p.rsplit('/').next()) else {
            continue;
        };
        last = name.to_string();
        let Some(id) = unhex(name) else { continue };
        let Ok((filers, dir)) = controller::parse_volume_id(&id) else { continue };
        // A volume reached through several granted filers is listed once: through the first
        // of its own filers that is granted.
        if filers.iter().find(|f| req.hosts.iter().any(|h| h == *f)) != Some(&host.as_str()) {
            continue;
        }
        let capacity = e
            .get("Extended")
            .and_then(|x| x.get(CAPACITY_HEADER))
            .and_then(|v| v.as_str())
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
        let context: Vec<Kv> = vec![kv("filer", filers.join(",")), kv("path", dir)];
        volumes.push(ListedVolume::new(id.clone(), capacity).with_context(context));
    }
    let more = doc.get("ShouldDisplayLoadMore").and_then(|m| m.as_bool()).unwrap_or(false);
    let next_token = if more && !last.is_empty() { format!("{at}:{last}") } else { next_host() };
    Ok(ListAnswer::new(volumes).with_next_token(next_token))
}

/// Plan GetCapacity.
pub fn capacity(req: &CapacityRequest) -> Result<CapacityAnswer, BackendError> {
    let p = params::open(&req.parameters, ParamSource::Parameter)?;
    let settings = Settings::parse(&p)?;
    let unknown = CapacityAnswer::default();
    let Some(master) = settings.master else {
        return Ok(unknown);
    };
    let Some(status) = answer(&req.looked_up, "master", &format!("{master}/dir/status"))? else {
        let steps = vec![get("master", "GET", vec![format!("http://{master}/dir/status")], Vec::new())];
        return Ok(unknown.with_steps(steps));
    };
    if status.status != 200 {
        return Err(BackendError::Unavailable(format!(
            "the master {master} answered {} to /dir/status",
            status.status
        )));
    }
    let doc: serde_json::Value = serde_json::from_slice(&status.body)
        .map_err(|e| BackendError::Unavailable(format!("the master's /dir/status is not JSON: {e}")))?;
    let free = doc.pointer("/Topology/Free").and_then(serde_json::Value::as_u64).ok_or_else(|| {
        BackendError::Unavailable(format!("the master's /dir/status has no Topology.Free ({master})"))
    })?;
    let copies = settings.replication.map(copies_of).unwrap_or(1);
    let available = free.saturating_mul(settings.master_volume_size_limit_mb * MIB) / copies;
    Ok(unknown.with_available_bytes(available))
}

/// How many copies a replica placement (`xyz`) makes: 1 + x + y + z.
pub fn copies_of(replication: &str) -> u64 {
    1 + replication.bytes().map(|b| u64::from(b.saturating_sub(b'0'))).sum::<u64>()
}

/// Whether the volume exists: its directory on its filers.
pub fn describe(req: &DescribeRequest) -> Result<DescribeAnswer, BackendError> {
    // A static volume (an id CreateVolume did not make) is its context's directory, which
    // `weed mount` creates at the first stage: a missing directory is no missing volume, and
    // its context is checked by `validate`.
    let Ok((filers, dir)) = controller::parse_volume_id(&req.volume_id) else {
        return Ok(DescribeAnswer::new(Existence::Unknown));
    };
    let Some(found) = answer(&req.looked_up, "dir", dir)? else {
        let steps = vec![get("dir", "HEAD", urls(&filers, dir, ""), Vec::new())];
        return Ok(DescribeAnswer::new(Existence::Unknown).with_steps(steps));
    };
    let existence = match found.status {
        200 => Existence::Exists,
        404 => Existence::Missing,
        s => return Err(BackendError::Unavailable(format!("checking {dir}: the filer answered {s}"))),
    };
    Ok(DescribeAnswer::new(existence))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mounthost_plugin_sdk::{Plan, StageRequest};

    fn answered(key: &str, status: u16, body: &str) -> LookedUp {
        LookedUp::new(key, status, body.as_bytes())
    }

    fn expand_req(side: ExpandSide, required: u64, looked_up: Vec<LookedUp>) -> ExpandRequest {
        ExpandRequest::default()
            .with_volume_id("127.0.0.1:8888/buckets/pvc-1")
            .with_side(side)
            .with_required_bytes(required)
            .with_recorded([
                kv("filer", "127.0.0.1:8888"),
                kv("path", "/buckets/pvc-1"),
                kv("collection", "pvc-1"),
                kv("readOnly", "false"),
                kv("quotaMB", "1024"),
            ])
            .with_looked_up(looked_up)
    }

    fn lookups(steps: &[Step]) -> Vec<(String, String, Vec<String>)> {
        steps
            .iter()
            .map(|s| match s {
                Step::Lookup(l) => (l.key.clone(), l.method.clone(), l.urls.clone()),
                other => panic!("expected lookups only, got {other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_controller_reads_first_then_grows_the_record_and_the_list_entry() {
        let first = expand(&expand_req(ExpandSide::Controller, 2 << 30, vec![])).unwrap();
        assert_eq!(
            lookups(&first.steps),
            [
                ("dir".into(), "HEAD".into(), vec!["http://127.0.0.1:8888/buckets/pvc-1".to_string()]),
                (
                    "record".into(),
                    "GET".into(),
                    vec!["http://127.0.0.1:8888/.mounthost/capacity/buckets/pvc-1".to_string()]
                ),
            ]
        );
        let read =
            |dir: u16, record: (u16, &str)| vec![answered("dir", dir, ""), answered("record", record.0, record.1)];
        let grown =
            expand(&expand_req(ExpandSide::Controller, 2 << 30, read(200, (200, "{\"capacityBytes\":1073741824}\n"))))
                .unwrap();
        assert_eq!((grown.capacity_bytes, grown.node_expansion_required), (2 << 30, true));
        let [Step::Http(record), Step::Http(entry)] = grown.steps.as_slice() else { panic!("{:?}", grown.steps) };
        assert_eq!(
            (record.method.as_str(), record.body.as_slice()),
            ("PUT", b"{\"capacityBytes\":2147483648}\n".as_slice())
        );
        assert!(entry.urls[0].contains("/.mounthost/volumes/"), "{entry:?}");
        assert_eq!(entry.headers[0].name, CAPACITY_HEADER);
        // The parameters CreateVolume recorded are kept.
        let with_params = "{\"capacityBytes\":1073741824,\"parameters\":{\"replication\":\"001\"}}\n";
        let kept = expand(&expand_req(ExpandSide::Controller, 2 << 30, read(200, (200, with_params)))).unwrap();
        let Step::Http(record) = &kept.steps[0] else { panic!("{:?}", kept.steps) };
        assert_eq!(
            String::from_utf8_lossy(&record.body),
            "{\"capacityBytes\":2147483648,\"parameters\":{\"replication\":\"001\"}}\n"
        );
        // Already that large (or larger): nothing written, the recorded size answered.
        let same =
            expand(&expand_req(ExpandSide::Controller, 1 << 30, read(200, (200, "{\"capacityBytes\":2147483648}"))))
                .unwrap();
        assert_eq!((same.capacity_bytes, same.steps.len()), (2 << 30, 1));
        let [Step::Http(entry)] = same.steps.as_slice() else { panic!("{:?}", same.steps) };
        assert!(entry.urls[0].contains("/.mounthost/volumes/"), "only the list entry, written again: {entry:?}");
        // A volume made without a size has no record: it gets one.
        let sizeless = expand(&expand_req(ExpandSide::Controller, 1 << 30, read(200, (404, "")))).unwrap();
        assert_eq!((sizeless.capacity_bytes, sizeless.steps.len()), (1 << 30, 2));
        // Gone, or the filer down.
        let gone = expand(&expand_req(ExpandSide::Controller, 1 << 30, read(404, (404, "")))).unwrap_err();
        assert!(matches!(gone, BackendError::NotFound(m) if m.contains("/buckets/pvc-1")));
        let down = expand(&expand_req(ExpandSide::Controller, 1 << 30, read(0, (0, "")))).unwrap_err();
        assert!(matches!(down, BackendError::Unavailable(_)), "{down:?}");
        let odd = expand(&expand_req(ExpandSide::Controller, 1 << 30, read(200, (200, "not json")))).unwrap_err();
        assert!(matches!(odd, BackendError::Internal(m) if m.contains("not JSON")));
        let mut foreign = expand_req(ExpandSide::Controller, 1 << 30, vec![]);
        foreign.volume_id = "no-slash".into();
        assert!(matches!(expand(&foreign).unwrap_err(), BackendError::NotFound(_)));
    }

    #[test]
    fn the_node_tells_the_running_mount_the_recorded_size() {
        let first = expand(&expand_req(ExpandSide::Node, 2 << 30, vec![])).unwrap();
        assert_eq!(lookups(&first.steps)[0].2, ["http://127.0.0.1:8888/.mounthost/capacity/buckets/pvc-1"]);
        let record = |body: &str| vec![answered("record", 200, body)];
        let plan = expand(&expand_req(ExpandSide::Node, 2 << 30, record("{\"capacityBytes\":2147483648}"))).unwrap();
        assert_eq!((plan.capacity_bytes, plan.node_expansion_required), (2 << 30, false));
        let [Step::SocketCall(call)] = plan.steps.as_slice() else { panic!("{:?}", plan.steps) };
        assert_eq!(call.socket, runtime("weed.sock"));
        assert_eq!(call.method, "/messaging_pb.SeaweedMount/Configure");
        assert_eq!(call.message, configure_message(2 << 30));
        // The SDK's default, as this plugin set it before (10 s).
        assert_eq!(call.timeout_ms, 10_000);
        // The controller has not grown it yet, or never recorded a size.
        let early =
            expand(&expand_req(ExpandSide::Node, 2 << 30, record("{\"capacityBytes\":1073741824}"))).unwrap_err();
        assert!(matches!(early, BackendError::OutOfRange(m) if m.contains("ControllerExpandVolume")));
        let none = expand(&expand_req(ExpandSide::Node, 2 << 30, vec![answered("record", 404, "")])).unwrap_err();
        assert!(matches!(none, BackendError::OutOfRange(_)));
        // Staged without a quota: weed checks no usage, so there is no one to tell.
        let mut req = expand_req(ExpandSide::Node, 2 << 30, record("{\"capacityBytes\":2147483648}"));
        req.recorded.retain(|kv| kv.key != "quotaMB");
        let plan = expand(&req).unwrap();
        assert_eq!((plan.capacity_bytes, plan.steps.len()), (2 << 30, 0));
        // A static volume has no recorded size.
        let mut req = expand_req(ExpandSide::Node, 2 << 30, vec![]);
        req.volume_id = "my-static-volume".into();
        assert!(matches!(expand(&req).unwrap_err(), BackendError::OutOfRange(m) if m.contains("static")));
    }

    #[test]
    fn configure_messages_are_protobuf_varints() {
        assert_eq!(configure_message(0), [0x08, 0x00]);
        assert_eq!(configure_message(300), [0x08, 0xac, 0x02]);
        // 2 GiB = 2^31: five 7-bit groups.
        assert_eq!(configure_message(2 << 30), [0x08, 0x80, 0x80, 0x80, 0x80, 0x08]);
        assert_eq!(quota_mb(1), 1);
        assert_eq!(quota_mb(1 << 30), 1024);
        assert_eq!(quota_mb((1 << 30) + 1), 1025);
    }

    fn stage_req(looked_up: Vec<LookedUp>, extra: &[(&str, &str)]) -> StageRequest {
        let mut context = vec![kv("filer", "127.0.0.1:8888"), kv("path", "/buckets/pvc-1")];
        context.extend(extra.iter().map(|(k, v)| kv(*k, *v)));
        StageRequest::default()
            .with_volume_id("seaweedfs~127.0.0.1:8888/buckets/pvc-1")
            .with_context(context)
            .with_looked_up(looked_up)
            .with_node_id("node-1")
    }

    fn args(plan: &Plan) -> Vec<String> {
        let [Step::SpawnFuse(s)] = plan.steps.as_slice() else { panic!("{:?}", plan.steps) };
        s.args.iter().map(|a| format!("{a:?}")).collect()
    }

    #[test]
    fn a_provisioned_volume_is_staged_with_its_recorded_size_as_quota() {
        let dir = || answered("dir", 200, "");
        let first = crate::node::stage(&stage_req(vec![], &[])).unwrap();
        let read: Vec<(String, String)> = lookups(&first.steps).into_iter().map(|(k, m, _)| (k, m)).collect();
        assert_eq!(read, [("dir".into(), "HEAD".into()), ("capacity".into(), "GET".into())]);
        let plan = crate::node::stage(&stage_req(
            vec![dir(), answered("capacity", 200, "{\"capacityBytes\":1073741825}")],
            &[],
        ))
        .unwrap();
        assert!(args(&plan).iter().any(|a| a.contains("-collectionQuotaMB=1025")), "{:?}", args(&plan));
        assert!(plan.attributes.contains(&kv("quotaMB", "1025")));
        let plan = crate::node::stage(&stage_req(vec![dir(), answered("capacity", 404, "")], &[])).unwrap();
        assert!(!args(&plan).iter().any(|a| a.contains("collectionQuotaMB")));
        assert!(plan.attributes.contains(&kv("quotaMB", "0")));
        let down = crate::node::stage(&stage_req(vec![dir(), answered("capacity", 0, "")], &[])).unwrap_err();
        assert!(matches!(down, BackendError::Unavailable(_)));
        // The StorageClass's own quota wins, and only the directory is read.
        let quota = [("mountOptions", "collectionQuotaMB=10")];
        let own = crate::node::stage(&stage_req(vec![], &quota)).unwrap();
        assert_eq!(lookups(&own.steps).into_iter().map(|(k, ..)| k).collect::<Vec<_>>(), ["dir"]);
        let own = crate::node::stage(&stage_req(vec![dir()], &quota)).unwrap();
        let own_args = args(&own);
        assert_eq!(own_args.iter().filter(|a| a.contains("collectionQuotaMB")).count(), 1, "{own_args:?}");
        assert!(own.attributes.contains(&kv("quotaMB", "10")) && own.attributes.contains(&kv("quotaFixed", "true")));
        // Such a volume cannot grow on the node: the StorageClass's quota bounds it.
        let mut req = expand_req(ExpandSide::Node, 2 << 30, vec![]);
        req.recorded = own.attributes.clone();
        req.volume_id = format!("{}{}", own.attributes[0].value, own.attributes[1].value);
        let e = expand(&req).unwrap_err();
        assert!(matches!(&e, BackendError::OutOfRange(m) if m.contains("collectionQuotaMB=10")), "{e:?}");
    }

    /// CSI NodeStageVolume "Volume does not exist 5 NOT_FOUND": a provisioned volume whose
    /// directory is gone is `not-found`, and nothing is mounted (weed would make it anew).
    #[test]
    fn a_provisioned_volume_whose_directory_is_gone_is_not_found() {
        let capacity = || answered("capacity", 200, "{\"capacityBytes\":1073741824}");
        let gone = crate::node::stage(&stage_req(vec![answered("dir", 404, ""), capacity()], &[])).unwrap_err();
        assert!(matches!(&gone, BackendError::NotFound(m) if m.contains("/buckets/")), "{gone:?}");
        for status in [0, 500] {
            let e = crate::node::stage(&stage_req(vec![answered("dir", status, ""), capacity()], &[])).unwrap_err();
            assert!(matches!(e, BackendError::Unavailable(_)), "{status}: {e:?}");
        }
    }

    fn list_req(token: &str, looked_up: Vec<LookedUp>) -> ListRequest {
        ListRequest::default()
            .with_hosts(["f1:8888".to_string(), "f2:8888".to_string()])
            .with_starting_token(token)
            .with_max_entries(10)
            .with_looked_up(looked_up)
    }

    fn entry_json(id: &str, capacity: Option<&str>) -> String {
        let hex: String = id.bytes().map(|b| format!("{b:02x}")).collect();
        let extended = match capacity {
            Some(c) => format!("{{\"{CAPACITY_HEADER}\":\"{}\"}}", base64::engine::general_purpose::STANDARD.encode(c)),
            None => "null".into(),
        };
        format!("{{\"FullPath\":\"/.mounthost/volumes/{hex}\",\"Extended\":{extended}}}")
    }

    #[test]
    fn volumes_are_listed_a_filer_page_at_a_time_each_once() {
        let first = list(&list_req("", vec![])).unwrap();
        assert_eq!(
            lookups(&first.steps),
            [("list-0".into(), "GET".into(), vec!["http://f1:8888/.mounthost/volumes/?limit=10".to_string()])]
        );
        let page = format!(
            "{{\"Entries\":[{},{},{},{}],\"ShouldDisplayLoadMore\":true}}",
            entry_json("f1:8888/buckets/a", Some("1073741824")),
            // Reached through f1 too, but its first granted filer is f2: listed there.
            entry_json("f2:8888,f1:8888/buckets/b", Some("5")),
            entry_json("f1:8888/buckets/c", None),
            "{\"FullPath\":\"/.mounthost/volumes/zz\"}",
        );
        let answer = list(&list_req("", vec![answered("list-0", 200, &page)])).unwrap();
        let got: Vec<(&str, u64)> = answer.volumes.iter().map(|v| (v.volume_id.as_str(), v.capacity_bytes)).collect();
        assert_eq!(got, [("f1:8888/buckets/a", 1 << 30), ("f1:8888/buckets/c", 0)]);
        assert_eq!(answer.volumes[0].context, [kv("filer", "f1:8888"), kv("path", "/buckets/a")]);
        assert_eq!(answer.next_token, "0:zz");
        // The next page of f1 starts after the last entry; its last page leads to f2.
        let next = list(&list_req("0:zz", vec![])).unwrap();
        assert!(lookups(&next.steps)[0].2[0].ends_with("?limit=10&lastFileName=zz"));
        let last = list(&list_req("0:zz", vec![answered("list-0", 200, "{\"Entries\":null}")])).unwrap();
        assert_eq!((last.volumes.len(), last.next_token.as_str()), (0, "1:"));
        let f2 = list(&list_req("1:", vec![answered("list-1", 404, "")])).unwrap();
        assert_eq!((f2.volumes.len(), f2.next_token.as_str()), (0, ""));
        for bad in ["x", "0:a b", "0:zz&limit=1000", "0:a/b", "0:%2F"] {
            assert!(matches!(list(&list_req(bad, vec![])).unwrap_err(), BackendError::InvalidArgument(_)), "{bad}");
        }
        assert!(matches!(
            list(&list_req("", vec![answered("list-0", 500, "")])).unwrap_err(),
            BackendError::Unavailable(_)
        ));
    }

    fn capacity_req(params: &[(&str, &str)], looked_up: Vec<LookedUp>) -> CapacityRequest {
        let mut parameters = vec![kv("filer", "127.0.0.1:8888")];
        parameters.extend(params.iter().map(|(k, v)| kv(*k, *v)));
        CapacityRequest::default().with_parameters(parameters).with_looked_up(looked_up)
    }

    #[test]
    fn capacity_is_the_masters_free_slots_times_their_size_over_the_copies() {
        assert_eq!(capacity(&capacity_req(&[], vec![])).unwrap().available_bytes, None);
        let params = [("master", "127.0.0.1:9333"), ("masterVolumeSizeLimitMB", "1024"), ("replication", "001")];
        let first = capacity(&capacity_req(&params, vec![])).unwrap();
        assert_eq!(lookups(&first.steps)[0].2, ["http://127.0.0.1:9333/dir/status"]);
        let status = "{\"Topology\":{\"Max\":100,\"Free\":10},\"Version\":\"4.48\"}";
        let answer = capacity(&capacity_req(&params, vec![answered("master", 200, status)])).unwrap();
        assert_eq!(answer.available_bytes, Some(10 * 1024 * MIB / 2));
        let bad = capacity(&capacity_req(&params, vec![answered("master", 200, "{}")])).unwrap_err();
        assert!(matches!(bad, BackendError::Unavailable(m) if m.contains("Topology.Free")));
        assert_eq!(copies_of("000"), 1);
        assert_eq!(copies_of("210"), 4);
        let two = capacity(&capacity_req(&[("master", "a:1,b:2")], vec![])).unwrap_err();
        assert!(matches!(two, BackendError::InvalidArgument(m) if m.contains("one host:port")));
    }

    fn describe_req(id: &str, context: Vec<Kv>, looked_up: Vec<LookedUp>) -> DescribeRequest {
        DescribeRequest::default().with_volume_id(id).with_context(context).with_looked_up(looked_up)
    }

    #[test]
    fn a_volume_exists_when_its_directory_does() {
        let id = "127.0.0.1:8888/buckets/pvc-1";
        let first = describe(&describe_req(id, vec![], vec![])).unwrap();
        assert_eq!(lookups(&first.steps)[0].2, ["http://127.0.0.1:8888/buckets/pvc-1"]);
        let of = |status| describe(&describe_req(id, vec![], vec![answered("dir", status, "")]));
        assert_eq!(of(200).unwrap().existence, Existence::Exists);
        assert_eq!(of(404).unwrap().existence, Existence::Missing);
        assert!(matches!(of(0).unwrap_err(), BackendError::Unavailable(_)));
        // A static volume: its directory is made by the first stage, so whether it exists says
        // nothing; no lookup is planned.
        for ctx in [vec![kv("filer", "f:1"), kv("path", "/data")], vec![]] {
            let st = describe(&describe_req("static-1", ctx, vec![answered("dir", 404, "")])).unwrap();
            assert_eq!((st.existence, st.steps.len()), (Existence::Unknown, 0));
        }
    }
}
