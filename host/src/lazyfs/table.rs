//! The lazy filesystem's tree: inodes built from the file table the host sent
//! ([`crate::unpriv::lazy_wire::FileEntry`]), in the order later layers replace earlier ones,
//! as unpacking them one after the other would lay them out.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};

use crate::unpriv::lazy_wire::{Data, FileEntry, Kind, Owner};

/// The root's inode number (FUSE's).
pub const ROOT: u64 = 1;

/// One inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its parent (the root is its own).
    pub parent: u64,
    /// What it is.
    pub kind: NodeKind,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Its owner and mode (an image's entries); `None`: files 0444, directories 0555, links
    /// 0777, owned by root.
    pub owner: Option<Owner>,
    /// A directory that a layer still pending may add entries to (an image's,
    /// [`FileEntry::open`]): a lookup of a name it lacks, and its listing, wait.
    pub open: bool,
    /// The names it has (a file of an image may have several: hard links).
    pub links: u32,
}

/// What an inode is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    /// A directory and its entries by name.
    Dir(BTreeMap<OsString, u64>),
    /// A regular file: its id in the table, size and where its bytes are.
    File { id: u32, size: u64, data: Data },
    /// A symbolic link.
    Symlink(String),
}

/// The tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Inode `n` is `nodes[n - 1]`.
    nodes: Vec<Node>,
    /// Entries in the table, so the next added one gets the next id.
    files: u32,
    /// An image's files by layer and [`FileEntry::inode`]: a hard link joins its target's inode.
    linked: std::collections::HashMap<(u32, u64), u64>,
}

impl Table {
    /// The tree of `entries`: each path's parents become directories (mode of the root), a
    /// later entry replaces an earlier one of the same path, and an entry below a path that
    /// is not a directory (the host refuses such tables) is left out.
    pub fn new(entries: &[FileEntry]) -> Table {
        let root =
            Node { parent: ROOT, kind: NodeKind::Dir(BTreeMap::new()), mtime: 0, owner: None, open: false, links: 1 };
        let mut t = Table { nodes: vec![root], files: 0, linked: Default::default() };
        t.add(entries);
        t
    }

    /// Add `entries` (a layer whose files became known later). A path already present is
    /// replaced only if the new entry is of the same kind (the kernel may hold the inode);
    /// otherwise it is left out.
    pub fn add(&mut self, entries: &[FileEntry]) {
        for e in entries {
            let id = self.files;
            self.files += 1;
            let components: Vec<&str> = e.path.split('/').filter(|c| !c.is_empty()).collect();
            if components.iter().any(|c| *c == "." || *c == "..") {
                continue;
            }
            let Some((name, parents)) = components.split_last() else {
                // The root itself: only a directory entry can name it.
                if let Kind::Dir = e.kind {
                    let root = &mut self.nodes[0];
                    (root.mtime, root.owner, root.open) = (e.mtime, e.owner, e.open);
                }
                continue;
            };
            let Some(parent) = self.make_dirs(parents, e.mtime) else { continue };
            let kind = match &e.kind {
                Kind::Dir => NodeKind::Dir(BTreeMap::new()),
                Kind::File { size, data } => NodeKind::File { id, size: *size, data: data.clone() },
                Kind::Symlink { target } => NodeKind::Symlink(target.clone()),
            };
            match self.child(parent, OsStr::new(name)) {
                Some(existing) => {
                    let node = &mut self.nodes[(existing - 1) as usize];
                    match (&node.kind, kind) {
                        // A directory named again keeps its entries.
                        (NodeKind::Dir(_), NodeKind::Dir(_)) => {
                            (node.mtime, node.owner, node.open) = (e.mtime, e.owner, e.open);
                        }
                        // A file of several names is left as it is (its other names keep it).
                        (NodeKind::File { .. }, new @ NodeKind::File { .. }) if node.links == 1 => {
                            node.kind = new;
                            (node.mtime, node.owner) = (e.mtime, e.owner);
                        }
                        (NodeKind::Symlink(_), new @ NodeKind::Symlink(_)) => {
                            node.kind = new;
                            (node.mtime, node.owner) = (e.mtime, e.owner);
                        }
                        _ => {}
                    }
                }
                None => {
                    // A hard link: another name of a file this layer already has.
                    let key = match (&kind, e.inode) {
                        (NodeKind::File { data, .. }, Some(inode)) => Some((data.layer(), inode)),
                        _ => None,
                    };
                    if let Some(ino) = key.and_then(|k| self.linked.get(&k).copied())
                        && let Some(node) = self.nodes.get_mut((ino - 1) as usize)
                        && matches!(node.kind, NodeKind::File { .. })
                    {
                        node.links += 1;
                        self.link(parent, name, ino);
                        continue;
                    }
                    let open = e.open && matches!(kind, NodeKind::Dir(_));
                    let ino = self.push(Node { parent, kind, mtime: e.mtime, owner: e.owner, open, links: 1 });
                    self.link(parent, name, ino);
                    if let Some(k) = key {
                        self.linked.insert(k, ino);
                    }
                }
            }
        }
    }

    /// Take an image's merged table again (the host's `Added`, or its opening after a restart):
    /// the paths it lacks join; those it has keep their inode and what they are (the layers
    /// below the ones served add to the tree, never change it), and take their owner, time
    /// and openness. Returns the inodes whose attributes changed (the kernel's copy is stale).
    pub fn refresh(&mut self, entries: &[FileEntry]) -> Vec<u64> {
        let mut changed = Vec::new();
        let mut new = Vec::new();
        for e in entries {
            let Some(ino) = self.by_path(&e.path) else {
                new.push(e.clone());
                continue;
            };
            let node = &mut self.nodes[(ino - 1) as usize];
            let dir = match (&node.kind, &e.kind) {
                (NodeKind::Dir(_), Kind::Dir) => true,
                (NodeKind::File { .. }, Kind::File { .. }) | (NodeKind::Symlink(_), Kind::Symlink { .. }) => false,
                _ => continue,
            };
            if (node.owner, node.mtime) != (e.owner, e.mtime) {
                (node.owner, node.mtime) = (e.owner, e.mtime);
                changed.push(ino);
            }
            node.open = dir && e.open;
        }
        self.add(&new);
        changed
    }

    /// The directory at `components` below the root, made where missing; `None` if one of
    /// them is not a directory.
    fn make_dirs(&mut self, components: &[&str], mtime: i64) -> Option<u64> {
        let mut at = ROOT;
        for c in components {
            at = match self.child(at, OsStr::new(c)) {
                Some(ino) if matches!(self.nodes[(ino - 1) as usize].kind, NodeKind::Dir(_)) => ino,
                Some(_) => return None,
                None => {
                    let dir = NodeKind::Dir(BTreeMap::new());
                    let ino = self.push(Node { parent: at, kind: dir, mtime, owner: None, open: false, links: 1 });
                    self.link(at, c, ino);
                    ino
                }
            };
        }
        Some(at)
    }

    fn push(&mut self, node: Node) -> u64 {
        self.nodes.push(node);
        self.nodes.len() as u64
    }

    fn link(&mut self, dir: u64, name: &str, ino: u64) {
        if let NodeKind::Dir(children) = &mut self.nodes[(dir - 1) as usize].kind {
            children.insert(OsString::from(name), ino);
        }
    }

    /// Inode `ino`.
    pub fn get(&self, ino: u64) -> Option<&Node> {
        self.nodes.get(usize::try_from(ino).ok()?.checked_sub(1)?)
    }

    /// The entry `name` of directory `dir`.
    pub fn child(&self, dir: u64, name: &OsStr) -> Option<u64> {
        match &self.get(dir)?.kind {
            NodeKind::Dir(children) => children.get(name).copied(),
            _ => None,
        }
    }

    /// The inode at `path` (relative, `/`-separated; `""` is the root).
    pub fn by_path(&self, path: &str) -> Option<u64> {
        let mut at = ROOT;
        for c in path.split('/').filter(|c| !c.is_empty()) {
            at = self.child(at, OsStr::new(c))?;
        }
        Some(at)
    }

    /// The path of `ino` from the root (`""` for the root).
    pub fn path(&self, ino: u64) -> String {
        let mut parts = Vec::new();
        let mut at = ino;
        while at != ROOT {
            let Some(node) = self.get(at) else { break };
            let parent = node.parent;
            if let Some(NodeKind::Dir(children)) = self.get(parent).map(|n| &n.kind)
                && let Some((name, _)) = children.iter().find(|(_, i)| **i == at)
            {
                parts.push(name.to_string_lossy().into_owned());
            }
            at = parent;
        }
        parts.reverse();
        parts.join("/")
    }

    /// How many inodes (never 0: the root is always there).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// How many file-table entries it was built from (the next added one's id).
    pub fn entries(&self) -> u32 {
        self.files
    }

    /// The inode of the file with table id `id`.
    #[cfg(test)]
    pub fn by_id(&self, id: u32) -> Option<u64> {
        self.nodes.iter().position(|n| matches!(n.kind, NodeKind::File { id: i, .. } if i == id)).map(|i| i as u64 + 1)
    }

    /// Every file inode.
    pub fn file_inodes(&self) -> impl Iterator<Item = u64> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| matches!(n.kind, NodeKind::File { .. }))
            .map(|(i, _)| i as u64 + 1)
    }

    /// The bytes of all files.
    pub fn bytes(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| match n.kind {
                NodeKind::File { size, .. } => size,
                _ => 0,
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64, layer: u32) -> FileEntry {
        FileEntry {
            path: path.into(),
            kind: Kind::File { size, data: Data::Blob { layer, offset: 0 } },
            mtime: 5,
            owner: None,
            open: false,
            inode: None,
        }
    }

    #[test]
    fn parents_are_made_and_later_entries_replace_earlier_ones() {
        let t = Table::new(&[
            file("config.json", 10, 0),
            file("tokenizer/vocab.txt", 20, 1),
            FileEntry { path: "tokenizer".into(), kind: Kind::Dir, mtime: 9, owner: None, open: false, inode: None },
            file("config.json", 11, 2),
            FileEntry {
                path: "link".into(),
                kind: Kind::Symlink { target: "config.json".into() },
                mtime: 1,
                owner: None,
                open: false,
                inode: None,
            },
        ]);
        let config = t.child(ROOT, OsStr::new("config.json")).unwrap();
        assert!(matches!(t.get(config).unwrap().kind, NodeKind::File { id: 3, size: 11, .. }), "the later one");
        let dir = t.child(ROOT, OsStr::new("tokenizer")).unwrap();
        assert_eq!(t.get(dir).unwrap().mtime, 9, "a directory named again keeps its entries");
        let vocab = t.child(dir, OsStr::new("vocab.txt")).unwrap();
        assert_eq!(t.path(vocab), "tokenizer/vocab.txt");
        assert_eq!(t.by_id(1), Some(vocab));
        assert_eq!(t.bytes(), 31);
        assert_eq!(t.entries(), 5);
        assert_eq!(t.file_inodes().count(), 2);
    }

    #[test]
    fn entries_below_a_file_or_with_dot_dot_are_left_out() {
        let t = Table::new(&[file("a", 1, 0), file("a/b", 2, 0), file("../x", 3, 0), file("c/../d", 3, 0)]);
        assert_eq!(t.len(), 2, "the root and `a`");
        let a = t.child(ROOT, OsStr::new("a")).unwrap();
        assert!(t.child(a, OsStr::new("b")).is_none());
    }

    fn image(path: &str, kind: Kind, owner: Option<Owner>, open: bool) -> FileEntry {
        FileEntry { path: path.into(), kind, mtime: 1, owner, open, inode: None }
    }

    fn tree_file(path: &str, layer: u32) -> Kind {
        Kind::File { size: 3, data: Data::Tree { layer, rel: path.into() } }
    }

    /// An image's table: first the layers above a pending one (open directories), then, once
    /// it is known, the merge again reaching further down. What was served keeps its inode
    /// and what it is; directories take their owner and close.
    #[test]
    fn an_images_table_grows_as_its_pending_layers_become_known() {
        let user = Some(Owner { uid: 1000, gid: 1000, mode: 0o600 });
        let above = [
            image("", Kind::Dir, Some(Owner::DIR), true),
            image("app", Kind::Dir, Some(Owner::DIR), true),
            image("app/config.json", tree_file("app/config.json", 2), user, false),
            image("etc", Kind::Dir, Some(Owner { uid: 0, gid: 0, mode: 0o700 }), false),
        ];
        let mut t = Table::new(&above);
        let (app, config, etc) =
            (t.by_path("app").unwrap(), t.by_path("app/config.json").unwrap(), t.by_path("etc").unwrap());
        assert!(t.get(ROOT).unwrap().open && t.get(app).unwrap().open && !t.get(etc).unwrap().open);
        assert_eq!(t.get(config).unwrap().owner, user);
        let app_owner = Some(Owner { uid: 5, gid: 6, mode: 0o750 });
        let all = [
            image("", Kind::Dir, Some(Owner::DIR), false),
            image("app", Kind::Dir, app_owner, false),
            image("app/config.json", tree_file("app/config.json", 2), user, false),
            image("app/model.bin", tree_file("app/model.bin", 0), None, false),
            image("etc", Kind::Dir, Some(Owner { uid: 0, gid: 0, mode: 0o700 }), false),
            // Not what was served: left as it is (a merge that grows never changes a kind).
            image("app/config.json/x", tree_file("x", 0), None, false),
        ];
        let changed = t.refresh(&all);
        assert_eq!(changed, [app], "the directory a lower layer gave its owner");
        assert_eq!((t.by_path("app"), t.by_path("app/config.json")), (Some(app), Some(config)), "same inodes");
        assert_eq!(t.get(app).unwrap().owner, app_owner);
        assert!(t.by_path("app/model.bin").is_some(), "the lower layer's file joined");
        assert!(!t.get(ROOT).unwrap().open && !t.get(app).unwrap().open, "nothing is pending any more");
        assert!(t.by_path("app/config.json/x").is_none());
        assert!(t.refresh(&all).is_empty(), "taken again, nothing changes");
    }

    /// Hard links of an image's layer are one inode of several names (a later layer's file of
    /// the same offset is another file).
    #[test]
    fn an_images_hard_links_are_one_inode() {
        let linked = |path: &str, layer: u32, inode: u64| FileEntry {
            inode: Some(inode),
            ..image(path, Kind::File { size: 3, data: Data::Blob { layer, offset: inode } }, None, false)
        };
        let t = Table::new(&[linked("a", 0, 512), linked("d/b", 0, 512), linked("c", 1, 512), linked("e", 0, 1024)]);
        let ino = |p: &str| t.by_path(p).unwrap();
        assert_eq!(ino("a"), ino("d/b"));
        assert_eq!(t.get(ino("a")).unwrap().links, 2);
        assert_ne!(ino("a"), ino("c"), "another layer's");
        assert_ne!(ino("a"), ino("e"));
        assert_eq!(t.file_inodes().count(), 3);
        assert_eq!(t.bytes(), 9, "a file of two names counts once");
    }

    #[test]
    fn added_layers_join_the_tree_without_changing_a_kind() {
        let mut t = Table::new(&[file("w/a.bin", 1, 0)]);
        t.add(&[
            file("w/b.bin", 2, 1),
            FileEntry { path: "w/a.bin".into(), kind: Kind::Dir, mtime: 0, owner: None, open: false, inode: None },
        ]);
        let w = t.child(ROOT, OsStr::new("w")).unwrap();
        assert!(t.child(w, OsStr::new("b.bin")).is_some());
        let a = t.child(w, OsStr::new("a.bin")).unwrap();
        assert!(matches!(t.get(a).unwrap().kind, NodeKind::File { .. }), "a file stays a file");
        assert_eq!(t.entries(), 3);
    }
}
