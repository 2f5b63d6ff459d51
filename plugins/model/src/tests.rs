//! Table tests of the planners, run natively: both stage rounds step by step, the filters on
//! real-shaped manifests, every refusal with its message, secrets only as key references,
//! read-only binds whatever is asked, determinism, and provisioning.

use mounthost_plugin_sdk::*;
use rstest::rstest;
use serde_json::{Value as Json, json};

use crate::Model;
use crate::node::{self, Staged};
use crate::params::SPECS;

const REF: &str = "registry.example.com/models/llama:3.1";
const MANIFEST_DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const MODEL_ARTIFACT: &str = "application/vnd.cncf.model.manifest.v1+json";
const MODEL_CONFIG: &str = "application/vnd.cncf.model.config.v1+json";

fn kvs(pairs: &[(&str, &str)]) -> Vec<Kv> {
    pairs.iter().map(|(k, v)| kv(*k, *v)).collect()
}

/// `sha256:` and 64 copies of `c`.
fn digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn media(class_format: &str) -> String {
    format!("application/vnd.cncf.model.{class_format}")
}

/// A layer descriptor; `path` `None` leaves the annotation out.
fn layer(media_type: &str, c: char, size: u64, path: Option<&str>) -> Json {
    let mut l = json!({ "mediaType": media_type, "digest": digest(c), "size": size });
    if let Some(p) = path {
        l["annotations"] = json!({ "org.cncf.model.filepath": p });
    }
    l
}

/// A ModelPack manifest with these layers.
fn manifest(layers: &[Json]) -> Json {
    json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": MODEL_ARTIFACT,
        "config": { "mediaType": MODEL_CONFIG, "digest": digest('c'), "size": 300 },
        "layers": layers,
    })
}

/// A ModelPack config with `n` diffIds.
fn config(n: usize) -> Json {
    json!({
        "descriptor": { "name": "llama", "version": "3.1" },
        "config": { "format": "safetensors" },
        "modelfs": { "type": "layers", "diffIds": (0..n).map(|_| digest('d')).collect::<Vec<_>>() },
    })
}

/// The model most tests use: weights (tar), its config (raw), a README (tar+gzip), a dataset
/// (tar+zstd), a tokenizer directory (tar).
fn model_layers() -> Vec<Json> {
    vec![
        layer(&media("weight.v1.tar"), 'a', 1000, Some("model.safetensors")),
        layer(&media("weight.config.v1.raw"), 'b', 20, Some("config.json")),
        layer(&media("doc.v1.tar+gzip"), 'e', 30, Some("README.md")),
        layer(&media("dataset.v1.tar+zstd"), 'f', 5000, Some("data/train.parquet")),
        layer(&media("weight.config.v1.tar"), '9', 40, Some("tokenizer/vocab.json")),
    ]
}

fn resolved(m: &Json, c: &Json) -> Resolved {
    Resolved::new(REF, MANIFEST_DIGEST, m.to_string(), c.to_string())
}

fn capability(mode: AccessMode) -> VolumeCapability {
    VolumeCapability::new(mode)
}

fn stage_req(ctx: &[(&str, &str)], secrets: &[(&str, &str)], resolved: Option<Resolved>) -> StageRequest {
    StageRequest::default()
        .with_volume_id("model-vol")
        .with_context(kvs(ctx))
        .with_secrets(kvs(secrets))
        .with_resolved(resolved)
        .with_node_id("node-1")
}

/// The second round for the standard model, with `extra` context.
fn stage_model(extra: &[(&str, &str)]) -> Result<Staged, BackendError> {
    let mut ctx = vec![("reference", REF)];
    ctx.extend_from_slice(extra);
    let layers = model_layers();
    node::stage(&stage_req(&ctx, &[], Some(resolved(&manifest(&layers), &config(layers.len())))))
}

fn message(err: BackendError) -> String {
    match err {
        BackendError::InvalidArgument(m) => m,
        other => panic!("expected invalid-argument, got {other:?}"),
    }
}

fn resolve_step(auth: RegistryAuth) -> Step {
    Step::Resolve(Resolve::new(REF).with_auth(auth))
}

fn fetch(c: char, size: u64, class_format: &str) -> Step {
    Step::FetchBlob(FetchBlob::new(digest(c), size, media(class_format)))
}

fn unpack(c: char, format: Archive, dest: &str) -> Step {
    Step::Unpack(Unpack::new(digest(c), format, cache(dest)))
}

/// The second round's plan for the test manifest without filters: every layer fetched and
/// unpacked, then `bind`.
fn every_layer(bind: Step) -> Plan {
    Plan::new(vec![
        resolve_step(RegistryAuth::Anonymous),
        fetch('a', 1000, "weight.v1.tar"),
        fetch('b', 20, "weight.config.v1.raw"),
        fetch('e', 30, "doc.v1.tar+gzip"),
        fetch('f', 5000, "dataset.v1.tar+zstd"),
        fetch('9', 40, "weight.config.v1.tar"),
        unpack('a', Archive::Tar, "model"),
        unpack('b', Archive::Raw, "model/config.json"),
        unpack('e', Archive::TarGzip, "model"),
        unpack('f', Archive::TarZstd, "model"),
        unpack('9', Archive::Tar, "model"),
        bind,
    ])
    .with_attributes([kv("reference", REF), kv("manifestDigest", MANIFEST_DIGEST), kv("files", "5")])
}

fn model_bind() -> Step {
    Step::Bind(Bind::new(cache("model"), staging("")).with_readonly(true).with_options(["nosuid", "nodev"]))
}

/// The digests a plan fetches, in order.
fn fetched(plan: &Plan) -> Vec<String> {
    plan.steps
        .iter()
        .filter_map(|s| match s {
            Step::FetchBlob(f) => Some(f.digest.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn info_documents_every_key() {
    let info = Model::info();
    assert_eq!(info.name, "model");
    assert_eq!(info.version, "0.1.0");
    assert!(!info.description.is_empty());
    assert!(info.programs.is_empty() && info.fstypes.is_empty());
    assert_eq!(info.parameters.len(), SPECS.len());
    for doc in &info.parameters {
        assert!(!doc.doc.is_empty(), "{} undocumented", doc.name);
    }
    let names = |source: ParamSource| -> Vec<&str> {
        info.parameters.iter().filter(|d| d.source == source).map(|d| d.name.as_str()).collect()
    };
    assert_eq!(
        names(ParamSource::Parameter),
        ["reference", "mirror", "include", "exclude", "weights", "types", "path", "insecure"]
    );
    assert_eq!(names(ParamSource::Secret), ["username", "password", "token", ".dockerconfigjson"]);
    let doc = |name: &str| info.parameters.iter().find(|d| d.name == name).unwrap();
    assert!(doc("reference").required && doc("reference").kind == ParamKind::OciReference);
    assert_eq!(doc("mirror").kind, ParamKind::Endpoint);
    assert_eq!(doc("weights").default_value.as_deref(), Some("include"));
    assert_eq!(doc("types").default_value.as_deref(), Some("weight,config,doc,code,dataset"));
    assert_eq!(doc("insecure").default_value.as_deref(), Some("false"));
    assert_eq!(info.parameters.iter().filter(|d| d.required).count(), 1);
}

#[test]
fn first_round_is_one_resolve_step() {
    let plan = Model::stage(stage_req(&[("reference", REF)], &[], None)).unwrap();
    assert_eq!(plan, Plan::new([resolve_step(RegistryAuth::Anonymous)]));
}

#[test]
fn resolve_carries_the_canonical_reference_mirror_and_insecure() {
    let ctx = [("reference", "localhost:5000/bert"), ("mirror", "[::1]:5001"), ("insecure", "true")];
    let plan = Model::stage(stage_req(&ctx, &[], None)).unwrap();
    assert_eq!(
        plan.steps,
        vec![Step::Resolve(
            Resolve::new("localhost:5000/bert:latest").with_mirror("[::1]:5001".to_string()).with_insecure(true)
        )]
    );
}

#[rstest]
#[case(&[("username", "robot-user"), ("password", "s3cr3t-pass")], RegistryAuth::Basic(BasicAuth::new("username", "password")))]
#[case(&[("token", "s3cr3t-t0k3n")], RegistryAuth::Token("token".into()))]
#[case(&[(".dockerconfigjson", "{\"auths\":{\"registry.example.com\":{\"auth\":\"dTpw\"}}}")], RegistryAuth::DockerConfig(".dockerconfigjson".into()))]
#[case(&[(".dockerconfigjson", "{\n  \"auths\": {}\n}\n")], RegistryAuth::DockerConfig(".dockerconfigjson".into()))]
#[case(&[], RegistryAuth::Anonymous)]
fn secrets_become_key_references(#[case] secrets: &[(&str, &str)], #[case] auth: RegistryAuth) {
    let plan = Model::stage(stage_req(&[("reference", REF)], secrets, None)).unwrap();
    assert_eq!(plan.steps, vec![resolve_step(auth)]);
    let text = format!("{plan:?}");
    for (_, value) in secrets.iter().filter(|(k, _)| *k != ".dockerconfigjson") {
        assert!(!text.contains(value), "secret value {value:?} in the plan: {text}");
    }
}

#[rstest]
#[case(&[("username", "u")], "secret \"username\" is given without secret \"password\"")]
#[case(&[("password", "p")], "secret \"password\" is given without secret \"username\"")]
#[case(&[("username", "u"), ("password", "p"), ("token", "t")], "more than one kind of registry credential (username/password, token)")]
#[case(&[("token", "t"), (".dockerconfigjson", "{\"auths\":{}}")], "(token, .dockerconfigjson)")]
#[case(&[("token", "")], "secret \"token\" is empty")]
#[case(&[("tokn", "t")], "unknown secret \"tokn\"; accepted: .dockerconfigjson, password, token, username")]
#[case(&[(".dockerconfigjson", "")], "secret \".dockerconfigjson\" is empty")]
#[case(&[(".dockerconfigjson", "{\"auths\": {\"r\": {\"auth\": \"s3cr3t\"}")], "is not JSON (at line 1")]
#[case(&[(".dockerconfigjson", "{\"credHelpers\":{}}")], "has no \"auths\" object")]
fn bad_secrets(#[case] secrets: &[(&str, &str)], #[case] says: &str) {
    let m = message(Model::stage(stage_req(&[("reference", REF)], secrets, None)).unwrap_err());
    assert!(m.contains(says), "{m}");
    assert!(!m.contains("s3cr3t"), "a secret value in the message: {m}");
}

#[test]
fn second_round_plans_every_layer() {
    let staged = stage_model(&[]).unwrap();
    assert!(staged.notes.is_empty());
    assert_eq!(staged.plan, every_layer(model_bind()));
}

#[test]
fn second_round_keeps_the_resolve_step_with_its_auth() {
    let layers = model_layers();
    let req = stage_req(
        &[("reference", REF)],
        &[("username", "u"), ("password", "p")],
        Some(resolved(&manifest(&layers), &config(layers.len()))),
    );
    let plan = Model::stage(req).unwrap();
    let basic = RegistryAuth::Basic(BasicAuth::new("username", "password"));
    assert_eq!(plan.steps[0], resolve_step(basic));
}

#[rstest]
#[case(&[("weights", "only")], &['a'])]
#[case(&[("weights", "exclude")], &['b', 'e', 'f', '9'])]
#[case(&[("types", "weight,config")], &['a', 'b', '9'])]
#[case(&[("types", "doc")], &['e'])]
#[case(&[("include", "*.safetensors,*.json")], &['a', 'b', '9'])]
#[case(&[("include", "tokenizer")], &['9'])]
#[case(&[("exclude", "data/**,README.md")], &['a', 'b', '9'])]
#[case(&[("exclude", "data")], &['a', 'b', 'e', '9'])]
#[case(&[("include", "*.json"), ("exclude", "tokenizer/")], &['b'])]
#[case(&[("weights", "exclude"), ("exclude", "*.md"), ("types", "weight,config,doc")], &['b', '9'])]
fn filters_select_layers(#[case] extra: &[(&str, &str)], #[case] kept: &[char]) {
    let plan = stage_model(extra).unwrap().plan;
    assert_eq!(fetched(&plan), kept.iter().map(|c| digest(*c)).collect::<Vec<_>>(), "{extra:?}");
    assert_eq!(plan.attributes[2], kv("files", kept.len().to_string()));
    assert_eq!(plan.steps.last(), Some(&model_bind()));
}

#[test]
fn nothing_selected_names_the_filters_and_the_files() {
    let m = message(stage_model(&[("include", "*.gguf"), ("weights", "only")]).unwrap_err());
    assert_eq!(
        m,
        format!(
            "the filters (include \"*.gguf\", weights \"only\") select none of the 5 model files of {REF}: \
             model.safetensors (weight), config.json (config), README.md (doc), data/train.parquet (dataset), \
             tokenizer/vocab.json (config); change parameters include, exclude, weights or types"
        )
    );
}

#[test]
fn unknown_media_types_are_skipped_with_a_note() {
    let mut layers = model_layers();
    layers.insert(1, layer("application/vnd.cncf.model.license.v1.tar", '7', 10, Some("LICENSE")));
    layers.push(layer("application/vnd.oci.image.layer.v1.tar", '8', 10, None));
    let staged =
        node::stage(&stage_req(&[("reference", REF)], &[], Some(resolved(&manifest(&layers), &config(layers.len())))))
            .unwrap();
    assert_eq!(
        staged.notes,
        vec![format!(
            "{REF}: skipped 2 layer(s) whose media type is not a ModelPack layer type: layers[1] \
             (application/vnd.cncf.model.license.v1.tar), layers[6] (application/vnd.oci.image.layer.v1.tar)"
        )]
    );
    assert_eq!(fetched(&staged.plan).len(), 5);
}

#[test]
fn only_unknown_media_types_is_refused() {
    let layers = vec![
        layer("application/vnd.cncf.model.license.v1.tar", '7', 10, Some("LICENSE")),
        layer("application/vnd.cncf.model.license.v1.tar", '8', 10, Some("NOTICE")),
    ];
    let req = stage_req(&[("reference", REF)], &[], Some(resolved(&manifest(&layers), &config(2))));
    let m = message(node::stage(&req).unwrap_err());
    assert!(m.starts_with(&format!("{REF} has no ModelPack layer this plugin reads: its 2 layers have the media types application/vnd.cncf.model.license.v1.tar, none")), "{m}");
}

#[test]
fn no_layers_is_not_found() {
    let req = stage_req(&[("reference", REF)], &[], Some(resolved(&manifest(&[]), &config(0))));
    assert_eq!(
        node::stage(&req).unwrap_err(),
        BackendError::NotFound(format!("{REF} has no layers: there is no model file to mount"))
    );
}

/// Stage the standard context against a manifest and config.
fn stage_with(m: &Json, c: &Json) -> Result<Staged, BackendError> {
    node::stage(&stage_req(&[("reference", REF)], &[], Some(resolved(m, c))))
}

#[rstest]
#[case(
    Some("/etc/passwd"),
    "layers[0] (application/vnd.cncf.model.weight.v1.raw) of registry.example.com/models/llama:3.1: its org.cncf.model.filepath \"/etc/passwd\" is not a file path this plugin takes (absolute; it must be relative to the model's root)"
)]
#[case(
    Some("a/../../x"),
    "layers[0] (application/vnd.cncf.model.weight.v1.raw) of registry.example.com/models/llama:3.1: its org.cncf.model.filepath \"a/../../x\" is not a file path this plugin takes (it has an empty, . or .. component)"
)]
#[case(Some("a//b"), "(it has an empty, . or .. component)")]
#[case(Some(""), "(empty)")]
#[case(
    None,
    "layers[0] (application/vnd.cncf.model.weight.v1.raw) of registry.example.com/models/llama:3.1: the layer has no org.cncf.model.filepath annotation"
)]
fn bad_file_paths_name_the_layer(#[case] path: Option<&str>, #[case] says: &str) {
    let m = manifest(&[layer(&media("weight.v1.raw"), 'a', 1, path)]);
    let msg = message(stage_with(&m, &config(1)).unwrap_err());
    assert!(msg.contains(says), "{msg}");
}

#[test]
fn bad_layer_digests_name_the_layer() {
    let mut l = layer(&media("weight.v1.tar"), 'a', 1, Some("w"));
    l["digest"] = json!("sha256:ABC");
    let msg = message(stage_with(&manifest(&[l]), &config(1)).unwrap_err());
    assert!(
        msg.contains("layers[0] (application/vnd.cncf.model.weight.v1.tar)") && msg.contains("\"sha256:ABC\""),
        "{msg}"
    );
}

#[rstest]
#[case(json!({"modelfs": {"type": "layers", "diffIds": [digest('d')]}}), "lists 1 modelfs.diffIds for 5 layers")]
#[case(json!({"modelfs": {"type": "snapshot", "diffIds": []}}), "modelfs.type \"snapshot\"; only \"layers\"")]
#[case(json!({"descriptor": {}}), "is not a ModelPack model config (missing field `modelfs`")]
fn bad_configs(#[case] c: Json, #[case] says: &str) {
    let msg = message(stage_with(&manifest(&model_layers()), &c).unwrap_err());
    assert!(msg.contains(says), "{msg}");
    assert!(msg.contains(&format!("the config of {REF}")), "{msg}");
}

#[test]
fn a_config_that_is_not_json_is_refused() {
    let mut bad = resolved(&manifest(&model_layers()), &config(5));
    bad.config = "not json".into();
    let req = stage_req(&[("reference", REF)], &[], None).with_resolved(bad);
    assert!(message(node::stage(&req).unwrap_err()).contains("is not a ModelPack model config"));
}

#[test]
fn ordinary_image_manifests_with_file_paths_are_accepted() {
    let mut m = manifest(&model_layers());
    m.as_object_mut().unwrap().remove("artifactType");
    m["config"]["mediaType"] = json!("application/vnd.oci.image.config.v1+json");
    // Not a ModelPack config, so its contents are not checked.
    let staged = stage_with(&m, &json!({})).unwrap();
    assert_eq!(fetched(&staged.plan).len(), 5);

    let mut plain = manifest(&[layer("application/vnd.example.blob.v1", 'a', 1, None)]);
    plain.as_object_mut().unwrap().remove("artifactType");
    plain["config"]["mediaType"] = json!("application/vnd.oci.image.config.v1+json");
    let msg = message(stage_with(&plain, &json!({})).unwrap_err());
    assert!(
        msg.starts_with(&format!("{REF} is neither a ModelPack model nor a container image: its manifest has neither")),
        "{msg}"
    );
}

#[test]
fn the_artifact_type_alone_marks_a_model() {
    let mut m = manifest(&model_layers());
    m["config"]["mediaType"] = json!("application/vnd.oci.empty.v1+json");
    assert_eq!(fetched(&stage_with(&m, &json!({})).unwrap().plan).len(), 5);
}

#[rstest]
#[case(json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}), "is a application/vnd.oci.image.index.v1+json, not an OCI image manifest")]
#[case(json!({"schemaVersion": 1, "config": {"mediaType": MODEL_CONFIG, "digest": digest('c'), "size": 1}, "layers": []}), "has schemaVersion 1, not 2")]
#[case(json!({"schemaVersion": 2, "layers": []}), "has no config: it is not an OCI image manifest")]
#[case(json!({"layers": []}), "has schemaVersion none, not 2")]
#[case(json!([1, 2]), "is not an OCI image manifest (invalid type")]
fn bad_manifests(#[case] m: Json, #[case] says: &str) {
    let msg = message(stage_with(&m, &config(0)).unwrap_err());
    assert!(msg.contains(says), "{msg}");
}

#[test]
fn a_layer_without_size_is_refused() {
    let mut l = layer(&media("weight.v1.tar"), 'a', 1, Some("w"));
    l.as_object_mut().unwrap().remove("size");
    let msg = message(stage_with(&manifest(&[l]), &config(1)).unwrap_err());
    assert!(msg.contains("missing field `size`"), "{msg}");
}

#[test]
fn clashing_paths_are_refused_unless_filtered_out() {
    let layers = vec![
        layer(&media("weight.v1.raw"), 'a', 1, Some("model.bin")),
        layer(&media("doc.v1.raw"), 'b', 1, Some("model.bin")),
    ];
    let msg = message(stage_with(&manifest(&layers), &config(2)).unwrap_err());
    assert_eq!(
        msg,
        format!(
            "layers[0] and layers[1] of {REF} both carry the file path \"model.bin\"; select one of them \
             with parameter \"include\" or \"exclude\""
        )
    );
    let req =
        stage_req(&[("reference", REF), ("weights", "only")], &[], Some(resolved(&manifest(&layers), &config(2))));
    assert_eq!(fetched(&node::stage(&req).unwrap().plan), vec![digest('a')]);

    let nested =
        vec![layer(&media("weight.v1.tar"), 'a', 1, Some("w/x.bin")), layer(&media("doc.v1.raw"), 'b', 1, Some("w"))];
    let msg = message(stage_with(&manifest(&nested), &config(2)).unwrap_err());
    assert!(msg.contains("\"w\" is a file but \"w/x.bin\" needs it as a directory"), "{msg}");
    // A tar layer of a directory and a file inside it are fine.
    let dirs = vec![
        layer(&media("weight.config.v1.tar"), 'a', 1, Some("tokenizer")),
        layer(&media("weight.config.v1.raw"), 'b', 1, Some("tokenizer/extra.json")),
    ];
    assert!(stage_with(&manifest(&dirs), &config(2)).is_ok());
}

#[test]
fn a_blob_shared_by_two_files_is_fetched_once() {
    let layers = vec![
        layer(&media("doc.v1.raw"), 'a', 7, Some("LICENSE")),
        layer(&media("doc.v1.raw"), 'a', 7, Some("docs/LICENSE")),
    ];
    let plan = stage_with(&manifest(&layers), &config(2)).unwrap().plan;
    assert_eq!(
        plan.steps,
        vec![
            resolve_step(RegistryAuth::Anonymous),
            fetch('a', 7, "doc.v1.raw"),
            unpack('a', Archive::Raw, "model/LICENSE"),
            unpack('a', Archive::Raw, "model/docs/LICENSE"),
            model_bind(),
        ]
    );
    assert_eq!(plan.attributes[2], kv("files", "2"));
}

#[test]
fn a_model_of_many_files_plans_quickly() {
    let n = 20_000;
    let layers: Vec<Json> = (0..n)
        .map(|i| {
            let mut l = layer(&media("dataset.v1.raw"), 'a', 1, Some(&format!("shards/{i:05}.parquet")));
            l["digest"] = json!(format!("sha256:{i:064x}"));
            l
        })
        .collect();
    let started = std::time::Instant::now();
    let staged = stage_with(&manifest(&layers), &config(n)).unwrap();
    assert_eq!(staged.plan.steps.len(), 2 * n + 2);
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn a_mismatched_resolution_is_an_internal_error() {
    let layers = model_layers();
    let mut r = resolved(&manifest(&layers), &config(5));
    r.reference = "registry.example.com/models/other:1".into();
    let err = node::stage(&stage_req(&[("reference", REF)], &[], Some(r))).unwrap_err();
    assert!(matches!(err, BackendError::Internal(ref m) if m.contains("other:1")), "{err:?}");
    let mut r = resolved(&manifest(&layers), &config(5));
    r.manifest_digest = "md5:x".into();
    assert!(matches!(node::stage(&stage_req(&[("reference", REF)], &[], Some(r))), Err(BackendError::Internal(_))));
}

#[test]
fn plans_are_deterministic() {
    let all = [
        ("include", "*.json,*.safetensors"),
        ("types", "config,weight"),
        ("mirror", "m.example.com"),
        ("reference", REF),
    ];
    let layers = model_layers();
    let run = |ctx: &[(&str, &str)]| {
        node::stage(&stage_req(ctx, &[], Some(resolved(&manifest(&layers), &config(5))))).unwrap()
    };
    let plan = run(&all);
    assert_eq!(plan, run(&all));
    let reversed: Vec<(&str, &str)> = all.iter().rev().copied().collect();
    assert_eq!(plan, run(&reversed));
}

#[rstest]
#[case(AccessMode::SingleNodeWriter, false)]
#[case(AccessMode::MultiNodeMultiWriter, false)]
#[case(AccessMode::MultiNodeReaderOnly, true)]
fn publish_is_always_read_only(#[case] mode: AccessMode, #[case] readonly: bool) {
    let req = PublishRequest::default()
        .with_volume_id("model-vol")
        .with_context(kvs(&[("reference", REF)]))
        .with_capability(capability(mode))
        .with_readonly(readonly);
    assert_eq!(
        Model::publish(req).unwrap(),
        Plan::new([Step::Bind(
            Bind::new(staging(""), target("")).with_readonly(true).with_options(["nosuid", "nodev"]),
        )])
    );
}

fn validate(
    params: &[(&str, &str)],
    secrets: &[(&str, &str)],
    caps: Vec<VolumeCapability>,
) -> Result<(), BackendError> {
    Model::validate(
        ValidateRequest::default().with_parameters(kvs(params)).with_secrets(kvs(secrets)).with_capabilities(caps),
    )
}

#[test]
fn validate_accepts_a_full_storage_class_and_every_access_mode() {
    let params = [
        (
            "reference",
            "registry.example.com:5000/models/llama:3.1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ),
        ("mirror", "mirror.example.com:443"),
        ("include", "*.safetensors, config.json, tokenizer/**"),
        ("exclude", "original/"),
        ("weights", "include"),
        ("types", "weight,config"),
        ("insecure", "false"),
        ("csi.storage.k8s.io/pvc/name", "models"),
    ];
    let caps = [
        AccessMode::SingleNodeWriter,
        AccessMode::SingleNodeReaderOnly,
        AccessMode::MultiNodeReaderOnly,
        AccessMode::MultiNodeSingleWriter,
        AccessMode::MultiNodeMultiWriter,
        AccessMode::SingleNodeSingleWriter,
        AccessMode::SingleNodeMultiWriter,
    ]
    .map(capability)
    .to_vec();
    validate(&params, &[("token", "t")], caps).unwrap();
    let ro = capability(AccessMode::MultiNodeReaderOnly).with_mount_flags(["ro", "rw,ro"]);
    validate(&[("reference", REF)], &[], vec![ro]).unwrap();
}

#[rstest]
#[case(&[], "parameter \"reference\" is required")]
#[case(&[("reference", "")], "parameter \"reference\" is empty")]
#[case(&[("reference", "models/llama")], "parameter \"reference\" \"models/llama\" is not an OCI reference")]
#[case(&[("reference", REF), ("mirror", "https://m.example.com")], "parameter \"mirror\" \"https://m.example.com\" is not a registry endpoint")]
#[case(&[("reference", REF), ("mirror", "a:1,b:2")], "parameter \"mirror\" \"a:1,b:2\" is not a registry endpoint")]
#[case(&[("reference", REF), ("include", "/abs")], "parameter \"include\" has a pattern starting with /")]
#[case(&[("reference", REF), ("exclude", "a[")], "parameter \"exclude\": pattern \"a[\" is not a valid glob")]
#[case(&[("reference", REF), ("weights", "all")], "parameter \"weights\" must be one of include, only, exclude, not \"all\"")]
#[case(&[("reference", REF), ("types", "weights")], "parameter \"types\": \"weights\" is not a layer class")]
#[case(&[("reference", REF), ("types", "doc"), ("weights", "only")], "together they select no layer class")]
#[case(&[("reference", REF), ("insecure", "yes")], "parameter \"insecure\" must be \"true\" or \"false\"")]
#[case(&[("reference", REF), ("filter", "x")], "unknown parameter \"filter\"; accepted: exclude, include, insecure, mirror, path, reference, types, weights")]
#[case(&[("reference", REF), ("reference", REF)], "parameter \"reference\" is given twice")]
fn bad_parameters(#[case] params: &[(&str, &str)], #[case] says: &str) {
    let m = message(validate(params, &[], vec![]).unwrap_err());
    assert!(m.contains(says), "{m}");
    // The same refusal at stage and at provisioning.
    let stage = message(Model::stage(stage_req(params, &[], None)).unwrap_err());
    assert!(stage.contains(says), "{stage}");
    let prov = message(Model::provision(provision_req("pvc-1", params)).unwrap_err());
    assert!(prov.contains(says), "{prov}");
}

#[rstest]
#[case("ext4", &[], "fsType \"ext4\" is not supported")]
#[case("", &["noexec"], "mount flag \"noexec\" is not supported")]
#[case("", &["ro,nosuid"], "mount flag \"nosuid\" is not supported")]
#[case("", &["ro,"], "mount flag \"\" is not supported")]
fn bad_capabilities(#[case] fs_type: &str, #[case] flags: &[&str], #[case] says: &str) {
    let cap = VolumeCapability::new(AccessMode::MultiNodeReaderOnly)
        .with_fs_type(fs_type)
        .with_mount_flags(flags.iter().map(|f| f.to_string()).collect::<Vec<_>>());
    let m = message(validate(&[("reference", REF)], &[], vec![cap.clone()]).unwrap_err());
    assert!(m.contains(says), "{m}");
    let req = stage_req(&[("reference", REF)], &[], None).with_capability(cap);
    assert!(message(Model::stage(req).unwrap_err()).contains(says));
}

fn provision_req(name: &str, params: &[(&str, &str)]) -> ProvisionRequest {
    ProvisionRequest::default()
        .with_name(name)
        .with_parameters(kvs(params))
        .with_capabilities(vec![capability(AccessMode::MultiNodeReaderOnly)])
        .with_required_bytes(10u64 << 30)
}

#[test]
fn provision_returns_a_stable_id_and_the_parameters_as_context() {
    let params = [
        ("csi.storage.k8s.io/pvc/name", "models"),
        ("weights", "only"),
        ("reference", REF),
        ("mirror", "mirror.example.com"),
    ];
    let plan = Model::provision(provision_req("pvc-1", &params)).unwrap();
    assert_eq!(plan.volume_id.len(), 32);
    assert!(plan.volume_id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{}", plan.volume_id);
    assert_eq!(plan.capacity_bytes, 0);
    assert!(plan.steps.is_empty());
    assert_eq!(plan.context, kvs(&[("reference", REF), ("mirror", "mirror.example.com"), ("weights", "only")]));
    assert_eq!(plan, Model::provision(provision_req("pvc-1", &params)).unwrap());

    // The context stages.
    let ctx: Vec<(&str, &str)> = plan.context.iter().map(|kv| (kv.key.as_str(), kv.value.as_str())).collect();
    let first = Model::stage(stage_req(&ctx, &[], None)).unwrap();
    assert!(matches!(&first.steps[..], [Step::Resolve(r)] if r.mirror.as_deref() == Some("mirror.example.com")));
}

#[test]
fn volume_ids_follow_the_name_the_model_and_the_filters() {
    let id = |name: &str, params: &[(&str, &str)]| Model::provision(provision_req(name, params)).unwrap().volume_id;
    let base = id("pvc-1", &[("reference", REF)]);
    // Equivalent spellings, and what does not change the files, keep the id.
    assert_eq!(base, id("pvc-1", &[("reference", REF), ("weights", "include"), ("insecure", "true")]));
    assert_eq!(id("pvc-1", &[("reference", "r.io/m")]), id("pvc-1", &[("reference", "r.io/m:latest")]));
    assert_eq!(
        id("pvc-1", &[("reference", REF), ("include", "b,a")]),
        id("pvc-1", &[("reference", REF), ("include", "a, b,a")])
    );
    // Another claim, another model or other files: another id.
    let others = [
        id("pvc-2", &[("reference", REF)]),
        id("pvc-1", &[("reference", "registry.example.com/models/llama:3.2")]),
        id("pvc-1", &[("reference", REF), ("weights", "only")]),
        id("pvc-1", &[("reference", REF), ("exclude", "*.md")]),
        id("pvc-1", &[("reference", REF), ("include", "*.md")]),
    ];
    for (i, other) in others.iter().enumerate() {
        assert_ne!(&base, other, "case {i}");
    }
}

#[test]
fn provision_refuses_bad_secrets_capabilities_and_names() {
    let mut req = provision_req("pvc-1", &[("reference", REF)]);
    req.secrets = kvs(&[("username", "u")]);
    assert!(message(Model::provision(req).unwrap_err()).contains("without secret \"password\""));
    let mut req = provision_req("pvc-1", &[("reference", REF)]);
    req.capabilities[0].fs_type = "xfs".into();
    assert!(message(Model::provision(req).unwrap_err()).contains("fsType \"xfs\""));
    let req = provision_req("", &[("reference", REF)]);
    assert_eq!(message(Model::provision(req).unwrap_err()), "the volume name is empty");
}

#[test]
fn delete_and_unstage_plan_nothing() {
    let del = DeleteRequest::default().with_volume_id("0123");
    assert_eq!(Model::delete(del).unwrap(), Plan::default());
    let unstage = UnstageRequest::default().with_volume_id("0123");
    assert_eq!(Model::unstage(unstage).unwrap(), Plan::default());
}

// ---------------------------------------------------------------------------------------------
// Dynamic mounts

/// A dynamic volume's context: its own model and filters (which a dynamic mount ignores) and
/// `extra` registry settings.
fn volume_ctx(extra: &[(&str, &str)]) -> Vec<Kv> {
    let mut ctx = kvs(&[("reference", "registry.example.com/models/volume:1"), ("weights", "only")]);
    ctx.extend(kvs(extra));
    ctx
}

fn dynamic_req(ctx: Vec<Kv>, request: &[(&str, &str)], recorded: Vec<Kv>) -> DynamicMountRequest {
    DynamicMountRequest::default()
        .with_volume_id("model-vol")
        .with_context(ctx)
        .with_request(kvs(request))
        .with_recorded(recorded)
}

/// What the host records for the volume's stage, then the resolution under the reserved keys.
fn recorded_with(r: &Resolved) -> Vec<Kv> {
    let mut recorded = kvs(&[
        ("reference", "registry.example.com/models/volume:1"),
        ("manifestDigest", MANIFEST_DIGEST),
        ("files", "1"),
    ]);
    recorded.extend([
        kv(RESOLVED_REFERENCE, r.reference.as_str()),
        kv(RESOLVED_MANIFEST_DIGEST, r.manifest_digest.as_str()),
        kv(RESOLVED_MANIFEST, r.manifest.as_str()),
        kv(RESOLVED_CONFIG, r.config.as_str()),
    ]);
    recorded
}

/// The standard model's resolution, as the second round's `recorded`.
fn model_recorded() -> Vec<Kv> {
    let layers = model_layers();
    recorded_with(&resolved(&manifest(&layers), &config(layers.len())))
}

fn dynamic_bind() -> Step {
    Step::Bind(Bind::new(cache("model"), target("")).with_readonly(true).with_options(["nosuid", "nodev"]))
}

fn internal(err: BackendError) -> String {
    match err {
        BackendError::Internal(m) => m,
        other => panic!("expected internal, got {other:?}"),
    }
}

#[test]
fn dynamic_first_round_is_one_anonymous_resolve_step() {
    let plan = Model::dynamic_mount(dynamic_req(volume_ctx(&[]), &[("reference", REF)], Vec::new())).unwrap();
    assert_eq!(plan, Plan::new([resolve_step(RegistryAuth::Anonymous)]));
    // The volume's own stage attributes alone are a first round too.
    let stage_only = kvs(&[("reference", "registry.example.com/models/volume:1"), ("files", "1")]);
    let plan = Model::dynamic_mount(dynamic_req(volume_ctx(&[]), &[("reference", REF)], stage_only)).unwrap();
    assert_eq!(plan.steps, vec![resolve_step(RegistryAuth::Anonymous)]);
}

#[test]
fn dynamic_second_round_plans_every_layer_onto_the_mount() {
    // The volume's `weights: only` does not apply: a dynamic mount has its own filters.
    let plan = Model::dynamic_mount(dynamic_req(volume_ctx(&[]), &[("reference", REF)], model_recorded())).unwrap();
    assert_eq!(plan, every_layer(dynamic_bind()));
}

#[test]
fn dynamic_plans_are_stage_plans_but_for_the_bind_and_the_auth() {
    let filters = [("reference", "registry.example.com/models/llama:3.1"), ("include", "*.json"), ("types", "config")];
    let dynamic = node::dynamic_mount(&dynamic_req(volume_ctx(&[]), &filters, model_recorded())).unwrap();
    let mut staged = stage_model(&filters[1..]).unwrap();
    *staged.plan.steps.last_mut().unwrap() = dynamic_bind();
    assert_eq!(dynamic, staged);
    assert_eq!(fetched(&dynamic.plan), vec![digest('b'), digest('9')]);
}

#[rstest]
#[case(&[("weights", "only")], &['a'])]
#[case(&[("weights", "exclude"), ("exclude", "data")], &['b', 'e', '9'])]
#[case(&[("include", "tokenizer")], &['9'])]
#[case(&[("types", "doc,dataset")], &['e', 'f'])]
fn dynamic_filters_are_the_pods(#[case] extra: &[(&str, &str)], #[case] kept: &[char]) {
    let mut request = vec![("reference", REF)];
    request.extend_from_slice(extra);
    let plan = Model::dynamic_mount(dynamic_req(volume_ctx(&[]), &request, model_recorded())).unwrap();
    assert_eq!(fetched(&plan), kept.iter().map(|c| digest(*c)).collect::<Vec<_>>(), "{extra:?}");
    assert_eq!(plan.steps.last(), Some(&dynamic_bind()));
}

#[test]
fn dynamic_mounts_use_the_volumes_mirror_and_insecure_and_no_credentials() {
    let ctx = volume_ctx(&[("mirror", "mirror.cluster.local:5000"), ("insecure", "true"), ("include", "*.md")]);
    let request = [("reference", "localhost:5000/bert")];
    let want = Step::Resolve(
        Resolve::new("localhost:5000/bert:latest")
            .with_mirror("mirror.cluster.local:5000".to_string())
            .with_insecure(true),
    );
    let plan = Model::dynamic_mount(dynamic_req(ctx.clone(), &request, Vec::new())).unwrap();
    assert_eq!(plan.steps, vec![want.clone()]);
    let layers = model_layers();
    let mut r = resolved(&manifest(&layers), &config(layers.len()));
    r.reference = "localhost:5000/bert:latest".into();
    let plan = Model::dynamic_mount(dynamic_req(ctx, &request, recorded_with(&r))).unwrap();
    assert_eq!(plan.steps[0], want);
    assert_eq!(plan.steps.len(), 12, "the volume's include does not apply");
}

#[rstest]
#[case(&[("reference", REF), ("mirror", "evil.example.com")], "unknown parameter \"mirror\" for a dynamic mount (the volume's registry settings apply: mirror and insecure come from its StorageClass); accepted: exclude, include, path, reference, types, weights")]
#[case(&[("reference", REF), ("insecure", "true")], "unknown parameter \"insecure\" for a dynamic mount (the volume's registry settings apply: mirror and insecure come from its StorageClass); accepted: exclude, include, path, reference, types, weights")]
#[case(&[("reference", REF), ("token", "t")], "unknown parameter \"token\" for a dynamic mount (a pod's request carries no credentials: the host gives the mount the volume's own, for the registries its StorageClass names); accepted: exclude, include, path, reference, types, weights")]
#[case(&[("reference", REF), (".dockerconfigjson", "{}")], "unknown parameter \".dockerconfigjson\" for a dynamic mount (a pod's request carries no credentials")]
#[case(&[("reference", REF), ("username", "u"), ("password", "p")], "unknown parameter \"username\" for a dynamic mount (a pod's request carries no credentials")]
#[case(&[("reference", REF), ("filter", "x")], "unknown parameter \"filter\" for a dynamic mount; accepted: exclude, include, path, reference, types, weights")]
#[case(&[("reference", REF), ("plugin", "model")], "unknown parameter \"plugin\" for a dynamic mount; accepted:")]
#[case(&[("reference", REF), ("csi.storage.k8s.io/pod.name", "p")], "unknown parameter \"csi.storage.k8s.io/pod.name\" for a dynamic mount; accepted:")]
#[case(&[], "parameter \"reference\" is required")]
#[case(&[("include", "*.json")], "parameter \"reference\" is required")]
#[case(&[("reference", "")], "parameter \"reference\" is empty")]
#[case(&[("reference", "models/llama")], "parameter \"reference\" \"models/llama\" is not an OCI reference")]
#[case(&[("reference", "https://registry.example.com/m")], "parameter \"reference\"")]
#[case(&[("reference", REF), ("include", "../x")], "parameter \"include\" has a pattern with an empty, . or .. component")]
#[case(&[("reference", REF), ("weights", "all")], "parameter \"weights\" must be one of include, only, exclude, not \"all\"")]
#[case(&[("reference", REF), ("types", "doc"), ("weights", "only")], "together they select no layer class")]
#[case(&[("reference", REF), ("reference", REF)], "parameter \"reference\" is given twice")]
fn dynamic_requests_are_checked(#[case] request: &[(&str, &str)], #[case] says: &str) {
    for recorded in [Vec::new(), model_recorded()] {
        let m = message(Model::dynamic_mount(dynamic_req(volume_ctx(&[]), request, recorded)).unwrap_err());
        assert!(m.contains(says), "{m}");
    }
}

#[test]
fn a_dynamic_mount_into_a_subdir_is_a_contract_mismatch() {
    let req = dynamic_req(volume_ctx(&[]), &[("reference", REF)], Vec::new()).with_subdir("models/a");
    let m = internal(Model::dynamic_mount(req).unwrap_err());
    assert!(m.contains("sub-directory \"models/a\"") && m.contains("disagree on the contract"), "{m}");
}

#[test]
fn a_partial_resolution_is_a_contract_mismatch() {
    for missing in RESOLVED_KEYS {
        let recorded: Vec<Kv> = model_recorded().into_iter().filter(|kv| kv.key != missing).collect();
        let m =
            internal(Model::dynamic_mount(dynamic_req(volume_ctx(&[]), &[("reference", REF)], recorded)).unwrap_err());
        let given: Vec<&str> = RESOLVED_KEYS.into_iter().filter(|k| *k != missing).collect();
        assert_eq!(
            m,
            format!(
                "the host passed the resolution keys {} but not all of {}: the host and the plugin disagree on \
                 the contract",
                given.join(", "),
                RESOLVED_KEYS.join(", ")
            )
        );
    }
}

#[test]
fn a_dynamic_resolution_of_another_reference_is_an_internal_error() {
    let layers = model_layers();
    let mut other = resolved(&manifest(&layers), &config(layers.len()));
    other.reference = "registry.example.com/models/other:1".into();
    let m = internal(
        Model::dynamic_mount(dynamic_req(volume_ctx(&[]), &[("reference", REF)], recorded_with(&other))).unwrap_err(),
    );
    assert!(m.contains("other:1") && m.contains(REF), "{m}");
}

#[test]
fn dynamic_keys_are_documented_parameters() {
    let info = Model::info();
    for key in crate::params::DYNAMIC {
        assert!(SPECS.iter().any(|s| s.name == *key && s.source == ParamSource::Parameter), "{key}");
        assert!(info.description.contains(key), "the description does not name {key}");
    }
}

/// An ordinary image manifest (OCI, or Docker schema 2 with `docker`) with these layers.
fn image_manifest(layers: &[Json], docker: bool) -> Json {
    let (manifest, config) = if docker {
        ("application/vnd.docker.distribution.manifest.v2+json", "application/vnd.docker.container.image.v1+json")
    } else {
        ("application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.config.v1+json")
    };
    json!({
        "schemaVersion": 2,
        "mediaType": manifest,
        "config": { "mediaType": config, "digest": digest('c'), "size": 300 },
        "layers": layers,
    })
}

fn stage_image(m: &Json, ctx: &[(&str, &str)]) -> Result<Staged, BackendError> {
    let mut all = vec![("reference", REF)];
    all.extend_from_slice(ctx);
    node::stage(&stage_req(&all, &[], Some(resolved(m, &json!({"rootfs": {"type": "layers"}})))))
}

#[rstest]
#[case(
    false,
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    Archive::TarZstd
)]
#[case(
    true,
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
    Archive::Tar
)]
fn an_image_applies_every_layer_in_order(
    #[case] docker: bool,
    #[case] lower: &str,
    #[case] upper: &str,
    #[case] upper_format: Archive,
) {
    // The same blob twice (an empty layer, say) is fetched once and applied twice.
    let m = image_manifest(
        &[layer(lower, 'a', 10, None), layer(upper, 'b', 20, None), layer(lower, 'a', 10, None)],
        docker,
    );
    let staged = stage_image(&m, &[]).unwrap();
    let image_bind =
        Step::Bind(Bind::new(cache("model"), staging("")).with_readonly(true).with_options(["nosuid", "nodev"]));
    let expected = Plan::new(vec![
        resolve_step(RegistryAuth::Anonymous),
        Step::FetchBlob(FetchBlob::new(digest('a'), 10, lower)),
        Step::FetchBlob(FetchBlob::new(digest('b'), 20, upper)),
        Step::Unpack(Unpack::new(digest('a'), Archive::TarGzip, cache("model"))),
        Step::Unpack(Unpack::new(digest('b'), upper_format, cache("model"))),
        Step::Unpack(Unpack::new(digest('a'), Archive::TarGzip, cache("model"))),
        image_bind,
    ])
    .with_attributes([
        kv("reference", REF),
        kv("manifestDigest", MANIFEST_DIGEST),
        kv("image", "true"),
        kv("layers", "3"),
    ]);
    assert_eq!(staged.plan, expected);
    assert!(staged.notes.is_empty());
}

#[rstest]
#[case("/models")]
#[case("models/")]
#[case("models")]
fn path_binds_one_directory_of_the_image(#[case] path: &str) {
    let m = image_manifest(&[layer("application/vnd.oci.image.layer.v1.tar", 'a', 10, None)], false);
    let staged = stage_image(&m, &[("path", path)]).unwrap();
    let Some(Step::Bind(bind)) = staged.plan.steps.last() else { panic!("{:?}", staged.plan) };
    assert_eq!(bind.source, cache("model/models"));
    assert!(staged.plan.attributes.contains(&kv("path", "/models")));
    // `/` is the root.
    let staged = stage_image(&m, &[("path", "/")]).unwrap();
    let Some(Step::Bind(bind)) = staged.plan.steps.last() else { panic!() };
    assert_eq!(bind.source, cache("model"));
}

#[rstest]
#[case(&[("path", "../etc")], "parameter \"path\" \"../etc\" is not a directory of an image")]
#[case(&[("path", "/a//b")], "parameter \"path\" \"/a//b\" is not a directory of an image")]
#[case(&[("weights", "only")], "parameter(s) weights select files of a ModelPack model")]
#[case(&[("include", "*.bin"), ("types", "weight")], "parameter(s) include, types select files of a ModelPack model")]
fn an_image_refuses_filters_and_bad_paths(#[case] ctx: &[(&str, &str)], #[case] says: &str) {
    let m = image_manifest(&[layer("application/vnd.oci.image.layer.v1.tar", 'a', 10, None)], false);
    let msg = message(stage_image(&m, ctx).unwrap_err());
    assert!(msg.starts_with(says), "{msg}");
}

#[test]
fn path_is_refused_for_a_modelpack_model() {
    let msg = message(stage_model(&[("path", "/models")]).unwrap_err());
    assert!(msg.contains("is a ModelPack model; select its files with include and exclude"), "{msg}");
}

#[test]
fn foreign_layers_are_skipped_with_a_note_and_unknown_ones_refused() {
    let mut foreign = layer("application/vnd.oci.image.layer.v1.tar+gzip", 'f', 99, None);
    foreign["urls"] = json!(["https://example.com/blob"]);
    let m = image_manifest(
        &[
            foreign,
            layer("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip", 'e', 5, None),
            layer("application/vnd.oci.image.layer.v1.tar", 'a', 10, None),
        ],
        false,
    );
    let staged = stage_image(&m, &[]).unwrap();
    assert_eq!(fetched(&staged.plan), [digest('a')], "foreign blobs are never fetched");
    assert!(staged.notes[0].contains("skipped 2 foreign layer(s)"), "{:?}", staged.notes);

    let m = image_manifest(
        &[
            layer("application/vnd.oci.image.layer.v1.tar", 'a', 10, None),
            layer("application/vnd.example.blob", 'b', 1, None),
        ],
        false,
    );
    let msg = message(stage_image(&m, &[]).unwrap_err());
    assert!(
        msg.contains("layers[1] (application/vnd.example.blob) of image")
            && msg.contains("not an image layer media type"),
        "{msg}"
    );
}
