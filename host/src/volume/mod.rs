//! Volumes as the host sees them: their directories, the per-volume lock, and their state.

pub mod dirs;
pub mod lock;
pub mod request;
pub mod size;
pub mod state;

pub use dirs::VolumeDirs;
pub use lock::{Busy, VolumeGuard, VolumeLocks};
