//! Container image layers in a lazy volume (issue 45, docs/lazy.md): ordinary OCI and Docker
//! image layers (`plan::tar_rules::image_layer`) are changesets applied in order, not archives
//! of files, and their table says so.
//!
//! - [`LayerReader`] reads one image layer's members as the image spec lays them out: owners
//!   and modes kept (set-uid and set-gid cleared), symbolic links kept whatever their target
//!   (the server never follows them: the kernel resolves them in the reader's namespace),
//!   whiteouts and opaque markers taken out of the entries into [`Whiteout`]s, and what a
//!   volume cannot hold (device nodes, FIFOs, hard links to no earlier file of the layer)
//!   skipped and counted, never making the image unmountable.
//! - [`merge`] applies the layers in order, as unpacking them one over the other into one
//!   directory does: each layer's whiteouts delete what the layers below it put there, then its
//!   entries replace whatever the layers below have at their paths (a directory over a
//!   directory merges with it). A layer whose table is not known yet (a compressed layer not
//!   yet unpacked) stops it: only the layers above the highest such layer are served, so a
//!   volume never shows a file a layer above it may delete, and each directory says whether
//!   the layers below may still add to it (the server waits there, and nowhere else).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::entry::{BlobTable, Owner, TableEntry, TableKind, Whiteout};
use crate::plan::tar_rules::{self, Whiteout as Marker};

/// One member of an image layer's archive as its headers describe it, its path already
/// checked ([`tar_rules::clean`], UTF-8, not too long or deep).
pub(in crate::oci) struct Member {
    pub rel: PathBuf,
    pub kind: tar::EntryType,
    /// Its data: `size` bytes at `offset` in the (uncompressed) archive.
    pub size: u64,
    pub offset: u64,
    pub mtime: i64,
    /// A link's target, as the headers give it.
    pub link: Option<Vec<u8>>,
    pub owner: Owner,
}

/// What reading one image layer collects, member by member, following what unpacking the
/// layer lays out (`exec::artifacts`' `unpack_layer`): a later member replaces an earlier one
/// of the same path whatever their types, a member below a file or a link of the layer is
/// left out (unpacking follows no link), a hard link takes the file its target names at that
/// point of the archive.
#[derive(Default)]
pub(in crate::oci) struct LayerReader {
    entries: Vec<TableEntry>,
    whiteouts: Vec<Whiteout>,
    /// What each path of the layer is at this point of the archive: a directory (`true`,
    /// named or implied by a path below it) or not.
    kinds: BTreeMap<PathBuf, bool>,
    /// The regular files at this point, by path (a hard link takes the one it names): where
    /// their bytes are, their owner and time (a hard link is the same inode).
    files: BTreeMap<PathBuf, (u64, u64, Owner, i64)>,
    skipped: Skipped,
}

/// Members an image layer holds that a volume does not, by kind.
#[derive(Debug, Default, PartialEq, Eq)]
struct Skipped {
    devices: u32,
    fifos: u32,
    /// Hard links to anything but a regular file earlier in the same layer.
    hard_links: u32,
    /// Symbolic links without a target (no filesystem makes one), members below a file or a
    /// link of the layer, paths with `..`, other types (sockets, unknown ones).
    other: u32,
}

impl LayerReader {
    /// Take the next member; an error refuses the layer (what a lazy volume cannot serve: a
    /// sparse file, a link target of other bytes than UTF-8).
    pub fn member(&mut self, m: Member) -> Result<(), String> {
        // The archive's root (`./`) names nothing the volume shows.
        let Some(name) = m.rel.file_name() else { return Ok(()) };
        // Below a file or a link of this layer: unpacking cannot make it without following a
        // link (a layer's own link could point anywhere), and leaves it out.
        if m.rel.ancestors().skip(1).any(|a| self.kinds.get(a) == Some(&false)) {
            self.skipped.other += 1;
            return Ok(());
        }
        // Below a marker name (`.wh.a/b`): a marker is no directory of the image.
        if tar_rules::below_marker(&m.rel) {
            self.skipped.other += 1;
            return Ok(());
        }
        let parent = m.rel.parent().unwrap_or(Path::new(""));
        match tar_rules::whiteout(name.as_bytes()) {
            Marker::Opaque => {
                self.parents(&m.rel);
                self.whiteouts.push(Whiteout { path: text(parent), opaque: true });
                return Ok(());
            }
            Marker::Hides(hidden) if hidden != b"." && hidden != b".." => {
                let hidden = std::str::from_utf8(hidden).map_err(|_| "its name is not UTF-8".to_string())?;
                self.parents(&m.rel);
                self.whiteouts.push(Whiteout { path: text(&parent.join(hidden)), opaque: false });
                return Ok(());
            }
            // Markers of nothing: never shown.
            Marker::Hides(_) | Marker::Reserved => return Ok(()),
            Marker::No => {}
        }
        let kind = match m.kind {
            tar::EntryType::Directory => TableKind::Dir,
            tar::EntryType::Regular | tar::EntryType::Continuous => TableKind::File { size: m.size, offset: m.offset },
            tar::EntryType::Symlink => {
                let target = m.link.clone().unwrap_or_default();
                if target.is_empty() {
                    self.skipped.other += 1;
                    return Ok(());
                }
                if target.contains(&0) {
                    return Err("its symbolic link target holds a NUL byte".into());
                }
                let target = String::from_utf8(target).map_err(|_| "its symbolic link target is not UTF-8")?;
                TableKind::Symlink { target }
            }
            tar::EntryType::Link => {
                // The file the target names now (an absolute target is read from the root).
                let target = m.link.as_deref().and_then(|t| std::str::from_utf8(t).ok()).map(Path::new);
                let found = target
                    .and_then(|t| tar_rules::clean(t.strip_prefix("/").unwrap_or(t)).ok())
                    .filter(|t| !t.as_os_str().is_empty() && *t != m.rel)
                    .and_then(|t| self.files.get(&t).copied());
                let Some((size, offset, owner, mtime)) = found else {
                    self.skipped.hard_links += 1;
                    return Ok(());
                };
                self.place(&m.rel, false);
                self.files.insert(m.rel.clone(), (size, offset, owner, mtime));
                self.entries.push(TableEntry {
                    path: text(&m.rel),
                    kind: TableKind::File { size, offset },
                    mtime,
                    owner: Some(owner),
                });
                return Ok(());
            }
            tar::EntryType::GNUSparse => return Err("it is a sparse file, which a lazy volume cannot serve".into()),
            tar::EntryType::Char | tar::EntryType::Block => {
                self.skipped.devices += 1;
                return Ok(());
            }
            tar::EntryType::Fifo => {
                self.skipped.fifos += 1;
                return Ok(());
            }
            _ => {
                self.skipped.other += 1;
                return Ok(());
            }
        };
        self.place(&m.rel, matches!(kind, TableKind::Dir));
        if let TableKind::File { size, offset } = kind {
            self.files.insert(m.rel.clone(), (size, offset, m.owner, m.mtime));
        }
        self.entries.push(TableEntry { path: text(&m.rel), kind, mtime: m.mtime, owner: Some(m.owner) });
        Ok(())
    }

    /// A member unpacking leaves out before reading it (a path with `..`).
    pub fn skip(&mut self) {
        self.skipped.other += 1;
    }

    /// Entries and whiteouts so far.
    pub fn len(&self) -> usize {
        self.entries.len() + self.whiteouts.len()
    }

    /// The layer's entries and whiteouts; what it skipped is logged (once per reading).
    pub fn finish(self, digest: &str) -> (Vec<TableEntry>, Vec<Whiteout>) {
        let s = &self.skipped;
        if *s != Skipped::default() {
            tracing::warn!(
                digest,
                devices = s.devices,
                fifos = s.fifos,
                hard_links = s.hard_links,
                others = s.other,
                "an image layer holds entries a volume does not (device nodes, FIFOs, hard links to no earlier file of the layer, paths below a link or with `..`, other types): they are skipped"
            );
        }
        (self.entries, self.whiteouts)
    }

    /// A member (a directory when `dir`) is at `rel` from now on: its parents are directories,
    /// and what was at `rel` is gone (with everything below it) unless a directory merges with
    /// a directory.
    fn place(&mut self, rel: &Path, dir: bool) {
        self.parents(rel);
        if !(dir && self.kinds.get(rel) == Some(&true)) {
            let below: Vec<PathBuf> = self
                .kinds
                .range(rel.to_path_buf()..)
                .map(|(p, _)| p)
                .take_while(|p| p.starts_with(rel))
                .cloned()
                .collect();
            for p in below {
                self.kinds.remove(&p);
                self.files.remove(&p);
            }
        }
        self.kinds.insert(rel.to_path_buf(), dir);
    }

    /// `rel`'s parents are directories (none of them is anything else: checked first).
    fn parents(&mut self, rel: &Path) {
        for a in rel.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()) {
            self.kinds.insert(a.to_path_buf(), true);
        }
    }
}

fn text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// One layer as [`merge`] takes it.
#[derive(Debug, Clone, Copy)]
pub struct MergeLayer<'a> {
    /// Its table, `None` while it is not known (a compressed layer not yet unpacked).
    pub table: Option<&'a BlobTable>,
    /// The directory its entries go below (`""`: the root).
    pub dest: &'a str,
}

/// One path of the merged view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged<'a> {
    /// Its path below the root (`""`: the root itself).
    pub path: String,
    /// The layer (by index) whose entry it is, and that entry (its path in its layer); `None`:
    /// a directory no layer served gave an entry (the root, an implicit parent), shown 0755
    /// and owned by root ([`Owner::DIR`]) until a layer below gives it one.
    pub from: Option<(usize, &'a TableEntry)>,
    /// Its time when it has no entry (that of the entry that made it).
    pub mtime: i64,
    /// A directory that layers not known yet may still add to.
    pub open: bool,
}

/// A node of the merge's tree.
enum Node<'a> {
    Dir { children: BTreeMap<String, Node<'a>>, from: Option<(usize, &'a TableEntry)>, mtime: i64 },
    Leaf(usize, &'a TableEntry),
}

impl<'a> Node<'a> {
    fn implicit(mtime: i64) -> Node<'a> {
        Node::Dir { children: BTreeMap::new(), from: None, mtime }
    }

    fn children(&mut self) -> Option<&mut BTreeMap<String, Node<'a>>> {
        match self {
            Node::Dir { children, .. } => Some(children),
            Node::Leaf(..) => None,
        }
    }
}

/// `rel` below `dest`, as a list of components.
fn components<'p>(dest: &'p str, rel: &'p str) -> Vec<&'p str> {
    dest.split('/').chain(rel.split('/')).filter(|c| !c.is_empty()).collect()
}

/// The layers merged as the image spec applies them, in order, over an empty directory: every
/// path once, parents before children, of the layers above the highest one whose table is not
/// known only (none known above it: nothing but the root, open). A directory is `open` when a
/// layer not known yet may add to it: while one is, unless a layer served deleted it, made it
/// opaque or put something else at it or at a directory above it.
pub fn merge<'a>(layers: &[MergeLayer<'a>]) -> Vec<Merged<'a>> {
    let first = layers.iter().rposition(|l| l.table.is_none()).map_or(0, |p| p + 1);
    let pending = first > 0;
    let mut root = Node::implicit(0);
    // Paths below which (or, for an opaque directory, below which in it) nothing of the
    // layers not known yet can show.
    let mut cut: BTreeSet<String> = BTreeSet::new();
    for (k, layer) in layers.iter().enumerate().skip(first) {
        let table = layer.table.expect("the layers above the highest pending one are known");
        // A layer's whiteouts apply to the layers below it, its own entries stay.
        // The marker's directory is the layer's (made where missing, as for any entry).
        for w in &table.whiteouts {
            let path = components(layer.dest, &w.path);
            if w.opaque {
                dirs(&mut root, &path, 0).clear();
            } else if let Some((name, parent)) = path.split_last() {
                dirs(&mut root, parent, 0).remove(*name);
            }
            cut.insert(path.join("/"));
        }
        for e in &table.entries {
            let path = components(layer.dest, &e.path);
            let Some((name, parents)) = path.split_last() else { continue };
            let children = dirs(&mut root, parents, e.mtime);
            match (&e.kind, children.get_mut(*name)) {
                (TableKind::Dir, Some(Node::Dir { from, .. })) => *from = Some((k, e)),
                (TableKind::Dir, _) => {
                    children.insert(
                        name.to_string(),
                        Node::Dir { children: BTreeMap::new(), from: Some((k, e)), mtime: e.mtime },
                    );
                }
                (_, _) => {
                    children.insert(name.to_string(), Node::Leaf(k, e));
                    cut.insert(path.join("/"));
                }
            }
        }
    }
    let mut out = Vec::new();
    let mut path = Vec::new();
    walk(&root, &mut path, pending, &cut, &mut out);
    out
}

/// The entries of the directory at `path`, made (of no entry, at `mtime`) where missing: a
/// parent over a file or a link replaces it.
fn dirs<'t, 'a>(root: &'t mut Node<'a>, path: &[&str], mtime: i64) -> &'t mut BTreeMap<String, Node<'a>> {
    let mut at = root;
    for c in path {
        let children = at.children().expect("walked through directories");
        let child = children.entry(c.to_string()).or_insert_with(|| Node::implicit(mtime));
        if matches!(child, Node::Leaf(..)) {
            *child = Node::implicit(mtime);
        }
        at = child;
    }
    at.children().expect("made a directory")
}

/// `node` at `path` and everything below it, parents first.
fn walk<'a, 'p>(
    node: &'p Node<'a>,
    path: &mut Vec<&'p str>,
    open: bool,
    cut: &BTreeSet<String>,
    out: &mut Vec<Merged<'a>>,
) {
    let joined = path.join("/");
    match node {
        Node::Leaf(k, e) => out.push(Merged { path: joined, from: Some((*k, *e)), mtime: e.mtime, open: false }),
        Node::Dir { children, from, mtime } => {
            let open = open && !cut.contains(&joined);
            out.push(Merged { path: joined, from: *from, mtime: from.map_or(*mtime, |(_, e)| e.mtime), open });
            for (name, child) in children {
                path.push(name);
                walk(child, path, open, cut, out);
                path.pop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::kept::compressed_image_table;
    use super::super::{Source_, at_once, read_tar};
    use super::*;
    use crate::plan::Archive;
    use tar::EntryType as T;

    /// An image layer's archive, entry by entry, with raw names (absolute ones too).
    struct Layer(tar::Builder<Vec<u8>>);

    impl Layer {
        fn new() -> Layer {
            Layer(tar::Builder::new(Vec::new()))
        }

        /// An entry of `kind` owned by `uid` (its group `uid + 1`), mode `mode`.
        fn raw(mut self, name: &str, kind: T, link: Option<&str>, mode: u32, uid: u64, data: &[u8]) -> Layer {
            let h = crate::oci::tests::header(name, kind, link, mode, (uid, uid + 1), data.len());
            self.0.append(&h, data).unwrap();
            self
        }

        fn file(self, name: &str, data: &[u8]) -> Layer {
            self.raw(name, T::Regular, None, 0o644, 0, data)
        }

        fn dir(self, name: &str) -> Layer {
            self.raw(name, T::Directory, None, 0o755, 0, b"")
        }

        fn symlink(self, name: &str, target: &str) -> Layer {
            self.raw(name, T::Symlink, Some(target), 0o777, 0, b"")
        }

        fn hardlink(self, name: &str, target: &str) -> Layer {
            self.raw(name, T::Link, Some(target), 0o644, 0, b"")
        }

        fn bytes(self) -> Vec<u8> {
            self.0.into_inner().unwrap()
        }

        /// The layer's table, read from its headers as a lazy volume reads an uncompressed
        /// image layer.
        fn table(self) -> BlobTable {
            table_of(&self.bytes())
        }
    }

    fn table_of(bytes: &[u8]) -> BlobTable {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        std::fs::write(&path, bytes).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let (entries, whiteouts) =
            at_once(read_tar(&Source_::Local(&f), "sha256:t", bytes.len() as u64, true)).unwrap();
        BlobTable { verified: true, entries, whiteouts }
    }

    fn entry<'t>(t: &'t BlobTable, path: &str) -> Option<&'t TableEntry> {
        t.entries.iter().rev().find(|e| e.path == path)
    }

    fn owner(uid: u32, mode: u32) -> Option<Owner> {
        Some(Owner { uid, gid: uid + 1, mode })
    }

    /// The merged view in short: `dir/` (`dir/*` when open), `file=L<layer>`, `link->target`,
    /// parents first.
    fn shown(layers: &[Option<&BlobTable>]) -> Vec<String> {
        let layers: Vec<MergeLayer<'_>> = layers.iter().map(|t| MergeLayer { table: *t, dest: "" }).collect();
        merge(&layers)
            .iter()
            .map(|m| match m.from.map(|(k, e)| (k, &e.kind)) {
                None | Some((_, TableKind::Dir)) => format!("{}/{}", m.path, if m.open { "*" } else { "" }),
                Some((k, TableKind::File { .. })) => format!("{}=L{k}", m.path),
                Some((_, TableKind::Symlink { target })) => format!("{}->{target}", m.path),
            })
            .collect()
    }

    #[test]
    fn owners_and_modes_are_kept_and_set_id_bits_cleared() {
        let t = Layer::new()
            .raw("bin/", T::Directory, None, 0o2750, 7, b"")
            .raw("bin/su", T::Regular, None, 0o4755, 0, b"x")
            .raw("home/u/secret", T::Regular, None, 0o600, 1000, b"s")
            .raw("tmp/", T::Directory, None, 0o1777, 0, b"")
            .raw("bin/sh", T::Symlink, Some("/usr/bin/dash"), 0o777, 3, b"")
            .table();
        assert_eq!(entry(&t, "bin").unwrap().owner, owner(7, 0o750), "set-gid cleared");
        assert_eq!(entry(&t, "bin/su").unwrap().owner, owner(0, 0o755), "set-uid cleared");
        assert_eq!(entry(&t, "home/u/secret").unwrap().owner, owner(1000, 0o600));
        assert_eq!(entry(&t, "tmp").unwrap().owner, owner(0, 0o1777), "the sticky bit stays");
        assert_eq!(entry(&t, "bin/sh").unwrap().owner.map(|o| o.uid), Some(3), "a link's owner");
        assert!(entry(&t, "home").is_none(), "an implicit parent has no entry of its own");
    }

    #[test]
    fn whiteouts_and_opaque_markers_are_no_entries() {
        let t = Layer::new()
            .file("a/.wh.b", b"")
            .file(".wh.top", b"")
            .dir("d/")
            .file("d/.wh..wh..opq", b"")
            .file(".wh..wh.plnk", b"")
            .file(".wh..", b"")
            .file("keep", b"k")
            .table();
        assert_eq!(
            t.whiteouts,
            [
                Whiteout { path: "a/b".into(), opaque: false },
                Whiteout { path: "top".into(), opaque: false },
                Whiteout { path: "d".into(), opaque: true },
            ]
        );
        let paths: Vec<&str> = t.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["d", "keep"], "markers are never shown, reserved names neither");
    }

    #[test]
    fn device_nodes_fifos_and_hard_links_to_no_earlier_file_are_skipped() {
        let t = Layer::new()
            .raw("dev/null", T::Char, None, 0o666, 0, b"")
            .raw("dev/sda", T::Block, None, 0o660, 0, b"")
            .raw("run/fifo", T::Fifo, None, 0o644, 0, b"")
            .hardlink("h1", "missing")
            .hardlink("h2", "later")
            .symlink("l", "x")
            .hardlink("h3", "l")
            .file("later", b"late")
            .table();
        let paths: Vec<&str> = t.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["l", "later"], "the image stays mountable");
    }

    #[test]
    fn a_hard_link_is_the_file_its_target_named_then() {
        let bytes = Layer::new()
            .raw("f", T::Regular, None, 0o640, 5, b"old")
            .hardlink("h", "f")
            .hardlink("abs", "/f")
            .file("f", b"new!")
            .hardlink("h2", "./f")
            .bytes();
        let t = table_of(&bytes);
        let data = |p: &str| match entry(&t, p).unwrap().kind {
            TableKind::File { size, offset } => &bytes[offset as usize..(offset + size) as usize],
            ref k => panic!("{p}: {k:?}"),
        };
        assert_eq!(
            (data("h"), data("abs"), data("f"), data("h2")),
            (&b"old"[..], &b"old"[..], &b"new!"[..], &b"new!"[..])
        );
        assert_eq!(entry(&t, "h").unwrap().owner, owner(5, 0o640), "the target's inode: its owner and mode");
    }

    #[test]
    fn link_targets_are_kept_whatever_they_are_and_paths_read_as_a_runtime_reads_them() {
        let t = Layer::new()
            .symlink("usr/lib/libc.so", "/lib/x86_64-linux-gnu/libc.so.6")
            .symlink("etc/up", "../../../etc/passwd")
            .file("/abs/file", b"a")
            .file("a/../../escape", b"e")
            .table();
        let target = |p: &str| match &entry(&t, p).unwrap().kind {
            TableKind::Symlink { target } => target.clone(),
            k => panic!("{p}: {k:?}"),
        };
        assert_eq!(target("usr/lib/libc.so"), "/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(target("etc/up"), "../../../etc/passwd");
        assert!(entry(&t, "abs/file").is_some(), "`/abs/file` is `abs/file`");
        assert!(t.entries.iter().all(|e| !e.path.contains("escape")), "`..` is left out");
    }

    /// Unpacking follows no link and makes no directory over a file of the same layer: a
    /// member below one is left out; a member replaces an earlier one whatever their types.
    #[test]
    fn members_below_a_file_or_a_link_of_the_layer_are_left_out() {
        let t = Layer::new()
            .symlink("lib", "/usr/lib")
            .file("lib/evil", b"e")
            .file("f", b"f")
            .file("f/g", b"g")
            .dir("d/")
            .file("d/x", b"x")
            .file("d", b"now a file")
            .dir("d/")
            .file("d/y", b"y")
            .table();
        let paths: Vec<&str> = t.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["lib", "f", "d", "d/x", "d", "d", "d/y"]);
        assert_eq!(shown(&[Some(&t)]), ["/", "d/", "d/y=L0", "f=L0", "lib->/usr/lib"], "d/x went with the dir");
    }

    #[test]
    fn whiteouts_delete_what_the_layers_below_put_there_and_not_the_layers_own() {
        let lower = Layer::new().file("a/b", b"b").file("a/c", b"c").dir("gone/").file("gone/deep/x", b"x").table();
        let upper =
            Layer::new().file("a/.wh.b", b"").file(".wh.gone", b"").file(".wh.mine", b"").file("mine", b"m").table();
        assert_eq!(shown(&[Some(&lower), Some(&upper)]), ["/", "a/", "a/c=L0", "mine=L1"]);
        // A whiteout in a directory nothing below has makes it (as unpacking the layer does).
        let upper = Layer::new().file("new/.wh.x", b"").table();
        assert_eq!(
            shown(&[Some(&lower), Some(&upper)]),
            ["/", "a/", "a/b=L0", "a/c=L0", "gone/", "gone/deep/", "gone/deep/x=L0", "new/"]
        );
    }

    #[test]
    fn an_opaque_directory_hides_what_lower_layers_put_in_it() {
        let lower = Layer::new().file("d/old", b"o").file("d/sub/f", b"f").file("e/kept", b"k").table();
        let upper = Layer::new()
            .raw("d/", T::Directory, None, 0o700, 9, b"")
            .file("d/.wh..wh..opq", b"")
            .file("d/new", b"n")
            .table();
        assert_eq!(shown(&[Some(&lower), Some(&upper)]), ["/", "d/", "d/new=L1", "e/", "e/kept=L0"]);
        let top = Layer::new().file(".wh..wh..opq", b"").file("only", b"o").table();
        assert_eq!(shown(&[Some(&lower), Some(&upper), Some(&top)]), ["/", "only=L2"], "the root made opaque");
    }

    #[test]
    fn a_later_layers_entry_replaces_a_lower_one_whatever_the_types() {
        let l0 =
            Layer::new().file("a/f", b"f").symlink("s", "t").file("x", b"x").dir("m/").file("m/lower", b"l").table();
        let l1 = Layer::new()
            .file("a", b"file over a directory")
            .file("s/inside", b"i")
            .dir("x/")
            .dir("m/")
            .file("m/upper", b"u")
            .table();
        assert_eq!(
            shown(&[Some(&l0), Some(&l1)]),
            ["/", "a=L1", "m/", "m/lower=L0", "m/upper=L1", "s/", "s/inside=L1", "x/"],
            "a directory over a directory merges; over a file or a link it replaces them"
        );
        let l2 = Layer::new().file("a/new", b"n").table();
        assert_eq!(shown(&[Some(&l0), Some(&l1), Some(&l2)])[1..3], ["a/".to_string(), "a/new=L2".into()]);
    }

    #[test]
    fn a_directory_without_an_entry_of_its_own_keeps_the_owner_a_lower_layer_gave_it() {
        let l0 = Layer::new().raw("app/", T::Directory, None, 0o700, 1000, b"").file("app/a", b"a").table();
        let l1 = Layer::new().file("app/b", b"b").file("new/c", b"c").table();
        let l2 = Layer::new().raw("app/", T::Directory, None, 0o750, 5, b"").table();
        fn layers<'a>(ts: &[&'a BlobTable]) -> Vec<MergeLayer<'a>> {
            ts.iter().map(|t| MergeLayer { table: Some(*t), dest: "" }).collect()
        }
        let meta = |m: &[Merged<'_>], p: &str| m.iter().find(|m| m.path == p).unwrap().from.and_then(|(_, e)| e.owner);
        let two = layers(&[&l0, &l1]);
        let merged = merge(&two);
        assert_eq!(meta(&merged, "app"), owner(1000, 0o700), "l1 only implies it");
        assert_eq!(meta(&merged, "new"), None, "nobody gave it one: 0755, root's (Owner::DIR)");
        assert_eq!(meta(&merged, ""), None, "the root");
        let three = layers(&[&l0, &l1, &l2]);
        assert_eq!(meta(&merge(&three), "app"), owner(5, 0o750), "an entry of its own wins");
    }

    /// Gating: while a layer's table is unknown (a compressed layer not yet unpacked), only
    /// the layers above it are served, and only the directories it may add to wait.
    #[test]
    fn a_pending_layer_hides_everything_below_it_and_opens_what_it_may_add_to() {
        let l0 = Layer::new().file("secret", b"s").file("app/model.bin", b"m").file("o/lower", b"l").table();
        let l2 = Layer::new()
            .file("app/config.json", b"c")
            .file("o/.wh..wh..opq", b"")
            .file("o/upper", b"u")
            .file("f", b"f")
            .table();
        assert_eq!(
            shown(&[Some(&l0), None, Some(&l2)]),
            ["/*", "app/*", "app/config.json=L2", "f=L2", "o/", "o/upper=L2"],
            "nothing of layer 0; o is opaque above the pending layer"
        );
        // Layer 1 turns out to delete `secret`: the volume never showed it.
        let l1 = Layer::new().file(".wh.secret", b"").file("app/.wh.model.bin", b"").table();
        assert_eq!(
            shown(&[Some(&l0), Some(&l1), Some(&l2)]),
            ["/", "app/", "app/config.json=L2", "f=L2", "o/", "o/upper=L2"]
        );
        // Pending at the bottom: the layers above are served, all open but what they cut.
        assert_eq!(shown(&[None, Some(&l2)]), ["/*", "app/*", "app/config.json=L1", "f=L1", "o/", "o/upper=L1"]);
        assert_eq!(shown(&[Some(&l0), Some(&l2), None]), ["/*"], "the top layer pending: nothing yet");
    }

    #[test]
    fn a_compressed_image_layers_table_is_read_from_its_archive() {
        let tar = Layer::new()
            .raw("app/", T::Directory, None, 0o750, 10, b"")
            .raw("app/w.bin", T::Regular, None, 0o640, 10, &[9u8; 200_000])
            .file("app/.wh.old", b"")
            .symlink("bin", "/usr/bin")
            .hardlink("app/copy", "app/w.bin")
            .bytes();
        let plain = table_of(&tar);
        let dir = tempfile::tempdir().unwrap();
        for (format, bytes) in
            [(Archive::TarGzip, crate::oci::tests::gzip(&tar)), (Archive::TarZstd, crate::oci::tests::zstd(&tar))]
        {
            let blob = dir.path().join("blob");
            std::fs::write(&blob, bytes).unwrap();
            let t = compressed_image_table(&blob, "sha256:t", format).unwrap();
            assert_eq!((&t.entries, &t.whiteouts), (&plain.entries, &plain.whiteouts), "{format:?}");
        }
        // An archive without its end blocks ends where the stream does.
        let cut = &tar[..tar.len() - 1024];
        let blob = dir.path().join("cut");
        std::fs::write(&blob, crate::oci::tests::gzip(cut)).unwrap();
        assert_eq!(compressed_image_table(&blob, "sha256:t", Archive::TarGzip).unwrap().entries, plain.entries);
    }
}
