//! A tar layer as a registry could serve it, read the way a lazy volume reads it (its headers
//! only, `oci/table.rs`) and unpacked the way an eager volume is (`exec/artifacts/unpack.rs`):
//! what the table accepts it accepts with relative plain paths and file extents inside the blob;
//! when both accept, the lazy volume serves exactly what the eager one holds (every file's bytes
//! are the blob's bytes at the extent the table gives, every link its target, every directory a
//! directory, and nothing the unpack made is missing from the table); what unpacking refuses,
//! the table refuses; nothing panics.
#![no_main]
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use libfuzzer_sys::fuzz_target;
use mounthost::oci::{TableEntry, TableKind};
use mounthost::plan::Archive;

#[path = "work_dir.rs"]
mod work_dir;

const DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// Every entry below `root` (links not followed), relative.
fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        out.push(p.strip_prefix(root).unwrap().to_path_buf());
        if p.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            walk(root, &p, out);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let work = work_dir::work("lazy-table", &[]);
    let blob = work.join("blob");
    let into = work.join("into");
    std::fs::write(&blob, data).unwrap();
    let table = mounthost::oci::fuzzing::tar_table_of(&blob);
    if let Ok(entries) = &table {
        for e in entries {
            let path = Path::new(&e.path);
            assert!(
                !e.path.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_))),
                "{e:?}"
            );
            if let TableKind::File { size, offset } = e.kind {
                assert!(offset.checked_add(size).is_some_and(|end| end <= data.len() as u64), "{e:?}");
            }
        }
    }
    let unpacked = mounthost::exec::artifacts::fuzzing::unpack(&blob, DIGEST, Archive::Tar, &into);
    // What unpacking refuses, the table refuses (a lazy volume never serves a layer an eager
    // one would not hold).
    if let (Ok(entries), Err(e)) = (&table, &unpacked) {
        assert!(
            e.kind() == std::io::ErrorKind::StorageFull,
            "unpacking refused ({e}) what the table accepts: {entries:?}"
        );
    }
    if let (Ok(entries), Ok(())) = (&table, &unpacked) {
        // A later entry of a path replaces an earlier one; a path below a later non-directory
        // is gone with it.
        let mut view: BTreeMap<PathBuf, &TableEntry> = BTreeMap::new();
        for e in entries {
            let path = PathBuf::from(&e.path);
            if !matches!(e.kind, TableKind::Dir) {
                view.retain(|p, _| !p.starts_with(&path) || *p == path);
            }
            view.insert(path, e);
        }
        let mut made = Vec::new();
        walk(&into, &into, &mut made);
        for rel in &made {
            let at = into.join(rel);
            let meta = at.symlink_metadata().unwrap();
            match view.get(rel).map(|e| &e.kind) {
                Some(TableKind::File { size, offset }) => {
                    assert!(meta.is_file(), "{rel:?}: the table says a file");
                    let want = &data[*offset as usize..(*offset + *size) as usize];
                    assert_eq!(std::fs::read(&at).unwrap(), want, "{rel:?}: other bytes than the table's extent");
                }
                Some(TableKind::Symlink { target }) => {
                    assert!(meta.file_type().is_symlink(), "{rel:?}: the table says a link");
                    assert_eq!(std::fs::read_link(&at).unwrap(), Path::new(target), "{rel:?}");
                }
                Some(TableKind::Dir) | None => {
                    // A directory the archive implies (a parent of an entry) need not be listed.
                    assert!(meta.is_dir(), "{rel:?}: unpacked but not in the table ({meta:?})");
                }
            }
        }
        for (p, e) in &view {
            assert!(made.contains(p), "{p:?} is in the table ({e:?}) but was not unpacked");
        }
    }
    let _ = std::fs::remove_dir_all(&into);
});
