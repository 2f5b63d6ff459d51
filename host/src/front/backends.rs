//! The backends this controller provisioned on, so that ListVolumes lists what it created on
//! a default configuration. ListVolumes carries no StorageClass (CSI v1.12: "returns all
//! available volumes"), so the hosts a plugin lists are those the configuration grants it
//! (`--grant <plugin>:host=`) and those this file records: every `host:port` a CreateVolume's
//! id names that its StorageClass's endpoint parameters granted (a `seaweedfs` volume's
//! `filer`), once the volume is made.
//!
//! - **Where.** `<state-dir>/controller/backends.json` (the directory 0700, the file 0644: it
//!   holds host names, no secret), `{"version":1,"backends":[{"plugin":…,"host":…}]}`, in the
//!   order recorded, so a new backend goes last and the hosts ListVolumes hands a plugin keep
//!   their places (its page tokens count them) while a listing is paged.
//! - **How.** Written whole, temp file + fsync + rename + fsync of the directory
//!   ([`private_files::write_atomic`]): a crash leaves the old file or the new one. Read at
//!   every call (it is small), so a restarted controller lists the same, and an operator may
//!   edit it while the controller runs.
//! - **Bounds.** A host is at most [`MAX_HOST_LEN`] bytes and reads as `host:port`; at most
//!   [`MAX_BACKENDS`] are kept. Past that a new backend is not recorded, and a warning says to
//!   grant it; its volumes are created all the same. The file is read up to [`MAX_FILE_BYTES`].
//! - **Forgetting.** After a DeleteVolume, a recorded host the id named that now lists no
//!   volume at all is dropped, so a filer taken out of service with its last volume does not
//!   keep ListVolumes waiting on it. One change at a time in this process ([`Backends::lock`]):
//!   a CreateVolume's record waits while a DeleteVolume checks and drops its hosts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::plan::url::HostGrant;
use crate::unpriv::private_files;

/// The most backends recorded (over all plugins).
pub const MAX_BACKENDS: usize = 64;
/// The longest host recorded: a DNS name's 253 bytes, brackets and a port.
pub const MAX_HOST_LEN: usize = 262;
/// The longest record file read.
pub const MAX_FILE_BYTES: u64 = 64 * 1024;
/// The schema version this controller writes (and the newest it reads).
pub const SCHEMA_VERSION: u64 = 1;

/// One recorded backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// The plugin that provisioned there.
    pub plugin: String,
    /// `host:port`, as the volume id names it.
    pub host: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordFile {
    version: u64,
    backends: Vec<Backend>,
}

/// The record of the backends this controller provisioned on.
#[derive(Debug)]
pub struct Backends {
    path: PathBuf,
    lock: tokio::sync::Mutex<()>,
}

/// Leave to change the record ([`Backends::lock`]).
pub struct Writer<'a> {
    backends: &'a Backends,
    _guard: tokio::sync::MutexGuard<'a, ()>,
}

impl Backends {
    /// The record in `<state_dir>/controller/backends.json`.
    pub fn in_state_dir(state_dir: &Path) -> Self {
        Backends { path: state_dir.join("controller").join("backends.json"), lock: tokio::sync::Mutex::new(()) }
    }

    /// Where the record is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every recorded backend, in the order recorded.
    pub fn read(&self) -> Result<Vec<Backend>, Error> {
        let shown = self.path.display();
        let what = "the backends this controller provisioned on";
        let fix = "fix or remove it (without it ListVolumes lists the granted hosts, and the backends of \
                   the next CreateVolume calls)";
        let bytes = match private_files::read_capped(&self.path, MAX_FILE_BYTES) {
            Ok(None) => return Ok(Vec::new()),
            Ok(Some(bytes)) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(Error::precondition(format!(
                    "{shown}, {what}, is longer than {MAX_FILE_BYTES} bytes; {fix}"
                )));
            }
            Err(e) => return Err(Error::unavailable(format!("reading {shown}, {what}: {e}"))),
        };
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::precondition(format!("{shown}, {what}, is not UTF-8; {fix}")))?;
        parse(&text).map_err(|why| Error::precondition(format!("{shown}, {what}, {why}; {fix}")))
    }

    /// The hosts recorded for `plugin`, in the order recorded.
    pub fn hosts(&self, plugin: &str) -> Result<Vec<String>, Error> {
        Ok(self.read()?.into_iter().filter(|b| b.plugin == plugin).map(|b| b.host).collect())
    }

    /// The only way to change the record: one change at a time in this process.
    pub async fn lock(&self) -> Writer<'_> {
        Writer { backends: self, _guard: self.lock.lock().await }
    }

    fn write(&self, backends: Vec<Backend>) -> Result<(), std::io::Error> {
        let dir = self.path.parent().expect("the record has a directory");
        private_files::private_dir(dir)?;
        let doc = RecordFile { version: SCHEMA_VERSION, backends };
        let mut text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)?;
        text.push('\n');
        private_files::write_atomic(&self.path, text.as_bytes(), 0o644)
    }
}

impl Writer<'_> {
    /// Record `hosts` for `plugin` (those not recorded yet, in order). Answers the hosts left
    /// out because [`MAX_BACKENDS`] are recorded already. An error means nothing was written.
    pub fn record(&self, plugin: &str, hosts: &[String]) -> Result<Vec<String>, Error> {
        let mut all = self.backends.read()?;
        let mut left_out = Vec::new();
        let mut changed = false;
        for host in hosts {
            if all.iter().any(|b| b.plugin == plugin && same_host(&b.host, host)) {
                continue;
            }
            if all.len() >= MAX_BACKENDS {
                left_out.push(host.clone());
                continue;
            }
            all.push(Backend { plugin: plugin.to_string(), host: host.clone() });
            changed = true;
        }
        if changed {
            self.backends.write(all).map_err(|e| {
                Error::unavailable(format!(
                    "cannot record in {} that plugin {plugin} provisioned on {}, which ListVolumes needs: {e}",
                    self.backends.path.display(),
                    hosts.join(", ")
                ))
            })?;
        }
        Ok(left_out)
    }

    /// Forget `hosts` of `plugin`.
    pub fn forget(&self, plugin: &str, hosts: &[String]) -> Result<(), Error> {
        let all = self.backends.read()?;
        let kept: Vec<Backend> = all
            .iter()
            .filter(|b| !(b.plugin == plugin && hosts.iter().any(|h| same_host(&b.host, h))))
            .cloned()
            .collect();
        if kept.len() == all.len() {
            return Ok(());
        }
        self.backends
            .write(kept)
            .map_err(|e| Error::unavailable(format!("cannot update {}: {e}", self.backends.path.display())))
    }
}

/// `text` as a record: its schema version not newer than this controller's, every entry a
/// plugin name and a `host:port`, at most [`MAX_BACKENDS`].
fn parse(text: &str) -> Result<Vec<Backend>, String> {
    let doc: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("is not valid JSON: {e}"))?;
    match doc.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) if v > SCHEMA_VERSION => {
            return Err(format!(
                "has schema version {v}, written by a newer mounthost; this controller reads version {SCHEMA_VERSION}"
            ));
        }
        Some(_) => {}
        None => return Err("has no schema version".into()),
    }
    let file: RecordFile = serde_json::from_value(doc).map_err(|e| format!("is not a backend record: {e}"))?;
    if file.backends.len() > MAX_BACKENDS {
        return Err(format!("holds {} backends, more than {MAX_BACKENDS}", file.backends.len()));
    }
    for b in &file.backends {
        if !crate::plugin::info::valid_name(&b.plugin) {
            return Err(format!("names {:?}, which is not a plugin name", b.plugin));
        }
        backend_host(&b.host)?;
    }
    Ok(file.backends)
}

/// `host` parsed, if it is one this record takes: at most [`MAX_HOST_LEN`] bytes, `host:port`
/// (a name, an IPv4 address or a bracketed IPv6 address, and a port), nothing else.
pub fn backend_host(host: &str) -> Result<HostGrant, String> {
    let shown = crate::volume::request::shown(host);
    if host.len() > MAX_HOST_LEN {
        return Err(format!("backend {shown} is longer than {MAX_HOST_LEN} bytes"));
    }
    let has_port = host
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if !has_port {
        return Err(format!("backend {shown} is not host:port"));
    }
    HostGrant::parse(host).map_err(|e| format!("backend {shown}: {e}"))
}

/// The same host as a plugin compares them: byte for byte. A plugin finds a volume's hosts in
/// its id as the StorageClass wrote them (the `seaweedfs` plugin lists a volume through the
/// first of the hosts it is handed that its id names, by string), so `Filer:8888` and
/// `filer:8888` are two entries here, each listing only the volumes whose ids write it so.
fn same_host(a: &str, b: &str) -> bool {
    a == b
}

/// The backends a new volume's id (`inner`, the plugin's part) puts it on, to record: each
/// `/`- or `,`-separated part that is a `host:port` the StorageClass's endpoint parameters
/// granted (`endpoints`, from [`crate::plan::policy::endpoint_hosts`]) and the configuration
/// does not grant already (`granted`), as the id writes it, once each.
pub fn new_volume_backends(inner: &str, endpoints: &BTreeSet<String>, granted: &BTreeSet<String>) -> Vec<String> {
    let endpoints: Vec<HostGrant> = endpoints.iter().filter_map(|h| HostGrant::parse(h).ok()).collect();
    let mut out: Vec<String> = Vec::new();
    for part in inner.split(['/', ',']) {
        let Ok(host) = backend_host(part) else { continue };
        let granted = granted.iter().any(|g| same_host(g, part));
        if endpoints.contains(&host) && !granted && !out.iter().any(|o| same_host(o, part)) {
            out.push(part.to_string());
        }
    }
    out
}

/// The recorded `hosts` a volume id (`inner`) names.
pub fn named_in(inner: &str, hosts: &[String]) -> Vec<String> {
    hosts.iter().filter(|h| inner.split(['/', ',']).any(|part| same_host(part, h))).cloned().collect()
}

/// The hosts ListVolumes hands plugin: the granted ones (sorted), then the recorded ones that
/// are not granted, in the order recorded.
pub fn listed_hosts(granted: &BTreeSet<String>, recorded: Vec<String>) -> Vec<String> {
    let mut hosts: Vec<String> = granted.iter().cloned().collect();
    for r in recorded {
        if !hosts.iter().any(|h| same_host(h, &r)) {
            hosts.push(r);
        }
    }
    hosts
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn set(hosts: &[&str]) -> BTreeSet<String> {
        hosts.iter().map(|h| h.to_string()).collect()
    }

    #[test]
    fn a_new_volume_records_the_granted_hosts_its_id_names_and_no_other() {
        let endpoints = set(&["f1:8888", "Filer.example:8888", "master:9333"]);
        // The id names two filers of the StorageClass, one of which the configuration grants,
        // and a path that reads as host:port but no StorageClass granted.
        let got = new_volume_backends("f1:8888,Filer.Example:8888/buckets/evil:1", &endpoints, &set(&["f1:8888"]));
        assert_eq!(got, vec!["Filer.Example:8888".to_string()], "as the id writes it");
        // Grants are written lowercase; a plugin compares an id's host as the id writes it.
        let got = new_volume_backends("Filer.Example:8888/b/v", &endpoints, &set(&["filer.example:8888"]));
        assert_eq!(got, vec!["Filer.Example:8888".to_string()]);
        // A grant without a port is not the same string the plugin compares: recorded.
        assert_eq!(new_volume_backends("f1:8888/b/v", &endpoints, &set(&["f1"])), vec!["f1:8888".to_string()]);
        assert!(new_volume_backends("f1:8888,f1:8888/b/v", &endpoints, &set(&[])).len() == 1, "once");
        assert!(new_volume_backends("pvc-1", &endpoints, &set(&[])).is_empty(), "an id naming no host");
        assert_eq!(named_in("x:1,f1:8888/b", &["f1:8888".into(), "f2:8888".into()]), vec!["f1:8888".to_string()]);
        assert!(named_in("F1:8888/b", &["f1:8888".into()]).is_empty(), "byte for byte");
        assert_eq!(
            listed_hosts(&set(&["b:1", "a:1"]), vec!["c:1".into(), "a:1".into(), "b:2".into()]),
            vec!["a:1", "b:1", "c:1", "b:2"],
            "granted first, sorted; then recorded, in their order, once"
        );
    }

    #[test]
    fn hosts_must_be_host_port_and_bounded() {
        for good in ["127.0.0.1:8888", "seaweedfs-filer.seaweedfs:8888", "[::1]:8888"] {
            backend_host(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        let long = format!("{}:8888", "a".repeat(MAX_HOST_LEN));
        for bad in [
            "filer",
            "filer:",
            ":8888",
            "user@filer:8888",
            "filer:8888/x",
            "fi ler:1",
            "filer:0",
            "filer:99999",
            "[::1]",
            &long,
        ] {
            assert!(backend_host(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn the_record_is_written_whole_kept_bounded_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backends::in_state_dir(dir.path());
        assert!(b.read().unwrap().is_empty(), "no file: nothing recorded");
        let w = b.lock().await;
        assert!(w.record("seaweedfs", &["f1:8888".into(), "f2:8888".into()]).unwrap().is_empty());
        assert!(w.record("seaweedfs", &["f1:8888".into()]).unwrap().is_empty(), "recorded already");
        assert!(w.record("other", &["f1:8888".into()]).unwrap().is_empty());
        assert_eq!(b.hosts("seaweedfs").unwrap(), vec!["f1:8888", "f2:8888"]);
        assert_eq!(b.hosts("other").unwrap(), vec!["f1:8888"]);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(b.path()), 0o644);
        assert_eq!(mode(b.path().parent().unwrap()), 0o700);
        let text = std::fs::read_to_string(b.path()).unwrap();
        assert!(text.contains("\"version\": 1"), "{text}");

        w.forget("seaweedfs", &["f1:8888".into()]).unwrap();
        assert_eq!(b.hosts("seaweedfs").unwrap(), vec!["f2:8888"]);
        assert_eq!(b.hosts("other").unwrap(), vec!["f1:8888"], "another plugin's host stays");

        // Past the bound: nothing more is recorded, and the caller is told which.
        let many: Vec<String> = (0..MAX_BACKENDS).map(|i| format!("h{i}:1")).collect();
        let left = w.record("seaweedfs", &many).unwrap();
        assert_eq!(left.len(), 2, "{left:?}");
        assert_eq!(b.read().unwrap().len(), MAX_BACKENDS);
        drop(w);

        // No temporary file left beside it.
        let names: Vec<String> = std::fs::read_dir(b.path().parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["backends.json"]);
    }

    #[test]
    fn a_record_that_is_not_one_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backends::in_state_dir(dir.path());
        std::fs::create_dir_all(b.path().parent().unwrap()).unwrap();
        let entry = |p: &str, h: &str| format!(r#"{{"version":1,"backends":[{{"plugin":"{p}","host":"{h}"}}]}}"#);
        for (text, why) in [
            ("{", "is not valid JSON"),
            (r#"{"backends":[]}"#, "has no schema version"),
            (r#"{"version":2,"backends":[]}"#, "written by a newer mounthost"),
            (&entry("Bad", "f:1"), "not a plugin name"),
            (&entry("seaweedfs", "f"), "is not host:port"),
            (r#"{"version":1,"backends":[],"extra":1}"#, "not a backend record"),
        ] {
            std::fs::write(b.path(), text).unwrap();
            let e = b.read().unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::FailedPrecondition, "{text}");
            assert!(e.message.contains(why) && e.message.contains("fix or remove it"), "{text}: {}", e.message);
        }
        std::fs::write(b.path(), " ".repeat(MAX_FILE_BYTES as usize + 1)).unwrap();
        assert!(b.read().unwrap_err().message.contains("longer than"));
        std::fs::write(b.path(), entry("seaweedfs", "f:1")).unwrap();
        assert_eq!(b.hosts("seaweedfs").unwrap(), vec!["f:1"]);
    }
}
