//! Volumes as the host sees them. For now: the directories a volume's plans may touch.

pub mod dirs;

pub use dirs::VolumeDirs;
