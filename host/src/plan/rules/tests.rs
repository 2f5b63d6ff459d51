use std::path::Path;

use rstest::rstest;

use super::*;
use crate::plan::url::HostGrant;

const CACHE: &str = "/s/cache/volumes/ab";
const RUNTIME: &str = "/s/run/ab";
const STAGING: &str = "/k/plugins/kubernetes.io/csi/csi.mounthost.dev/h/globalmount";
const KEY: &str = "/run/mounthost/fuse/ab/secret-sshPrivateKey";

fn values(mount_point: &str) -> Values<'static> {
    Values {
        mount_point: mount_point.into(),
        secret_files: [KEY.to_string()].into(),
        cache: Some(Path::new(CACHE)),
        runtime: Some(Path::new(RUNTIME)),
        secret_files_dir: Some(Path::new("/run/mounthost/fuse/ab")),
        grants: ["filer:8888", "127.0.0.1:8333", "sftp.example.com"]
            .into_iter()
            .map(|g| HostGrant::parse(g).unwrap())
            .collect(),
    }
}

fn argv(s: &[&str]) -> Vec<String> {
    s.iter().map(|a| a.to_string()).collect()
}

fn weed_argv(extra: &[&str]) -> Vec<String> {
    let mut a = argv(&[
        "-logtostderr",
        "mount",
        "-filer=filer:8888",
        "-filer.path=/buckets/pv-1",
        &format!("-dir={STAGING}"),
        &format!("-cacheDir={CACHE}"),
        &format!("-localSocket={RUNTIME}/mount.sock"),
        "-collection=pv-1",
        "-cacheCapacityMB=128",
    ]);
    a.extend(argv(extra));
    a
}

fn weed(extra: &[&str]) -> Result<(), ArgRefusal> {
    builtin("weed").unwrap().check(&weed_argv(extra), &values(STAGING))
}

#[test]
fn every_builtin_set_parses_and_is_named_by_its_file() {
    for (name, _) in BUILTIN {
        assert_eq!(builtin(name).unwrap().name, *name);
    }
}

#[test]
fn the_seaweedfs_plugins_argv_passes_weed() {
    weed(&[]).unwrap();
    weed(&["-readOnly", "-allowOthers=false", "-readRetryTime=1m30s", "-map.uid=1000:0,1001:1", "-umask=022"]).unwrap();
}

#[rstest]
#[case::another_subcommand(&["-logtostderr", "shell"], 2, "subcommand")]
#[case::no_subcommand(&["-logtostderr"], 2, "subcommand")]
#[case::server(&["server", "-dir=/"], 1, "subcommand")]
fn weed_runs_only_its_mount_subcommand(#[case] args: &[&str], #[case] position: usize, #[case] rule: &str) {
    let err = builtin("weed").unwrap().check(&argv(args), &values(STAGING)).unwrap_err();
    assert_eq!((err.position, err.rule.as_str()), (position, rule), "{err:?}");
}

#[rstest]
#[case::mount_elsewhere("-dir=/etc", "options.-dir")]
#[case::cache_outside("-cacheDir=/var/lib", "options.-cacheDir")]
#[case::cache_below_staging(
    "-cacheDir=/k/plugins/kubernetes.io/csi/csi.mounthost.dev/h/globalmount/x",
    "options.-cacheDir"
)]
#[case::options_file("-options=/etc/weed.opts", "unknown-option")]
#[case::filer_not_granted("-filer=evil:8888", "options.-filer")]
#[case::filer_one_of_two_not_granted("-filer=filer:8888,169.254.169.254:80", "options.-filer")]
#[case::socket_outside("-localSocket=/run/other.sock", "options.-localSocket")]
#[case::socket_climbing("-localSocket=/s/run/ab/../../etc/x", "options.-localSocket")]
#[case::debug_port("-debug", "unknown-option")]
#[case::double_dash("--dir=/etc", "spelling")]
#[case::valued_flag_without_value("-collection", "options.-collection")]
#[case::flag_with_value("-readOnly=false", "options.-readOnly")]
#[case::positional("/etc", "extra-positional")]
#[case::dash("-", "spelling")]
#[case::int_out_of_range("-chunkSizeLimitMB=0", "options.-chunkSizeLimitMB")]
#[case::int_not_canonical("-chunkSizeLimitMB=08", "options.-chunkSizeLimitMB")]
#[case::enum_other("-volumeServerAccess=filer", "options.-volumeServerAccess")]
fn weed_refuses(#[case] extra: &str, #[case] rule: &str) {
    let err = weed(&[extra]).unwrap_err();
    assert_eq!(err.rule, rule, "{err:?}");
    assert_eq!(err.argument, extra);
    assert_eq!(err.position, weed_argv(&[]).len() + 1);
}

#[test]
fn after_a_positional_go_reads_everything_as_positional() {
    // Go stops reading flags at the first positional argument: a flag after it is the
    // program's positional, so the host never reads it as the flag it looks like.
    let err = weed(&["x", "-readOnly"]).unwrap_err();
    assert_eq!(err.rule, "extra-positional");
}

fn sshfs_argv(extra: &[&str]) -> Vec<String> {
    let mut a = argv(&[
        "alice@sftp.example.com:/srv/data",
        "/dev/fd/3",
        "-f",
        "-o",
        "port=22",
        "-o",
        &format!("IdentityFile={KEY}"),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "reconnect",
    ]);
    a.extend(argv(extra));
    a
}

fn sshfs(extra: &[&str]) -> Result<(), ArgRefusal> {
    builtin("sshfs").unwrap().check(&sshfs_argv(extra), &values("/dev/fd/3"))
}

#[test]
fn the_sshfs_examples_argv_passes_sshfs() {
    sshfs(&[]).unwrap();
    sshfs(&["-o", "cache=yes", "-ocompression=no"]).unwrap_err();
    sshfs(&["-o", "cache=yes,Compression=no"]).unwrap();
}

#[rstest]
#[case::ssh_command(&["-o", "ssh_command=sh -c id"], "unknown-o-option")]
#[case::proxy_command(&["-oProxyCommand=sh"], "unknown-o-option")]
#[case::config_file(&["-F", "/root/.ssh/config"], "unknown-option")]
#[case::identity_on_the_node(&["-o", "IdentityFile=/etc/ssh/ssh_host_ed25519_key"], "o-options.IdentityFile")]
#[case::accept_new(&["-o", "StrictHostKeyChecking=accept-new"], "o-options.StrictHostKeyChecking")]
#[case::escaped_item(&["-o", "cache=yes\\,ssh_command=x"], "spelling")]
#[case::item_as_argument(&["-o", "-F/etc/x"], "spelling")]
#[case::cluster(&["-fo", "ssh_command=x"], "spelling")]
#[case::double_dash(&["--", "x"], "spelling")]
#[case::list_missing(&["-o"], "spelling")]
fn sshfs_refuses(#[case] extra: &[&str], #[case] rule: &str) {
    let err = sshfs(extra).unwrap_err();
    assert_eq!(err.rule, rule, "{err:?}");
}

#[rstest]
#[case::ungranted_host("alice@evil.example.com:/", "positionals.1")]
#[case::option_as_host("-oProxyCommand=x:/", "unknown-o-option")]
#[case::dash_user("-x@sftp.example.com:/", "spelling")]
#[case::no_path("sftp.example.com", "positionals.1")]
fn sshfs_judges_its_remote(#[case] remote: &str, #[case] rule: &str) {
    let mut args = sshfs_argv(&[]);
    args[0] = remote.into();
    let err = builtin("sshfs").unwrap().check(&args, &values("/dev/fd/3")).unwrap_err();
    assert_eq!(err.rule, rule, "{err:?}");
}

#[test]
fn a_positional_mount_point_must_be_the_planned_one() {
    let mut args = sshfs_argv(&[]);
    args[1] = "/etc".into();
    let err = builtin("sshfs").unwrap().check(&args, &values("/dev/fd/3")).unwrap_err();
    assert_eq!((err.position, err.rule.as_str()), (2, "positionals.2"), "{err:?}");
    args.remove(1);
    // The options around it are judged, then the missing positional is named.
    let err = builtin("sshfs").unwrap().check(&args, &values("/dev/fd/3")).unwrap_err();
    assert_eq!((err.position, err.rule.as_str()), (0, "positionals.2"), "{err:?}");
}

#[rstest]
#[case::root(&["-f", "/", STAGING], Some("positionals.1"))]
#[case::node_dir(&["-f", "/etc", STAGING], Some("positionals.1"))]
#[case::cache_itself(&["-f", CACHE, STAGING], None)]
#[case::in_cache(&["-f", "/s/cache/volumes/ab/data", STAGING], None)]
#[case::climbing(&["-f", "/s/cache/volumes/ab/../../../../etc", STAGING], Some("positionals.1"))]
#[case::sibling_prefix(&["-f", "/s/cache/volumes/abc", STAGING], Some("positionals.1"))]
#[case::second_mount_point(&["-f", CACHE, "/etc"], Some("positionals.2"))]
#[case::third_positional(&["-f", CACHE, STAGING, "/mnt"], Some("extra-positional"))]
fn bindfs_mirrors_only_the_volumes_own_directory(#[case] args: &[&str], #[case] rule: Option<&str>) {
    let got = builtin("bindfs").unwrap().check(&argv(args), &values(STAGING));
    assert_eq!(got.as_ref().err().map(|e| e.rule.as_str()), rule, "{got:?}");
}

#[test]
fn unknown_keys_and_bad_classes_are_refused_with_where() {
    let base = "name: x\nchecked: {version: '1', command: [--version]}\nstyle: fuse\n";
    let err = RuleSet::parse("x.yaml", &format!("{base}colour: blue\n")).unwrap_err();
    assert!(err.contains("x.yaml") && err.contains("colour"), "{err}");
    for (yaml, expect) in [
        ("options: {-f: flagg}", "unknown class \"flagg\""),
        ("options: {-f: {enum: [a], int: [1, 2]}}", "exactly one of"),
        ("options: {-f: {pattern: 'a', part: {}}}", "unknown key \"part\""),
        ("options: {-f: {pattern: '(a'}}", "does not compile"),
        ("options: {-f: {pattern: 'a', parts: {host: granted-host}}}", "no group named host"),
        ("options: {-f: {int: [5, 1]}}", "is empty"),
        ("options: {-f: {below: etc}}", "cache, runtime or secret-files"),
        ("options: {-oo: flag}", "not spelled"),
        ("options: {-o: flag}", "o-options"),
        ("global-options: {-x: flag}", "style go"),
        ("reads: [etc/x]", "absolute"),
        ("config-file: [-F, /dev/null]", "{empty}"),
        ("env: [LD_PRELOAD]", "dynamic loader"),
        ("positionals: [{name: x, class: flag}]", "value class"),
    ] {
        let err = RuleSet::parse("x.yaml", &format!("{base}{yaml}\n")).unwrap_err();
        assert!(err.contains(expect), "{yaml}: {err}");
    }
}

#[test]
fn a_rule_sets_directory_names_each_set_by_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = "name: mine\nchecked: {version: '1', command: [--version]}\nstyle: gnu\noptions: {--x: flag}\n";
    std::fs::write(dir.path().join("mine.yaml"), text).unwrap();
    std::fs::write(dir.path().join("README"), "not a set").unwrap();
    let sets = load_dir(dir.path()).unwrap();
    assert_eq!(sets.keys().collect::<Vec<_>>(), ["mine"]);
    std::fs::write(dir.path().join("other.yaml"), text).unwrap();
    let err = load_dir(dir.path()).unwrap_err();
    assert!(err.contains("other.yaml") && err.contains("mine.yaml"), "{err}");
}

#[test]
fn config_file_arguments_name_the_empty_file() {
    let set = builtin("sshfs").unwrap();
    assert_eq!(set.config_args(Path::new("/tmp/.mounthost/empty")), ["-F", "/tmp/.mounthost/empty"]);
}
