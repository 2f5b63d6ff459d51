//! What the lazy server of a container image's volume is sent (issue 45, docs/lazy.md): not each
//! layer's entries in turn, as for a model's layers, but the layers merged as the image spec
//! applies them ([`crate::oci::merge_image_layers`]): each path once, whiteouts applied, owners
//! and modes, and only what the layers above the highest one still pending leave to show. Each
//! time a pending layer becomes known the merge is made again, reaching further down, and the
//! server adds what it lacks.

use crate::oci::{BlobTable, MergeLayer, Owner, TableEntry, TableKind, merge_image_layers};
use crate::plan::Archive;
use crate::unpriv::lazy_wire::{Data, FileEntry, Kind};

/// How the server finds an entry's bytes: in layer `layer`'s blob (a raw or tar layer), or in
/// its unpacked tree (a compressed layer).
pub(super) fn wire_kind(layer: u32, format: Archive, e: &TableEntry) -> Kind {
    match &e.kind {
        TableKind::Dir => Kind::Dir,
        TableKind::Symlink { target } => Kind::Symlink { target: target.clone() },
        TableKind::File { size, offset } => {
            let data = match format {
                Archive::TarGzip | Archive::TarZstd => Data::Tree { layer, rel: e.path.clone() },
                Archive::Raw | Archive::Tar => Data::Blob { layer, offset: *offset },
            };
            Kind::File { size: *size, data }
        }
    }
}

/// The table an image's server serves: `layers` (each layer's format and the directory its
/// entries go below) merged, with `tables[k]` the table of layer `k`, `None` while it is
/// pending (nothing below the highest such layer is served yet).
pub(super) fn image_files(layers: &[(Archive, &str)], tables: &[Option<BlobTable>]) -> Vec<FileEntry> {
    let merge: Vec<MergeLayer<'_>> =
        layers.iter().zip(tables).map(|((_, dest), table)| MergeLayer { table: table.as_ref(), dest }).collect();
    merge_image_layers(&merge)
        .into_iter()
        .map(|m| match m.from {
            // The root, or a directory of no entry: 0755, root's, until a layer gives it one.
            None => FileEntry {
                path: m.path,
                kind: Kind::Dir,
                mtime: m.mtime,
                owner: Some(Owner::DIR),
                open: m.open,
                inode: None,
            },
            Some((k, e)) => FileEntry {
                path: m.path,
                kind: wire_kind(k as u32, layers[k].0, e),
                mtime: e.mtime,
                owner: e.owner,
                open: m.open,
                // A hard link names its target's data: the same inode.
                inode: match e.kind {
                    TableKind::File { offset, .. } if e.owner.is_some() => Some(offset),
                    _ => None,
                },
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(path: &str, kind: TableKind, owner: Option<Owner>) -> TableEntry {
        TableEntry { path: path.into(), kind, mtime: 3, owner }
    }

    /// The server's table of an image: a tar layer's files read from its blob at their
    /// offsets, a compressed one's from its tree, directories of no entry 0755 and root's, and
    /// only the layers above the pending one.
    #[test]
    fn an_images_server_gets_the_merged_layers_with_where_their_bytes_are() {
        let user = Some(Owner { uid: 1000, gid: 1000, mode: 0o640 });
        let gz = BlobTable {
            verified: true,
            entries: vec![e("app/w.bin", TableKind::File { size: 9, offset: 0 }, user)],
            whiteouts: Vec::new(),
        };
        let tar = BlobTable {
            verified: false,
            entries: vec![e("app/c.json", TableKind::File { size: 2, offset: 1536 }, user)],
            whiteouts: Vec::new(),
        };
        let shape = [(Archive::TarGzip, ""), (Archive::TarZstd, ""), (Archive::Tar, "")];
        let files = image_files(&shape, &[Some(gz.clone()), Some(tar.clone()), None]);
        assert_eq!(files.len(), 1, "the top layer pending: the root only, open");
        assert!(files[0].path.is_empty() && files[0].open && files[0].owner == Some(Owner::DIR));
        let files = image_files(&shape, &[Some(gz), None, Some(tar.clone())]);
        let paths: Vec<(&str, bool)> = files.iter().map(|f| (f.path.as_str(), f.open)).collect();
        assert_eq!(paths, [("", true), ("app", true), ("app/c.json", false)]);
        assert_eq!(files[2].kind, Kind::File { size: 2, data: Data::Blob { layer: 2, offset: 1536 } });
        assert_eq!(files[2].inode, Some(1536), "where its data is: hard links share it");
        assert_eq!((files[1].kind.clone(), files[1].owner), (Kind::Dir, Some(Owner::DIR)));
        let files = image_files(&shape[..2], &[Some(BlobTable { whiteouts: Vec::new(), ..tar.clone() }), Some(tar)]);
        assert!(files.iter().all(|f| !f.open), "nothing pending");
        let gz_only = BlobTable {
            verified: true,
            entries: vec![e("w.bin", TableKind::File { size: 9, offset: 0 }, user)],
            whiteouts: Vec::new(),
        };
        let files = image_files(&[(Archive::TarGzip, "sub")], &[Some(gz_only)]);
        assert_eq!(files[2].path, "sub/w.bin");
        assert_eq!(files[2].kind, Kind::File { size: 9, data: Data::Tree { layer: 0, rel: "w.bin".into() } });
        assert_eq!(files[2].owner, user);
    }
}
