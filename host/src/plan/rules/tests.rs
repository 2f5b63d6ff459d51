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
    // And one that looks like an option there is read no way at all (weed's fla9 would load
    // `-options=FILE` from it).
    let set = RuleSet::parse(
        "p.yaml",
        "name: p\nchecked: {version: '1', command: [version]}\nstyle: go\npositionals: [{name: a, class: {pattern: '.*'}}, {name: b, class: {pattern: '.*'}}]\n",
    )
    .unwrap();
    let err = set.check(&argv(&["x", "-options=/etc/x"]), &values(STAGING)).unwrap_err();
    assert_eq!((err.position, err.rule.as_str()), (2, "spelling"), "{err:?}");
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
fn config_file_arguments_name_the_empty_file() {
    let set = builtin("sshfs").unwrap();
    assert_eq!(set.config_args(Path::new("/tmp/.mounthost/empty")), ["-F", "/tmp/.mounthost/empty"]);
}

const WEBDAV: &str = ":webdav,url='https://dav.example.com/remote.php/dav/files/alice',vendor=nextcloud:pv-1";
const S3: &str = ":s3,provider=SeaweedFS,endpoint='http://127.0.0.1:8333',region=us-east-1,force_path_style=true,\
                  no_check_bucket=true:pv-1/data";

/// [`values`], and the WebDAV server a StorageClass grants.
fn rclone_values() -> Values<'static> {
    let mut v = values(STAGING);
    v.grants.push(HostGrant::parse("dav.example.com:443").unwrap());
    v
}

fn rclone_argv(remote: &str, extra: &[&str]) -> Vec<String> {
    let mut a = argv(&[
        "mount",
        remote,
        STAGING,
        &format!("--cache-dir={CACHE}"),
        "--vfs-cache-mode=writes",
        "--dir-cache-time=30s",
        "--allow-other",
        "--uid=1000",
        "--gid=1000",
        "--umask=022",
        "--log-level=INFO",
    ]);
    a.extend(argv(extra));
    a
}

fn rclone(remote: &str, extra: &[&str]) -> Result<(), ArgRefusal> {
    builtin("rclone").unwrap().check(&rclone_argv(remote, extra), &rclone_values())
}

#[test]
fn a_webdav_and_an_s3_plugins_argv_pass_rclone() {
    rclone(WEBDAV, &[]).unwrap();
    rclone(S3, &[]).unwrap();
    rclone(":webdav,url='http://127.0.0.1:8333/dav':", &[]).unwrap();
    rclone(":webdav,url='https://dav.example.com/dav',vendor=other,user=alice:a/b", &[]).unwrap();
    rclone(":s3,provider=Minio,endpoint='http://127.0.0.1:8333',upload_concurrency=8:pv-1", &[]).unwrap();
    rclone(
        WEBDAV,
        &[
            "--read-only",
            "--vfs-cache-max-size=10Gi",
            "--vfs-cache-max-age=1h0m0s",
            "--vfs-read-chunk-size=64M",
            "--vfs-read-chunk-size-limit=off",
            "--buffer-size=16Mi",
            "--poll-interval=0",
            "--transfers=8",
            "--timeout=5m",
            "--contimeout=30s",
            "--low-level-retries=3",
            "--file-perms=0644",
            "--dir-perms=755",
            "--no-modtime=false",
            &format!("--ca-cert={KEY}"),
        ],
    )
    .unwrap();
}

#[rstest]
#[case::serve(&["serve", "webdav", ":local:/", "--addr=:8080"], 1, "subcommand")]
#[case::rcd(&["rcd", "--rc-no-auth"], 1, "subcommand")]
#[case::config(&["config", "create", "x", "local"], 1, "subcommand")]
#[case::mount2(&["mount2", WEBDAV, STAGING], 1, "subcommand")]
#[case::flag_first(&["--rc", "mount", WEBDAV, STAGING], 1, "subcommand")]
#[case::no_subcommand(&[WEBDAV, STAGING], 1, "subcommand")]
fn rclone_runs_only_its_mount_subcommand(#[case] args: &[&str], #[case] position: usize, #[case] rule: &str) {
    let err = builtin("rclone").unwrap().check(&argv(args), &rclone_values()).unwrap_err();
    assert_eq!((err.position, err.rule.as_str()), (position, rule), "{err:?}");
}

#[rstest]
#[case::password_command("--password-command=sh -c id", "unknown-option")]
#[case::bearer_token_command_flag("--webdav-bearer-token-command=id", "unknown-option")]
#[case::rc("--rc", "unknown-option")]
#[case::rc_addr("--rc-addr=:5572", "unknown-option")]
#[case::rc_serve("--rc-serve", "unknown-option")]
#[case::config("--config=/root/.config/rclone/rclone.conf", "unknown-option")]
#[case::backend_flag("--webdav-url=http://169.254.169.254/", "unknown-option")]
#[case::s3_env_auth("--s3-env-auth", "unknown-option")]
#[case::log_file("--log-file=/etc/cron.d/x", "unknown-option")]
#[case::temp_dir("--temp-dir=/etc", "unknown-option")]
#[case::dump("--dump=headers,auth", "unknown-option")]
#[case::daemon("--daemon", "unknown-option")]
#[case::fuse_option("-o", "unknown-option")]
#[case::fuse_flag("--fuse-flag=suid", "unknown-option")]
#[case::no_check_certificate("--no-check-certificate", "unknown-option")]
#[case::cache_outside("--cache-dir=/var/lib", "options.--cache-dir")]
#[case::cache_climbing("--cache-dir=/s/cache/volumes/ab/../../..", "options.--cache-dir")]
#[case::cache_below_staging(
    "--cache-dir=/k/plugins/kubernetes.io/csi/csi.mounthost.dev/h/globalmount/x",
    "options.--cache-dir"
)]
#[case::cache_in_next_argument("--cache-dir", "options.--cache-dir")]
#[case::ca_on_the_node("--ca-cert=/etc/ssl/private/node.key", "options.--ca-cert")]
#[case::umask_decimal("--umask=22", "options.--umask")]
#[case::setuid_perms("--file-perms=4755", "options.--file-perms")]
#[case::duration_in_days("--dir-cache-time=1d", "options.--dir-cache-time")]
#[case::log_level_lower("--log-level=debug", "options.--log-level")]
#[case::verbose("-v", "unknown-option")]
#[case::verbose_cluster("-vv", "spelling")]
#[case::double_dash("--", "spelling")]
#[case::second_mount_point("/mnt", "extra-positional")]
fn rclone_refuses(#[case] extra: &str, #[case] rule: &str) {
    let err = rclone(WEBDAV, &[extra]).unwrap_err();
    assert_eq!(err.rule, rule, "{err:?}");
    assert_eq!(err.argument, extra);
    assert_eq!(err.position, rclone_argv(WEBDAV, &[]).len() + 1);
}

#[rstest]
#[case::node_root("/", "is not a match of")]
#[case::node_path("/etc", "is not a match of")]
#[case::local_backend(":local:/", "is not a match of")]
#[case::local_backend_with_parameters(":local,nounc=true:/etc", "is not a match of")]
#[case::config_remote("node-remote:", "is not a match of")]
#[case::config_remote_with_override("node-remote,url='https://dav.example.com/':", "is not a match of")]
#[case::sftp_with_ssh(":sftp,host=sftp.example.com,ssh='sh -c id':/", "is not a match of")]
#[case::webdav_with_ssh(":webdav,url='https://dav.example.com/',ssh='sh -c id':", "is not a match of")]
#[case::bearer_token_command(
    ":webdav,url='https://dav.example.com/',bearer_token_command='sh -c id':",
    "is not a match of"
)]
#[case::parameters_after_the_path(
    ":webdav,url='https://dav.example.com/':x,bearer_token_command=id:",
    "is not a match of"
)]
#[case::ungranted_url(":webdav,url='https://evil.example.com/':", "part url")]
#[case::metadata_url(":webdav,url='http://169.254.169.254/latest/':", "part url")]
#[case::userinfo(":webdav,url='https://evil@dav.example.com/':", "part url")]
#[case::unquoted_url(":webdav,url=https://dav.example.com/:", "is not a match of")]
#[case::doubled_quote(":webdav,url='https://dav.example.com/'':x'':", "is not a match of")]
#[case::sharepoint(":webdav,url='https://dav.example.com/',vendor=sharepoint:", "part vendor")]
#[case::keys_out_of_order(":webdav,vendor=other,url='https://dav.example.com/':", "is not a match of")]
#[case::climbing_path(":webdav,url='https://dav.example.com/dav/alice':../bob", "is not a match of")]
#[case::aws_provider(":s3,provider=AWS,endpoint='http://127.0.0.1:8333':pv-1", "part provider")]
#[case::no_endpoint(":s3,provider=SeaweedFS:pv-1", "is not a match of")]
#[case::env_auth(":s3,provider=Other,endpoint='http://127.0.0.1:8333',env_auth=true:pv-1", "is not a match of")]
#[case::shared_credentials_file(
    ":s3,provider=Other,endpoint='http://127.0.0.1:8333',shared_credentials_file=/root/.aws/credentials:pv-1",
    "is not a match of"
)]
#[case::virtual_host_style(
    ":s3,provider=Other,endpoint='http://127.0.0.1:8333',force_path_style=false:pv-1",
    "is not a match of"
)]
#[case::concurrency_out_of_range(
    ":s3,provider=Other,endpoint='http://127.0.0.1:8333',upload_concurrency=0:pv-1",
    "part upload_concurrency"
)]
#[case::no_bucket(":s3,provider=Other,endpoint='http://127.0.0.1:8333':", "is not a match of")]
fn rclone_judges_its_remote(#[case] remote: &str, #[case] why: &str) {
    let err = rclone(remote, &[]).unwrap_err();
    assert_eq!((err.position, err.rule.as_str()), (2, "positionals.1"), "{err:?}");
    assert!(err.reason.contains(why), "{err:?}");
}

#[test]
fn rclone_mounts_only_at_the_planned_mount_point() {
    let mut args = rclone_argv(WEBDAV, &[]);
    args[2] = "/etc".into();
    let err = builtin("rclone").unwrap().check(&args, &rclone_values()).unwrap_err();
    assert_eq!((err.position, err.rule.as_str()), (3, "positionals.2"), "{err:?}");
}

const PASSWD: &str = "/s/run/ab/secret-passwd";

/// [`values`], and the password file an s3fs plugin has the host write (a program that mounts
/// by itself gets its secret files in the runtime directory).
fn s3fs_values() -> Values<'static> {
    let mut v = values(STAGING);
    v.secret_files.insert(PASSWD.into());
    v
}

/// A SeaweedFS S3 gateway's bucket, as an s3fs plugin mounts it.
fn s3fs_argv(extra: &[&str]) -> Vec<String> {
    let mut a = argv(&[
        "pv-1:/data",
        STAGING,
        "-f",
        "-o",
        "url=http://127.0.0.1:8333,use_path_request_style",
        "-o",
        &format!("passwd_file={PASSWD}"),
        "-o",
        &format!("use_cache={CACHE},tmpdir={CACHE},del_cache"),
        "-o",
        "allow_other,uid=1000,gid=1000,umask=0022,mp_umask=022",
    ]);
    a.extend(argv(extra));
    a
}

fn s3fs(extra: &[&str]) -> Result<(), ArgRefusal> {
    builtin("s3fs").unwrap().check(&s3fs_argv(extra), &s3fs_values())
}

#[test]
fn a_seaweedfs_s3_gateways_argv_passes_s3fs() {
    s3fs(&[]).unwrap();
    s3fs(&["-o", "endpoint=us-east-1,sigv4,multipart_size=64,parallel_count=8,ensure_diskfree=1024"]).unwrap();
    s3fs(&["-ostat_cache_expire=60,enable_noobj_cache,complement_stat,dbglevel=info,ro"]).unwrap();
}

#[rstest]
#[case::passwd_on_the_node(&["-o", "passwd_file=/etc/passwd-s3fs"], "o-options.passwd_file")]
#[case::passwd_in_roots_home(&["-o", "passwd_file=/root/.passwd-s3fs"], "o-options.passwd_file")]
#[case::passwd_in_the_cache(&["-o", "passwd_file=/s/cache/volumes/ab/passwd"], "o-options.passwd_file")]
#[case::cache_outside(&["-o", "use_cache=/var/lib"], "o-options.use_cache")]
#[case::cache_root(&["-o", "use_cache=/"], "o-options.use_cache")]
#[case::cache_climbing(&["-o", "use_cache=/s/cache/volumes/ab/../../.."], "o-options.use_cache")]
#[case::cache_in_staging(
    &["-o", "use_cache=/k/plugins/kubernetes.io/csi/csi.mounthost.dev/h/globalmount"],
    "o-options.use_cache"
)]
#[case::tmpdir_outside(&["-o", "tmpdir=/etc"], "o-options.tmpdir")]
#[case::credlib(&["-o", "credlib=/tmp/x.so"], "unknown-o-option")]
#[case::credlib_opts(&["-o", "credlib_opts=x"], "unknown-o-option")]
#[case::modules(&["-o", "modules=subdir,subdir=/etc"], "unknown-o-option")]
#[case::suid(&["-o", "suid"], "unknown-o-option")]
#[case::dev(&["-odev"], "unknown-o-option")]
#[case::metadata_url(&["-o", "url=http://169.254.169.254"], "o-options.url")]
#[case::second_url_spelling(&["-o", "host=http://evil.example.com"], "unknown-o-option")]
#[case::iam_role(&["-o", "iam_role=auto"], "unknown-o-option")]
#[case::ecs(&["-o", "ecs"], "unknown-o-option")]
#[case::ibm_iam_endpoint(&["-o", "ibm_iam_endpoint=http://evil.example.com"], "unknown-o-option")]
#[case::profile(&["-o", "profile=default"], "unknown-o-option")]
#[case::logfile(&["-o", "logfile=/etc/cron.d/x"], "unknown-o-option")]
#[case::mime(&["-o", "mime=/etc/shadow"], "unknown-o-option")]
#[case::ahbe_conf(&["-o", "ahbe_conf=/etc/shadow"], "unknown-o-option")]
#[case::sse_key_file(&["-o", "use_sse=custom:/etc/shadow"], "unknown-o-option")]
#[case::no_check_certificate(&["-o", "no_check_certificate"], "unknown-o-option")]
#[case::uid_in_octal(&["-o", "uid=0100"], "o-options.uid")]
#[case::umask_not_octal(&["-o", "umask=0o22"], "o-options.umask")]
#[case::escaped_item(&["-o", "del_cache\\,tmpdir=/etc"], "spelling")]
#[case::utility_mode(&["-u"], "unknown-option")]
#[case::mpu_abort(&["--incomplete-mpu-abort=all"], "unknown-option")]
#[case::second_mount_point(&["/mnt"], "extra-positional")]
fn s3fs_refuses(#[case] extra: &[&str], #[case] rule: &str) {
    let err = s3fs(extra).unwrap_err();
    assert_eq!(err.rule, rule, "{err:?}");
    assert_eq!(err.position, s3fs_argv(&[]).len() + extra.len());
}

#[rstest]
#[case::bucket("pv-1", None)]
#[case::bucket_root("pv-1:/", None)]
#[case::node_root("/", Some(1))]
#[case::upper_case("PV-1", Some(1))]
#[case::relative_path("pv-1:data", Some(1))]
#[case::climbing_path("pv-1:/../x", Some(1))]
#[case::url("http://127.0.0.1:8333/pv-1", Some(1))]
#[case::mount_point_outside("/etc", Some(2))]
fn s3fs_judges_its_positionals(#[case] arg: &str, #[case] refused_at: Option<usize>) {
    let mut args = s3fs_argv(&[]);
    match refused_at {
        Some(2) => args[1] = arg.into(),
        _ => args[0] = arg.into(),
    }
    let got = builtin("s3fs").unwrap().check(&args, &s3fs_values());
    let want = refused_at.map(|p| (p, format!("positionals.{p}")));
    assert_eq!(got.as_ref().err().map(|e| (e.position, e.rule.clone())), want, "{got:?}");
}

#[test]
fn rclone_and_s3fs_mount_by_themselves_and_get_credentials_only_from_the_plan() {
    let rclone = builtin("rclone").unwrap();
    let s3fs = builtin("s3fs").unwrap();
    assert_eq!((rclone.host_fd, s3fs.host_fd), (HostFd::Unsupported, HostFd::Unsupported));
    assert_eq!(rclone.config_args(Path::new("/tmp/.mounthost/empty")), ["--config=/tmp/.mounthost/empty"]);
    // Variables that name a command, a file, a host or another configuration stay refused.
    for name in rclone.env.iter().chain(&s3fs.env) {
        for word in ["COMMAND", "FILE", "URL", "CONFIG", "AUTH", "PROFILE"] {
            assert!(!name.contains(word), "{name}");
        }
    }
    assert!(rclone.reads.contains(&PathBuf::from("/root/.config/rclone")));
    assert!(s3fs.reads.contains(&PathBuf::from("/etc/passwd-s3fs")));
}
