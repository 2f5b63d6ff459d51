//! A body a pod POSTs to its volume's socket (`/mounts`), and the ids it names in paths: the
//! daemon's decoding and checks never panic, and what they accept stays within the API's
//! documented bounds.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mounthost::daemon::dynamic::api::{self, CreateMount};

fuzz_target!(|data: &[u8]| {
    if data.len() > api::MAX_BODY {
        return;
    }
    if let Ok(text) = std::str::from_utf8(data) {
        // `DELETE /mounts/<id>` and `GET /mounts/<id>`: the id is the rest of the path.
        if api::check_id(text).is_ok() {
            assert!(!text.is_empty() && text.len() <= api::MAX_ID_LEN, "{text:?}");
            assert!(!text.contains('/') && text != "." && text != "..", "{text:?}");
        }
    }
    let Ok(ask) = serde_json::from_slice::<CreateMount>(data) else { return };
    if api::check_id(&ask.id).is_ok() && api::check_parameters(&ask.parameters).is_ok() {
        assert!(ask.parameters.len() <= api::MAX_PARAMS);
        for (k, v) in &ask.parameters {
            assert!(k.len() <= api::MAX_KEY_LEN && v.len() <= api::MAX_VALUE_LEN);
        }
    }
});
