//! What the kernel has mounted, from `/proc/self/mountinfo` (proc(5)).
//!
//! Every operation checks this before acting ("same source already at the target: OK;
//! different source: AlreadyExists"), and the daemon reconciles its state files against it at
//! start, so the parser must be exact: octal escapes in paths (`\040` for a space), optional
//! fields of any number up to the `-` separator, and the topmost mount winning when several are
//! stacked on one path.

use std::path::{Path, PathBuf};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Unique id of the mount.
    pub mount_id: u32,
    /// Id of the parent mount.
    pub parent_id: u32,
    /// `major:minor` of the filesystem's device.
    pub device: String,
    /// The path inside the filesystem that is mounted (differs from `/` for bind mounts).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`, `ro`, `nosuid`, ...).
    pub mount_options: String,
    /// Filesystem type, e.g. `tmpfs` or `fuse.seaweedfs`.
    pub fstype: String,
    /// The mount source (device, or a name such as `tmpfs`).
    pub source: String,
    /// Per-superblock options.
    pub super_options: String,
}

impl MountEntry {
    /// True if the mount is read-only.
    pub fn is_readonly(&self) -> bool {
        self.mount_options.split(',').any(|o| o == "ro")
    }
}

/// A line that does not follow proc(5).
#[derive(Debug, thiserror::Error)]
#[error("malformed mountinfo line {line}: {text:?}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// The line.
    pub text: String,
}

/// Parse the text of a mountinfo file.
pub fn parse(text: &str) -> Result<Vec<MountEntry>, ParseError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| parse_line(l).ok_or_else(|| ParseError { line: i + 1, text: l.to_string() }))
        .collect()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    let (head, tail) = line.split_once(" - ")?;
    let mut h = head.split(' ');
    let mount_id = h.next()?.parse().ok()?;
    let parent_id = h.next()?.parse().ok()?;
    let device = h.next()?.to_string();
    let root = PathBuf::from(unescape(h.next()?));
    let mount_point = PathBuf::from(unescape(h.next()?));
    let mount_options = h.next()?.to_string();
    // The rest of `head` are optional fields (shared:N, master:N, ...), zero or more.
    let mut t = tail.split(' ');
    let fstype = unescape(t.next()?);
    let source = unescape(t.next()?);
    let super_options = t.next().unwrap_or_default().to_string();
    Some(MountEntry { mount_id, parent_id, device, root, mount_point, mount_options, fstype, source, super_options })
}

/// Undo the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash).
fn unescape(s: &str) -> String {
    if !s.contains('\\') {
        return s.to_string();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Read this process's mount table.
pub fn read() -> std::io::Result<Vec<MountEntry>> {
    read_where(|_| true)
}

/// Read the entries whose mount point `keep` accepts; the others are skipped before they are
/// parsed (a node with thousands of pod mounts costs an operation only the lines it needs).
pub fn read_where(keep: impl Fn(&Path) -> bool) -> std::io::Result<Vec<MountEntry>> {
    use std::io::Read;
    // A proc file reports no size: read it in large chunks, not the growing small reads a size
    // hint of zero would give (each one makes the kernel walk the table again).
    let mut f = std::fs::File::open("/proc/self/mountinfo")?;
    let mut buf = Vec::with_capacity(64 << 10);
    loop {
        buf.reserve(64 << 10);
        let spare = buf.spare_capacity_mut().len();
        let n = f.by_ref().take(spare as u64).read_to_end(&mut buf)?;
        if n == 0 {
            break;
        }
    }
    let text = String::from_utf8(buf).map_err(std::io::Error::other)?;
    parse_where(&text, keep).map_err(std::io::Error::other)
}

/// [`parse`], keeping only the entries whose mount point `keep` accepts.
pub fn parse_where(text: &str, keep: impl Fn(&Path) -> bool) -> Result<Vec<MountEntry>, ParseError> {
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = || ParseError { line: i + 1, text: l.to_string() };
        let point = l.split(' ').nth(4).ok_or_else(bad)?;
        let point = if point.contains('\\') { PathBuf::from(unescape(point)) } else { PathBuf::from(point) };
        if keep(&point) {
            out.push(parse_line(l).ok_or_else(bad)?);
        }
    }
    Ok(out)
}

/// The topmost mount at exactly `path` (the last one listed there), if any.
pub fn at<'a>(entries: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    entries.iter().rev().find(|e| e.mount_point == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
36 22 0:31 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv\\0401/mount rw,nosuid master:3 shared:7 - tmpfs tmpfs rw,size=1024k
37 22 0:45 / /mnt/weed ro - fuse.seaweedfs 127.0.0.1:8888:/buckets/v1 rw,user_id=0,group_id=0
38 22 0:31 /sub /mnt/bound rw - tmpfs tmpfs rw
39 22 0:50 / /mnt/weed rw - tmpfs tmpfs rw
";

    #[test]
    fn parses_optional_fields_and_escapes() {
        let e = parse(SAMPLE).unwrap();
        assert_eq!(e.len(), 5);
        assert_eq!(e[1].mount_point, PathBuf::from("/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv 1/mount"));
        assert_eq!((e[1].fstype.as_str(), e[1].source.as_str()), ("tmpfs", "tmpfs"));
        assert_eq!(e[1].super_options, "rw,size=1024k");
        assert_eq!(e[2].fstype, "fuse.seaweedfs");
        assert!(e[2].is_readonly() && !e[1].is_readonly());
        assert_eq!(e[3].root, PathBuf::from("/sub"));
    }

    #[test]
    fn the_topmost_mount_wins() {
        let e = parse(SAMPLE).unwrap();
        assert_eq!(at(&e, Path::new("/mnt/weed")).unwrap().mount_id, 39);
        assert!(at(&e, Path::new("/mnt")).is_none());
    }

    #[test]
    fn malformed_lines_are_errors() {
        let err = parse("22 1 8:1 / / rw\n").unwrap_err();
        assert_eq!(err.line, 1);
        assert!(parse("x 1 8:1 / / rw - ext4 /dev/sda1 rw").is_err());
    }

    #[test]
    fn unescape_handles_edges() {
        assert_eq!(unescape("a\\134b"), "a\\b");
        assert_eq!(unescape("tail\\04"), "tail\\04");
        assert_eq!(unescape("\\011\\012"), "\t\n");
    }

    #[test]
    fn reads_this_process_table() {
        let e = read().unwrap();
        assert!(e.iter().any(|m| m.mount_point == Path::new("/")), "the root is mounted");
    }
}
