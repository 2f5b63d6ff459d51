//! Sigstore bundles as a registry writer could attach them to a model (a referrer, or a
//! `model.sig` layer), read by the host daemon before any signature is checked: the bundle's
//! JSON, its DSSE envelope, and the in-toto statement inside, for both predicates the host reads.
//! Nothing panics; a statement that is read names only relative paths of plain components.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mounthost::oci::signing::{INDEX_PREDICATE, MODEL_PREDICATE, fuzzing};

fuzz_target!(|data: &[u8]| {
    for predicate in [MODEL_PREDICATE, INDEX_PREDICATE] {
        for read in [fuzzing::read_bundle(data, predicate), fuzzing::read_statement(data, predicate)] {
            let Ok(files) = read else { continue };
            for name in &files {
                assert!(!name.is_empty() && !name.starts_with('/'), "{name:?}");
                assert!(name.split('/').all(|c| !c.is_empty() && c != "." && c != ".."), "{name:?}");
            }
        }
    }
    // And through the whole verification, against an empty trust set (refused, never a panic).
    let verdict = mounthost::oci::signing::verify(
        data,
        &mounthost::oci::signing::TrustSet::empty(),
        &["corp".to_string()],
        MODEL_PREDICATE,
        std::time::SystemTime::now(),
    );
    assert!(verdict.is_err());
});
