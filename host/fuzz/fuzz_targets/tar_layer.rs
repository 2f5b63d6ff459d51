//! A model layer as a registry could serve it (tar, tar+gzip, tar+zstd; the first byte picks),
//! unpacked by the host into a volume's directory: whatever the archive holds (links, `..`,
//! absolute names, devices, set-uid bits, a file replacing a directory), nothing is created or
//! changed outside the directory it is unpacked into, and nothing panics.
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use mounthost::plan::Archive;

#[path = "work_dir.rs"]
mod work_dir;

const DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, archive)) = data.split_first() else { return };
    let format = match which % 4 {
        0 | 1 => Archive::Tar,
        2 => Archive::TarGzip,
        _ => Archive::TarZstd,
    };
    let work = work_dir::work("tar", &["outside"]);
    let blob = work.join("blob");
    let into = work.join("into");
    std::fs::write(&blob, archive).unwrap();
    let _ = mounthost::exec::artifacts::fuzzing::unpack(&blob, DIGEST, format, &into);
    let made = names(work);
    assert!(made == ["blob", "into", "outside"] || made == ["blob", "outside"], "made beside its directory: {made:?}");
    assert!(names(&work.join("outside")).is_empty(), "the unpack wrote outside its directory");
    assert_eq!(std::fs::read(&blob).unwrap(), archive, "the unpack changed the blob");
    // Root (the daemon's, and the fuzzer's, user) removes it whatever modes the archive gave.
    if into.exists() {
        std::fs::remove_dir_all(&into).unwrap();
    }
});
