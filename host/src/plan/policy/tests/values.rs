//! Arguments and values of contract 0.2.0: path suffixes, secret files, secret templates and
//! path values, and where each may appear.

use rstest::rstest;

use super::*;

fn secret_file_arg(prefix: &str, key: &str, suffix: &str) -> w::Arg {
    w::Arg::SecretFile(w::SecretFileArg { prefix: prefix.into(), key: key.into(), suffix: suffix.into() })
}

fn header_fetch(value: w::Value) -> w::Step {
    w::Step::Fetch(w::Fetch {
        url: "https://registry.local/v2/x".into(),
        headers: vec![w::Header { name: "Authorization".into(), value }],
        digest: format!("sha256:{}", "a".repeat(64)),
        size: 1,
    })
}

fn spawn_of(plan: &Plan) -> (&Vec<SpawnArg>, &Vec<EnvVar>) {
    match &plan.steps[..] {
        [Step::SpawnFuse { args, env, .. }] => (args, env),
        other => panic!("expected one spawn, got {other:?}"),
    }
}

#[test]
fn secret_files_templates_and_paths_stay_references() {
    let f = Fixture::new();
    let args =
        vec![secret_file_arg("-oIdentityFile=", "token", ",ro"), path_arg("-cache=", p(DirRoot::Cache, "c"), "/")];
    let env = vec![
        env("AUTH", template("Bearer ", "token", "")),
        env("TMPDIR", w::Value::Path(p(DirRoot::Cache, "tmp"))),
        env("CREDENTIALS", w::Value::SecretFile("token".into())),
    ];
    let plan = f.check(Operation::Stage, vec![spawn("fusetest", args, env)]).unwrap();
    let (args, env) = spawn_of(&plan);
    assert_eq!(
        args,
        &[
            SpawnArg::SecretFile { prefix: "-oIdentityFile=".into(), key: "token".into(), suffix: ",ro".into() },
            SpawnArg::Text("-cache=/s/cache/ab/c/".into()),
        ]
    );
    assert_eq!(
        env[0].value,
        Value::SecretTemplate { prefix: "Bearer ".into(), key: "token".into(), suffix: "".into() }
    );
    assert_eq!(env[1].value, Value::Path("/s/cache/ab/tmp".into()));
    assert_eq!(env[2].value, Value::SecretFile("token".into()));
    // Printable and storable without the value; filled in only at execution.
    let json = serde_json::to_string(&plan).unwrap();
    assert!(!json.contains("hunter22"), "{json}");
    assert_eq!(serde_json::from_str::<Plan>(&json).unwrap(), plan);
    assert_eq!(crate::plan::secret_refs(&plan), vec!["token".to_string()]);
    let runtime = std::path::Path::new("/s/run/ab");
    let file = crate::plan::secret_file_path(runtime, "token");
    assert_eq!(args[0].render(runtime), format!("-oIdentityFile={},ro", file.display()));
    assert_eq!(crate::plan::resolve_env(&env[0].value, &f.secrets, runtime), "Bearer hunter22");
    assert_eq!(crate::plan::resolve_env(&env[1].value, &f.secrets, runtime), "/s/cache/ab/tmp");
    assert_eq!(crate::plan::resolve_env(&env[2].value, &f.secrets, runtime), file.display().to_string());
}

#[test]
fn a_secret_template_header_is_filled_in_at_execution() {
    let f = Fixture::new();
    let plan = f.check(Operation::Stage, vec![header_fetch(template("Bearer ", "token", ""))]).unwrap();
    let Step::Fetch { headers, .. } = &plan.steps[0] else { panic!("{plan:?}") };
    assert_eq!(crate::plan::resolve(&headers[0].value, &f.secrets), "Bearer hunter22");
    assert!(!serde_json::to_string(&plan).unwrap().contains("hunter22"));
}

#[rstest]
#[case::secret_file_in_mount(mount("tmpfs", w::MountSource::Named("tmpfs".into()), vec![secret_file_arg("key=", "token", "")]), "secret files are for program arguments")]
#[case::suffix_in_mount(mount("tmpfs", w::MountSource::Named("tmpfs".into()), vec![path_arg("x=", p(DirRoot::Cache, ""), ",y")]), "a mount option is a prefix and a path only")]
#[case::path_in_header(header_fetch(w::Value::Path(p(DirRoot::Cache, "x"))), "paths are for environment variables")]
#[case::secret_file_in_header(header_fetch(w::Value::SecretFile("token".into())), "secret files are for spawned programs only")]
#[case::template_line_break(header_fetch(template("Bearer ", "token", "\r\nX: y")), "line break")]
#[case::template_missing(header_fetch(template("Bearer ", "nope", "")), "does not carry (given: token)")]
#[case::template_leaks(spawn("fusetest", vec![], vec![env("A", template("hunter22", "token", ""))]), "value of secret")]
#[case::secret_file_missing(spawn("fusetest", vec![secret_file_arg("-k=", "nope", "")], vec![]), "does not carry")]
#[case::secret_file_env_missing(spawn("fusetest", vec![], vec![env("A", w::Value::SecretFile("nope".into()))]), "does not carry")]
#[case::suffix_leaks(spawn("fusetest", vec![path_arg("-d=", p(DirRoot::Cache, ""), "hunter22")], vec![]), "value of secret")]
#[case::secret_file_prefix_leaks(spawn("fusetest", vec![secret_file_arg("hunter22", "token", "")], vec![]), "value of secret")]
#[case::path_value_escapes(spawn("fusetest", vec![], vec![env("A", w::Value::Path(p(DirRoot::Cache, "../x")))]), "would leave")]
fn new_kinds_are_policed(#[case] step: w::Step, #[case] reason: &str) {
    let f = Fixture::new();
    let err = f.check(Operation::Stage, vec![step]).unwrap_err();
    assert!(err.reason.contains(reason), "{err}");
}

#[test]
fn a_secret_file_needs_the_runtime_directory() {
    let mut f = Fixture::new();
    f.dirs.runtime = None;
    let step = spawn("fusetest", vec![secret_file_arg("-k=", "token", "")], vec![]);
    let err = f.check(Operation::Stage, vec![step]).unwrap_err();
    assert!(err.reason.contains("runtime directory"), "{err}");
}

#[test]
fn plans_stored_before_secret_files_still_read() {
    // A spawn's arguments were plain strings; they read as text.
    let json = r#"{"step":"spawn-fuse","program":"weed","executable":"/bin/weed","args":["mount","-dir=/m"],
        "env":[{"name":"K","value":{"secret":"k"}}],"mountpoint":"/m","fstype":"fuse.x","readyTimeoutMs":5}"#;
    let step: Step = serde_json::from_str(json).unwrap();
    let Step::SpawnFuse { args, .. } = &step else { panic!("{step:?}") };
    assert_eq!(args, &[SpawnArg::Text("mount".into()), SpawnArg::Text("-dir=/m".into())]);
    let back = serde_json::to_value(&step).unwrap();
    assert_eq!(back["args"], serde_json::json!(["mount", "-dir=/m"]), "text arguments are still written as strings");
}
