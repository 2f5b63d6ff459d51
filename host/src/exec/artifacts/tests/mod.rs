//! Unit tests of unpacking and linking the cache's blobs: no root, no registry.

mod assemble;
mod image;
mod unpack;

pub(super) use std::path::Path;

pub(super) use crate::oci::tests::*;
