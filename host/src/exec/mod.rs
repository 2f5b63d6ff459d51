//! The executor room: every effect the host daemon has on the node, and the only `unsafe`
//! besides loading compiled plugins.
//!
//! Mounts, directories, files (state, kept secrets, logs), cgroups, processes, signals,
//! reaping, pidfds and sockets all go through the [`Executor`] traits, so a reviewer audits the
//! daemon's privilege by reading one folder, and the recording executor sees every effect of
//! the pipeline in unit tests. Paths below the daemon's anchors are resolved without following
//! symbolic links ([`beneath`]).

pub mod artifacts;
pub mod beneath;
pub mod cgroup;
pub mod confine;
pub mod executor;
pub mod fuse_log;
pub mod instance;
pub mod lazy;
pub mod linux;
pub mod mount;
pub mod mountinfo;
pub mod process;
pub mod recording;

pub use executor::{
    Boot, Confinement, Control, Executor, Exit, FileId, FileKind, Files, Fuse, FuseError, Groups, HostFuse, Mounts,
    Processes, Usage,
};
pub use linux::Linux;
