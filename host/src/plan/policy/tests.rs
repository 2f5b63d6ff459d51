use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use rstest::rstest;

use super::*;
use crate::plugin::bindings::types::{self as w, DirRoot};

fn p(root: DirRoot, rel: &str) -> w::PathRef {
    w::PathRef { root, rel: rel.into() }
}

fn lit(s: &str) -> w::Arg {
    w::Arg::Literal(s.into())
}

fn spawn(program: &str, args: Vec<w::Arg>, env: Vec<w::EnvVar>) -> w::Step {
    w::Step::SpawnFuse(w::SpawnFuse {
        program: program.into(),
        args,
        env,
        mountpoint: p(DirRoot::Staging, ""),
        fstype: "fuse.test".into(),
        ready_timeout_ms: 1000,
        memory_limit_bytes: None,
    })
}

fn http(url: &str) -> w::Step {
    w::Step::Http(w::HttpCall {
        method: "POST".into(),
        urls: vec![url.into()],
        headers: vec![],
        body: vec![],
        ok_status: vec![200, 201],
    })
}

struct Fixture {
    grant: Grant,
    programs: BTreeMap<String, PathBuf>,
    dirs: VolumeDirs,
    secrets: Secrets,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            grant: Grant {
                programs: ["fusetest".to_string()].into(),
                fstypes: ["fuse.test".to_string(), "tmpfs".to_string()].into(),
                hosts: ["registry.local".to_string()].into(),
            },
            programs: [("fusetest".to_string(), PathBuf::from("/usr/bin/fusetest"))].into(),
            dirs: VolumeDirs {
                staging: Some("/k/plugins/x/globalmount".into()),
                target: Some("/k/pods/u/mount".into()),
                cache: Some("/s/cache/ab".into()),
                runtime: Some("/s/run/ab".into()),
            },
            secrets: [("token".to_string(), "hunter22".to_string())].into_iter().collect(),
        }
    }

    fn ctx(&self, operation: Operation) -> Context<'_> {
        Context {
            operation,
            plugin: "t",
            digest: "sha256:00".into(),
            grant: &self.grant,
            programs: &self.programs,
            endpoint_hosts: ["filer:8888".to_string()].into(),
            dirs: &self.dirs,
            secrets: &self.secrets,
        }
    }

    fn check(&self, operation: Operation, steps: Vec<w::Step>) -> Result<Plan, PolicyError> {
        check(&self.ctx(operation), w::Plan { steps, attributes: vec![] })
    }
}

#[test]
fn a_good_stage_plan_is_resolved() {
    let f = Fixture::new();
    let env = vec![
        w::EnvVar { name: "TOKEN".into(), value: w::Value::Secret("token".into()) },
        w::EnvVar { name: "MODE".into(), value: w::Value::Literal("fast".into()) },
    ];
    let args = vec![
        lit("mount"),
        w::Arg::Path(w::PathArg { prefix: "-dir=".into(), path: p(DirRoot::Staging, "") }),
        w::Arg::Path(w::PathArg { prefix: "-sock=".into(), path: p(DirRoot::Runtime, "f.sock") }),
    ];
    let plan = f
        .check(Operation::Stage, vec![w::Step::Mkdir(p(DirRoot::Cache, "a/b")), spawn("fusetest", args, env)])
        .unwrap();
    assert_eq!(plan.steps[0], Step::Mkdir { path: "/s/cache/ab/a/b".into() });
    let Step::SpawnFuse { executable, args, env, mountpoint, .. } = &plan.steps[1] else { panic!() };
    assert_eq!(executable, &PathBuf::from("/usr/bin/fusetest"));
    assert_eq!(args, &["mount", "-dir=/k/plugins/x/globalmount", "-sock=/s/run/ab/f.sock"]);
    assert_eq!(env[0].value, Value::Secret("token".into()));
    assert_eq!(mountpoint, &PathBuf::from("/k/plugins/x/globalmount"));
    let json = serde_json::to_string(&plan).unwrap();
    assert!(!json.contains("hunter22"), "a checked plan never holds secret values: {json}");
}

#[rstest]
#[case::dotdot(p(DirRoot::Staging, "../../etc"), "would leave the volume's directory")]
#[case::inner_dotdot(p(DirRoot::Cache, "a/../../b"), "would leave the volume's directory")]
#[case::dot(p(DirRoot::Cache, "./a"), "not normalised")]
#[case::empty_component(p(DirRoot::Cache, "a//b"), "not normalised")]
#[case::trailing_slash(p(DirRoot::Cache, "a/"), "not normalised")]
#[case::absolute(p(DirRoot::Cache, "/etc/passwd"), "is absolute")]
#[case::nul(p(DirRoot::Cache, "a\0b"), "control characters")]
#[case::newline(p(DirRoot::Cache, "a\nb"), "control characters")]
fn paths_cannot_escape(#[case] path: w::PathRef, #[case] reason: &str) {
    let f = Fixture::new();
    let err = f.check(Operation::Stage, vec![w::Step::Mkdir(path)]).unwrap_err();
    assert_eq!((err.index, err.kind), (1, "mkdir"));
    assert!(err.reason.contains(reason), "{err}");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[rstest]
#[case::path(spawn("/bin/sh", vec![], vec![]), "is a path")]
#[case::relative_path(spawn("./weed", vec![], vec![]), "is a path")]
#[case::not_granted(spawn("weed", vec![], vec![]), "not granted to plugin t")]
#[case::bad_chars(spawn("we ed", vec![], vec![]), "must be letters")]
#[case::secret_in_argv(spawn("fusetest", vec![lit("-token=hunter22")], vec![]), "value of secret \"token\"")]
#[case::nul_in_arg(spawn("fusetest", vec![lit("a\0")], vec![]), "contains NUL")]
#[case::ld_preload(spawn("fusetest", vec![], vec![w::EnvVar { name: "LD_PRELOAD".into(), value: w::Value::Literal("/x.so".into()) }]), "dynamic loader")]
#[case::env_syntax(spawn("fusetest", vec![], vec![w::EnvVar { name: "A=B".into(), value: w::Value::Literal("c".into()) }]), "must match")]
#[case::env_twice(spawn("fusetest", vec![], vec![w::EnvVar { name: "A".into(), value: w::Value::Literal("1".into()) }, w::EnvVar { name: "A".into(), value: w::Value::Literal("2".into()) }]), "set twice")]
#[case::missing_secret(spawn("fusetest", vec![], vec![w::EnvVar { name: "A".into(), value: w::Value::Secret("nope".into()) }]), "does not carry (given: token)")]
#[case::secret_literal_env(spawn("fusetest", vec![], vec![w::EnvVar { name: "A".into(), value: w::Value::Literal("xhunter22".into()) }]), "value of secret")]
fn spawn_steps_are_policed(#[case] step: w::Step, #[case] reason: &str) {
    let f = Fixture::new();
    let err = f.check(Operation::Stage, vec![step]).unwrap_err();
    assert!(err.reason.contains(reason), "{err}");
}

#[test]
fn a_granted_program_needs_a_configured_binary() {
    let mut f = Fixture::new();
    f.grant.programs.insert("weed".into());
    let err = f.check(Operation::Stage, vec![spawn("weed", vec![], vec![])]).unwrap_err();
    assert!(err.reason.contains("--program weed=/absolute/path"), "{err}");
}

fn mount(fstype: &str, source: w::MountSource, options: Vec<w::Arg>) -> w::Step {
    w::Step::Mount(w::Mount {
        fstype: fstype.into(),
        source,
        target: p(DirRoot::Staging, ""),
        options,
        readonly: false,
    })
}

#[rstest]
#[case::fstype(mount("ext4", w::MountSource::Named("x".into()), vec![]), "fstype \"ext4\" is not allowed")]
#[case::device(mount("tmpfs", w::MountSource::Named("/dev/sda1".into()), vec![]), "devices are not allowed")]
#[case::smuggled_option(mount("tmpfs", w::MountSource::Named("tmpfs".into()), vec![lit("size=1m,exec")]), "contains ','")]
#[case::bind_option(w::Step::Bind(w::Bind { source: p(DirRoot::Staging, ""), target: p(DirRoot::Staging, "x"), readonly: false, options: vec!["suid".into()] }), "bind option \"suid\"")]
#[case::remove_staging(w::Step::Remove(p(DirRoot::Staging, "")), "CO's job")]
#[case::unpack_unfetched(w::Step::Unpack(w::Unpack { digest: format!("sha256:{}", "a".repeat(64)), format: w::Archive::Tar, dest: p(DirRoot::Staging, "m") }), "not fetched by an earlier step")]
#[case::fetch_bad_digest(w::Step::Fetch(w::Fetch { url: "https://registry.local/v2/x".into(), headers: vec![], digest: "md5:x".into(), size: 1 }), "is not sha256")]
#[case::fetch_ungranted(w::Step::Fetch(w::Fetch { url: "https://evil.example/x".into(), headers: vec![], digest: format!("sha256:{}", "a".repeat(64)), size: 1 }), "host evil.example is not granted")]
#[case::http_in_stage(http("http://filer:8888/x"), "not allowed in a Stage plan")]
fn node_steps_are_policed(#[case] step: w::Step, #[case] reason: &str) {
    let f = Fixture::new();
    let err = f.check(Operation::Stage, vec![step]).unwrap_err();
    assert!(err.reason.contains(reason), "{err}");
}

#[rstest]
#[case::endpoint("http://filer:8888/buckets/x/?op=mkdir", true)]
#[case::endpoint_other_port("http://filer:9999/x", false)]
#[case::config_host_any_port("https://registry.local:5000/v2/", true)]
#[case::case_insensitive("http://FILER:8888/x", true)]
#[case::credentials("http://user:pw@filer:8888/x", false)]
#[case::scheme("ftp://filer:8888/x", false)]
#[case::other_host("http://169.254.169.254/latest/meta-data", false)]
#[case::userinfo_trick("http://filer:8888@evil/x", false)]
fn urls_only_to_granted_hosts(#[case] url: &str, #[case] ok: bool) {
    let f = Fixture::new();
    let r = f.check(Operation::Provision, vec![http(url)]);
    assert_eq!(r.is_ok(), ok, "{url}: {r:?}");
}

#[test]
fn operations_limit_steps_and_roots() {
    let f = Fixture::new();
    let err = f.check(Operation::Provision, vec![w::Step::Mkdir(p(DirRoot::Cache, "x"))]).unwrap_err();
    assert!(err.reason.contains("not allowed in a Provision plan"), "{err}");
    let err = f.check(Operation::Publish, vec![spawn("fusetest", vec![], vec![])]).unwrap_err();
    assert!(err.reason.contains("not allowed in a Publish plan"), "{err}");
    let mut f = Fixture::new();
    f.dirs.target = None;
    let bind = w::Step::Bind(w::Bind {
        source: p(DirRoot::Staging, ""),
        target: p(DirRoot::Target, ""),
        readonly: true,
        options: vec![],
    });
    let err = f.check(Operation::Stage, vec![bind]).unwrap_err();
    assert!(err.reason.contains("target directory is not available"), "{err}");
}

#[test]
fn plan_size_and_attributes_are_bounded() {
    let f = Fixture::new();
    let steps = vec![w::Step::Mkdir(p(DirRoot::Cache, "x")); MAX_STEPS + 1];
    let err = f.check(Operation::Stage, steps).unwrap_err();
    assert_eq!(err.index, 0);
    let attrs = vec![w::Kv { key: "k".into(), value: "hunter22".into() }];
    let err = check(&f.ctx(Operation::Stage), w::Plan { steps: vec![], attributes: attrs }).unwrap_err();
    assert!(err.reason.contains("value of secret"), "{err}");
}

#[test]
fn endpoint_hosts_come_from_endpoint_parameters_only() {
    use crate::plugin::info::{ParamDoc, PluginInfo};
    let doc = |name: &str, kind: &'static str| ParamDoc {
        name: name.into(),
        doc: String::new(),
        kind,
        source: "parameter",
        required: false,
        default: None,
    };
    let info = PluginInfo {
        name: "t".into(),
        version: "0".into(),
        description: String::new(),
        parameters: vec![doc("filer", "endpoint"), doc("path", "remote-path")],
        programs: vec![],
        fstypes: vec![],
    };
    let hosts = endpoint_hosts(&info, [("filer", "A:1, b:2"), ("path", "evil:80")]);
    assert_eq!(hosts, BTreeSet::from(["a:1".to_string(), "b:2".to_string()]));
}

#[test]
fn a_relative_host_directory_is_an_error_not_a_panic() {
    let mut f = Fixture::new();
    f.dirs.cache = Some("relative/cache".into());
    let err = f.check(Operation::Stage, vec![w::Step::Mkdir(p(DirRoot::Cache, "x"))]).unwrap_err();
    assert!(err.reason.contains("cache directory relative/cache is not absolute"), "{err}");
}
