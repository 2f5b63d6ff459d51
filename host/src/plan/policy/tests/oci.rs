//! `resolve` and `fetch-blob`: one resolve per stage plan, to a granted registry; blobs only
//! after it, by digest; unpack only of a fetched blob.

use rstest::rstest;

use super::*;
use crate::plan::RegistryAuth;

fn resolve(reference: &str, mirror: Option<&str>, auth: w::RegistryAuth) -> w::Step {
    w::Step::Resolve(w::Resolve {
        reference: reference.into(),
        mirror: mirror.map(String::from),
        auth,
        insecure: false,
    })
}

fn anonymous(reference: &str) -> w::Step {
    resolve(reference, None, w::RegistryAuth::Anonymous)
}

fn digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn blob(d: &str, size: u64) -> w::Step {
    w::Step::FetchBlob(w::FetchBlob {
        digest: d.into(),
        size,
        media_type: "application/vnd.oci.image.layer.v1.tar".into(),
    })
}

fn unpack(d: &str) -> w::Step {
    w::Step::Unpack(w::Unpack { digest: d.into(), format: w::Archive::Tar, dest: p(DirRoot::Staging, "m") })
}

#[test]
fn a_resolved_artifact_is_fetched_and_unpacked() {
    let f = Fixture::new();
    let auth = w::RegistryAuth::Basic(w::BasicAuth { username_key: "token".into(), password_key: "token".into() });
    let steps = vec![resolve("registry.local/org/model:v1", None, auth), blob(&digest('a'), 10), unpack(&digest('a'))];
    let plan = f.check(Operation::Stage, steps).unwrap();
    assert_eq!(
        plan.steps[0],
        Step::Resolve {
            reference: "registry.local/org/model:v1".into(),
            mirror: None,
            auth: RegistryAuth::Basic { username_key: "token".into(), password_key: "token".into() },
            insecure: false,
        }
    );
    assert_eq!(
        plan.steps[1],
        Step::FetchBlob { digest: digest('a'), size: 10, media_type: "application/vnd.oci.image.layer.v1.tar".into() }
    );
    assert_eq!((plan.steps[0].kind(), plan.steps[1].kind()), ("resolve", "fetch-blob"));
    assert!(crate::plan::secret_refs(&plan).is_empty(), "registry credentials are never kept with a volume");
    let json = serde_json::to_string(&plan).unwrap();
    assert!(!json.contains("hunter22"), "{json}");
    assert_eq!(serde_json::from_str::<Plan>(&json).unwrap(), plan);
}

#[rstest]
#[case::granted_by_config("registry.local/m", None, true)]
#[case::config_any_port(
    "registry.local:5000/m@sha256:0000000000000000000000000000000000000000000000000000000000000000",
    None,
    true
)]
#[case::granted_by_parameter("ghcr.io/org/model:1", None, true)]
#[case::parameter_other_registry("quay.io/org/model:1", None, false)]
#[case::mirror_by_endpoint("ghcr.io/org/model:1", Some("filer:8888"), true)]
#[case::mirror_by_config("ghcr.io/org/model:1", Some("registry.local"), true)]
#[case::mirror_not_granted("ghcr.io/org/model:1", Some("mirror.example"), false)]
#[case::mirror_with_path("ghcr.io/org/model:1", Some("registry.local/x"), false)]
#[case::mirror_with_scheme("ghcr.io/org/model:1", Some("https://registry.local"), false)]
fn registries_and_mirrors_must_be_granted(#[case] reference: &str, #[case] mirror: Option<&str>, #[case] ok: bool) {
    let mut f = Fixture::new();
    let info = crate::plugin::info::PluginInfo {
        name: "t".into(),
        version: "0".into(),
        description: String::new(),
        parameters: vec![crate::plugin::info::ParamDoc {
            name: "model".into(),
            doc: String::new(),
            kind: "oci-reference",
            source: "parameter",
            required: true,
            default: None,
        }],
        programs: vec![],
        fstypes: vec![],
    };
    let granted = endpoint_hosts(&info, [("model", "ghcr.io/org/other:2")]);
    assert_eq!(granted, BTreeSet::from(["ghcr.io".to_string()]));
    let mut ctx = f.ctx(Operation::Stage);
    ctx.endpoint_hosts.extend(granted);
    let r = check(
        &ctx,
        w::Plan { steps: vec![resolve(reference, mirror, w::RegistryAuth::Anonymous)], attributes: vec![] },
    );
    assert_eq!(r.is_ok(), ok, "{reference} via {mirror:?}: {r:?}");
    if let Err(e) = r {
        assert!(e.reason.contains("not granted") || e.reason.contains("host[:port]"), "{e}");
    }
    // Insecure passes the policy (the host config decides at execution).
    f.grant.hosts.insert("plain.local".into());
    let insecure = w::Step::Resolve(w::Resolve {
        reference: "plain.local/m".into(),
        mirror: None,
        auth: w::RegistryAuth::Anonymous,
        insecure: true,
    });
    let plan = f.check(Operation::Stage, vec![insecure]).unwrap();
    assert!(matches!(plan.steps[0], Step::Resolve { insecure: true, .. }));
}

#[test]
fn an_ungranted_registry_says_how_to_grant_it() {
    let f = Fixture::new();
    let err = f.check(Operation::Stage, vec![anonymous("evil.example/m")]).unwrap_err();
    assert!(err.reason.contains("registry evil.example:443 is not granted to plugin t"), "{err}");
    assert!(err.reason.contains("oci-reference parameter"), "{err}");
    assert!(err.reason.contains("--grant t:host=evil.example"), "{err}");
}

#[rstest]
#[case::twice(vec![anonymous("registry.local/a"), anonymous("registry.local/b")], 2, "at most one")]
#[case::bad_reference(vec![anonymous("registry.local/Model")], 1, "does not parse")]
#[case::no_registry(vec![anonymous("busybox")], 1, "must start with a registry")]
#[case::missing_token(vec![resolve("registry.local/m", None, w::RegistryAuth::Token("nope".into()))], 1, "does not carry")]
#[case::missing_docker_config(vec![resolve("registry.local/m", None, w::RegistryAuth::DockerConfig("cfg".into()))], 1, "does not carry")]
#[case::blob_first(vec![blob(&digest('a'), 1), anonymous("registry.local/m")], 1, "before any resolve")]
#[case::blob_digest(vec![anonymous("registry.local/m"), blob("sha256:ABC", 1)], 2, "is not sha256")]
#[case::blob_upper_digest(vec![anonymous("registry.local/m"), blob(&format!("sha256:{}", "A".repeat(64)), 1)], 2, "is not sha256")]
#[case::unpack_other_blob(vec![anonymous("registry.local/m"), blob(&digest('a'), 1), unpack(&digest('b'))], 3, "not fetched")]
fn oci_steps_are_policed(#[case] steps: Vec<w::Step>, #[case] index: usize, #[case] reason: &str) {
    let f = Fixture::new();
    let err = f.check(Operation::Stage, steps).unwrap_err();
    assert_eq!(err.index, index, "{err}");
    assert!(err.reason.contains(reason), "{err}");
}

#[test]
fn an_empty_blob_is_a_blob() {
    // An empty file packed raw (`__init__.py`) is a blob of size 0.
    let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    let plan = Fixture::new().check(Operation::Stage, vec![anonymous("registry.local/m"), blob(empty, 0)]).unwrap();
    assert!(matches!(&plan.steps[1], Step::FetchBlob { size: 0, .. }), "{plan:?}");
}

#[test]
fn only_stage_and_dynamic_mount_plans_resolve() {
    let f = Fixture::new();
    let plan = f.check(Operation::DynamicMount, vec![anonymous("registry.local/m"), blob(&digest('a'), 1)]).unwrap();
    assert_eq!(plan.steps.len(), 2);
    for op in [Operation::Publish, Operation::Unstage, Operation::Provision] {
        let err = f.check(op, vec![anonymous("registry.local/m")]).unwrap_err();
        assert!(err.reason.contains("not allowed"), "{op:?}: {err}");
        let err = f.check(op, vec![blob(&digest('a'), 1)]).unwrap_err();
        assert!(err.reason.contains("not allowed"), "{op:?}: {err}");
    }
}
