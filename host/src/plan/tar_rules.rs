//! What a layer's tar entries may be, for the host's unpacking (`exec::artifacts`) and for the
//! file tables of lazy volumes (`oci::table`) alike: relative paths of plain components, and
//! symbolic links that stay inside the tree.

use std::path::{Component, Path, PathBuf};

/// `raw` as a relative path of normal components (`.` dropped), or why not.
pub fn clean(raw: &Path) -> Result<PathBuf, &'static str> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err("its path contains `..`"),
            Component::RootDir | Component::Prefix(_) => return Err("its path is absolute"),
        }
    }
    Ok(out)
}

/// A symbolic link at `at` (relative to the tree) may point to `target` only if it stays in the
/// tree: relative, with `..` only at its start, and no more of them than `at` is deep. Every
/// other link in the tree obeys the same rule, so following any chain of them never leaves it.
pub fn check_link_target(at: &Path, target: &Path) -> Result<(), String> {
    if target.as_os_str().is_empty() {
        return Err("the symbolic link has an empty target".into());
    }
    let depth = at.components().count().saturating_sub(1);
    let mut ups = 0;
    let mut named = false;
    for c in target.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!("its symbolic link target {} is absolute", target.display()));
            }
            Component::ParentDir if named => {
                return Err(format!("its symbolic link target {} uses `..` after a name", target.display()));
            }
            Component::ParentDir => ups += 1,
            Component::CurDir => {}
            Component::Normal(_) => named = true,
        }
    }
    if ups > depth {
        return Err(format!("its symbolic link target {} points outside the archive", target.display()));
    }
    Ok(())
}
