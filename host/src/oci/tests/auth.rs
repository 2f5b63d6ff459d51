use super::super::auth::base64_for_test;
use super::super::{Credentials, RegistryConfig, credentials_from_docker_config};

#[test]
fn docker_config_entries_match_by_host() {
    // "user:pa:ss" in base64.
    let json = r#"{"auths":{"https://reg.example:5000/v1/":{"auth":"dXNlcjpwYTpzcw=="},
        "other.example":{"username":"u2","password":"p2"},
        "http://tok.example":{"registrytoken":"t0k"}}}"#;
    let basic = |u: &str, p: &str| Credentials::Basic { username: u.into(), password: p.into() };
    assert_eq!(credentials_from_docker_config(json, "reg.example:5000").unwrap(), basic("user", "pa:ss"));
    assert_eq!(credentials_from_docker_config(json, "REG.example:5000").unwrap(), basic("user", "pa:ss"));
    assert_eq!(credentials_from_docker_config(json, "other.example").unwrap(), basic("u2", "p2"));
    assert_eq!(credentials_from_docker_config(json, "tok.example").unwrap(), Credentials::Bearer("t0k".into()));
    assert_eq!(credentials_from_docker_config(json, "reg.example").unwrap(), Credentials::Anonymous, "port differs");
    let hub = r#"{"auths":{"https://index.docker.io/v1/":{"auth":"YTpi"}}}"#;
    assert_eq!(credentials_from_docker_config(hub, "docker.io").unwrap(), basic("a", "b"));
}

#[test]
fn bad_docker_configs_name_the_problem_not_the_secret() {
    let e = credentials_from_docker_config("{", "r").unwrap_err().to_string();
    assert!(e.contains("not JSON"), "{e}");
    let e = credentials_from_docker_config(r#"{"auths":{"r":{"auth":"!!!secret!!!"}}}"#, "r").unwrap_err().to_string();
    assert!(e.contains("not valid base64") && !e.contains("secret!!!"), "{e}");
    let e = credentials_from_docker_config(r#"{"auths":{"r":{"auth":"bm9jb2xvbg=="}}}"#, "r").unwrap_err().to_string();
    assert!(e.contains("username:password") && !e.contains("nocolon"), "{e}");
    let e = credentials_from_docker_config(r#"{"auths":{"r":{"identitytoken":"x"}}}"#, "r").unwrap_err().to_string();
    assert!(e.contains("identitytoken"), "{e}");
}

#[test]
fn base64_decodes_with_and_without_padding() {
    assert_eq!(base64_for_test("YTpi").unwrap(), b"a:b");
    assert_eq!(base64_for_test("YQ==").unwrap(), b"a");
    assert_eq!(base64_for_test("YQ").unwrap(), b"a");
    assert_eq!(base64_for_test("-_8").unwrap(), [0xfb, 0xff]);
    assert!(base64_for_test("a b").is_none());
}

#[test]
fn secrets_never_show_in_debug() {
    let c = Credentials::Basic { username: "alice".into(), password: "hunter2".into() };
    let shown = format!("{c:?} {:?}", Credentials::Bearer("tok3n".into()));
    assert!(!shown.contains("hunter2") && !shown.contains("tok3n") && !shown.contains("alice"), "{shown}");
    let cfg = RegistryConfig { proxy: Some("http://u:pw@proxy:3128".into()), ..Default::default() };
    assert!(!format!("{cfg:?}").contains("pw@"));
}

#[test]
fn errors_say_what_to_do() {
    let e = super::super::error::tls_hint_for_test("invalid peer certificate: UnknownIssuer");
    assert!(e.to_string().contains("configure the registry's CA"), "{e}");
    assert!(!e.is_transient());
}

#[test]
fn a_ca_directory_reads_its_crt_and_pem_files_and_an_empty_one_adds_none() {
    use super::super::registry::Registries;
    let dir = tempfile::tempdir().unwrap();
    let cfg = |p: &std::path::Path| RegistryConfig { ca_bundle: Some(p.to_path_buf()), ..Default::default() };
    // An empty directory (an empty ConfigMap mounted there): no extra CA, no error.
    assert!(Registries::new(cfg(dir.path())).is_ok());
    // A mounted ConfigMap's bookkeeping and files of other names are not bundles.
    std::fs::create_dir(dir.path().join("..data")).unwrap();
    std::fs::write(dir.path().join("..data/ca.crt"), b"not read").unwrap();
    std::fs::write(dir.path().join("README"), b"not a bundle").unwrap();
    assert!(Registries::new(cfg(dir.path())).is_ok());
    // A bundle named by its suffix must hold a certificate, as a file named by the flag must.
    std::fs::write(dir.path().join("team.crt"), b"garbage").unwrap();
    let err = Registries::new(cfg(dir.path())).err().expect("a .crt without a certificate").to_string();
    assert!(err.contains("team.crt") && err.contains("holds no certificate"), "{err}");
    let err = Registries::new(cfg(&dir.path().join("team.crt"))).err().unwrap().to_string();
    assert!(err.contains("holds no certificate"), "{err}");
    let err = Registries::new(cfg(&dir.path().join("missing"))).err().unwrap().to_string();
    assert!(err.contains("reading the registry CA bundle"), "{err}");
}

#[test]
fn a_node_mirror_applies_only_to_sources_without_their_own() {
    let cfg = RegistryConfig {
        mirrors: [("registry.example.com".to_string(), "mirror.local:5000".to_string())].into(),
        ..Default::default()
    };
    assert_eq!(cfg.mirror_for("Registry.Example.com", None).as_deref(), Some("mirror.local:5000"));
    assert_eq!(cfg.mirror_for("registry.example.com", Some("own:5000")).as_deref(), Some("own:5000"));
    assert_eq!(cfg.mirror_for("other.io", None), None);
}
