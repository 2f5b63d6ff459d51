//! The in-toto v1 statement inside a verified envelope: its subjects, and for model-signing's
//! predicate the file list, checked the way model_signing's `dsse_payload_to_manifest` checks it
//! (one subject whose digest is the SHA-256 over the resources' digests, in their order).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use sha2::Digest as _;

use super::{INDEX_PREDICATE, MODEL_PREDICATE, Refusal};

const STATEMENT_V1: &str = "https://in-toto.io/Statement/v1";

/// What a statement says, once read.
pub(crate) struct Read {
    pub predicate_type: String,
    pub subjects: Vec<(String, String)>,
    pub files: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Statement {
    #[serde(rename = "_type")]
    kind: String,
    #[serde(default)]
    subject: Vec<Subject>,
    predicate_type: String,
    #[serde(default)]
    predicate: serde_json::Value,
}

#[derive(Deserialize)]
struct Subject {
    #[serde(default)]
    name: String,
    #[serde(default)]
    digest: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct ModelPredicate {
    serialization: Serialization,
    resources: Vec<Resource>,
}

#[derive(Deserialize)]
struct Serialization {
    method: String,
    #[serde(default)]
    hash_type: Option<String>,
}

#[derive(Deserialize)]
struct Resource {
    name: String,
    algorithm: String,
    digest: String,
}

#[derive(Deserialize)]
struct IndexPredicate {
    manifest: String,
    index: String,
}

fn malformed(detail: String) -> Refusal {
    Refusal { reason: "malformed", detail }
}

fn algorithm(detail: String) -> Refusal {
    Refusal { reason: "algorithm", detail }
}

/// Read the signed `payload` as a statement of `predicate`.
pub(crate) fn read(payload: &[u8], predicate: &str) -> Result<Read, Refusal> {
    let s: Statement = serde_json::from_slice(payload)
        .map_err(|e| malformed(format!("the signed statement is not in-toto statement JSON: {e}")))?;
    if s.kind != STATEMENT_V1 {
        return Err(malformed(format!("the signed statement's _type is {:?}, not {STATEMENT_V1}", s.kind)));
    }
    if s.predicate_type != predicate {
        return Err(Refusal {
            reason: "predicate",
            detail: format!(
                "the signature is over a {} statement, and a {predicate} statement was asked for here",
                s.predicate_type
            ),
        });
    }
    let mut subjects = Vec::with_capacity(s.subject.len());
    for sub in &s.subject {
        let Some(hex) = sub.digest.get("sha256") else {
            let algs: Vec<&str> = sub.digest.keys().map(String::as_str).collect();
            return Err(algorithm(format!(
                "subject {:?} has no sha256 digest (it has {}); only sha256 is taken here",
                sub.name,
                algs.join(", ")
            )));
        };
        subjects.push((sub.name.clone(), sha256_hex(hex, &format!("subject {:?}", sub.name))?));
    }
    let files = match predicate {
        MODEL_PREDICATE => model_files(&s.predicate, &subjects)?,
        INDEX_PREDICATE => {
            index_matches(&s.predicate, &subjects)?;
            BTreeMap::new()
        }
        _ => BTreeMap::new(),
    };
    Ok(Read { predicate_type: s.predicate_type, subjects, files })
}

/// A SHA-256 digest in hex, lowercased.
fn sha256_hex(hex: &str, what: &str) -> Result<String, Refusal> {
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex.to_ascii_lowercase())
    } else {
        Err(malformed(format!("{what}'s sha256 digest {hex:?} is not 64 hex digits")))
    }
}

fn model_files(
    predicate: &serde_json::Value,
    subjects: &[(String, String)],
) -> Result<BTreeMap<String, String>, Refusal> {
    let p = ModelPredicate::deserialize(predicate)
        .map_err(|e| malformed(format!("the model-signing predicate is not as model_signing writes it: {e}")))?;
    match p.serialization.method.as_str() {
        "files" => {}
        "shards" => {
            return Err(algorithm(
                "the model was signed with serialization method \"shards\" (resources are file byte ranges); \
                 only method \"files\" is taken here: sign with the model_signing CLI, which hashes whole files"
                    .into(),
            ));
        }
        other => {
            return Err(algorithm(format!(
                "the model was signed with serialization method {other:?}; only \"files\" is taken here"
            )));
        }
    }
    if let Some(h) = p.serialization.hash_type.as_deref().filter(|h| *h != "sha256") {
        return Err(algorithm(format!("the model's files were hashed with {h}; only sha256 is taken here")));
    }
    let [(_, root)] = subjects else {
        return Err(malformed(format!("a model-signing statement has one subject, this one has {}", subjects.len())));
    };
    let mut files = BTreeMap::new();
    let mut over_digests = sha2::Sha256::new();
    for r in &p.resources {
        if r.algorithm != "sha256" {
            return Err(algorithm(format!(
                "file {:?} was hashed with {}; only sha256 is taken here",
                r.name, r.algorithm
            )));
        }
        let hex = sha256_hex(&r.digest, &format!("file {:?}", r.name))?;
        check_path(&r.name)?;
        over_digests.update(hex::decode(&hex).unwrap_or_default());
        if files.insert(r.name.clone(), hex).is_some() {
            return Err(malformed(format!("file {:?} is listed twice in the signed statement", r.name)));
        }
    }
    let computed = hex::encode(over_digests.finalize());
    if computed != *root {
        return Err(malformed(format!(
            "the statement's model digest {root} is not the digest over its files' digests ({computed}); \
             the statement was not made by model_signing"
        )));
    }
    Ok(files)
}

/// A file name of a signed model: relative, `/`-separated, no `.` or `..` part, no NUL.
fn check_path(name: &str) -> Result<(), Refusal> {
    let bad = name.is_empty()
        || name.starts_with('/')
        || name.contains('\0')
        || name.split('/').any(|part| part.is_empty() || part == "." || part == "..");
    if bad { Err(malformed(format!("file name {name:?} is not a relative path inside the model"))) } else { Ok(()) }
}

fn index_matches(predicate: &serde_json::Value, subjects: &[(String, String)]) -> Result<(), Refusal> {
    let p = IndexPredicate::deserialize(predicate)
        .map_err(|e| malformed(format!("the chunk-index predicate lacks its manifest and index digests: {e}")))?;
    let names: BTreeSet<&str> = subjects.iter().map(|(n, _)| n.as_str()).collect();
    if names.len() != subjects.len() {
        return Err(malformed("the chunk-index statement names a subject twice".into()));
    }
    for (name, digest) in [("manifest", &p.manifest), ("index", &p.index)] {
        let hex = digest.strip_prefix("sha256:").unwrap_or_default();
        let subject = subjects.iter().find(|(n, _)| n == name).map(|(_, d)| d.as_str());
        if subject != Some(hex) {
            return Err(malformed(format!(
                "the chunk-index statement's {name} digest {digest} is not the sha256 of its {name:?} subject"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(resources: serde_json::Value, root: &str) -> Vec<u8> {
        serde_json::json!({
            "_type": STATEMENT_V1,
            "subject": [{ "name": "m", "digest": { "sha256": root } }],
            "predicateType": MODEL_PREDICATE,
            "predicate": { "serialization": { "method": "files", "hash_type": "sha256" }, "resources": resources },
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn file_names_must_stay_inside_the_model() {
        let d = "a".repeat(64);
        let root = hex::encode(sha2::Sha256::digest(hex::decode(&d).unwrap()));
        for name in ["../x", "/x", "a//b", "a/./b", ""] {
            let s = model(serde_json::json!([{ "name": name, "algorithm": "sha256", "digest": d }]), &root);
            assert_eq!(read(&s, MODEL_PREDICATE).err().unwrap().reason, "malformed", "{name}");
        }
        let s = model(serde_json::json!([{ "name": "x/y", "algorithm": "sha256", "digest": d.to_uppercase() }]), &root);
        assert_eq!(read(&s, MODEL_PREDICATE).ok().unwrap().files["x/y"], d);
    }

    #[test]
    fn the_model_digest_must_cover_the_files() {
        let d = "a".repeat(64);
        let s = model(serde_json::json!([{ "name": "x", "algorithm": "sha256", "digest": d }]), &"b".repeat(64));
        assert!(read(&s, MODEL_PREDICATE).err().unwrap().detail.contains("not the digest over"));
    }

    #[test]
    fn a_subject_without_sha256_names_its_algorithm() {
        let s = serde_json::json!({
            "_type": STATEMENT_V1, "subject": [{ "name": "x", "digest": { "sha512": "00" } }], "predicateType": "p",
        });
        let r = read(s.to_string().as_bytes(), "p").err().unwrap();
        assert_eq!((r.reason, r.detail.contains("sha512")), ("algorithm", true));
    }
}
