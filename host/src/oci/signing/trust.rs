//! The node's trust set: named keys and CAs read from a directory, a ConfigMap mount in a
//! cluster. One broken file costs its own entry only, and says why in [`TrustSet::problems`];
//! an entry whose identity pin cannot be read is not loaded at all (never loaded without its pin).

use std::collections::BTreeMap;
use std::io::{self, Read as _};
use std::path::Path;

use rustls::pki_types::{CertificateDer, TrustAnchor};

use super::ec::{PublicKey, pem_blocks};

/// The largest trust file read.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// The most files read from one trust directory.
const MAX_FILES: usize = 1000;
/// The most CA certificates one entry holds.
const MAX_CAS: usize = 100;

/// Named trust entries read from a directory (a ConfigMap mount). Read afresh by each caller that
/// needs it (so a changed ConfigMap applies without a restart).
#[derive(Debug, Default)]
pub struct TrustSet {
    entries: BTreeMap<String, Entry>,
    problems: Vec<String>,
}

/// One usable trust entry.
#[derive(Debug)]
pub(crate) enum Entry {
    /// `NAME.pub`: bundles signed with this key.
    Key(PublicKey),
    /// `NAME.ca.pem` (and `NAME.identity`): bundles whose certificate chain leads to these CAs.
    Ca(Ca),
}

#[derive(Debug)]
pub(crate) struct Ca {
    pub anchors: Vec<TrustAnchor<'static>>,
    /// Each CA's subject, for [`TrustSet::describe`].
    pub subjects: Vec<String>,
    /// The subjectAltNames accepted (exact match), when `NAME.identity` exists.
    pub identities: Option<Vec<String>>,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Kind {
    Key,
    Ca,
    Identity,
}

const SUFFIXES: [(&str, Kind); 3] = [(".ca.pem", Kind::Ca), (".identity", Kind::Identity), (".pub", Kind::Key)];

impl TrustSet {
    /// An empty set (nothing trusted).
    pub fn empty() -> TrustSet {
        TrustSet::default()
    }

    /// Every entry of `dir`: `NAME.pub` (a PEM public key, ECDSA P-256 or P-384), `NAME.ca.pem` (one or
    /// more PEM CA certificates, the anchors of entry NAME), and beside a CA entry an optional
    /// `NAME.identity` (one accepted subjectAltName per line — email, URI or DNS name, exact match;
    /// `#` comment lines and blank lines ignored: the leaf must carry one of them). Names:
    /// `[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?`. Hidden files and directories (a ConfigMap mount's
    /// `..data`, `..2026_…`) are skipped; symlinks are followed (a ConfigMap's files are symlinks
    /// into `..data`). A file that does not parse, an unknown suffix, an identity without its CA,
    /// or two kinds for one name make that entry (or that file) unusable and are reported in
    /// [`TrustSet::problems`], never an error for the others. A missing directory is an empty set.
    /// Each file is read up to 1 MiB, and at most 1000 files.
    pub fn load(dir: &Path) -> TrustSet {
        let mut set = TrustSet::default();
        let read_dir = match std::fs::read_dir(dir) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return set,
            Err(e) => {
                set.problems.push(format!("directory {}: {e}", dir.display()));
                return set;
            }
        };
        let mut names = Vec::new();
        for dirent in read_dir {
            let file = match dirent {
                Ok(d) => d.file_name().to_string_lossy().into_owned(),
                Err(e) => {
                    set.problems.push(format!("directory {}: {e}", dir.display()));
                    break;
                }
            };
            if file.starts_with('.') {
                continue;
            }
            if names.len() == MAX_FILES {
                set.problems
                    .push(format!("directory {}: more than {MAX_FILES} files; the rest were not read", dir.display()));
                break;
            }
            names.push(file);
        }
        names.sort();
        // name → each kind's bytes; names one of whose files could not be read.
        let mut files: BTreeMap<String, BTreeMap<Kind, Vec<u8>>> = BTreeMap::new();
        let mut broken = Vec::new();
        for file in names {
            let Some((name, kind)) = SUFFIXES.iter().find_map(|(s, k)| Some((file.strip_suffix(s)?, *k))) else {
                set.problems.push(format!("file {file}: not NAME.pub, NAME.ca.pem or NAME.identity; ignored"));
                continue;
            };
            if !valid_name(name) {
                set.problems.push(format!(
                    "file {file}: entry name {name:?} is not lowercase letters, digits and '-' (at most 63, \
                     starting and ending with a letter or digit); ignored"
                ));
                continue;
            }
            match read_bounded(&dir.join(&file)) {
                Ok(bytes) => {
                    files.entry(name.to_string()).or_default().insert(kind, bytes);
                }
                Err(why) => {
                    set.problems.push(format!("file {file}: {why}; entry {name} is not loaded"));
                    broken.push(name.to_string());
                }
            }
        }
        for (name, kinds) in files {
            if broken.contains(&name) {
                continue;
            }
            match entry(&name, &kinds) {
                Ok(e) => {
                    set.entries.insert(name, e);
                }
                Err(problem) => set.problems.push(problem),
            }
        }
        set
    }

    /// The usable entries' names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    /// What could not be loaded, each as "file X: why" (or "entry N: why", "directory D: why").
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// Is `name` a usable entry?
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// A line saying what entry `name` trusts, e.g. "ECDSA P-256 key sha256:…" or
    /// "CA (2 certificates: CN=…; CN=…), identities a@b".
    pub fn describe(&self, name: &str) -> Option<String> {
        Some(match self.entries.get(name)? {
            Entry::Key(k) => format!("ECDSA {} key sha256:{}", k.curve(), k.hint()),
            Entry::Ca(ca) => {
                let n = ca.anchors.len();
                let plural = if n == 1 { "" } else { "s" };
                let who = match &ca.identities {
                    Some(ids) => format!("identities {}", ids.join(", ")),
                    None => "any identity".into(),
                };
                format!("CA ({n} certificate{plural}: {}), {who}", ca.subjects.join("; "))
            }
        })
    }

    pub(crate) fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }
}

/// `[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?`
fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&b.len()) && alnum(&b[0]) && alnum(&b[b.len() - 1]) && b.iter().all(|c| alnum(c) || *c == b'-')
}

/// A regular file's bytes, up to [`MAX_FILE_BYTES`]; opened without blocking (a FIFO in its
/// place would block a plain open) and judged by the descriptor read.
fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("larger than {} KiB", MAX_FILE_BYTES >> 10));
    }
    Ok(bytes)
}

/// Entry `name` of its files, or the problem that makes it unusable.
fn entry(name: &str, kinds: &BTreeMap<Kind, Vec<u8>>) -> Result<Entry, String> {
    let (key, ca, identity) = (kinds.get(&Kind::Key), kinds.get(&Kind::Ca), kinds.get(&Kind::Identity));
    if key.is_some() && ca.is_some() {
        return Err(format!("entry {name}: both {name}.pub and {name}.ca.pem; an entry is a key or a CA, keep one"));
    }
    if identity.is_some() && ca.is_none() {
        let not = if key.is_some() { format!("; entry {name} is not loaded") } else { String::new() };
        return Err(format!(
            "file {name}.identity: no {name}.ca.pem beside it (identities pin the certificates of a CA entry){not}"
        ));
    }
    if let Some(pem) = key {
        return PublicKey::from_pem(pem).map(Entry::Key).map_err(|why| format!("file {name}.pub: {why}"));
    }
    let Some(pem) = ca else {
        return Err(format!("entry {name}: no key or CA"));
    };
    let identities = match identity {
        None => None,
        Some(text) => {
            Some(identities(text).map_err(|why| format!("file {name}.identity: {why}; entry {name} is not loaded"))?)
        }
    };
    let (anchors, subjects) = cas(pem).map_err(|why| format!("file {name}.ca.pem: {why}"))?;
    Ok(Entry::Ca(Ca { anchors, subjects, identities }))
}

/// The lines of an identity file that name an identity.
fn identities(text: &[u8]) -> Result<Vec<String>, String> {
    let text = std::str::from_utf8(text).map_err(|_| "not UTF-8 text".to_string())?;
    let ids: Vec<String> =
        text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect();
    if ids.is_empty() {
        return Err("lists no identity (a leaf could match none); remove the file to accept any".into());
    }
    Ok(ids)
}

/// The anchors (and subjects) of a CA file's certificates.
fn cas(pem: &[u8]) -> Result<(Vec<TrustAnchor<'static>>, Vec<String>), String> {
    use x509_cert::der::Decode as _;
    let blocks = pem_blocks(pem)?;
    if blocks.is_empty() {
        return Err("no PEM CERTIFICATE block".into());
    }
    if blocks.len() > MAX_CAS {
        return Err(format!("{} certificates, more than the {MAX_CAS} read", blocks.len()));
    }
    let mut anchors = Vec::new();
    let mut subjects = Vec::new();
    for (i, (label, der)) in blocks.iter().enumerate() {
        if label != "CERTIFICATE" {
            return Err(format!("block {} is a PEM {label}, not a CERTIFICATE", i + 1));
        }
        let cert = x509_cert::Certificate::from_der(der).map_err(|e| format!("certificate {}: {e}", i + 1))?;
        let der = CertificateDer::from(der.as_slice());
        let anchor = webpki::anchor_from_trusted_cert(&der).map_err(|e| format!("certificate {}: {e}", i + 1))?;
        anchors.push(anchor.to_owned());
        subjects.push(cert.tbs_certificate.subject.to_string());
    }
    Ok((anchors, subjects))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        for ok in ["a", "a1", "team-a", &"a".repeat(63)] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn identity_files_skip_comments_and_refuse_an_empty_list() {
        assert_eq!(identities(b"# who\n\n a@b \nhttps://x/y#frag\n").unwrap(), ["a@b", "https://x/y#frag"]);
        assert!(identities(b"# none\n\n").unwrap_err().contains("no identity"));
        assert!(identities(&[0xff]).is_err());
    }

    #[test]
    fn an_unreadable_or_huge_file_is_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big.pub"), vec![b'x'; MAX_FILE_BYTES as usize + 1]).unwrap();
        std::fs::create_dir(dir.path().join("sub.pub")).unwrap();
        nix::unistd::mkfifo(&dir.path().join("fifo.pub"), nix::sys::stat::Mode::S_IRUSR).unwrap();
        let set = TrustSet::load(dir.path());
        assert!(set.names().is_empty());
        let p = set.problems().join("\n");
        assert!(p.contains("file big.pub: larger than 1024 KiB"), "{p}");
        assert!(p.contains("file sub.pub: not a regular file"), "{p}");
        assert!(p.contains("file fifo.pub: not a regular file"), "{p}");
    }
}
