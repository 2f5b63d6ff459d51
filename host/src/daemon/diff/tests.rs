use rstest::rstest;

use super::*;

const STAGING: &str = "/k/plugins/v/globalmount";
const TARGET: &str = "/k/pods/p/mount";
const CACHE: &str = "/s/cache/volumes/k";
const RUN: &str = "/s/run/k";

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

fn mount(at: &str, dev: &str, root: &str, fstype: &str, ro: bool) -> MountEntry {
    MountEntry {
        mount_id: 1,
        parent_id: 1,
        device: dev.into(),
        root: root.into(),
        mount_point: p(at),
        mount_options: if ro { "ro".into() } else { "rw".into() },
        fstype: fstype.into(),
        source: "src".into(),
        super_options: String::new(),
    }
}

fn spawn() -> Step {
    Step::SpawnFuse {
        program: "weed".into(),
        executable: p("/bin/weed"),
        args: vec![],
        env: vec![],
        mountpoint: p(STAGING),
        fstype: "fuse.seaweedfs".into(),
        ready_timeout_ms: 1000,
        memory_limit_bytes: None,
        host_mount: None,
        lazy: None,
    }
}

fn bind(source: &str, target: &str, readonly: bool) -> Step {
    Step::Bind { source: p(source), target: p(target), readonly, options: vec![] }
}

fn tmpfs(at: &str, ro: bool) -> Step {
    Step::Mount { fstype: "tmpfs".into(), source: "src".into(), target: p(at), options: vec![], readonly: ro }
}

fn stage(steps: Vec<Step>, published: &[(&str, bool)], process: Option<ProcessId>) -> Desired {
    Desired::Stage {
        staging: Root { path: p(STAGING), below: p("/k/plugins/v") },
        host_dirs: vec![p(CACHE), p(RUN)],
        steps,
        published: published
            .iter()
            .map(|(t, ro)| {
                (
                    p(t),
                    Publication {
                        readonly: *ro,
                        steps: vec![bind(STAGING, t, *ro)],
                        dynamic: None,
                        dynamic_limits: Default::default(),
                    },
                )
            })
            .collect(),
        process,
    }
}

fn publish(steps: Vec<Step>) -> Desired {
    Desired::Publish { staging: p(STAGING), target: Root { path: p(TARGET), below: p("/k/pods/p") }, steps }
}

const PID: ProcessId = ProcessId { pid: 7, start_time: 1 };

fn run(d: &Desired, mounts: &[MountEntry], alive: bool) -> Result<Vec<Action>, Conflict> {
    diff(d, Observed { mounts, process_alive: alive, gone_targets: &Default::default() })
}

fn stage_prefix(stop: bool) -> Vec<Action> {
    let mut v = Vec::new();
    if stop {
        v.push(Action::Stop(PID));
    }
    v.push(Action::ReleaseGroup);
    v
}

fn dirs() -> Vec<Action> {
    vec![
        Action::Mkdir { path: p(STAGING), below: p("/k/plugins/v") },
        Action::PrivateDir(p(CACHE)),
        Action::PrivateDir(p(RUN)),
    ]
}

fn cat(parts: Vec<Vec<Action>>) -> Vec<Action> {
    parts.into_iter().flatten().collect()
}

#[rstest]
#[case::fresh_fuse_stage(
    stage(vec![spawn()], &[], None), vec![], false,
    cat(vec![stage_prefix(false), dirs(), vec![Action::Run(spawn())]]))]
#[case::dead_mount_and_live_process_are_replaced(
    stage(vec![spawn()], &[], Some(PID)), vec![mount(STAGING, "0:9", "/", "fuse.seaweedfs", false)], true,
    cat(vec![stage_prefix(true), vec![Action::Unmount(p(STAGING))], dirs(), vec![Action::Run(spawn())]]))]
#[case::a_dead_process_is_not_stopped(
    stage(vec![spawn()], &[], Some(PID)), vec![], false,
    cat(vec![stage_prefix(false), dirs(), vec![Action::Run(spawn())]]))]
#[case::stacked_mounts_all_go(
    stage(vec![tmpfs(STAGING, false)], &[], None),
    vec![mount(STAGING, "0:9", "/", "tmpfs", false), mount(STAGING, "0:10", "/", "tmpfs", false)], false,
    cat(vec![stage_prefix(false), vec![Action::Unmount(p(STAGING)), Action::Unmount(p(STAGING))], dirs(), vec![
        Action::Run(tmpfs(STAGING, false))]]))]
#[case::restage_rebinds_targets_left_on_the_dead_mount(
    stage(vec![spawn()], &[(TARGET, true)], Some(PID)),
    vec![mount(STAGING, "0:9", "/", "fuse.seaweedfs", false), mount(TARGET, "0:9", "/", "fuse.seaweedfs", true)], false,
    cat(vec![stage_prefix(false), vec![Action::Unmount(p(STAGING))], dirs(), vec![
        Action::Run(spawn()),
        Action::Unmount(p(TARGET)), Action::Mkdir { path: p(TARGET), below: p("/k/pods/p") },
        Action::Run(bind(STAGING, TARGET, true))]]))]
fn stage_table(
    #[case] desired: Desired,
    #[case] mounts: Vec<MountEntry>,
    #[case] alive: bool,
    #[case] want: Vec<Action>,
) {
    assert_eq!(run(&desired, &mounts, alive).unwrap(), want);
}

#[rstest]
#[case::fresh_target(vec![mount(STAGING, "0:9", "/", "tmpfs", false)],
    Ok(vec![Action::Mkdir { path: p(TARGET), below: p("/k/pods/p") }, Action::Run(bind(STAGING, TARGET, false))]))]
#[case::already_there_is_a_no_op(
    vec![mount(STAGING, "0:9", "/", "tmpfs", false), mount(TARGET, "0:9", "/", "tmpfs", false)], Ok(vec![]))]
#[case::same_volume_other_flags(
    vec![mount(STAGING, "0:9", "/", "tmpfs", false), mount(TARGET, "0:9", "/", "tmpfs", true)],
    Err("this volume with other flags"))]
#[case::another_mount(
    vec![mount(STAGING, "0:9", "/", "tmpfs", false), mount(TARGET, "0:3", "/", "ext4", false)],
    Err("another mount"))]
#[case::a_sub_path_of_another_bind_is_not_the_same(
    vec![mount(STAGING, "0:9", "/", "tmpfs", false), mount(TARGET, "0:9", "/other", "tmpfs", false)],
    Err("another mount"))]
fn publish_table(#[case] mounts: Vec<MountEntry>, #[case] want: Result<Vec<Action>, &str>) {
    let got = run(&publish(vec![bind(STAGING, TARGET, false)]), &mounts, false);
    match (got, want) {
        (Ok(g), Ok(w)) => assert_eq!(g, w),
        (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e}"),
        (g, w) => panic!("got {g:?}, want {w:?}"),
    }
}

#[test]
fn a_sub_path_bind_is_recognised_by_its_mount_root() {
    let sub = format!("{STAGING}/models/a");
    let mounts = [mount(STAGING, "0:9", "/", "fuse.x", false), mount(TARGET, "0:9", "/models/a", "fuse.x", true)];
    assert_eq!(run(&publish(vec![bind(&sub, TARGET, true)]), &mounts, false).unwrap(), vec![]);
    let want_rw = run(&publish(vec![bind(&sub, TARGET, false)]), &mounts, false).unwrap_err();
    assert!(want_rw.to_string().contains("other flags"), "{want_rw}");
}

#[test]
fn a_directory_hidden_by_a_new_mount_is_made_again() {
    let sub = format!("{TARGET}/a");
    let d = publish(vec![Step::Mkdir { path: p(&sub) }, tmpfs(TARGET, false), Step::Mkdir { path: p(&sub) }]);
    let got = run(&d, &[], false).unwrap();
    let mkdirs = got.iter().filter(|a| matches!(a, Action::Mkdir { path, .. } if path == &p(&sub))).count();
    assert_eq!(mkdirs, 2, "{got:?}");
}

#[test]
fn the_top_of_a_stack_is_what_a_bind_of_it_shows() {
    // Two mounts stacked at staging; the target shows the top one: a republish is a no-op.
    let mounts = [
        mount(STAGING, "0:8", "/", "tmpfs", false),
        mount(STAGING, "0:9", "/", "tmpfs", false),
        mount(TARGET, "0:9", "/", "tmpfs", false),
    ];
    assert_eq!(run(&publish(vec![bind(STAGING, TARGET, false)]), &mounts, false).unwrap(), vec![]);
}

#[test]
fn plan_mkdirs_start_below_their_root_and_targets_below_their_parent() {
    let d = publish(vec![
        Step::Mkdir { path: p(TARGET) },
        Step::Mkdir { path: p(&format!("{TARGET}/a/b")) },
        tmpfs(&format!("{TARGET}/a/b"), true),
    ]);
    let got = run(&d, &[], false).unwrap();
    assert_eq!(
        got,
        vec![
            Action::Mkdir { path: p(TARGET), below: p("/k/pods/p") },
            Action::Mkdir { path: p(&format!("{TARGET}/a/b")), below: p(TARGET) },
            Action::Run(tmpfs(&format!("{TARGET}/a/b"), true)),
        ]
    );
}

#[test]
fn unpublish_unmounts_every_stacked_mount_then_removes_the_target() {
    let mounts = [mount(TARGET, "0:9", "/", "tmpfs", false), mount(TARGET, "0:9", "/", "tmpfs", true)];
    let d = Desired::Unpublish { target: p(TARGET) };
    assert_eq!(
        run(&d, &mounts, false).unwrap(),
        vec![Action::Unmount(p(TARGET)), Action::Unmount(p(TARGET)), Action::RemoveEntry(p(TARGET))]
    );
    assert_eq!(run(&d, &[], false).unwrap(), vec![Action::RemoveEntry(p(TARGET))], "already gone: remove only");
}

#[test]
fn teardown_clears_below_host_dirs_deepest_first() {
    let mounts = [
        mount(STAGING, "0:9", "/", "fuse.x", false),
        mount(&format!("{CACHE}/a"), "0:5", "/", "tmpfs", false),
        mount(&format!("{CACHE}/a/b"), "0:6", "/", "tmpfs", false),
    ];
    let d = Desired::Teardown {
        staging: p(STAGING),
        host_dirs: vec![p(CACHE), p(RUN)],
        steps: vec![Step::Remove { path: p(&format!("{RUN}/sock")) }],
        process: Some(PID),
    };
    assert_eq!(
        run(&d, &mounts, true).unwrap(),
        vec![
            Action::BestEffort(Box::new(Action::RemoveTree(p(&format!("{RUN}/sock"))))),
            Action::Stop(PID),
            Action::ReleaseGroup,
            Action::Unmount(p(STAGING)),
            Action::Unmount(p(&format!("{CACHE}/a/b"))),
            Action::Unmount(p(&format!("{CACHE}/a"))),
            Action::RemoveTree(p(CACHE)),
            Action::RemoveTree(p(RUN)),
        ]
    );
}

#[test]
fn steps_this_host_cannot_run_are_refused_before_anything() {
    let fetch = Step::Fetch { url: "https://r/x".into(), headers: vec![], digest: "sha256:0".into(), size: 1 };
    let e = run(&publish(vec![fetch]), &[], false).unwrap_err();
    assert_eq!(e, Conflict::Unsupported { kind: "fetch" });
}

#[test]
fn a_target_whose_pod_is_gone_is_skipped_and_the_others_get_everything_they_need() {
    // Two targets replay a plan that makes a sub-directory of staging and binds it. The first
    // (in the record's order) belongs to a pod that went away: the second must still get the
    // staging mkdir, which the first would have made.
    let sub = format!("{STAGING}/sub");
    let (gone, kept) = ("/k/pods/a/mount", "/k/pods/b/mount");
    let steps = |t: &str| vec![Step::Mkdir { path: p(&sub) }, bind(&sub, t, false)];
    let d = Desired::Stage {
        staging: Root { path: p(STAGING), below: p("/k/plugins/v") },
        host_dirs: vec![],
        steps: vec![tmpfs(STAGING, false)],
        published: [gone, kept]
            .map(|t| {
                (
                    p(t),
                    Publication { readonly: false, steps: steps(t), dynamic: None, dynamic_limits: Default::default() },
                )
            })
            .into(),
        process: None,
    };
    let gone_targets = [p(gone)].into();
    let got = diff(&d, Observed { mounts: &[], process_alive: false, gone_targets: &gone_targets }).unwrap();
    let names = |path: &str| got.iter().any(|a| format!("{a:?}").contains(path));
    assert!(!names("/k/pods/a"), "nothing for the gone pod's target: {got:?}");
    let i_mkdir = got.iter().position(|a| matches!(a, Action::Mkdir { path, .. } if *path == p(&sub)));
    let i_bind = got.iter().position(|a| *a == Action::Run(bind(&sub, kept, false)));
    assert!(i_mkdir.is_some() && i_bind.is_some() && i_mkdir < i_bind, "{got:?}");
    // Without the gone pod, the same record gives the same actions for the kept target.
    let alone = Desired::Stage {
        staging: Root { path: p(STAGING), below: p("/k/plugins/v") },
        host_dirs: vec![],
        steps: vec![tmpfs(STAGING, false)],
        published: [(
            p(kept),
            Publication { readonly: false, steps: steps(kept), dynamic: None, dynamic_limits: Default::default() },
        )]
        .into(),
        process: None,
    };
    assert_eq!(run(&alone, &[], false).unwrap(), got);
}

#[test]
fn a_lone_bind_onto_a_missing_target_needs_no_mount_table() {
    // What the pipeline relies on to skip reading mountinfo: with nothing at the target (it
    // does not exist), the table around it changes nothing in the actions.
    for readonly in [false, true] {
        let d = publish(vec![bind(STAGING, TARGET, readonly)]);
        assert_eq!(d.lone_bind_target(), Some(p(TARGET).as_path()));
        let around = [
            mount("/", "254:0", "/", "ext4", false),
            mount(STAGING, "0:9", "/", "fuse.seaweedfs", false),
            mount(STAGING, "0:10", "/", "tmpfs", true),
            mount("/k/pods/other/mount", "0:10", "/", "tmpfs", true),
        ];
        let want = run(&d, &[], false).unwrap();
        assert_eq!(run(&d, &around, false).unwrap(), want);
        assert_eq!(
            want,
            vec![
                Action::Mkdir { path: p(TARGET), below: p("/k/pods/p") },
                Action::Run(bind(STAGING, TARGET, readonly))
            ]
        );
    }
    // Anything more than that one bind reads the table.
    assert_eq!(
        publish(vec![bind(STAGING, TARGET, false), tmpfs(&format!("{TARGET}/x"), false)]).lone_bind_target(),
        None
    );
    assert_eq!(publish(vec![bind(&format!("{STAGING}/sub"), &format!("{TARGET}/x"), false)]).lone_bind_target(), None);
}

/// A dynamic volume's publication at TARGET: the host's tmpfs, the volume under `volume/`,
/// the socket.
fn dynamic_publication() -> Publication {
    let steps =
        crate::daemon::dynamic::publication_steps(&p(TARGET), vec![bind(STAGING, &format!("{TARGET}/volume"), true)]);
    Publication { readonly: true, steps, dynamic: Some(vec!["model".into()]), dynamic_limits: Default::default() }
}

#[test]
fn a_dynamic_publication_is_a_tmpfs_with_the_volume_below_and_a_socket() {
    let publication = dynamic_publication();
    let d = publish(publication.steps.clone());
    let actions = run(&d, &[], false).unwrap();
    assert!(
        matches!(&actions[1], Action::Run(Step::Mount { fstype, target, .. }) if fstype == "tmpfs" && *target == p(TARGET)),
        "{actions:?}"
    );
    assert_eq!(actions[2], Action::Mkdir { path: p(&format!("{TARGET}/volume")), below: p(TARGET) });
    assert!(
        matches!(actions.last(), Some(Action::Run(Step::Socket { path })) if *path == p(&format!("{TARGET}/csi.sock")))
    );
    // Published already: only the socket step runs again (it checks what is there itself).
    let mounts = [
        mount(STAGING, "0:9", "/", "fuse.x", false),
        MountEntry {
            source: crate::daemon::dynamic::TMPFS_SOURCE.into(),
            ..mount(TARGET, "0:20", "/", "tmpfs", false)
        },
        mount(&format!("{TARGET}/volume"), "0:9", "/", "fuse.x", true),
    ];
    assert_eq!(run(&d, &mounts, false).unwrap(), vec![Action::Run(publication.steps.last().unwrap().clone())]);
}

#[test]
fn a_restage_binds_a_dynamic_volume_again_below_its_tmpfs_and_keeps_the_pods_mounts() {
    let mut d = stage(vec![tmpfs(STAGING, false)], &[], None);
    if let Desired::Stage { published, .. } = &mut d {
        published.insert(p(TARGET), dynamic_publication());
    }
    let mounts = [
        MountEntry {
            source: crate::daemon::dynamic::TMPFS_SOURCE.into(),
            ..mount(TARGET, "0:20", "/", "tmpfs", false)
        },
        mount(&format!("{TARGET}/volume"), "0:8", "/", "tmpfs", true),
        mount(&format!("{TARGET}/mounts/m1"), "0:3", "/cache/m1", "ext4", true),
    ];
    let actions = run(&d, &mounts, false).unwrap();
    assert!(!actions.contains(&Action::Unmount(p(TARGET))), "the tmpfs with the socket stays: {actions:?}");
    assert!(!actions.contains(&Action::Unmount(p(&format!("{TARGET}/mounts/m1")))), "{actions:?}");
    assert!(actions.contains(&Action::Unmount(p(&format!("{TARGET}/volume")))), "the stale bind goes: {actions:?}");
    let rebind = Action::Run(bind(STAGING, &format!("{TARGET}/volume"), true));
    assert!(actions.contains(&rebind), "{actions:?}");
}

/// Below the target everything may be a pod's doing (a dynamic volume's pod can move a mount
/// out of reach of any path): those unmounts are best effort, deepest first; the target's own
/// stay mandatory (their lazy detach takes what is left below), then the target goes.
#[test]
fn unpublish_clears_mounts_below_the_target_best_effort_deepest_first_then_the_target() {
    let mounts = [
        mount("/k/pods", "0:1", "/", "ext4", false),
        mount(TARGET, "0:20", "/", "tmpfs", false),
        mount(&format!("{TARGET}/volume"), "0:9", "/", "fuse.x", true),
        mount(&format!("{TARGET}/mounts/a"), "0:3", "/c/a", "ext4", true),
        mount(&format!("{TARGET}/mounts/a/deep"), "0:4", "/", "tmpfs", false),
        mount(TARGET, "0:21", "/", "tmpfs", true),
        mount(&format!("{TARGET}2"), "0:22", "/", "tmpfs", false),
    ];
    let best_effort = |at: &str| Action::BestEffort(Box::new(Action::Unmount(p(&format!("{TARGET}/{at}")))));
    assert_eq!(
        run(&Desired::Unpublish { target: p(TARGET) }, &mounts, false).unwrap(),
        vec![
            best_effort("volume"),
            best_effort("mounts/a/deep"),
            best_effort("mounts/a"),
            Action::Unmount(p(TARGET)),
            Action::Unmount(p(TARGET)),
            Action::RemoveEntry(p(TARGET)),
        ],
        "the mount above the target and the neighbour {TARGET}2 are left alone"
    );
    // Nothing of the target's own: what is below is still tried, and the removal decides.
    assert_eq!(
        run(&Desired::Unpublish { target: p(TARGET) }, &mounts[2..3], false).unwrap(),
        vec![best_effort("volume"), Action::RemoveEntry(p(TARGET))]
    );
}

#[test]
fn a_dynamic_mount_goes_into_its_own_directory_and_refuses_what_is_there() {
    let target = format!("{TARGET}/mounts/m1");
    let cache = format!("{CACHE}/dynamic/m1");
    let d = Desired::Dynamic {
        target: Root { path: p(&target), below: p(&format!("{TARGET}/mounts")) },
        cache: Root { path: p(&cache), below: p(&format!("{CACHE}/dynamic")) },
        steps: vec![bind(&format!("{cache}/model"), &target, true)],
    };
    assert_eq!(
        run(&d, &[], false).unwrap(),
        vec![
            Action::PrivateDir(p(&cache)),
            Action::Mkdir { path: p(&target), below: p(&format!("{TARGET}/mounts")) },
            Action::Run(bind(&format!("{cache}/model"), &target, true)),
        ]
    );
    let other = [mount(&target, "0:77", "/", "tmpfs", false)];
    assert!(matches!(run(&d, &other, false), Err(Conflict::Occupied { .. })));
}
