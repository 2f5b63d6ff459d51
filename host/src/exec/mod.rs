//! The one room for privileged and `unsafe` operations.
//!
//! Everything that makes a syscall with side effects on the node, spawns a process, or needs
//! `unsafe` lives below this module, so that a reviewer can audit the daemon's privilege by
//! reading one folder. The node pipeline reaches it only through the [`Executor`] trait.

pub mod cgroup;
pub mod executor;
pub mod fs;
pub mod fuse_log;
pub mod mount;
pub mod mountinfo;
pub mod process;
pub mod recording;

pub use executor::{Executor, Fuse, FuseError, Linux, Usage};
