use super::super::segments::{Segments, chunks};

#[test]
fn ranges_merge_and_leave_gaps() {
    let mut s = Segments::default();
    s.insert(10..20);
    s.insert(30..40);
    s.insert(0..5);
    assert_eq!(s.prefix(), 5);
    assert_eq!(s.gaps(50), [5..10, 20..30, 40..50]);
    s.insert(5..10); // touches both neighbours' ends
    assert_eq!(s.ranges(), [0..20, 30..40]);
    s.insert(15..35); // overlaps
    assert_eq!(s.ranges(), std::slice::from_ref(&(0..40)));
    assert_eq!((s.prefix(), s.covered()), (40, 40));
    s.insert(40..50);
    assert!(s.gaps(50).is_empty());
    s.insert(7..7);
    assert_eq!(s.ranges(), std::slice::from_ref(&(0..50)));
}

#[test]
fn within_gives_the_recorded_parts_of_a_range() {
    let mut s = Segments::default();
    s.insert(10..20);
    s.insert(30..40);
    assert_eq!(s.within(0..100), [10..20, 30..40]);
    assert_eq!(s.within(15..35), [15..20, 30..35]);
    assert_eq!(s.within(20..30), Vec::<std::ops::Range<u64>>::new());
    assert_eq!(s.within(12..13), std::slice::from_ref(&(12..13)));
    assert_eq!(s.within(5..5), Vec::<std::ops::Range<u64>>::new());
}

#[test]
fn the_sidecar_round_trips_and_lies_are_refused() {
    let mut s = Segments::default();
    s.insert(0..100);
    s.insert(200..300);
    let text = s.encode(1000);
    assert_eq!(Segments::decode(&text, 1000, 1000), Some(s.clone()));
    assert_eq!(Segments::decode(&text, 999, 1000), None, "another size");
    assert_eq!(Segments::decode(&text, 1000, 250), None, "ranges past the file's end");
    assert_eq!(Segments::decode(r#"{"version":1,"size":1000,"have":[[200,300],[0,100]]}"#, 1000, 1000), None);
    assert_eq!(Segments::decode(r#"{"version":1,"size":1000,"have":[[5,5]]}"#, 1000, 1000), None);
    assert_eq!(Segments::decode("not json", 1000, 1000), None);
}

#[test]
fn gaps_are_cut_into_chunks_in_file_order() {
    assert_eq!(chunks(&[0..10, 20..25], 4), [0..4, 4..8, 8..10, 20..24, 24..25]);
}

#[test]
#[allow(clippy::single_range_in_vec_init)] // one-range rows of the table are meant
fn a_claim_returns_only_what_nobody_claimed_before() {
    let mut s = Segments::default();
    s.insert(10..20);
    s.insert(30..40);
    // (range claimed, parts returned): each claim against what the earlier rows left.
    let table: &[(std::ops::Range<u64>, &[std::ops::Range<u64>])] = &[
        (12..18, &[]),       // inside a claimed range
        (0..10, &[0..10]),   // up to a claimed range's start
        (5..35, &[20..30]),  // across a gap between two claimed ranges
        (38..45, &[40..45]), // overlapping a claimed range's end
        (50..60, &[50..60]), // past everything
        (44..52, &[45..50]), // between two claimed ranges, touching both
        (60..60, &[]),       // empty
        (0..70, &[60..70]),  // all of it
    ];
    for (r, parts) in table {
        assert_eq!(s.claim(r.clone()), *parts, "claim {r:?}");
    }
    assert_eq!(s.ranges(), std::slice::from_ref(&(0..70)));
}

#[test]
fn ranges_are_looked_up_and_removed_without_claiming() {
    let mut s = Segments::default();
    s.insert(0..10);
    s.insert(20..30);
    assert_eq!(s.missing_in(5..25), vec![10..20]);
    assert_eq!(s.ranges(), [0..10, 20..30], "looking claims nothing");
    assert!(s.contains(2..8) && s.contains(20..30) && !s.contains(8..21) && s.contains(5..5));
    s.remove(5..25);
    assert_eq!(s.ranges(), [0..5, 25..30]);
    s.remove(0..100);
    assert!(s.ranges().is_empty());
    s.insert(0..4);
    s.remove(4..8);
    assert_eq!(s.spans(), [(0, 4)], "removing what is not there changes nothing");
}
