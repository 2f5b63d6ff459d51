//! What the kernel has mounted, from `/proc/self/mountinfo` (proc(5)).
//!
//! Every operation checks this before acting ("same source already at the target: OK;
//! different source: AlreadyExists"), and the daemon reconciles its state files against it at
//! start, so the parser must be exact: octal escapes in paths (`\040` for a space), optional
//! fields of any number up to the `-` separator, and the topmost mount winning when several are
//! stacked on one path.
//!
//! The table is bytes, not text: the kernel escapes only space, tab, newline and backslash, so a
//! path holds any other byte as it is, UTF-8 or not (a pod that renames a directory holding
//! mounts inside its volume to `$'\xff'` puts one there). Paths stay byte-exact; the other fields
//! are decoded lossily, since nothing compares them to paths.

use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
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
    /// The line (decoded lossily).
    pub text: String,
}

/// Parse the bytes of a mountinfo file.
pub fn parse(text: &[u8]) -> Result<Vec<MountEntry>, ParseError> {
    lines(text).map(|(i, l)| parse_line(l).ok_or_else(|| malformed(i, l))).collect()
}

/// The non-blank lines of `text`, each with its 1-based number.
fn lines(text: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    text.split(|&b| b == b'\n').enumerate().map(|(i, l)| (i + 1, l)).filter(|(_, l)| !l.trim_ascii().is_empty())
}

/// The space-separated fields of `s`.
fn fields(s: &[u8]) -> impl Iterator<Item = &[u8]> {
    s.split(|&b| b == b' ')
}

fn malformed(line: usize, text: &[u8]) -> ParseError {
    ParseError { line, text: String::from_utf8_lossy(text).into_owned() }
}

fn parse_line(line: &[u8]) -> Option<MountEntry> {
    // The first " - " ends the optional fields: paths before it have their spaces escaped.
    let sep = line.windows(3).position(|w| w == b" - ")?;
    let (head, tail) = (&line[..sep], &line[sep + 3..]);
    let mut h = fields(head);
    let mount_id = std::str::from_utf8(h.next()?).ok()?.parse().ok()?;
    let parent_id = std::str::from_utf8(h.next()?).ok()?.parse().ok()?;
    let device = lossy(h.next()?);
    let root = path(h.next()?).into_owned();
    let mount_point = path(h.next()?).into_owned();
    // The kernel writes mount points from the reader's root; the root field may be another
    // kind of name (`net:[4026531840]` for a namespace file).
    if !mount_point.is_absolute() {
        return None;
    }
    let mount_options = lossy(h.next()?);
    // The rest of `head` are optional fields (shared:N, master:N, ...), zero or more.
    let mut t = fields(tail);
    let fstype = lossy(&unescape(t.next()?));
    let source = lossy(&unescape(t.next()?));
    let super_options = t.next().map(lossy).unwrap_or_default();
    Some(MountEntry { mount_id, parent_id, device, root, mount_point, mount_options, fstype, source, super_options })
}

/// A text field that no path is compared to: invalid UTF-8 becomes U+FFFD.
fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A path field, unescaped, byte for byte (borrowed when it holds no escape).
fn path(field: &[u8]) -> Cow<'_, Path> {
    match unescape(field) {
        Cow::Borrowed(b) => Cow::Borrowed(Path::new(OsStr::from_bytes(b))),
        Cow::Owned(b) => Cow::Owned(PathBuf::from(OsString::from_vec(b))),
    }
}

/// Undo the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash):
/// each yields one raw byte. Anything else, `\400` and up included, stays as it is.
fn unescape(s: &[u8]) -> Cow<'_, [u8]> {
    if !s.contains(&b'\\') {
        return Cow::Borrowed(s);
    }
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s.get(i..i + 4) {
            Some(&[b'\\', a @ b'0'..=b'3', b @ b'0'..=b'7', c @ b'0'..=b'7']) => {
                out.push((a - b'0') * 64 + (b - b'0') * 8 + (c - b'0'));
                i += 4;
            }
            _ => {
                out.push(s[i]);
                i += 1;
            }
        }
    }
    Cow::Owned(out)
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
    // Bytes, never a `String`: one mount point that is not UTF-8 must not hide the whole table.
    parse_where(&buf, keep).map_err(std::io::Error::other)
}

/// [`parse`], keeping only the entries whose mount point `keep` accepts.
pub fn parse_where(text: &[u8], keep: impl Fn(&Path) -> bool) -> Result<Vec<MountEntry>, ParseError> {
    let mut out = Vec::new();
    for (i, l) in lines(text) {
        let point = fields(l).nth(4).ok_or_else(|| malformed(i, l))?;
        if keep(&path(point)) {
            out.push(parse_line(l).ok_or_else(|| malformed(i, l))?);
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

    /// Found by the `mountinfo` fuzz target (host/fuzz): a relative mount point (here `:4`) was
    /// accepted, which no kernel writes and no absolute path can be compared to.
    #[test]
    fn a_relative_mount_point_is_malformed_and_another_root_name_is_not() {
        let err = parse(b"1 2 3:4 /+/ :4 /+/ - x y v-\n").unwrap_err();
        assert_eq!(err.line, 1);
        let ns = parse(b"40 22 0:4 net:[4026531840] /run/netns/a rw - nsfs nsfs rw\n").unwrap();
        assert_eq!(ns[0].root, Path::new("net:[4026531840]"));
        assert_eq!(ns[0].mount_point, Path::new("/run/netns/a"));
    }

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
36 22 0:31 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv\\0401/mount rw,nosuid master:3 shared:7 - tmpfs tmpfs rw,size=1024k
37 22 0:45 / /mnt/weed ro - fuse.seaweedfs 127.0.0.1:8888:/buckets/v1 rw,user_id=0,group_id=0
38 22 0:31 /sub /mnt/bound rw - tmpfs tmpfs rw
39 22 0:50 / /mnt/weed rw - tmpfs tmpfs rw
";

    #[test]
    fn parses_optional_fields_and_escapes() {
        let e = parse(SAMPLE.as_bytes()).unwrap();
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
        let e = parse(SAMPLE.as_bytes()).unwrap();
        assert_eq!(at(&e, Path::new("/mnt/weed")).unwrap().mount_id, 39);
        assert!(at(&e, Path::new("/mnt")).is_none());
    }

    #[test]
    fn malformed_lines_are_errors() {
        let err = parse(b"22 1 8:1 / / rw\n").unwrap_err();
        assert_eq!(err.line, 1);
        assert!(parse(b"x 1 8:1 / / rw - ext4 /dev/sda1 rw").is_err());
    }

    #[test]
    fn unescape_handles_edges() {
        assert_eq!(&*unescape(b"a\\134b"), b"a\\b");
        assert_eq!(&*unescape(b"tail\\04"), b"tail\\04");
        assert_eq!(&*unescape(b"\\011\\012"), b"\t\n");
        // Each escape is one raw byte, even one that is not UTF-8; past `\377` is no escape.
        assert_eq!(&*unescape(b"\\377\\400"), b"\xff\\400");
    }

    #[test]
    fn paths_that_are_not_utf8_parse_byte_for_byte() {
        // A root and a mount point holding a raw 0xff next to an escaped space, amid other lines.
        let line = b"40 22 0:31 /r\xff\\040x /mnt/a\xff\\040b rw shared:9 - tmpfs tmpfs rw\n";
        let table = [SAMPLE.as_bytes(), line].concat();
        let e = parse(&table).unwrap();
        assert_eq!(e.len(), 6, "every other line still parses");
        assert_eq!(e[1].mount_point, PathBuf::from("/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv 1/mount"));
        assert_eq!(e[5].mount_point.as_os_str().as_bytes(), b"/mnt/a\xff b");
        assert_eq!(e[5].root.as_os_str().as_bytes(), b"/r\xff x");
        assert_eq!((e[5].mount_id, e[5].fstype.as_str()), (40, "tmpfs"));
        // The pre-filter sees the same exact bytes.
        let kept = parse_where(&table, |p| p.as_os_str().as_bytes() == b"/mnt/a\xff b").unwrap();
        assert_eq!(kept, [e[5].clone()]);
        assert_eq!(parse_where(&table, |p| p == Path::new("/mnt/weed")).unwrap().len(), 2);
    }

    #[test]
    fn reads_this_process_table() {
        let e = read().unwrap();
        assert!(e.iter().any(|m| m.mount_point == Path::new("/")), "the root is mounted");
    }
}
