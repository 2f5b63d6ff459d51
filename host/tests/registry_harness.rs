//! The registry harness (`common::registry`) does what it claims, against the real
//! `docker-registry`: every claim is checked with plain `curl` (not the harness's own requests),
//! and layers are unpacked here with the tar, flate2 and zstd crates. Small files only: each test
//! takes well under a second or two.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::Command;

use common::registry::{Class, ModelBuilder, Packing, Registry, RegistryOptions, random_file};
use sha2::{Digest, Sha256};

/// One answer of plain curl: status, raw header block and body.
struct Got {
    status: u16,
    headers: String,
    body: Vec<u8>,
}

impl Got {
    fn header(&self, name: &str) -> Option<String> {
        let name = format!("{}:", name.to_ascii_lowercase());
        self.headers
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with(&name))
            .map(|l| l[name.len()..].trim().to_string())
    }
}

/// `curl URL` with `extra` options and nothing from the harness; `Err(exit code)` when curl got
/// no HTTP answer (7: refused, 60: untrusted certificate).
fn curl(url: &str, extra: &[&str]) -> Result<Got, i32> {
    let body = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new("curl")
        .args(["--silent", "--show-error", "--noproxy", "*", "--dump-header", "-", "--output"])
        .arg(body.path())
        .args(["--write-out", "\n%{http_code}"])
        .args(extra)
        .arg(url)
        .output()
        .expect("running curl");
    if !out.status.success() {
        return Err(out.status.code().unwrap_or(-1));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (headers, code) = text.rsplit_once('\n').unwrap();
    Ok(Got {
        status: code.trim().parse().unwrap(),
        headers: headers.to_string(),
        body: std::fs::read(body.path()).unwrap(),
    })
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `sha256sum FILE`, an implementation other than the harness's.
fn sha256sum(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_string()
}

const ACCEPT_OCI: &str = "Accept: application/vnd.oci.image.manifest.v1+json";

/// The bytes of the tar inside a layer, by its media type's suffix.
fn untar_layer(media_type: &str, blob: &[u8]) -> Vec<u8> {
    let mut tar = Vec::new();
    if media_type.ends_with(".tar") {
        tar = blob.to_vec();
    } else if media_type.ends_with(".tar+gzip") {
        flate2::read::GzDecoder::new(blob).read_to_end(&mut tar).unwrap();
    } else if media_type.ends_with(".tar+zstd") {
        zstd::stream::read::Decoder::new(blob).unwrap().read_to_end(&mut tar).unwrap();
    } else {
        panic!("not a tar layer: {media_type}");
    }
    tar
}

/// The entries (path, content) of a tar.
fn tar_entries(tar: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut archive = tar::Archive::new(tar);
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            let mut content = Vec::new();
            e.read_to_end(&mut content).unwrap();
            (path, content)
        })
        .collect()
}

#[test]
fn a_pushed_model_is_served_with_its_layers_and_every_blob_matches_its_digest() {
    let reg = Registry::start(RegistryOptions::default());
    let dir = tempfile::tempdir().unwrap();
    let (weights, weights_sha) = random_file(dir.path(), 3 * 1024 * 1024 + 5);
    let (raw_weights, raw_sha) = random_file(dir.path(), 1024 * 1024);
    assert_eq!(sha256sum(&weights), weights_sha);
    assert_eq!(sha256sum(&raw_weights), raw_sha);
    let small: Vec<(&str, &[u8])> = vec![
        ("config.json", br#"{"hidden_size": 8}"#),
        ("tokenizer/vocab.json", br#"{"a": 1, "b": 2}"#),
        ("README.md", b"# a test model\n"),
        ("src/infer.py", b"print('hi')\n"),
        ("data/train.jsonl", b"{\"x\": 1}\n"),
    ];
    let model = ModelBuilder::new()
        .file("model.safetensors", &weights, Class::Weight, Packing::TarZstd)
        .file("config.json", small[0].1, Class::Config, Packing::Raw)
        .file("tokenizer/vocab.json", small[1].1, Class::Config, Packing::TarGzip)
        .file("README.md", small[2].1, Class::Doc, Packing::Tar)
        .file("src/infer.py", small[3].1, Class::Code, Packing::Tar)
        .file("data/train.jsonl", small[4].1, Class::Dataset, Packing::Raw)
        .file("extra/weights.bin", raw_weights.as_path(), Class::Weight, Packing::Raw)
        .push(&reg, "team/llm", "v1");
    assert_eq!(model.reference, format!("{}/team/llm:v1", reg.host()));

    // What the test expects, written out independently of the builder.
    let expected: Vec<(&str, &str, String, u64)> = vec![
        ("model.safetensors", "application/vnd.cncf.model.weight.v1.tar+zstd", weights_sha, 3 * 1024 * 1024 + 5),
        (
            "config.json",
            "application/vnd.cncf.model.weight.config.v1.raw",
            sha256_hex(small[0].1),
            small[0].1.len() as u64,
        ),
        (
            "tokenizer/vocab.json",
            "application/vnd.cncf.model.weight.config.v1.tar+gzip",
            sha256_hex(small[1].1),
            small[1].1.len() as u64,
        ),
        ("README.md", "application/vnd.cncf.model.doc.v1.tar", sha256_hex(small[2].1), small[2].1.len() as u64),
        ("src/infer.py", "application/vnd.cncf.model.code.v1.tar", sha256_hex(small[3].1), small[3].1.len() as u64),
        (
            "data/train.jsonl",
            "application/vnd.cncf.model.dataset.v1.raw",
            sha256_hex(small[4].1),
            small[4].1.len() as u64,
        ),
        ("extra/weights.bin", "application/vnd.cncf.model.weight.v1.raw", raw_sha, 1024 * 1024),
    ];
    let files: Vec<(String, String, u64)> =
        expected.iter().map(|(p, _, sha, size)| (p.to_string(), sha.clone(), *size)).collect();
    assert_eq!(model.files, files);

    // The manifest needs the Accept header.
    let url = format!("http://{}/v2/team/llm/manifests/v1", reg.host());
    assert_eq!(curl(&url, &[]).unwrap().status, 404, "a manifest GET without Accept");
    let got = curl(&url, &["--header", ACCEPT_OCI]).unwrap();
    assert_eq!(got.status, 200, "{}", reg.log());
    assert_eq!(format!("sha256:{}", sha256_hex(&got.body)), model.manifest_digest);
    assert_eq!(got.header("docker-content-digest"), Some(model.manifest_digest.clone()));
    assert_eq!(got.header("content-type").as_deref(), Some("application/vnd.oci.image.manifest.v1+json"));
    let by_digest = format!("http://{}/v2/team/llm/manifests/{}", reg.host(), model.manifest_digest);
    assert_eq!(curl(&by_digest, &["--header", ACCEPT_OCI]).unwrap().body, got.body);
    let manifest: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(manifest["artifactType"], "application/vnd.cncf.model.manifest.v1+json");
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.cncf.model.config.v1+json");
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), expected.len());

    let blob = |digest: &str| {
        let got = curl(&format!("http://{}/v2/team/llm/blobs/{digest}", reg.host()), &[]).unwrap();
        assert_eq!(got.status, 200, "GET blob {digest}");
        assert_eq!(format!("sha256:{}", sha256_hex(&got.body)), digest, "the blob's content");
        got.body
    };
    let config: serde_json::Value =
        serde_json::from_slice(&blob(manifest["config"]["digest"].as_str().unwrap())).unwrap();
    assert_eq!(config["modelfs"]["type"], "layers");
    let diff_ids = config["modelfs"]["diffIds"].as_array().unwrap();
    assert_eq!(diff_ids.len(), expected.len());

    for (i, (layer, (path, media_type, sha, size))) in layers.iter().zip(&expected).enumerate() {
        assert_eq!(layer["mediaType"], *media_type);
        assert_eq!(layer["annotations"]["org.cncf.model.filepath"], *path);
        assert_eq!(model.layers[i].filepath, *path);
        assert_eq!(model.layers[i].media_type, *media_type);
        let digest = layer["digest"].as_str().unwrap();
        assert_eq!(digest, model.layers[i].descriptor.digest);
        let body = blob(digest);
        assert_eq!(layer["size"].as_u64(), Some(body.len() as u64));
        if media_type.ends_with(".raw") {
            assert_eq!(sha256_hex(&body), *sha, "{path}");
            assert_eq!(body.len() as u64, *size);
            assert_eq!(diff_ids[i].as_str(), Some(digest), "a raw layer's diff ID is its digest");
        } else {
            let tar = untar_layer(media_type, &body);
            assert_eq!(diff_ids[i].as_str().unwrap(), format!("sha256:{}", sha256_hex(&tar)), "{path}'s diff ID");
            let entries = tar_entries(&tar);
            assert_eq!(entries.len(), 1, "{path}: one file per layer");
            assert_eq!(entries[0].0, *path);
            assert_eq!(sha256_hex(&entries[0].1), *sha, "{path}'s content");
            assert_eq!(entries[0].1.len() as u64, *size);
        }
    }
    println!("checked: {} layers, config and manifest of {}", layers.len(), model.reference);
}

#[test]
fn tls_is_trusted_with_the_test_ca_and_refused_without_it() {
    let reg = Registry::start(RegistryOptions { tls: true, htpasswd: None });
    let ca = reg.ca_pem();
    let ca = ca.to_str().unwrap();
    let base = format!("https://{}", reg.host());
    let got = curl(&format!("{base}/v2/"), &["--cacert", ca]).unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(curl(&format!("{base}/v2/"), &[]).err(), Some(60), "without the CA the certificate is not trusted");
    // Plain HTTP to the TLS port is refused by the server.
    assert_eq!(curl(&format!("http://{}/v2/", reg.host()), &[]).unwrap().status, 400);
    // The server certificate names 127.0.0.1 in subjectAltName.
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
        .arg(reg.dir().join("server.pem"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("IP Address:127.0.0.1"));

    let model = ModelBuilder::new().file("README.md", b"tls\n", Class::Doc, Packing::Tar).push(&reg, "m", "t");
    let got = curl(&format!("{base}/v2/m/manifests/t"), &["--cacert", ca, "--header", ACCEPT_OCI]).unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(format!("sha256:{}", sha256_hex(&got.body)), model.manifest_digest);
}

#[test]
fn htpasswd_refuses_missing_and_wrong_credentials_and_accepts_the_right_ones() {
    // A space, a colon and a quote: the curl config file must quote them.
    let password = "pa ss:w\"ord";
    let reg = Registry::start(RegistryOptions { tls: false, htpasswd: Some(("alice".into(), password.into())) });
    let v2 = format!("http://{}/v2/", reg.host());
    let none = curl(&v2, &[]).unwrap();
    assert_eq!(none.status, 401);
    assert!(none.header("www-authenticate").is_some_and(|h| h.starts_with("Basic")), "{}", none.headers);
    assert_eq!(curl(&v2, &["--user", "alice:wrong"]).unwrap().status, 401);
    assert_eq!(curl(&v2, &["--user", "bob:pa ss:w\"ord"]).unwrap().status, 401);
    let right = format!("alice:{password}");
    assert_eq!(curl(&v2, &["--user", &right]).unwrap().status, 200);

    // The harness pushes with the credentials, kept in a file only its owner reads.
    let model =
        ModelBuilder::new().file("w.bin", b"weights", Class::Weight, Packing::Raw).push(&reg, "private/m", "v1");
    let conf = std::fs::metadata(reg.dir().join("curl.conf")).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&conf.permissions()) & 0o777, 0o600);
    let manifest = format!("http://{}/v2/private/m/manifests/v1", reg.host());
    assert_eq!(curl(&manifest, &["--header", ACCEPT_OCI]).unwrap().status, 401);
    let got = curl(&manifest, &["--header", ACCEPT_OCI, "--user", &right]).unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(format!("sha256:{}", sha256_hex(&got.body)), model.manifest_digest);
}

#[test]
fn kill_and_restart_keep_the_content_on_the_same_port() {
    let mut reg = Registry::start(RegistryOptions::default());
    let model = ModelBuilder::new()
        .file("w.bin", b"some weights", Class::Weight, Packing::Raw)
        .file("README.md", b"doc", Class::Doc, Packing::TarGzip)
        .push(&reg, "keep/me", "v1");
    let host = reg.host();
    let manifest = format!("http://{host}/v2/keep/me/manifests/v1");
    let weights = &model.layers[0].descriptor.digest;
    let blob = format!("http://{host}/v2/keep/me/blobs/{weights}");

    reg.kill();
    assert_eq!(curl(&manifest, &["--header", ACCEPT_OCI]).err(), Some(7), "killed: connection refused");
    reg.restart();
    assert_eq!(reg.host(), host);
    let got = curl(&manifest, &["--header", ACCEPT_OCI]).unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(format!("sha256:{}", sha256_hex(&got.body)), model.manifest_digest);
    assert_eq!(curl(&blob, &[]).unwrap().body, b"some weights");

    // blob_storage_path is the file the registry serves the blob from.
    let stored = reg.blob_storage_path(weights);
    assert_eq!(std::fs::read(&stored).unwrap(), b"some weights");
    std::fs::write(&stored, b"SOME weights").unwrap();
    assert_eq!(curl(&blob, &[]).unwrap().body, b"SOME weights", "the registry serves what is stored, unverified");
    // A restart while running (no kill first) works too.
    reg.restart();
    assert_eq!(curl(&blob, &[]).unwrap().status, 200);
}

#[test]
fn blob_ranges_answer_206_and_served_bytes_counts_them() {
    let reg = Registry::start(RegistryOptions::default());
    let dir = tempfile::tempdir().unwrap();
    let (file, sha) = random_file(dir.path(), 1024 * 1024);
    let desc = reg.push_blob("r", file.as_path());
    assert_eq!(desc.digest, format!("sha256:{sha}"));
    assert_eq!(desc.size, 1024 * 1024);
    let content = std::fs::read(&file).unwrap();
    let url = format!("http://{}/v2/r/blobs/{}", reg.host(), desc.digest);

    let part = curl(&url, &["--header", "Range: bytes=1000-1999"]).unwrap();
    assert_eq!(part.status, 206);
    assert_eq!(part.header("content-range"), Some(format!("bytes 1000-1999/{}", desc.size)));
    assert_eq!(part.body, &content[1000..2000]);
    let whole = curl(&url, &[]).unwrap();
    assert_eq!(whole.status, 200);
    assert_eq!(sha256_hex(&whole.body), sha);
    // Both GETs, and nothing of the pushes, are counted (the log line follows the response).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while reg.served_bytes() < desc.size + 1000 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(reg.served_bytes(), desc.size + 1000, "{}", reg.log());

    // Out of range: 416, with a Content-Length of the whole blob but a short body (a
    // distribution 2.8 quirk), so curl reports a partial transfer (18) after the status.
    let past = format!("Range: bytes={}-{}", desc.size + 10, desc.size + 20);
    let out = Command::new("curl")
        .args(["--silent", "--noproxy", "*", "--output", "/dev/null", "--write-out", "%{http_code}", "--header", &past])
        .arg(&url)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "416");
    assert!(matches!(out.status.code(), Some(0 | 18)), "curl: {:?}", out.status);
}

#[test]
fn random_files_have_their_size_and_hash_and_differ() {
    let dir = tempfile::tempdir().unwrap();
    let (a, a_sha) = random_file(dir.path(), 1024 * 1024 + 3);
    let (b, b_sha) = random_file(dir.path(), 1024 * 1024 + 3);
    assert_ne!(a, b);
    assert_ne!(a_sha, b_sha);
    assert_eq!(std::fs::metadata(&a).unwrap().len(), 1024 * 1024 + 3);
    assert_eq!(sha256sum(&a), a_sha);
    assert_eq!(sha256sum(&b), b_sha);
    let (empty, empty_sha) = random_file(dir.path(), 0);
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0);
    assert_eq!(empty_sha, sha256_hex(b""));
    // Incompressible: gzip cannot shrink it.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &std::fs::read(&a).unwrap()).unwrap();
    assert!(gz.finish().unwrap().len() as u64 > 1024 * 1024);
}
