//! The file table's types (see the parent module): what a layer holds, entry by entry, as the
//! host reads it from a layer's headers or its unpacked tree, keeps it beside the blob and
//! turns it into what its lazy server serves.

use serde::{Deserialize, Serialize};

pub use crate::unpriv::lazy_wire::Owner;

/// A layer's entries, in archive order (a later one replaces an earlier one of the same path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlobTable {
    /// Read from verified bytes (the complete blob, or an unpacked tree).
    pub verified: bool,
    pub entries: Vec<TableEntry>,
    /// An image layer's whiteouts and opaque directories ([`super::image`]): what it hides of the
    /// layers below it. Empty for every other layer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub whiteouts: Vec<Whiteout>,
}

/// One entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TableEntry {
    /// Its path in the layer (relative, plain components).
    pub path: String,
    pub kind: TableKind,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// An image layer's entry: its owner and mode, as the volume shows them. `None` for every
    /// other layer's (a lazy volume shows them read-only, owned by root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
}

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum TableKind {
    Dir,
    /// A file: `size` bytes at `offset` in the blob (0 for a tree's file).
    File {
        size: u64,
        offset: u64,
    },
    Symlink {
        target: String,
    },
}

/// What an image layer hides of the layers below it (`oci::table::image`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Whiteout {
    /// For a whiteout (`.wh.<name>`), the path it deletes (with everything below it); for an
    /// opaque marker, the directory whose entries of the lower layers it hides (`""`: the
    /// layer's root).
    pub path: String,
    /// An opaque marker (`.wh..wh..opq`), not a whiteout.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub opaque: bool,
}
