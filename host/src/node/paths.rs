//! Where staging and target paths may point.
//!
//! The host is configured with kubelet's root directory and its own state directory; every
//! path a CSI request names must lie strictly inside one of them. Paths are checked
//! lexically (absolute, no NUL, no `.`/`..`/empty components, bounded length) and then walked
//! from the root down with `lstat`, refusing any component that is a symlink, so a link
//! planted inside kubelet's tree cannot redirect a mount elsewhere on the node.

use std::io;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// Longest path accepted (PATH_MAX).
pub const MAX_PATH: usize = 4096;

/// The directories requests may name paths inside.
#[derive(Debug, Clone)]
pub struct Roots {
    roots: Vec<PathBuf>,
}

impl Roots {
    /// Paths must be inside one of `roots` (each made canonical when it exists, so a node whose
    /// `/var/lib/kubelet` is itself a link still works).
    pub fn new(roots: impl IntoIterator<Item = PathBuf>) -> Self {
        let roots = roots.into_iter().map(|r| std::fs::canonicalize(&r).unwrap_or(r)).collect();
        Roots { roots }
    }

    /// The roots, for messages.
    pub fn describe(&self) -> String {
        self.roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(" or ")
    }

    /// Check `raw`, the value of request field `field`, and return it as a path.
    pub fn check(&self, field: &str, raw: &str) -> Result<PathBuf, Error> {
        let path = lexical(field, raw)?;
        let root = self.roots.iter().find(|r| path.starts_with(r) && path != **r).ok_or_else(|| {
            Error::invalid(format!("{field} {raw:?} is outside the directories this host serves ({})", self.describe()))
        })?;
        no_symlinks(field, root, &path)?;
        Ok(path)
    }
}

/// The lexical rules, without touching the filesystem.
pub fn lexical(field: &str, raw: &str) -> Result<PathBuf, Error> {
    let bad = |why: &str| Error::invalid(format!("{field} {}: {why}", shown(raw)));
    if raw.is_empty() {
        return Err(Error::invalid(format!("{field} is required")));
    }
    if raw.len() > MAX_PATH {
        return Err(bad(&format!("{} bytes; at most {MAX_PATH} are allowed", raw.len())));
    }
    if raw.contains('\0') {
        return Err(bad("contains a NUL byte"));
    }
    if !raw.starts_with('/') {
        return Err(bad("must be an absolute path"));
    }
    for component in raw[1..].split('/') {
        match component {
            "" => return Err(bad("has an empty component (// or a trailing /)")),
            "." | ".." => return Err(bad("must not contain . or .. components")),
            _ => {}
        }
    }
    Ok(PathBuf::from(raw))
}

/// A value for a message: long values are cut, control characters escaped.
pub fn shown(raw: &str) -> String {
    let cut: String = raw.chars().take(160).collect();
    if cut.len() < raw.len() { format!("{:?}... ({} bytes)", cut, raw.len()) } else { format!("{cut:?}") }
}

fn no_symlinks(field: &str, root: &Path, path: &Path) -> Result<(), Error> {
    let rel = path.strip_prefix(root).expect("checked by the caller");
    let mut at = root.to_path_buf();
    for component in rel.components() {
        at.push(component);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(Error::invalid(format!(
                    "{field} {}: {} is a symbolic link; paths are resolved without following links",
                    shown(&path.display().to_string()),
                    at.display()
                )));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            // A dead FUSE mount answers ENOTCONN: it exists and is no link.
            Err(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn lexical_rules() {
        for bad in ["", "relative/x", "/a/../b", "/a/./b", "/a//b", "/a/b/", "/a/\0b"] {
            let e = lexical("target_path", bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{bad:?}");
            assert!(e.message.starts_with("target_path"), "{}", e.message);
        }
        assert!(lexical("t", &format!("/{}", "a".repeat(5000))).unwrap_err().message.contains("at most 4096"));
        assert_eq!(lexical("t", "/var/lib/kubelet/x").unwrap(), PathBuf::from("/var/lib/kubelet/x"));
    }

    #[test]
    fn confined_to_roots_and_no_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kubelet");
        std::fs::create_dir_all(root.join("pods/u")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("pods/evil")).unwrap();
        let roots = Roots::new([root.clone()]);
        let root = std::fs::canonicalize(&root).unwrap();
        let ok = root.join("pods/u/volumes/x/mount");
        assert_eq!(roots.check("target_path", ok.to_str().unwrap()).unwrap(), ok);
        let e = roots.check("target_path", "/etc/passwd").unwrap_err();
        assert!(e.message.contains("outside the directories"), "{}", e.message);
        let e = roots.check("target_path", root.to_str().unwrap()).unwrap_err();
        assert!(e.message.contains("outside"), "the root itself is refused: {}", e.message);
        let e = roots.check("target_path", root.join("pods/evil/mount").to_str().unwrap()).unwrap_err();
        assert!(e.message.contains("symbolic link"), "{}", e.message);
    }
}
