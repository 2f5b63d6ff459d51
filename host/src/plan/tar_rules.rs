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

/// Media types of OCI image layers and Docker image layers: changesets applied in order, whose
/// whiteouts (`.wh.<name>`, `.wh..wh..opq`) delete what lower layers put there, and whose
/// entries keep their owners and modes. The host lays out a blob fetched under one of these
/// types as an image layer (`exec::artifacts` eagerly, `oci::table` lazily), whatever step
/// unpacks it; a blob of any other type (a ModelPack layer) is a plain archive of files.
pub const IMAGE_LAYER_TYPES: [&str; 5] = [
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
];

/// A whiteout's prefix: `.wh.<name>` deletes `<name>` of the lower layers.
pub const WHITEOUT_PREFIX: &str = ".wh.";
/// The opaque marker: the directory holding it hides everything lower layers put in it.
pub const OPAQUE_MARKER: &str = ".wh..wh..opq";

/// Whether a blob fetched under `media_type` is an image layer ([`IMAGE_LAYER_TYPES`]).
pub fn image_layer(media_type: &str) -> bool {
    IMAGE_LAYER_TYPES.contains(&media_type)
}

/// How the host lays out a tar blob: a plain archive of files (ModelPack layers: links kept
/// inside the tree, devices refused, files 0444 root), or an image layer (whiteouts, owners
/// and modes kept, devices skipped). Decided by the media type the plan fetched the blob under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layering {
    /// A plain archive of files.
    #[default]
    Files,
    /// An image layer ([`IMAGE_LAYER_TYPES`]).
    Image,
}

impl Layering {
    /// The layering of a blob fetched under `media_type`.
    pub fn of(media_type: &str) -> Layering {
        if image_layer(media_type) { Layering::Image } else { Layering::Files }
    }

    /// A plain archive (the default, not written in records).
    pub fn is_files(&self) -> bool {
        *self == Layering::Files
    }
}

/// What an image layer's entry named `name` (one path component) is: a whiteout of another
/// name, the opaque marker, or an ordinary entry. Other names starting with `.wh..wh.` are
/// reserved by the image spec and are markers of nothing: [`Whiteout::Reserved`]; so are
/// `.wh.`, `.wh..` and `.wh...`, which would hide no name, `.` or `..` (the directory itself or
/// its parent: never a lower layer's entry).
pub fn whiteout(name: &[u8]) -> Whiteout<'_> {
    if name == OPAQUE_MARKER.as_bytes() {
        Whiteout::Opaque
    } else if name.starts_with(b".wh..wh.") {
        Whiteout::Reserved
    } else if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
        if hidden.is_empty() || hidden == b"." || hidden == b".." || hidden.contains(&b'/') {
            Whiteout::Reserved
        } else {
            Whiteout::Hides(hidden)
        }
    } else {
        Whiteout::No
    }
}

/// Whether an image layer's entry at `path` lies below a marker: a directory component (not
/// the last) that starts with `.wh.`. Such entries are left out by both readers (eager and
/// lazy): a marker is a file, never a directory of the image.
pub fn below_marker(path: &std::path::Path) -> bool {
    let mut parts: Vec<&[u8]> = path.iter().map(|c| c.as_encoded_bytes()).collect();
    parts.pop();
    parts.iter().any(|c| c.starts_with(WHITEOUT_PREFIX.as_bytes()))
}

/// See [`whiteout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whiteout<'a> {
    /// An ordinary entry.
    No,
    /// `.wh.<name>`: deletes `<name>` (file, link or whole directory) of the lower layers.
    Hides(&'a [u8]),
    /// `.wh..wh..opq`: its directory hides every entry of the lower layers.
    Opaque,
    /// Another `.wh..wh.` name: ignored.
    Reserved,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whiteouts_are_read_by_name() {
        assert_eq!(whiteout(b".wh.config.json"), Whiteout::Hides(b"config.json"));
        assert_eq!(whiteout(b".wh..wh..opq"), Whiteout::Opaque);
        assert_eq!(whiteout(b".wh..wh.plnk"), Whiteout::Reserved);
        assert_eq!(whiteout(b".wh."), Whiteout::Reserved);
        assert_eq!(whiteout(b".wh.."), Whiteout::Reserved, "it would hide `.`");
        assert_eq!(whiteout(b".wh..."), Whiteout::Reserved, "it would hide `..`");
        assert_eq!(whiteout(b".wh...."), Whiteout::Hides(b"..."));
        assert!(below_marker(std::path::Path::new("models/.wh.a/b")));
        assert!(below_marker(std::path::Path::new(".wh..wh..implicit/x")));
        assert!(!below_marker(std::path::Path::new("models/.wh.a")));
        assert!(!below_marker(std::path::Path::new("models/a.wh.b/c")));
        assert_eq!(whiteout(b"model.wh.x"), Whiteout::No);
        assert!(image_layer("application/vnd.docker.image.rootfs.diff.tar.gzip"));
        assert!(!image_layer("application/vnd.cncf.model.weight.v1.tar"));
        assert!(!image_layer("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"));
    }
}
