//! A model layer as a registry could serve it (tar, tar+gzip, tar+zstd; the first byte picks),
//! unpacked by the host into a volume's directory: whatever the archive holds (links, `..`,
//! absolute names, devices, set-uid bits, a file replacing a directory), nothing is created or
//! changed outside the directory it is unpacked into, and nothing panics. With the first byte's
//! bit 2 set, the archive is a container image layer: unpacked into a tree of its own, then
//! applied twice over a destination (its whiteouts over what the first application made), and
//! neither step reaches beside its directory.
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use mounthost::plan::Archive;
use mounthost::plan::tar_rules::Layering;

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
    let image = which & 4 != 0;
    let tree = work.join("tree");
    if image {
        use mounthost::exec::artifacts::fuzzing::{apply_image_layer, unpack_layer};
        if unpack_layer(&blob, DIGEST, format, Layering::Image, &tree).is_ok() {
            std::fs::create_dir(&into).unwrap();
            for _ in 0..2 {
                let _ = apply_image_layer(&tree, &into.join("model"), &into);
            }
        }
    } else {
        let _ = mounthost::exec::artifacts::fuzzing::unpack(&blob, DIGEST, format, &into);
    }
    let made: Vec<String> = names(work).into_iter().filter(|n| n != "tree" && n != "into").collect();
    assert_eq!(made, ["blob", "outside"], "made beside its directory");
    if into.exists() {
        let inside = names(&into);
        assert!(inside.is_empty() || !image || inside == ["model"], "applied beside its destination: {inside:?}");
    }
    assert!(names(&work.join("outside")).is_empty(), "the unpack wrote outside its directory");
    assert_eq!(std::fs::read(&blob).unwrap(), archive, "the unpack changed the blob");
    // Root (the daemon's, and the fuzzer's, user) removes it whatever modes the archive gave.
    for dir in [&into, &tree] {
        if dir.exists() {
            std::fs::remove_dir_all(dir).unwrap();
        }
    }
});
