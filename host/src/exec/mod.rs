//! The one room for privileged and `unsafe` operations.
//!
//! Everything that makes a syscall with side effects on the node, spawns a process, or needs
//! `unsafe` lives below this module, so that a reviewer can audit the daemon's privilege by
//! reading one folder.

pub mod artifact;
pub mod fs;
pub mod mount;
pub mod mountinfo;
pub mod process;
