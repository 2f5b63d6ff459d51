//! Table tests of the planners, run natively: every parameter to its flag, every bad value to
//! its error, secrets only as environment references, read-only sources, the mount-option
//! allowlist, determinism, and the provision/delete round trip.

use std::collections::BTreeMap;

use mounthost_plugin_sdk::*;
use rstest::rstest;

use crate::Seaweedfs;
use crate::params::SPECS;

const SECRETS: &[(&str, &str, &str)] = &[
    ("jwtSigningKey", "WEED_JWT_SIGNING_KEY", "s3cr3t-write-volume"),
    ("jwtSigningReadKey", "WEED_JWT_SIGNING_READ_KEY", "s3cr3t-read-volume"),
    ("jwtFilerSigningKey", "WEED_JWT_FILER_SIGNING_KEY", "s3cr3t-write-filer"),
    ("jwtFilerSigningReadKey", "WEED_JWT_FILER_SIGNING_READ_KEY", "s3cr3t-read-filer"),
];

fn kvs(pairs: &[(&str, &str)]) -> Vec<Kv> {
    pairs.iter().map(|(k, v)| kv(*k, *v)).collect()
}

/// The base context plus `extra`, an extra key replacing a base one.
fn context(extra: &[(&str, &str)]) -> Vec<Kv> {
    let mut pairs: Vec<(&str, &str)> = vec![("filer", "127.0.0.1:8888"), ("path", "/buckets/pvc-1")];
    for (k, v) in extra {
        pairs.retain(|(bk, _)| bk != k);
        pairs.push((k, v));
    }
    kvs(&pairs)
}

fn capability(mode: AccessMode, fs_type: &str, flags: &[&str]) -> VolumeCapability {
    VolumeCapability::new(mode)
        .with_fs_type(fs_type)
        .with_mount_flags(flags.iter().map(|f| f.to_string()).collect::<Vec<_>>())
}

fn rw() -> VolumeCapability {
    capability(AccessMode::MultiNodeMultiWriter, "", &[])
}

fn stage_req(ctx: Vec<Kv>, secrets: Vec<Kv>, cap: VolumeCapability) -> StageRequest {
    StageRequest::default()
        .with_volume_id("seaweedfs:vol")
        .with_context(ctx)
        .with_secrets(secrets)
        .with_capability(cap)
        .with_node_id("node-1")
}

fn stage(extra: &[(&str, &str)]) -> Result<Plan, BackendError> {
    Seaweedfs::stage(stage_req(context(extra), vec![], rw()))
}

fn spawn_of(plan: &Plan) -> &SpawnFuse {
    match plan.steps.as_slice() {
        [Step::SpawnFuse(s)] => s,
        other => panic!("expected one spawn-fuse step, got {other:?}"),
    }
}

fn literals(s: &SpawnFuse) -> Vec<String> {
    s.args
        .iter()
        .filter_map(|a| match a {
            Arg::Literal(t) => Some(t.clone()),
            _ => None,
        })
        .collect()
}

/// The literal flags after the fixed head (mount, -filer, -filer.path).
fn tuning(plan: &Plan) -> Vec<String> {
    // Skip `-logtostderr mount -filer=.. -filer.path=..` (the path arguments are not literals).
    literals(spawn_of(plan)).into_iter().skip(4).collect()
}

fn message(err: BackendError) -> String {
    match err {
        BackendError::InvalidArgument(m) => m,
        other => panic!("expected invalid-argument, got {other:?}"),
    }
}

#[test]
fn info_documents_every_key_and_the_program() {
    let info = Seaweedfs::info();
    assert_eq!(info.name, "seaweedfs");
    assert_eq!(info.version, "0.1.0");
    assert!(!info.description.is_empty());
    assert_eq!(info.programs, vec!["weed".to_string()]);
    assert_eq!(info.fstypes, vec!["fuse.seaweedfs".to_string()]);
    assert_eq!(info.parameters.len(), SPECS.len());
    for doc in &info.parameters {
        assert!(!doc.doc.is_empty(), "{} undocumented", doc.name);
        assert!(SPECS.iter().any(|s| s.name == doc.name));
    }
    let required: Vec<&str> = info.parameters.iter().filter(|d| d.required).map(|d| d.name.as_str()).collect();
    assert_eq!(required, vec!["filer"]);
    let secrets: Vec<&str> =
        info.parameters.iter().filter(|d| d.source == ParamSource::Secret).map(|d| d.name.as_str()).collect();
    assert_eq!(secrets, SECRETS.iter().map(|s| s.0).collect::<Vec<_>>());
}

#[test]
fn minimal_stage_plan() {
    let plan = stage(&[]).unwrap();
    let s = spawn_of(&plan);
    assert_eq!(
        s.args,
        vec![
            arg("-logtostderr"),
            arg("mount"),
            arg("-filer=127.0.0.1:8888"),
            arg("-filer.path=/buckets/pvc-1"),
            path_arg("-dir=", staging("")),
            path_arg("-cacheDir=", cache("")),
            path_arg("-localSocket=", runtime("weed.sock")),
            arg("-collection=pvc-1"),
        ]
    );
    assert_eq!(s.program, "weed");
    assert_eq!(s.mountpoint, staging(""));
    assert_eq!(s.fstype, "fuse.seaweedfs");
    assert_eq!(s.ready_timeout_ms, 30_000);
    assert_eq!(s.memory_limit_bytes, None);
    assert!(s.env.is_empty());
    assert_eq!(
        plan.attributes,
        vec![
            kv("filer", "127.0.0.1:8888"),
            kv("path", "/buckets/pvc-1"),
            kv("collection", "pvc-1"),
            kv("readOnly", "false"),
            kv("quotaMB", "0"),
            kv("quotaFixed", "false"),
        ]
    );
}

#[rstest]
#[case("filer", "a.example:8888,10.0.0.1:8889,[::1]:8890", &["-filer=a.example:8888,10.0.0.1:8889,[::1]:8890"])]
#[case("path", "/data/team-a", &["-filer.path=/data/team-a", "-collection=team-a"])]
#[case("collection", "my.col_1-x", &["-collection=my.col_1-x"])]
#[case("replication", "001", &["-replication=001"])]
#[case("diskType", "ssd", &["-disk=ssd"])]
#[case("diskType", "nvme_tier-1", &["-disk=nvme_tier-1"])]
#[case("dataCenter", "dc1", &["-dataCenter=dc1"])]
#[case("ttl", "3600", &["-ttl=3600"])]
#[case("ttl", "90s", &["-ttl=90"])]
#[case("ttl", "15m", &["-ttl=900"])]
#[case("ttl", "2h", &["-ttl=7200"])]
#[case("ttl", "7d", &["-ttl=604800"])]
#[case("ttl", "2w", &["-ttl=1209600"])]
#[case("chunkSizeLimitMB", "8", &["-chunkSizeLimitMB=8"])]
#[case("cacheCapacityMB", "512", &["-cacheCapacityMB=512"])]
#[case("cacheMetaTtlSec", "120", &["-cacheMetaTtlSec=120"])]
#[case("concurrentWriters", "32", &["-concurrentWriters=32"])]
#[case("concurrentReaders", "64", &["-concurrentReaders=64"])]
#[case("volumeServerAccess", "filerProxy", &["-volumeServerAccess=filerProxy"])]
#[case("uidMap", "1000:0,1001:1", &["-map.uid=1000:0,1001:1"])]
#[case("uidMap", "007:0", &["-map.uid=7:0"])]
#[case("gidMap", "2000:100", &["-map.gid=2000:100"])]
#[case("umask", "0002", &["-umask=0002"])]
#[case("readOnly", "true", &["-readOnly"])]
#[case("cacheDir", "disabled", &["-cacheCapacityMB=0"])]
#[case("memoryLimitMB", "1024", &["-memoryLimitMB=921"])]
#[case("mountOptions", "allowOthers=false,writebackCache", &["-allowOthers=false", "-writebackCache"])]
fn every_parameter_becomes_its_flag(#[case] key: &str, #[case] value: &str, #[case] flags: &[&str]) {
    let plan = stage(&[(key, value)]).unwrap();
    let args = literals(spawn_of(&plan));
    for flag in flags {
        assert!(args.contains(&flag.to_string()), "{key}={value}: {flag} missing from {args:?}");
    }
}

#[rstest]
#[case("readOnly", "false")]
#[case("cacheDir", "volume")]
#[case("parentDir", "/volumes")]
#[case("readyTimeoutSec", "5")]
fn parameters_without_a_flag_add_none(#[case] key: &str, #[case] value: &str) {
    let plan = stage(&[(key, value)]).unwrap();
    assert_eq!(tuning(&plan), vec!["-collection=pvc-1".to_string()]);
}

#[test]
fn resource_parameters_reach_the_spawn_step() {
    let plan = stage(&[("readyTimeoutSec", "5"), ("memoryLimitMB", "16")]).unwrap();
    let s = spawn_of(&plan);
    assert_eq!(s.ready_timeout_ms, 5_000);
    assert_eq!(s.memory_limit_bytes, Some(16 * 1024 * 1024));
    assert!(literals(s).contains(&"-memoryLimitMB=14".to_string()));
}

#[test]
fn cache_disabled_keeps_metadata_in_the_volume_cache_dir() {
    let plan = stage(&[("cacheDir", "disabled"), ("cacheCapacityMB", "0")]).unwrap();
    let s = spawn_of(&plan);
    assert!(s.args.contains(&path_arg("-cacheDir=", cache(""))));
    assert_eq!(literals(s).iter().filter(|a| a.starts_with("-cacheCapacityMB")).count(), 1);
}

#[test]
fn root_path_has_no_default_collection() {
    let plan = stage(&[("path", "/")]).unwrap();
    assert_eq!(tuning(&plan), Vec::<String>::new());
    assert!(plan.attributes.contains(&kv("collection", "")));
}

#[test]
fn every_flag_has_one_fixed_place() {
    let all: &[(&str, &str)] = &[
        ("mountOptions", "writebackCache,allowOthers=false,readRetryTime=10s"),
        ("memoryLimitMB", "1000"),
        ("readOnly", "true"),
        ("umask", "077"),
        ("gidMap", "2:3"),
        ("uidMap", "1:2"),
        ("volumeServerAccess", "publicUrl"),
        ("concurrentReaders", "5"),
        ("concurrentWriters", "4"),
        ("cacheMetaTtlSec", "3"),
        ("cacheCapacityMB", "2"),
        ("chunkSizeLimitMB", "1"),
        ("ttl", "1m"),
        ("dataCenter", "dc"),
        ("diskType", "hdd"),
        ("replication", "010"),
        ("collection", "c"),
    ];
    let plan = stage(all).unwrap();
    assert_eq!(
        tuning(&plan),
        [
            "-collection=c",
            "-replication=010",
            "-disk=hdd",
            "-dataCenter=dc",
            "-ttl=60",
            "-chunkSizeLimitMB=1",
            "-cacheCapacityMB=2",
            "-cacheMetaTtlSec=3",
            "-concurrentWriters=4",
            "-concurrentReaders=5",
            "-volumeServerAccess=publicUrl",
            "-map.uid=1:2",
            "-map.gid=2:3",
            "-umask=077",
            "-memoryLimitMB=900",
            "-readOnly",
            "-allowOthers=false",
            "-writebackCache",
            "-readRetryTime=10s",
        ]
    );
    // Same input, same plan; reversed input order, same plan.
    assert_eq!(plan, stage(all).unwrap());
    let reversed: Vec<(&str, &str)> = all.iter().rev().copied().collect();
    assert_eq!(plan, stage(&reversed).unwrap());
}

#[test]
fn mount_option_order_does_not_change_the_plan() {
    let a = stage(&[("mountOptions", "dlm,allowOthers=false,volumeName=v1")]).unwrap();
    let b = stage(&[("mountOptions", "volumeName=v1,dlm,allowOthers=false")]).unwrap();
    assert_eq!(a, b);
}

#[rstest]
#[case("filer", "")]
#[case("filer", "localhost")]
#[case("filer", "host:0")]
#[case("filer", "host:65536")]
#[case("filer", "host:http")]
#[case("filer", "a:1, b:2")]
#[case("filer", "a:1,,b:2")]
#[case("filer", "a:1,")]
#[case("filer", "[::1]")]
#[case("filer", "[zz::1]:8888")]
#[case("filer", "::1:8888")]
#[case("filer", "-bad-:1")]
#[case("filer", "a_b:1")]
#[case("filer", "256.1.1.1:1")]
#[case("filer", "http://a:1")]
#[case("filer", "a:1,a:1")]
#[case("path", "relative/dir")]
#[case("path", "/a//b")]
#[case("path", "/a/./b")]
#[case("path", "/a/../b")]
#[case("path", "/a/")]
#[case("path", "/a\u{1}b")]
#[case("parentDir", "buckets")]
#[case("parentDir", "/x/../y")]
#[case("collection", "a b")]
#[case("collection", "a/b")]
#[case("collection", "ü")]
#[case("replication", "1")]
#[case("replication", "0001")]
#[case("replication", "abc")]
#[case("diskType", "s s")]
#[case("diskType", "a.b")]
#[case("dataCenter", "dc 1")]
#[case("ttl", "1y")]
#[case("ttl", "-1")]
#[case("ttl", "1.5h")]
#[case("ttl", "h")]
#[case("ttl", "2147483648")]
#[case("ttl", "99999999999w")]
#[case("chunkSizeLimitMB", "0")]
#[case("chunkSizeLimitMB", "1025")]
#[case("chunkSizeLimitMB", "-1")]
#[case("cacheCapacityMB", "1048577")]
#[case("cacheCapacityMB", "1e3")]
#[case("cacheMetaTtlSec", "86401")]
#[case("concurrentWriters", "0")]
#[case("concurrentWriters", "1025")]
#[case("concurrentReaders", "0")]
#[case("volumeServerAccess", "proxy")]
#[case("uidMap", "1000")]
#[case("uidMap", "1000:")]
#[case("uidMap", "a:b")]
#[case("uidMap", "1000:0,1000:1")]
#[case("uidMap", "4294967296:0")]
#[case("uidMap", "1000:0;1:1")]
#[case("gidMap", "x")]
#[case("umask", "22")]
#[case("umask", "0888")]
#[case("umask", "00222")]
#[case("readOnly", "yes")]
#[case("readOnly", "True")]
#[case("cacheDir", "/var/cache/weed")]
#[case("cacheDir", "none")]
#[case("memoryLimitMB", "15")]
#[case("memoryLimitMB", "1048577")]
#[case("readyTimeoutSec", "0")]
#[case("readyTimeoutSec", "301")]
#[case("mountOptions", "dir=/mnt")]
#[case("mountOptions", "allowOthers=yes")]
#[case("mountOptions", "")]
fn every_bad_value_names_its_parameter(#[case] key: &str, #[case] value: &str) {
    let err = message(stage(&[(key, value)]).unwrap_err());
    assert!(err.contains(&format!("{key:?}")), "{key}={value:?}: message {err:?} does not name it");
    assert!(
        Seaweedfs::validate(ValidateRequest::default().with_parameters(
            context(&[(key, value)]).into_iter().filter(|kv| kv.key != "path" || key == "path").collect::<Vec<_>>()
        ))
        .is_err(),
        "validate accepted {key}={value:?}"
    );
}

#[test]
fn cache_disabled_conflicts_with_a_cache_size() {
    let err = message(stage(&[("cacheDir", "disabled"), ("cacheCapacityMB", "64")]).unwrap_err());
    assert!(err.contains("\"cacheDir\"") && err.contains("\"cacheCapacityMB\""), "{err}");
}

#[test]
fn a_default_collection_that_is_not_a_valid_name_asks_for_one() {
    let err = message(stage(&[("path", "/data/My Files")]).unwrap_err());
    assert!(err.contains("\"collection\""), "{err}");
    assert!(stage(&[("path", "/data/My Files"), ("collection", "files")]).is_ok());
}

#[test]
fn stage_without_path_explains() {
    let req = stage_req(kvs(&[("filer", "127.0.0.1:8888")]), vec![], rw());
    let err = message(Seaweedfs::stage(req).unwrap_err());
    assert!(err.contains("\"path\"") && err.contains("volumeAttributes"), "{err}");
}

#[rstest]
#[case::context(context(&[("filr", "x")]), vec![], "unknown parameter \"filr\"")]
#[case::secret(context(&[]), kvs(&[("token", "x")]), "unknown secret \"token\"")]
#[case::secret_in_context(context(&[("jwtSigningKey", "x")]), vec![], "unknown parameter \"jwtSigningKey\"")]
#[case::empty_secret(context(&[]), kvs(&[("jwtSigningKey", "")]), "secret \"jwtSigningKey\" is empty")]
fn unknown_keys_are_refused(#[case] ctx: Vec<Kv>, #[case] secrets: Vec<Kv>, #[case] expected: &str) {
    let err = message(Seaweedfs::stage(stage_req(ctx, secrets, rw())).unwrap_err());
    assert!(err.contains(expected), "{err}");
}

#[test]
fn orchestrator_keys_are_ignored() {
    let ctx =
        context(&[("csi.storage.k8s.io/pvc/name", "data"), ("storage.kubernetes.io/csiProvisionerIdentity", "x")]);
    assert!(Seaweedfs::stage(stage_req(ctx, vec![], rw())).is_ok());
}

#[test]
fn secrets_are_env_references_and_never_args() {
    let secrets: Vec<Kv> = SECRETS.iter().rev().map(|(k, _, v)| kv(*k, *v)).collect();
    let plan = Seaweedfs::stage(stage_req(context(&[]), secrets, rw())).unwrap();
    let s = spawn_of(&plan);
    let expected: Vec<EnvVar> =
        SECRETS.iter().map(|(k, env, _)| EnvVar::new(*env, Value::Secret(k.to_string()))).collect();
    assert_eq!(s.env, expected);
    let dump = format!("{plan:?}");
    for (key, _, value) in SECRETS {
        assert!(!dump.contains(value), "secret {key} leaked into the plan");
    }
    for a in &s.args {
        let text = match a {
            Arg::Literal(t) => t.clone(),
            Arg::Path(p) => format!("{}{}", p.prefix, p.suffix),
            Arg::SecretFile(f) => format!("{}{}", f.prefix, f.suffix),
            Arg::FuseFd(f) => format!("{}{}", f.prefix, f.suffix),
            other => format!("{other:?}"),
        };
        assert!(!text.to_lowercase().contains("jwt"), "{text}");
    }
}

#[rstest]
#[case(AccessMode::SingleNodeWriter, false)]
#[case(AccessMode::SingleNodeReaderOnly, true)]
#[case(AccessMode::MultiNodeReaderOnly, true)]
#[case(AccessMode::MultiNodeSingleWriter, false)]
#[case(AccessMode::MultiNodeMultiWriter, false)]
#[case(AccessMode::SingleNodeSingleWriter, false)]
#[case(AccessMode::SingleNodeMultiWriter, false)]
fn read_only_follows_the_access_mode(#[case] mode: AccessMode, #[case] read_only: bool) {
    let req = stage_req(context(&[("readOnly", "false")]), vec![], capability(mode, "", &[]));
    let plan = Seaweedfs::stage(req).unwrap();
    assert_eq!(literals(spawn_of(&plan)).contains(&"-readOnly".to_string()), read_only);
    assert!(plan.attributes.contains(&kv("readOnly", read_only.to_string())));
}

#[test]
fn publish_is_read_only_for_read_only_modes() {
    let req = |mode: AccessMode, readonly: bool| {
        PublishRequest::default()
            .with_volume_id("v")
            .with_context(context(&[]))
            .with_capability(capability(mode, "", &[]))
            .with_readonly(readonly)
    };
    let bind = |plan: Plan| match plan.steps.as_slice() {
        [Step::Bind(b)] => b.clone(),
        other => panic!("{other:?}"),
    };
    let b = bind(Seaweedfs::publish(req(AccessMode::MultiNodeReaderOnly, false)).unwrap());
    assert!(b.readonly);
    assert_eq!((b.source, b.target), (staging(""), target("")));
    assert!(bind(Seaweedfs::publish(req(AccessMode::MultiNodeMultiWriter, true)).unwrap()).readonly);
    assert!(!bind(Seaweedfs::publish(req(AccessMode::MultiNodeMultiWriter, false)).unwrap()).readonly);
}

#[rstest]
#[case("allowOthers", "-allowOthers")]
#[case("allowOthers=true", "-allowOthers")]
#[case("allowOthers=false", "-allowOthers=false")]
#[case("asyncDio", "-asyncDio")]
#[case("cacheSymlink", "-cacheSymlink")]
#[case("cacheDirMaxEntries=0", "-cacheDirMaxEntries=0")]
#[case("dirIdleEvictSec=300", "-dirIdleEvictSec=300")]
#[case("disableXAttr", "-disableXAttr")]
#[case("writebackCache", "-writebackCache")]
#[case("collectionQuotaMB=10240", "-collectionQuotaMB=10240")]
#[case("readRetryTime=1m30s", "-readRetryTime=1m30s")]
#[case("readerCacheSizeMB=512", "-readerCacheSizeMB=512")]
#[case("writeBufferSizeMB=0", "-writeBufferSizeMB=0")]
#[case("metadataFlushSeconds=60", "-metadataFlushSeconds=60")]
#[case("fuse.maxBackground=2048", "-fuse.maxBackground=2048")]
#[case("fuse.congestionThreshold=1536", "-fuse.congestionThreshold=1536")]
#[case("defaultPermissions=false", "-defaultPermissions=false")]
#[case("posix.dirNLink", "-posix.dirNLink")]
#[case("df.logical", "-df.logical")]
#[case("includeSystemEntries", "-includeSystemEntries")]
#[case("volumeName=team-a.data", "-volumeName=team-a.data")]
#[case("nonempty", "-nonempty")]
#[case("dlm", "-dlm")]
fn allowed_mount_options_pass_through(#[case] item: &str, #[case] flag: &str) {
    let from_param = stage(&[("mountOptions", item)]).unwrap();
    assert_eq!(tuning(&from_param).last().map(String::as_str), Some(flag));
    let cap = capability(AccessMode::MultiNodeMultiWriter, "", &[item]);
    let from_cap = Seaweedfs::stage(stage_req(context(&[]), vec![], cap)).unwrap();
    assert_eq!(from_param, from_cap);
}

#[rstest]
#[case("dir=/mnt", "node path")]
#[case("cacheDir=/var/cache", "node path")]
#[case("cacheDirWrite=/tmp", "node path")]
#[case("localSocket=/tmp/s.sock", "node path")]
#[case("options=/etc/weed.opts", "node path")]
#[case("cpuprofile=/tmp/cpu", "node path")]
#[case("memprofile=/tmp/mem", "node path")]
#[case("debug", "opens a port")]
#[case("debug.port=6061", "opens a port")]
#[case("peer.enable", "opens a port")]
#[case("peer.listen=:18080", "opens a port")]
#[case("filer=x:1", "filer parameter")]
#[case("filer.path=/", "path parameter")]
#[case("collection=x", "collection parameter")]
#[case("disk=ssd", "diskType parameter")]
#[case("map.uid=1:1", "uidMap parameter")]
#[case("readOnly", "readOnly parameter")]
#[case("memoryLimitMB=100", "memoryLimitMB parameter")]
#[case("debug.fuse", "logs raw FUSE")]
#[case("dirAutoCreate", "host creates the mount point")]
#[case("windows.uid=1", "Windows")]
#[case("noatime", "not a weed mount option")]
#[case("-allowOthers", "leading dash")]
#[case("allowOthers=1", "=true or =false")]
#[case("cacheDirMaxEntries=-1", "whole number")]
#[case("cacheDirMaxEntries", "whole number")]
#[case("fuse.maxBackground=65536", "0 to 65535")]
#[case("readRetryTime=6", "duration")]
#[case("volumeName=a b", "[A-Za-z0-9._-]")]
#[case("volumeName=", "[A-Za-z0-9._-]")]
#[case("allowOthers,allowOthers=false", "given twice")]
fn refused_mount_options_say_why(#[case] item: &str, #[case] why: &str) {
    let err = message(stage(&[("mountOptions", item)]).unwrap_err());
    assert!(err.contains("mountOptions"), "{err}");
    assert!(err.contains(why), "{item}: {err}");
}

#[rstest]
#[case(&["ro"], true)]
#[case(&["rw"], false)]
#[case(&["ro", "allowOthers=false"], true)]
fn capability_mount_flags(#[case] flags: &[&str], #[case] read_only: bool) {
    let cap = capability(AccessMode::MultiNodeMultiWriter, "", flags);
    let plan = Seaweedfs::stage(stage_req(context(&[]), vec![], cap)).unwrap();
    assert_eq!(literals(spawn_of(&plan)).contains(&"-readOnly".to_string()), read_only);
}

#[rstest]
#[case(&["noatime"], "", "StorageClass mountOptions")]
#[case(&["writebackCache"], "", "given twice")]
#[case(&[], "ext4", "fsType \"ext4\"")]
#[case(&[""], "", "empty item")]
fn bad_capabilities_are_refused(#[case] flags: &[&str], #[case] fs_type: &str, #[case] why: &str) {
    let cap = capability(AccessMode::MultiNodeMultiWriter, fs_type, flags);
    let ctx = context(&[("mountOptions", "writebackCache")]);
    let err = message(Seaweedfs::stage(stage_req(ctx, vec![], cap.clone())).unwrap_err());
    assert!(err.contains(why), "{err}");
    let validate = ValidateRequest::default()
        .with_parameters(kvs(&[("filer", "127.0.0.1:8888"), ("mountOptions", "writebackCache")]))
        .with_capabilities([cap]);
    assert!(Seaweedfs::validate(validate).is_err());
}

#[rstest]
#[case("")]
#[case("seaweedfs")]
#[case("fuse.seaweedfs")]
fn accepted_fs_types(#[case] fs_type: &str) {
    let cap = capability(AccessMode::SingleNodeWriter, fs_type, &[]);
    assert!(Seaweedfs::stage(stage_req(context(&[]), vec![], cap)).is_ok());
}

#[test]
fn validate_accepts_a_full_storage_class() {
    let req = ValidateRequest::default()
        .with_parameters(kvs(&[
            ("filer", "filer-0.seaweedfs:8888,filer-1.seaweedfs:8888"),
            ("parentDir", "/buckets"),
            ("replication", "001"),
            ("cacheDir", "disabled"),
            ("mountOptions", "allowOthers=false"),
            ("csi.storage.k8s.io/provisioner-secret-name", "weed"),
        ]))
        .with_secrets(kvs(&[("jwtSigningKey", "k")]))
        .with_capabilities([capability(AccessMode::MultiNodeMultiWriter, "", &["ro"])]);
    Seaweedfs::validate(req).unwrap();
}

#[test]
fn path_is_not_a_storage_class_parameter() {
    let err = message(
        Seaweedfs::provision(provision_req("pvc-1", &[("filer", "127.0.0.1:8888"), ("path", "/x")])).unwrap_err(),
    );
    assert!(err.contains("\"path\"") && err.contains("static PersistentVolume"), "{err}");
}

/// ValidateVolumeCapabilities sends a volume's context (with `path`) and parameters together.
#[test]
fn validate_accepts_a_volume_context() {
    let req = ValidateRequest::default()
        .with_parameters(kvs(&[("filer", "127.0.0.1:8888"), ("path", "/buckets/pvc-1"), ("collection", "pvc-1")]))
        .with_capabilities([rw()]);
    Seaweedfs::validate(req).unwrap();
}

/// What the host answers the capacity record's lookup with.
fn record_answer(status: u16, body: &str) -> LookedUp {
    LookedUp::new(crate::controller::RECORD_LOOKUP, status, body.as_bytes())
}

/// CreateVolume of 5 GiB in its second round, the record's lookup answered "no record" (404).
fn provision_req(name: &str, params: &[(&str, &str)]) -> ProvisionRequest {
    ProvisionRequest::default()
        .with_name(name)
        .with_parameters(kvs(params))
        .with_capabilities([rw()])
        .with_required_bytes(5u64 << 30)
        .with_looked_up([record_answer(404, "")])
}

/// The one `POST` that creates the directory, followed by the list entry's `PUT`.
fn mkdir_of(plan: &ProvisionPlan) -> &HttpCall {
    match plan.steps.as_slice() {
        [.., Step::Http(call), Step::Http(entry)] if call.method == "POST" && entry.method == "PUT" => call,
        other => panic!("expected the directory's POST, then the list entry, got {other:?}"),
    }
}

const RECORD_URL: &str = "http://127.0.0.1:8888/.mounthost/capacity/buckets/pvc-1";

fn record_lookup() -> Step {
    Step::Lookup(Lookup::new(crate::controller::RECORD_LOOKUP, "GET", [RECORD_URL.to_string()]))
}

fn if_match(etag: &str, ok: &[u16]) -> Step {
    Step::Http(
        HttpCall::new("HEAD", [RECORD_URL.to_string()], ok)
            .with_headers([Header::new("If-Match", Value::Literal(etag.into()))]),
    )
}

fn mkdir_pvc_1() -> Step {
    Step::Http(HttpCall::new("POST", ["http://127.0.0.1:8888/buckets/pvc-1/?mode=0777".to_string()], [201, 409]))
}

/// The list entry of `127.0.0.1:8888/buckets/pvc-1`: the hex of the volume id, its capacity in a
/// header the filer keeps.
fn list_entry_pvc_1(capacity: u64) -> Step {
    Step::Http(
        HttpCall::new(
            "PUT",
            [format!(
                "http://127.0.0.1:8888/.mounthost/volumes/{}",
                "3132372e302e302e313a383838382f6275636b6574732f7076632d31"
            )],
            [200, 201, 204],
        )
        .with_headers([Header::new("Seaweed-Mounthost-Capacity-Bytes", Value::Literal(capacity.to_string()))]),
    )
}

#[test]
fn provision_reads_the_record_then_plans_its_check_the_record_and_one_directory() {
    let params = [("replication", "001"), ("filer", "127.0.0.1:8888"), ("csi.storage.k8s.io/pvc/name", "data")];
    // First round: only the record's lookup, which the host makes while planning.
    let first = Seaweedfs::provision(provision_req("pvc-1", &params).with_looked_up(Vec::new())).unwrap();
    assert_eq!(first.steps, vec![record_lookup()]);
    // Second round, no record yet: a new volume of the size required.
    let plan = Seaweedfs::provision(provision_req("pvc-1", &params)).unwrap();
    assert_eq!(
        (plan.volume_id.as_str(), first.volume_id.as_str()),
        ("127.0.0.1:8888/buckets/pvc-1", plan.volume_id.as_str())
    );
    assert_eq!(plan.capacity_bytes, 5 << 30);
    assert_eq!(
        plan.context,
        vec![
            kv("filer", "127.0.0.1:8888"),
            kv("replication", "001"),
            kv("path", "/buckets/pvc-1"),
            kv("collection", "pvc-1"),
        ]
    );
    let content = "{\"capacityBytes\":5368709120,\"parameters\":{\"collection\":\"pvc-1\",\"filer\":\"127.0.0.1:8888\",\"replication\":\"001\"}}\n";
    // md5 of the content, as `printf '%s\n' '<content>' | md5sum` prints it.
    let etag = "\"8a3a4464a57dfa4d79b6a423cb3b58b7\"";
    assert_eq!(
        plan.steps,
        vec![
            record_lookup(),
            if_match(etag, &[200, 404]),
            Step::Http(
                HttpCall::new("PUT", [RECORD_URL.to_string()], [200, 201, 204])
                    .with_headers([Header::new("Content-Type", Value::Literal("application/json".into()))])
                    .with_body(content.as_bytes())
            ),
            mkdir_pvc_1(),
            list_entry_pvc_1(5 << 30),
        ]
    );
}

/// CSI: "compatible with the specified capacity_range": a recorded capacity N answers every
/// range with required <= N <= limit (0: unspecified) as that volume, of N bytes, guarded by
/// `If-Match` on the record it read (nothing rewritten); any other range is `already-exists`.
#[rstest]
#[case(5 << 30, 0, true)]
#[case(1 << 30, 0, true)]
#[case(0, 0, true)]
#[case(0, 5 << 30, true)]
#[case(1 << 30, 8 << 30, true)]
#[case(5 << 30, 5 << 30, true)]
#[case(6 << 30, 0, false)]
#[case(0, 4 << 30, false)]
#[case(1 << 30, 4 << 30, false)]
#[case(6 << 30, 8 << 30, false)]
fn a_recorded_capacity_answers_every_compatible_range(#[case] required: u64, #[case] limit: u64, #[case] ok: bool) {
    let recorded = "{\"capacityBytes\":5368709120}\n";
    let req = provision_req("pvc-1", &[("filer", "127.0.0.1:8888")])
        .with_required_bytes(required)
        .with_limit_bytes(limit)
        .with_looked_up([record_answer(200, recorded)]);
    match Seaweedfs::provision(req) {
        Ok(plan) if ok => {
            assert_eq!(plan.capacity_bytes, 5 << 30, "the recorded capacity");
            let etag = crate::controller::etag(recorded);
            assert_eq!(
                plan.steps,
                vec![record_lookup(), if_match(&etag, &[200]), mkdir_pvc_1(), list_entry_pvc_1(5 << 30)]
            );
        }
        Err(BackendError::AlreadyExists(m)) if !ok => {
            assert!(m.contains("pvc-1") && m.contains("5368709120 bytes") && m.contains("/buckets/pvc-1"), "{m}");
        }
        other => panic!("required {required} limit {limit}: {other:?}"),
    }
}

/// A new volume gets what is required, else its limit (the most it may be), else no size.
#[rstest]
#[case(1 << 30, 0, 1 << 30)]
#[case(1 << 30, 2 << 30, 1 << 30)]
#[case(0, 2 << 30, 2 << 30)]
#[case(0, 0, 0)]
fn a_new_volume_gets_a_size_in_its_range(#[case] required: u64, #[case] limit: u64, #[case] capacity: u64) {
    let req =
        provision_req("pvc-1", &[("filer", "127.0.0.1:8888")]).with_required_bytes(required).with_limit_bytes(limit);
    let plan = Seaweedfs::provision(req).unwrap();
    assert_eq!(plan.capacity_bytes, capacity);
    let put = plan.steps.iter().find_map(|s| match s {
        Step::Http(c) if c.method == "PUT" && c.urls == [RECORD_URL] => {
            Some(String::from_utf8(c.body.clone()).unwrap())
        }
        _ => None,
    });
    if capacity == 0 {
        // No size: nothing to record, only the directory and its list entry.
        assert_eq!(plan.steps, vec![record_lookup(), mkdir_pvc_1(), list_entry_pvc_1(0)]);
    } else {
        let params = [("filer".to_string(), "127.0.0.1:8888".to_string()), ("collection".into(), "pvc-1".into())];
        assert_eq!(put, Some(crate::controller::record_content(capacity, &params.into())));
    }
}

#[test]
fn a_record_lookup_that_fails_is_unavailable_and_a_foreign_record_is_named() {
    let with = |answer: LookedUp| {
        Seaweedfs::provision(provision_req("pvc-1", &[("filer", "127.0.0.1:8888")]).with_looked_up([answer]))
    };
    for status in [0, 500, 401] {
        match with(record_answer(status, "")) {
            Err(BackendError::Unavailable(m)) => assert!(m.contains("/.mounthost/capacity/buckets/pvc-1"), "{m}"),
            other => panic!("{status}: {other:?}"),
        }
    }
    for body in ["five gigabytes", "{\"capacityBytes\":-1}", "{\"capacity\":1}", ""] {
        match with(record_answer(200, body)) {
            Err(BackendError::Internal(m)) => {
                assert!(m.contains("capacity record") && m.contains("fix or remove"), "{m}")
            }
            other => panic!("{body:?}: {other:?}"),
        }
    }
    let truncated = record_answer(200, "{\"capacityBytes\":1}").with_truncated(true);
    assert!(matches!(with(truncated), Err(BackendError::Internal(_))));
}

#[test]
fn records_parse_as_they_are_written() {
    use crate::controller::{parameters_of_record, record_content};
    let odd: BTreeMap<String, String> =
        [("a\"b".to_string(), "\\\n".to_string()), ("filer".into(), "f:1".into())].into();
    for params in [BTreeMap::new(), odd] {
        for n in [0, 1, 5 << 30, u64::MAX] {
            let content = record_content(n, &params);
            assert!(content.ends_with('\n') && content.matches('\n').count() == 1, "one line: {content:?}");
            let found = record_answer(200, &content);
            assert_eq!(crate::volumes::record_bytes(&found, "r").unwrap(), n);
            let back = parameters_of_record(content.as_bytes());
            assert_eq!(back, (!params.is_empty()).then(|| params.clone()), "{content}");
        }
    }
    assert_eq!(crate::volumes::record_bytes(&record_answer(200, "{ \"capacityBytes\": 42 }"), "r").unwrap(), 42);
    for bad in ["{\"capacityBytes\":}", "{\"capacityBytes\":18446744073709551616}"] {
        assert!(crate::volumes::record_bytes(&record_answer(200, bad), "r").is_err(), "{bad}");
    }
}

#[test]
fn the_record_depends_on_the_capacity_and_the_parameters_not_the_name() {
    let plan = |name: &str, bytes: u64| {
        let mut req = provision_req(name, &[("filer", "127.0.0.1:8888"), ("collection", "shared")]);
        req.required_bytes = bytes;
        Seaweedfs::provision(req).unwrap()
    };
    let etag_of = |p: &ProvisionPlan| match &p.steps[1] {
        Step::Http(call) => call.headers.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(etag_of(&plan("pvc-1", 1 << 30)), etag_of(&plan("pvc-2", 1 << 30)));
    assert_ne!(etag_of(&plan("pvc-1", 1 << 30)), etag_of(&plan("pvc-1", 2 << 30)));
    let mut other = provision_req("pvc-1", &[("filer", "127.0.0.1:8888"), ("collection", "other")]);
    other.required_bytes = 1 << 30;
    assert_ne!(etag_of(&plan("pvc-1", 1 << 30)), etag_of(&Seaweedfs::provision(other).unwrap()));
}

/// CSI: "compatible with the specified ... parameters": a record holding other parameters is
/// `already-exists` naming each difference; a record of an earlier version (no parameters)
/// matches any; the same parameters in another order are the same.
#[test]
fn a_recorded_volume_with_other_parameters_already_exists() {
    let with = |recorded: &str, params: &[(&str, &str)]| {
        Seaweedfs::provision(provision_req("pvc-1", params).with_looked_up([record_answer(200, recorded)]))
    };
    let made =
        Seaweedfs::provision(provision_req("pvc-1", &[("filer", "127.0.0.1:8888"), ("replication", "001")])).unwrap();
    let Step::Http(put) = &made.steps[2] else { panic!("{:?}", made.steps) };
    let recorded = String::from_utf8(put.body.clone()).unwrap();
    with(&recorded, &[("replication", "001"), ("filer", "127.0.0.1:8888")]).unwrap();
    match with(&recorded, &[("filer", "127.0.0.1:8888"), ("replication", "010"), ("ttl", "1d")]) {
        Err(BackendError::AlreadyExists(m)) => assert!(
            m.contains("replication: \"001\" recorded, \"010\" asked")
                && m.contains("ttl: (unset) recorded, \"1d\" asked"),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
    with("{\"capacityBytes\":5368709120}\n", &[("filer", "127.0.0.1:8888"), ("replication", "010")]).unwrap();
}

#[test]
fn provision_with_several_filers_and_an_explicit_collection() {
    let plan = Seaweedfs::provision(provision_req(
        "pvc-2",
        &[("filer", "a:1,[::1]:2"), ("parentDir", "/k8s"), ("collection", "shared")],
    ))
    .unwrap();
    assert_eq!(plan.volume_id, "a:1,[::1]:2/k8s/pvc-2");
    assert!(plan.context.contains(&kv("collection", "shared")));
    assert!(plan.context.contains(&kv("parentDir", "/k8s")));
    assert_eq!(mkdir_of(&plan).urls, vec!["http://a:1/k8s/pvc-2/?mode=0777", "http://[::1]:2/k8s/pvc-2/?mode=0777"]);
    let Step::Http(check) = &plan.steps[1] else { panic!() };
    assert_eq!(
        check.urls,
        vec!["http://a:1/.mounthost/capacity/k8s/pvc-2", "http://[::1]:2/.mounthost/capacity/k8s/pvc-2"]
    );
}

#[test]
fn provisioned_context_stages_and_is_deterministic() {
    let req = provision_req("pvc-3", &[("filer", "127.0.0.1:8888"), ("parentDir", "/"), ("ttl", "1d")]);
    let plan = Seaweedfs::provision(req.clone()).unwrap();
    assert_eq!(plan, Seaweedfs::provision(req).unwrap());
    assert_eq!(plan.volume_id, "127.0.0.1:8888/pvc-3");
    let staged = Seaweedfs::stage(stage_req(plan.context.clone(), vec![], rw())).unwrap();
    let args = literals(spawn_of(&staged));
    assert_eq!(args[3], "-filer.path=/pvc-3");
    assert!(args.contains(&"-collection=pvc-3".to_string()));
    assert!(args.contains(&"-ttl=86400".to_string()));
}

/// Names a CO may send (CSI allows any string of up to 128 bytes) that SeaweedFS would refuse
/// as a bucket: each gets a valid directory, collection and id, and stages.
#[rstest]
#[case("Mixed-Case-PVC", "mixed-case-pvc-")]
#[case("v1", "v1-")]
#[case("a b", "a-b-")]
#[case("pvc:1", "pvc-1-")]
#[case("a/b", "a-b-")]
#[case("..", "vol-")]
#[case("üñí", "vol-")]
fn names_seaweedfs_refuses_map_to_valid_directories(#[case] name: &str, #[case] prefix: &str) {
    let plan = Seaweedfs::provision(provision_req(name, &[("filer", "127.0.0.1:8888")])).unwrap();
    let dir = plan.context.iter().find(|kv| kv.key == "path").unwrap().value.clone();
    let leaf = dir.strip_prefix("/buckets/").unwrap();
    assert!(leaf.starts_with(prefix), "{name} -> {leaf}");
    assert!(crate::names::bucket_rule(leaf).is_ok(), "{name} -> {leaf}");
    assert!(plan.context.contains(&kv("collection", leaf)), "the collection is the directory name");
    assert_eq!(plan.volume_id, format!("127.0.0.1:8888{dir}"));
    assert_eq!(Seaweedfs::provision(provision_req(name, &[("filer", "127.0.0.1:8888")])).unwrap(), plan);
    let (_, parsed) = crate::controller::parse_volume_id(&plan.volume_id).unwrap();
    assert_eq!(parsed, dir, "delete finds the same directory");
    let staged = Seaweedfs::stage(stage_req(plan.context.clone(), vec![], rw()).with_volume_id(plan.volume_id.clone()));
    assert!(staged.is_ok(), "{staged:?}");
}

#[test]
fn a_128_byte_name_fits_in_the_volume_id() {
    let name = format!("PVC-{}", "x".repeat(124));
    assert_eq!(name.len(), 128);
    let plan = Seaweedfs::provision(provision_req(&name, &[("filer", "seaweedfs-filer.storage:8888")])).unwrap();
    assert!(plan.volume_id.len() <= 100, "{}", plan.volume_id);
    assert!(
        plan.volume_id.starts_with("seaweedfs-filer.storage:8888/buckets/pvc-xxxxxxxxxxxxxxxxxxx-"),
        "{}",
        plan.volume_id
    );
    // Names that are already valid bucket names keep their directory.
    let plan =
        Seaweedfs::provision(provision_req("pvc-5f0c1d2e-3a4b-4c5d-8e9f-0a1b2c3d4e5f", &[("filer", "a:1")])).unwrap();
    assert_eq!(plan.volume_id, "a:1/buckets/pvc-5f0c1d2e-3a4b-4c5d-8e9f-0a1b2c3d4e5f");
}

#[test]
fn an_empty_name_is_refused() {
    let err = message(Seaweedfs::provision(provision_req("", &[("filer", "a:1")])).unwrap_err());
    assert!(err.contains("volume name"), "{err}");
}

#[test]
fn overlong_collections_are_refused() {
    let err = message(stage(&[("collection", &"c".repeat(65))]).unwrap_err());
    assert!(err.contains("\"collection\""), "{err}");
    assert!(stage(&[("collection", &"c".repeat(64))]).is_ok());
}

/// A static volume (or a StorageClass's parentDir) under /buckets must name a bucket SeaweedFS
/// takes; validate and stage refuse it before anything runs, naming the rule.
#[rstest]
#[case("/buckets/v1", "between [3, 63]")]
#[case("/buckets/Data/sub", "lower case")]
#[case("/buckets/my_data", "lower case")]
#[case("/buckets/10.0.0.1", "ip addresses")]
fn static_paths_in_buckets_seaweedfs_refuses(#[case] path: &str, #[case] rule: &str) {
    let err = message(stage(&[("path", path)]).unwrap_err());
    assert!(err.contains("\"path\"") && err.contains(rule) && err.contains("S3 bucket"), "{err}");
    let validate = |key: &str| {
        Seaweedfs::validate(
            ValidateRequest::default()
                .with_parameters(kvs(&[("filer", "127.0.0.1:8888"), (key, path)]))
                .with_capabilities([rw()]),
        )
    };
    let err = message(validate("path").unwrap_err());
    assert!(err.contains(rule), "{err}");
    let err = message(validate("parentDir").unwrap_err());
    assert!(err.contains("\"parentDir\"") && err.contains(rule), "{err}");
    let err =
        message(Seaweedfs::provision(provision_req("pvc-1", &[("filer", "a:1"), ("parentDir", path)])).unwrap_err());
    assert!(err.contains("\"parentDir\""), "{err}");
}

#[rstest]
#[case("/buckets")]
#[case("/buckets/data")]
#[case("/buckets/data/Sub_Dir")]
#[case("/buckets/.hidden")]
#[case("/Data/v1")]
fn other_static_paths_are_fine(#[case] path: &str) {
    assert!(stage(&[("path", path)]).is_ok());
}

#[test]
fn a_provisioned_volume_stages_whatever_its_name() {
    // Made by an earlier version from the name "Data": its id is <filers><path>.
    let ctx = context(&[("path", "/buckets/Data")]);
    for id in ["127.0.0.1:8888/buckets/Data", "seaweedfs~127.0.0.1:8888/buckets/Data"] {
        let req = stage_req(ctx.clone(), vec![], rw()).with_volume_id(id);
        assert!(Seaweedfs::stage(req).is_ok(), "{id}");
    }
    let req = stage_req(ctx, vec![], rw()).with_volume_id("static-data");
    assert!(Seaweedfs::stage(req).is_err(), "a static volume with that path is refused");
}

#[test]
fn too_long_volume_ids_are_refused() {
    let parent = format!("/{}", "p".repeat(60));
    let err = message(
        Seaweedfs::provision(provision_req(
            "pvc-2b2c9c6e-8a0a-4f4e-9a57-6f0f2b1c7d3e",
            &[("filer", "127.0.0.1:8888"), ("parentDir", &parent)],
        ))
        .unwrap_err(),
    );
    assert!(err.contains("more than 100") && err.contains("\"parentDir\""), "{err}");
}

#[test]
fn parent_dirs_that_cannot_be_in_an_id_are_refused() {
    let err = message(
        Seaweedfs::provision(provision_req("pvc-1", &[("filer", "a:1"), ("parentDir", "/my dir")])).unwrap_err(),
    );
    assert!(err.contains("\"parentDir\"") && err.contains("printable ASCII"), "{err}");
}

#[test]
fn provision_refuses_unknown_secrets_and_bad_capabilities() {
    let mut req = provision_req("pvc-1", &[("filer", "a:1")]);
    req.secrets = kvs(&[("password", "x")]);
    assert!(message(Seaweedfs::provision(req).unwrap_err()).contains("unknown secret"));
    let mut req = provision_req("pvc-1", &[("filer", "a:1")]);
    req.capabilities = vec![capability(AccessMode::SingleNodeWriter, "xfs", &[])];
    assert!(message(Seaweedfs::provision(req).unwrap_err()).contains("fsType"));
}

fn delete(id: &str) -> Result<Plan, BackendError> {
    Seaweedfs::delete(DeleteRequest::default().with_volume_id(id))
}

#[rstest]
#[case("127.0.0.1:8888/buckets/pvc-1", &["http://127.0.0.1:8888/buckets/pvc-1"])]
#[case("a:1,[::1]:2/k8s/pvc-2", &["http://a:1/k8s/pvc-2", "http://[::1]:2/k8s/pvc-2"])]
#[case("a:1/pvc-3", &["http://a:1/pvc-3"])]
#[case("a:1/odd?dir%/pvc-4", &["http://a:1/odd%3Fdir%25/pvc-4"])]
#[case("a:1/buckets/Old_Name", &["http://a:1/buckets/Old_Name"])]
fn delete_removes_the_directory_then_the_record(#[case] id: &str, #[case] dirs: &[&str]) {
    let plan = delete(id).unwrap();
    let records: Vec<String> = dirs
        .iter()
        .map(|d| {
            let (origin, path) = d.split_at(d[7..].find('/').unwrap() + 7);
            format!("{origin}/.mounthost/capacity{path}")
        })
        .collect();
    let hex: String = id.bytes().map(|b| format!("{b:02x}")).collect();
    let entries: Vec<String> =
        dirs.iter().map(|d| format!("{}/.mounthost/volumes/{hex}", &d[..d[7..].find('/').unwrap() + 7])).collect();
    assert_eq!(
        plan.steps,
        vec![
            Step::Http(HttpCall::new(
                "DELETE",
                dirs.iter().map(|u| format!("{u}?recursive=true")).collect::<Vec<_>>(),
                [200, 202, 204, 404],
            )),
            Step::Http(HttpCall::new("DELETE", records, [200, 202, 204, 404])),
            Step::Http(HttpCall::new("DELETE", entries, [200, 202, 204, 404])),
        ]
    );
}

/// Ids this plugin could not have made: `not-found`, which the host answers with OK (CSI:
/// DeleteVolume of a volume that does not exist succeeds).
#[rstest]
#[case("")]
#[case("noslash")]
#[case("127.0.0.1:8888")]
#[case("127.0.0.1:8888/")]
#[case("127.0.0.1:8888/buckets/")]
#[case("127.0.0.1:8888//pvc-1")]
#[case("127.0.0.1:8888/buckets/../pvc-1")]
#[case("127.0.0.1:8888/buckets/..")]
#[case("host/buckets/pvc-1")]
#[case("a:1/buckets/a b")]
#[case("a:1/buckets/pvc:1")]
#[case("/buckets/pvc-1")]
fn ids_this_plugin_did_not_make_are_not_found(#[case] id: &str) {
    match delete(id) {
        Err(BackendError::NotFound(m)) => assert!(m.contains("volume id"), "{m}"),
        other => panic!("{id:?}: {other:?}"),
    }
}

#[test]
fn a_volume_id_longer_than_100_bytes_is_not_found_on_delete() {
    let id = format!("a:1/{}", "x".repeat(97));
    assert_eq!(id.len(), 101);
    assert!(matches!(delete(&id), Err(BackendError::NotFound(_))));
    assert!(delete(&id[..100]).is_ok());
}

#[test]
fn provision_and_delete_agree_on_the_directory_and_the_record() {
    let plan =
        Seaweedfs::provision(provision_req("pvc-9", &[("filer", "f1:8888,f2:8888"), ("parentDir", "/a/b")])).unwrap();
    let removal = delete(&plan.volume_id).unwrap();
    let urls = |step: &Step| match step {
        Step::Http(call) => call
            .urls
            .iter()
            .map(|u| u.split('?').next().unwrap_or_default().trim_end_matches('/').to_string())
            .collect(),
        other => panic!("{other:?}"),
    };
    let created: Vec<String> = urls(&plan.steps[3]);
    let record: Vec<String> = urls(&plan.steps[2]);
    assert_eq!(created, urls(&removal.steps[0]));
    assert_eq!(record, urls(&removal.steps[1]));
    assert_eq!(created[0], "http://f1:8888/a/b/pvc-9");
    assert_eq!(record[0], "http://f1:8888/.mounthost/capacity/a/b/pvc-9");
}

#[test]
fn delete_refuses_unknown_secrets() {
    let req = DeleteRequest::default().with_volume_id("a:1/b/pvc-1").with_secrets(kvs(&[("x", "y")]));
    assert!(message(Seaweedfs::delete(req).unwrap_err()).contains("unknown secret"));
}
