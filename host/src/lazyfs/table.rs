//! The lazy filesystem's tree: inodes built from the file table the host sent
//! ([`crate::unpriv::lazy_wire::FileEntry`]), in the order later layers replace earlier ones,
//! as unpacking them one after the other would lay them out.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};

use crate::unpriv::lazy_wire::{Data, FileEntry, Kind};

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
}

impl Table {
    /// The tree of `entries`: each path's parents become directories (mode of the root), a
    /// later entry replaces an earlier one of the same path, and an entry below a path that
    /// is not a directory (the host refuses such tables) is left out.
    pub fn new(entries: &[FileEntry]) -> Table {
        let mut t =
            Table { nodes: vec![Node { parent: ROOT, kind: NodeKind::Dir(BTreeMap::new()), mtime: 0 }], files: 0 };
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
                    self.nodes[0].mtime = e.mtime;
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
                        (NodeKind::Dir(_), NodeKind::Dir(_)) => node.mtime = e.mtime,
                        (NodeKind::File { .. }, new @ NodeKind::File { .. })
                        | (NodeKind::Symlink(_), new @ NodeKind::Symlink(_)) => {
                            node.kind = new;
                            node.mtime = e.mtime;
                        }
                        _ => {}
                    }
                }
                None => {
                    let ino = self.push(Node { parent, kind, mtime: e.mtime });
                    self.link(parent, name, ino);
                }
            }
        }
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
                    let ino = self.push(Node { parent: at, kind: NodeKind::Dir(BTreeMap::new()), mtime });
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
        FileEntry { path: path.into(), kind: Kind::File { size, data: Data::Blob { layer, offset: 0 } }, mtime: 5 }
    }

    #[test]
    fn parents_are_made_and_later_entries_replace_earlier_ones() {
        let t = Table::new(&[
            file("config.json", 10, 0),
            file("tokenizer/vocab.txt", 20, 1),
            FileEntry { path: "tokenizer".into(), kind: Kind::Dir, mtime: 9 },
            file("config.json", 11, 2),
            FileEntry { path: "link".into(), kind: Kind::Symlink { target: "config.json".into() }, mtime: 1 },
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

    #[test]
    fn added_layers_join_the_tree_without_changing_a_kind() {
        let mut t = Table::new(&[file("w/a.bin", 1, 0)]);
        t.add(&[file("w/b.bin", 2, 1), FileEntry { path: "w/a.bin".into(), kind: Kind::Dir, mtime: 0 }]);
        let w = t.child(ROOT, OsStr::new("w")).unwrap();
        assert!(t.child(w, OsStr::new("b.bin")).is_some());
        let a = t.child(w, OsStr::new("a.bin")).unwrap();
        assert!(matches!(t.get(a).unwrap().kind, NodeKind::File { .. }), "a file stays a file");
        assert_eq!(t.entries(), 3);
    }
}
