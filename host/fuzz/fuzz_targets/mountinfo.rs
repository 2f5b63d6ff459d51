//! `/proc/self/mountinfo` as the kernel could write it (mount points a pod or backend names,
//! with octal escapes): the parser never panics, a filtered parse keeps exactly the entries
//! the filter accepts, and every mount point it returns is absolute.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mounthost::exec::mountinfo;

fuzz_target!(|data: &[u8]| {
    let Ok(all) = mountinfo::parse(data) else { return };
    for e in &all {
        assert!(e.mount_point.is_absolute(), "{e:?}");
        let _ = e.is_readonly();
    }
    let keep = |p: &std::path::Path| p.as_os_str().len() % 2 == 0;
    let some = mountinfo::parse_where(data, keep).expect("a text that parses whole parses filtered");
    let want: Vec<_> = all.iter().filter(|e| keep(&e.mount_point)).cloned().collect();
    assert_eq!(some, want);
    if let Some(first) = all.first() {
        assert!(mountinfo::at(&all, &first.mount_point).is_some());
    }
});
