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

fn path_arg(prefix: &str, path: w::PathRef, suffix: &str) -> w::Arg {
    w::Arg::Path(w::PathArg { prefix: prefix.into(), path, suffix: suffix.into() })
}

fn env(name: &str, value: w::Value) -> w::EnvVar {
    w::EnvVar { name: name.into(), value }
}

fn template(prefix: &str, key: &str, suffix: &str) -> w::Value {
    w::Value::SecretTemplate(w::SecretTemplate { prefix: prefix.into(), key: key.into(), suffix: suffix.into() })
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
        mount: w::FuseMount::ByProgram,
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
    program_args: BTreeMap<String, ArgRules>,
    rules: ProgramRules,
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
            program_args: BTreeMap::new(),
            rules: ProgramRules::default(),
            dirs: VolumeDirs {
                staging: Some("/k/plugins/x/globalmount".into()),
                target: Some("/k/pods/u/mount".into()),
                cache: Some("/s/cache/ab".into()),
                runtime: Some("/s/run/ab".into()),
                fuse_files: Some("/f/ab".into()),
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
            program_args: &self.program_args,
            rules: &self.rules,
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
        path_arg("-dir=", p(DirRoot::Staging, ""), ""),
        path_arg("-sock=", p(DirRoot::Runtime, "f.sock"), ",ro"),
    ];
    let plan = f
        .check(Operation::Stage, vec![w::Step::Mkdir(p(DirRoot::Cache, "a/b")), spawn("fusetest", args, env)])
        .unwrap();
    assert_eq!(plan.steps[0], Step::Mkdir { path: "/s/cache/ab/a/b".into() });
    let Step::SpawnFuse { executable, args, env, mountpoint, .. } = &plan.steps[1] else { panic!() };
    assert_eq!(executable, &PathBuf::from("/usr/bin/fusetest"));
    let text = |s: &str| SpawnArg::Text(s.into());
    assert_eq!(args, &[text("mount"), text("-dir=/k/plugins/x/globalmount"), text("-sock=/s/run/ab/f.sock,ro")]);
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

/// Found by the `plan` fuzz target (host/fuzz): a path holding a secret's value was accepted,
/// and a path shows in mountinfo, which every process on the node reads.
#[rstest]
#[case::bind_target(w::Step::Bind(w::Bind { source: p(DirRoot::Cache, "a"), target: p(DirRoot::Cache, "x-hunter22-y"), readonly: false, options: vec![] }))]
#[case::mkdir(w::Step::Mkdir(p(DirRoot::Cache, "a/hunter22")))]
#[case::mountpoint(w::Step::SpawnFuse(w::SpawnFuse { mountpoint: p(DirRoot::Staging, "hunter22"), ..match spawn("fusetest", vec![], vec![]) { w::Step::SpawnFuse(s) => s, _ => unreachable!() } }))]
// Found by the same target later: names were not checked, only values. A header name is sent
// as it is and an environment variable's name shows in /proc/PID/environ.
#[case::header_name(w::Step::Fetch(w::Fetch { url: "http://registry.local/v2/x".into(), headers: vec![w::Header { name: "Authorizationx-hunter22-y".into(), value: w::Value::Literal("v".into()) }], digest: format!("sha256:{}", "0".repeat(64)), size: 1 }))]
#[case::env_name(spawn("fusetest", vec![], vec![w::EnvVar { name: "A_hunter22".into(), value: w::Value::Literal("v".into()) }]))]
#[case::lookup_key(lookup("xhunter22", "GET", &["https://registry.local/v2/x"]))]
fn a_path_or_name_holding_a_secret_value_is_refused(#[case] step: w::Step) {
    let f = Fixture::new();
    let err = f.check(Operation::Stage, vec![step]).unwrap_err();
    assert!(err.reason.contains("contains the value of secret \"token\""), "{err}");
    assert!(!err.reason.contains("hunter22"), "the refusal does not show it either: {err}");
}

/// Found by the `plan` fuzz target: a refusal quoted a secret's value the plan carried (a mount
/// source that is not a pseudo name, a program name), and refusals reach logs and CO events.
#[rstest]
#[case::mount_source(mount("tmpfs", w::MountSource::Named("/dev/hunter22".into()), vec![]), "mount source")]
#[case::program(spawn("hunter22x", vec![], vec![]), "<redacted:token>")]
#[case::fstype(mount("hunter22", w::MountSource::Named("tmpfs".into()), vec![]), "<redacted:token>")]
fn a_refusal_never_quotes_a_secret_value(#[case] step: w::Step, #[case] says: &str) {
    let f = Fixture::new();
    let err = f.check(Operation::Stage, vec![step]).unwrap_err();
    assert!(err.to_string().contains(says), "{err}");
    assert!(!err.to_string().contains("hunter22"), "{err}");
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
#[case::host_header(w::Step::Fetch(w::Fetch { url: "https://registry.local/v2/x".into(), headers: vec![w::Header { name: "Host".into(), value: w::Value::Literal("evil.example".into()) }], digest: format!("sha256:{}", "a".repeat(64)), size: 1 }), "header Host is set by the host")]
#[case::fetch_ungranted(w::Step::Fetch(w::Fetch { url: "https://evil.example/x".into(), headers: vec![], digest: format!("sha256:{}", "a".repeat(64)), size: 1 }), "host evil.example:443 is not granted")]
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
    // Only the host serves a dynamic volume's socket.
    let err = f.check(Operation::Publish, vec![w::Step::Socket(p(DirRoot::Target, "csi.sock"))]).unwrap_err();
    assert!(err.reason.contains("not allowed in a Publish plan"), "{err}");
    let err = f.check(Operation::Stage, vec![w::Step::Socket(p(DirRoot::Staging, "csi.sock"))]).unwrap_err();
    assert!(err.reason.contains("not allowed in a Stage plan"), "{err}");
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
fn a_dynamic_mount_is_read_only_files_and_no_programs() {
    // The host gives a dynamic mount its own directory as `target` and its own cache only.
    let mut f = Fixture::new();
    f.dirs = VolumeDirs {
        staging: None,
        target: Some("/k/pods/u/mount/mounts/m1".into()),
        cache: Some("/s/cache/ab/dynamic/m1".into()),
        runtime: None,
        fuse_files: None,
    };
    let bind = |readonly| {
        w::Step::Bind(w::Bind {
            source: p(DirRoot::Cache, "model"),
            target: p(DirRoot::Target, ""),
            readonly,
            options: vec!["nosuid".into()],
        })
    };
    let plan = f.check(Operation::DynamicMount, vec![w::Step::Mkdir(p(DirRoot::Cache, "model")), bind(true)]).unwrap();
    assert!(
        matches!(&plan.steps[1], Step::Bind { source, target, readonly: true, .. }
            if source == Path::new("/s/cache/ab/dynamic/m1/model") && target == Path::new("/k/pods/u/mount/mounts/m1")),
        "{plan:?}"
    );
    let err = f.check(Operation::DynamicMount, vec![bind(false)]).unwrap_err();
    assert!(err.reason.contains("read-only"), "{err}");
    let writable = w::Step::Mount(w::Mount {
        fstype: "tmpfs".into(),
        source: w::MountSource::Named("tmpfs".into()),
        target: p(DirRoot::Target, ""),
        options: vec![],
        readonly: false,
    });
    let err = f.check(Operation::DynamicMount, vec![writable]).unwrap_err();
    assert!(err.reason.contains("read-only"), "{err}");
    for (step, why) in [
        (spawn("fusetest", vec![], vec![]), "not allowed in a DynamicMount plan"),
        (http("http://filer:8888/x"), "not allowed in a DynamicMount plan"),
        (w::Step::Remove(p(DirRoot::Cache, "x")), "not allowed in a DynamicMount plan"),
        (w::Step::Socket(p(DirRoot::Target, "s")), "not allowed in a DynamicMount plan"),
        (w::Step::Mkdir(p(DirRoot::Staging, "x")), "staging directory is not available"),
        (w::Step::Mkdir(p(DirRoot::Runtime, "x")), "runtime directory is not available"),
        (w::Step::Mkdir(p(DirRoot::Target, "../other")), "would leave"),
        (
            w::Step::Bind(w::Bind {
                source: p(DirRoot::Target, "pod-made"),
                target: p(DirRoot::Target, ""),
                readonly: true,
                options: vec![],
            }),
            "outside the mount's cache directory",
        ),
    ] {
        let err = f.check(Operation::DynamicMount, vec![step]).unwrap_err();
        assert!(err.reason.contains(why), "{why}: {err}");
    }
    // Unpacked files go into the mount's cache, never into the pod's directory.
    let digest = format!("sha256:{}", "a".repeat(64));
    let unpack_into = |dest| {
        vec![
            w::Step::Resolve(w::Resolve {
                reference: "registry.local/m:v1".into(),
                mirror: None,
                auth: w::RegistryAuth::Anonymous,
                insecure: false,
            }),
            w::Step::FetchBlob(w::FetchBlob { digest: digest.clone(), size: 1, media_type: "x/y".into() }),
            w::Step::Unpack(w::Unpack { digest: digest.clone(), format: w::Archive::Raw, dest }),
        ]
    };
    f.check(Operation::DynamicMount, unpack_into(p(DirRoot::Cache, "model/f"))).unwrap();
    let err = f.check(Operation::DynamicMount, unpack_into(p(DirRoot::Target, "f"))).unwrap_err();
    assert!(err.reason.contains("outside the mount's cache directory"), "{err}");
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
    let attrs = vec![w::Kv { key: "k-hunter22".into(), value: "v".into() }];
    let err = check(&f.ctx(Operation::Stage), w::Plan { steps: vec![], attributes: attrs }).unwrap_err();
    assert!(err.reason.contains("an attribute key contains the value of secret"), "{err}");
    assert!(!err.to_string().contains("hunter22"), "{err}");
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
        parameters: vec![doc("filer", "endpoint"), doc("path", "remote-path"), doc("site", "url"), doc("v6", "url")],
        programs: vec![],
        fstypes: vec![],
    };
    let hosts = endpoint_hosts(&info, [("filer", "A:1, b:2"), ("path", "evil:80")]);
    assert_eq!(hosts, BTreeSet::from(["a:1".to_string(), "b:2".to_string()]));
    // A url value grants its host and port (the scheme's default when it names none), parsed as
    // a plan's URLs are: one with credentials, or no URL at all, grants nothing.
    let hosts = endpoint_hosts(&info, [("site", " https://Files.Example/dav "), ("v6", "http://[::1]:9000/b")]);
    assert_eq!(hosts, BTreeSet::from(["files.example:443".to_string(), "[::1]:9000".to_string()]));
    for bad in ["http://user@evil/", "evil:80", "ftp://evil/"] {
        assert!(endpoint_hosts(&info, [("site", bad)]).is_empty(), "{bad}");
    }
}

#[test]
fn a_relative_host_directory_is_an_error_not_a_panic() {
    let mut f = Fixture::new();
    f.dirs.cache = Some("relative/cache".into());
    let err = f.check(Operation::Stage, vec![w::Step::Mkdir(p(DirRoot::Cache, "x"))]).unwrap_err();
    assert!(err.reason.contains("cache directory relative/cache is not absolute"), "{err}");
}

/// The address hyper-util's `HttpConnector` connects to for `uri` (its `get_host_port`: the
/// URI's host, and its port or else the scheme's default), written `host:port`.
fn hyper_connects_to(uri: &hyper::Uri) -> String {
    let default = if uri.scheme_str() == Some("https") { 443 } else { 80 };
    format!("{}:{}", uri.host().expect("a request URI has a host"), uri.port_u16().unwrap_or(default))
}

/// The fixture, granting by config `granted` (any port), `host:80`, `secure:443`, `[::1]:8888`,
/// `[::1]:80` and `dotted.example.` (with its dot); the endpoint parameter grants `filer:8888`.
fn tricky_fixture() -> Fixture {
    let mut f = Fixture::new();
    f.grant.hosts = ["granted", "host:80", "secure:443", "[::1]:8888", "[::1]:80", "dotted.example."]
        .into_iter()
        .map(String::from)
        .collect();
    f
}

/// Each URL is either refused by the policy, or approved for a `host:port` that is exactly
/// where the HTTP client's request would connect.
#[rstest]
// userinfo, however it is spelled
#[case::userinfo_a_b_c("http://a@b@c/", None)]
#[case::userinfo_granted_then_evil("http://granted@evil/", None)]
#[case::userinfo_before_granted("http://evil@granted/", None)]
#[case::userinfo_user_host("http://user@host/", None)]
#[case::userinfo_password("http://user:pw@granted/", None)]
#[case::userinfo_empty("http://@granted/", None)]
#[case::userinfo_port_trick("http://filer:8888@evil/x", None)]
// IPv6
#[case::ipv6_port("http://[::1]:8888/x", Some("[::1]:8888"))]
#[case::ipv6_default_port("http://[::1]/", Some("[::1]:80"))]
#[case::ipv6_long_form("http://[0:0:0:0:0:0:0:1]:8888/", Some("[::1]:8888"))]
#[case::ipv6_other_port("http://[::1]:9999/", None)]
#[case::ipv6_zone_id("http://[::1%25lo]:8888/", None)]
#[case::ipv6_unbracketed("http://::1:8888/", None)]
#[case::ipv6_junk_after("http://[::1]x:8888/", None)]
// percent-encoded and upper-case hosts
#[case::percent_host("http://gr%61nted/", None)]
#[case::percent_whole_host("http://%67%72%61%6e%74%65%64/", None)]
#[case::upper_case_host("http://GRANTED/x", Some("granted:80"))]
#[case::upper_case_everything("HTTP://FILER:8888/X", Some("filer:8888"))]
// trailing dots are significant
#[case::trailing_dot_not_granted("http://granted./", None)]
#[case::trailing_dot_granted("http://dotted.example./", Some("dotted.example.:80"))]
#[case::dot_missing("http://dotted.example/", None)]
#[case::ipv4_trailing_dot("http://127.0.0.1./", None)]
// backslashes anywhere
#[case::backslash_before_at("http://granted\\@evil/", None)]
#[case::backslash_as_slash("http://evil\\granted/", None)]
#[case::backslash_in_path("http://granted/a\\b", None)]
// default and explicit ports
#[case::default_port_granted("http://host/", Some("host:80"))]
#[case::explicit_default_port("http://host:80/", Some("host:80"))]
#[case::explicit_port_zeros("http://host:0080/", Some("host:80"))]
#[case::other_port_refused("http://host:8080/", None)]
#[case::https_default("https://secure/", Some("secure:443"))]
#[case::https_explicit("https://secure:443/", Some("secure:443"))]
#[case::http_to_https_port_grant("http://secure/", None)]
#[case::https_to_http_port_grant("https://host/", None)]
#[case::any_port_grant("http://granted:12345/", Some("granted:12345"))]
#[case::port_out_of_range("http://granted:99999/", None)]
#[case::port_signed("http://granted:+80/", None)]
#[case::port_empty("http://granted:/", None)]
#[case::endpoint("http://filer:8888/buckets/x/?op=mkdir", Some("filer:8888"))]
#[case::endpoint_default_port("http://filer/", None)]
// `@` and `:` after the authority are path, query or fragment
#[case::query_at("http://granted/?next=@evil", Some("granted:80"))]
#[case::query_without_path("http://granted?x=evil:80@evil", Some("granted:80"))]
#[case::fragment_at("http://granted#@evil/", Some("granted:80"))]
#[case::path_at_colon("http://granted/a:b@evil:80/", Some("granted:80"))]
// missing or other schemes
#[case::no_scheme("granted/x", None)]
#[case::no_scheme_port("granted:80/x", None)]
#[case::scheme_relative("//granted/x", None)]
#[case::single_slash("http:/granted/", None)]
#[case::no_slashes("http:granted", None)]
#[case::ftp("ftp://granted/", None)]
#[case::file("file:///etc/passwd", None)]
#[case::look_alike_scheme("httpx://granted/", None)]
// hosts that are not what they look like
#[case::empty_host("http:///x", None)]
#[case::empty_host_port("http://:80/", None)]
#[case::short_ipv4("http://127.1:8888/", None)]
#[case::whitespace("http://granted /", None)]
#[case::newline("http://granted\n.evil/", None)]
#[case::non_ascii("http://gr\u{e4}nted/", None)]
fn tricky_urls_go_only_where_approved(#[case] url: &str, #[case] approved: Option<&str>) {
    let f = tricky_fixture();
    let plan = f.check(Operation::Provision, vec![http(url)]);
    let Some(approved) = approved else {
        assert!(plan.is_err(), "{url:?} must be refused: {plan:?}");
        return;
    };
    let plan = plan.unwrap_or_else(|e| panic!("{url:?} must be approved: {e}"));
    let Step::Http { urls, .. } = &plan.steps[0] else { panic!("{plan:?}") };
    let target = super::url(&f.ctx(Operation::Provision), url).unwrap();
    assert_eq!(target.authority(), approved, "{url:?}");
    // What the client does with the URL the checked plan carries.
    let client_target = crate::plan::url::parse(&urls[0]).unwrap();
    let req = crate::unpriv::http::request(&hyper::Method::POST, &client_target, &[], "").unwrap();
    assert_eq!(hyper_connects_to(req.uri()), approved, "{url:?}: the client would connect elsewhere");
}

/// Reads one request head and answers 200; returns the head.
async fn answer_once(listener: tokio::net::TcpListener) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut conn, _) = listener.accept().await.unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await.unwrap();
        assert!(n > 0, "connection closed before the request head ended");
        head.extend_from_slice(&buf[..n]);
    }
    conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await.unwrap();
    String::from_utf8(head).unwrap()
}

fn call(urls: Vec<String>) -> crate::unpriv::http::Call {
    crate::unpriv::http::Call {
        method: "POST".into(),
        urls,
        headers: vec![],
        body: String::new(),
        ok_status: vec![200],
    }
}

#[tokio::test]
async fn the_client_connects_where_the_policy_approved() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // A granted port nothing listens on, tried first: alternatives still go in order.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut f = Fixture::new();
    f.grant.hosts = [format!("127.0.0.1:{port}"), format!("127.0.0.1:{closed}")].into();
    let server = tokio::spawn(answer_once(listener));
    let urls = [format!("http://127.0.0.1:{closed}/"), format!("HTTP://127.0.0.1:{port}/x?to=@evil:80#@evil")];
    let step = w::Step::Http(w::HttpCall {
        method: "POST".into(),
        urls: urls.to_vec(),
        headers: vec![],
        body: vec![],
        ok_status: vec![200],
    });
    let plan = f.check(Operation::Provision, vec![step]).unwrap();
    let Step::Http { urls, .. } = &plan.steps[0] else { panic!("{plan:?}") };
    let status = crate::unpriv::http::HttpClient::default().call(&call(urls.clone())).await.unwrap();
    assert_eq!(status, 200);
    let head = tokio::time::timeout(std::time::Duration::from_secs(10), server).await.unwrap().unwrap();
    assert!(head.starts_with("POST /x?to=@evil:80 HTTP/1.1\r\n"), "{head}");
    assert!(head.to_ascii_lowercase().contains(&format!("\r\nhost: 127.0.0.1:{port}\r\n")), "{head}");
}

#[tokio::test]
async fn a_refused_url_never_connects() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut f = Fixture::new();
    f.grant.hosts = ["granted".to_string(), format!("127.0.0.1:{port}")].into();
    // hyper alone would connect to 127.0.0.1:port for the first, and did before this parser.
    for url in [format!("http://granted@127.0.0.1:{port}/"), format!("http://127.0.0.1:{port}\\@granted/")] {
        let err = f.check(Operation::Provision, vec![http(&url)]).unwrap_err();
        assert_eq!(err.kind, "http", "{err}");
        // Even handed straight to the client, bypassing the policy, it is not requested.
        let err = crate::unpriv::http::HttpClient::default().call(&call(vec![url.clone()])).await.unwrap_err();
        assert!(matches!(err, crate::unpriv::http::HttpError::Invalid(_)), "{url}: {err}");
    }
    let accepted = tokio::time::timeout(std::time::Duration::from_millis(300), listener.accept()).await;
    assert!(accepted.is_err(), "something connected to the listener: {accepted:?}");
}

mod args;
mod grants;
mod oci;
mod values;

#[test]
fn argument_rules_judge_secret_files_where_the_executor_puts_them() {
    // A `-` before a secret file's path makes the path's letters short options, so the rules
    // must see the directory the program really gets: `<runtime>/secrets` for a program that
    // mounts by itself, the FUSE files directory for one the host mounts for.
    let mut f = Fixture::new();
    f.dirs.fuse_files = Some("/mnt/zz".into());
    f.program_args.insert("fusetest".into(), ArgRules { deny: [OptionName::Short('z')].into(), ..Default::default() });
    let file = w::Arg::SecretFile(w::SecretFileArg { prefix: "-".into(), key: "token".into(), suffix: String::new() });
    let fd = w::Arg::FuseFd(w::FuseFdArg { prefix: String::new(), suffix: String::new() });
    let by_program = spawn("fusetest", vec![file.clone()], vec![]);
    f.check(Operation::Stage, vec![by_program]).unwrap();
    let mut host_fd = spawn("fusetest", vec![fd, file], vec![]);
    let w::Step::SpawnFuse(s) = &mut host_fd else { unreachable!() };
    s.mount = w::FuseMount::HostFd(w::HostFdMount { source: "src".into(), options: vec![], readonly: false });
    let err = f.check(Operation::Stage, vec![host_fd.clone()]).unwrap_err();
    assert!(err.reason.contains(r#"option "-z" is denied"#), "{err}");
    // Without a directory for that program's files, a secret-file argument is refused.
    f.dirs.fuse_files = None;
    let err = f.check(Operation::Stage, vec![host_fd]).unwrap_err();
    assert!(err.reason.contains("no directory for this program's secret files"), "{err}");
}

fn lookup(key: &str, method: &str, urls: &[&str]) -> w::Step {
    w::Step::Lookup(w::Lookup {
        key: key.into(),
        method: method.into(),
        urls: urls.iter().map(|u| u.to_string()).collect(),
        headers: vec![],
    })
}

fn socket_call(socket: w::PathRef, method: &str, message: usize, timeout_ms: u32) -> w::Step {
    w::Step::SocketCall(w::SocketCall { socket, method: method.into(), message: vec![8; message], timeout_ms })
}

#[rstest]
#[case(lookup("capacity", "GET", &["http://filer:8888/.mounthost/capacity/buckets/v"]), "")]
#[case(lookup("dir", "HEAD", &["http://filer:8888/buckets/v", "http://filer:8888/x"]), "")]
#[case(lookup("k", "PUT", &["http://filer:8888/x"]), "is not GET or HEAD")]
#[case(lookup("", "GET", &["http://filer:8888/x"]), "must be 1 to 64")]
#[case(lookup("a b", "GET", &["http://filer:8888/x"]), "must be 1 to 64")]
#[case(lookup(&"k".repeat(65), "GET", &["http://filer:8888/x"]), "must be 1 to 64")]
#[case(lookup("k", "GET", &[]), "1 to 16 alternative URLs")]
#[case(lookup("k", "GET", &["http://elsewhere:8888/x"]), "elsewhere")]
#[case(socket_call(p(DirRoot::Runtime, "weed.sock"), "/messaging_pb.SeaweedMount/Configure", 3, 5000), "")]
#[case(socket_call(p(DirRoot::Staging, "weed.sock"), "/a.B/C", 3, 5000), "runtime directory")]
#[case(socket_call(p(DirRoot::Runtime, "../x.sock"), "/a.B/C", 3, 5000), "")]
#[case(socket_call(p(DirRoot::Runtime, "weed.sock"), "a.B/C", 3, 5000), "is not /<package>.<service>/<method>")]
#[case(socket_call(p(DirRoot::Runtime, "weed.sock"), "/a.B/C.D", 3, 5000), "is not /<package>.<service>/<method>")]
#[case(socket_call(p(DirRoot::Runtime, "weed.sock"), "/a.B/C", 64 * 1024 + 1, 5000), "at most")]
#[case(socket_call(p(DirRoot::Runtime, "weed.sock"), "/a.B/C", 3, 0), "1 to 60000")]
#[case(socket_call(p(DirRoot::Runtime, "weed.sock"), "/a.B/C", 3, 60_001), "1 to 60000")]
fn lookups_and_socket_calls_are_policed(#[case] step: w::Step, #[case] reason: &str) {
    let f = Fixture::new();
    let operation = if matches!(step, w::Step::SocketCall(_)) { Operation::NodeExpand } else { Operation::Expand };
    let r = f.check(operation, vec![step.clone()]);
    match (reason, &r) {
        ("", Ok(plan)) => assert_eq!(plan.steps.len(), 1),
        // `..` is refused whatever the step (the path checks are the same for every step).
        ("", Err(e)) if matches!(&step, w::Step::SocketCall(c) if c.socket.rel.contains("..")) => {
            assert!(e.reason.contains(".."), "{e}")
        }
        (want, Err(e)) => assert!(e.reason.contains(want), "{want}: {e}"),
        (want, Ok(plan)) => panic!("expected {want:?}, got {plan:?}"),
    }
}

#[test]
fn each_operation_takes_only_its_new_steps() {
    let f = Fixture::new();
    let get = || lookup("k", "GET", &["http://filer:8888/x"]);
    let call = || socket_call(p(DirRoot::Runtime, "weed.sock"), "/a.B/C", 3, 5000);
    for op in [Operation::Provision, Operation::Stage, Operation::Capacity, Operation::List, Operation::Describe] {
        assert!(f.check(op, vec![get()]).is_ok(), "{op:?} takes lookups");
    }
    for op in [Operation::Delete, Operation::Publish, Operation::Unstage, Operation::DynamicMount] {
        let err = f.check(op, vec![get()]).unwrap_err();
        assert!(err.reason.contains("not allowed in"), "{op:?}: {err}");
    }
    // Only a node-side expansion tells a running program something.
    for op in [Operation::Stage, Operation::Expand, Operation::Provision, Operation::Capacity] {
        let err = f.check(op, vec![call()]).unwrap_err();
        assert!(err.reason.contains("not allowed in"), "{op:?}: {err}");
    }
    assert!(f.check(Operation::Expand, vec![http("http://filer:8888/x")]).is_ok());
    for op in [Operation::NodeExpand, Operation::Capacity, Operation::List, Operation::Describe] {
        let err = f.check(op, vec![http("http://filer:8888/x")]).unwrap_err();
        assert!(err.reason.contains("not allowed in"), "{op:?}: {err}");
    }
}
