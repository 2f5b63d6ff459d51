//! `mounthost model`: what a model's publisher runs against its registry.
//!
//! `mounthost model index REF` reads every layer of the model once and publishes its chunk
//! index as an OCI referrer of the manifest (`oci::index`, docs/lazy.md#per-chunk-verification):
//! a lazy volume of that manifest then checks every chunk before a reader gets its bytes. With
//! `--sign-key KEY.pem` it also signs an in-toto statement naming the manifest and the index
//! (`oci::signing`) and attaches that Sigstore bundle the way `model sign` does.
//!
//! `mounthost model sign REF --signature FILE` attaches a Sigstore bundle made by OpenSSF's
//! `model_signing sign ... --signature FILE` as a referrer of the model's manifest
//! (`oci::referrer`), where nodes find and verify it. Only its shape is checked here (a bundle
//! v0.3 with a DSSE statement naming its predicate type): the node verifies, against its own
//! trust.
//!
//! Registry access follows the node's rules (`--registry-ca`, `--insecure-registry`,
//! `--registry-proxy`); credentials as for `plugin push`. A private key is read by this process
//! only, from the file named, and never printed or logged; an error about it names the file.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde_json::json;

use super::plugin::CliError;
use super::plugin_push::{Login, credentials};
use crate::config::Config;
use crate::oci::signing::{self, MAX_BUNDLE_BYTES};
use crate::oci::{RegistryConfig, SignatureBundle};
use crate::plan::oci_ref::OciRef;

/// The largest PEM file (a key, a certificate chain) read.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// `mounthost model ...`.
#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Publish the chunk index of a model (REGISTRY/REPOSITORY[:TAG][@sha256:...]) as a
    /// referrer of its manifest; prints what it pushed as JSON. With --sign-key, sign it too.
    Index(IndexArgs),
    /// Attach a Sigstore bundle made by `model_signing sign ... --signature FILE` to a model
    /// (REGISTRY/REPOSITORY[:TAG][@sha256:...]) as a referrer of its manifest; prints what it
    /// pushed as JSON. The bundle's shape is checked, not its signature: nodes verify it.
    Sign(SignArgs),
}

/// Arguments of `model index`.
#[derive(Debug, Args)]
pub struct IndexArgs {
    /// The model.
    pub reference: String,
    /// The chunk size in MiB (a power of two from 1 to 64): volumes fetch and check at least
    /// this much at a time.
    #[arg(long, default_value_t = 4, value_parser = parse_chunk)]
    pub chunk_mib: u64,
    /// Sign the index with this ECDSA private key (PEM, P-256 or P-384, unencrypted): an in-toto
    /// statement naming the model's manifest and the index, attached as a Sigstore bundle next
    /// to it. Read by this command only, never printed.
    #[arg(long, value_name = "KEY.pem")]
    pub sign_key: Option<PathBuf>,
    /// The certificate chain of --sign-key (PEM, its certificate first), carried in the bundle
    /// so nodes can check it against their CAs; without it the bundle names the key only.
    #[arg(long, value_name = "CHAIN.pem", requires = "sign_key")]
    pub sign_cert: Option<PathBuf>,
    #[command(flatten)]
    pub login: Login,
}

/// Arguments of `model sign`.
#[derive(Debug, Args)]
pub struct SignArgs {
    /// The model.
    pub reference: String,
    /// The bundle `model_signing sign ... --signature FILE` wrote (a Sigstore bundle v0.3 with
    /// a DSSE envelope, at most 16 MiB).
    #[arg(long, value_name = "FILE")]
    pub signature: PathBuf,
    #[command(flatten)]
    pub login: Login,
}

fn parse_chunk(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if (1..=64).contains(&n) && n.is_power_of_two() => Ok(n),
        _ => Err(format!("{s:?} is not a power of two from 1 to 64")),
    }
}

/// `raw` parsed, or why not (redacted: a reference is no place for credentials, but one
/// written with them is not echoed).
fn reference(raw: &str) -> Result<OciRef, String> {
    OciRef::parse(raw).map_err(|e| crate::oci::redact(&format!("reference {raw:?}: {e}")))
}

/// The file at `path`, refused past `max` bytes (read at most one byte more). `what` names it
/// in errors, with the path; the content never appears in one.
fn read_capped(path: &Path, max: u64, what: &str) -> Result<Vec<u8>, String> {
    let failed = |e: std::io::Error| format!("reading {what} {}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(failed)?;
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes).map_err(failed)?;
    if bytes.len() as u64 > max {
        return Err(format!("{what} {} is larger than {max} bytes", path.display()));
    }
    Ok(bytes)
}

/// A signing key and its chain, read from their files. Not `Debug`: the key never leaves it
/// but through [`signing::sign`].
struct Signer {
    key: Vec<u8>,
    /// The files, for errors: "signing with the key K (chain C)".
    named: String,
    chain: Option<Vec<u8>>,
}

impl Signer {
    /// Read `key` and `chain`, and sign a statement of zero digests with them (thrown away),
    /// so an unusable key is reported before anything is pushed.
    fn read(key: &Path, chain: Option<&Path>) -> Result<Signer, String> {
        let mut named = format!("the key {}", key.display());
        if let Some(c) = chain {
            named.push_str(&format!(" (chain {})", c.display()));
        }
        let chain = chain.map(|c| read_capped(c, MAX_PEM_BYTES, "the certificate chain")).transpose()?;
        let signer = Signer { key: read_capped(key, MAX_PEM_BYTES, "the signing key")?, named, chain };
        let zero = format!("sha256:{}", "0".repeat(64));
        signer.sign(&signing::index_statement(&zero, &zero))?;
        Ok(signer)
    }

    /// `statement` signed: a Sigstore bundle.
    fn sign(&self, statement: &[u8]) -> Result<SignatureBundle, String> {
        let bundle = signing::sign(statement, &self.key, self.chain.as_deref())
            .map_err(|e| format!("signing with {}: {e}", self.named))?;
        SignatureBundle::parse(bundle).map_err(|e| format!("the bundle signed: {e}"))
    }
}

/// Run a `model` command; its JSON output.
pub async fn run(cfg: &Config, cmd: ModelCommand) -> Result<String, CliError> {
    let usage = CliError::Usage;
    let out = match cmd {
        ModelCommand::Index(args) => {
            let target = reference(&args.reference).map_err(usage)?;
            let login = credentials(&args.login, target.registry())?;
            let signer = args
                .sign_key
                .as_deref()
                .map(|k| Signer::read(k, args.sign_cert.as_deref()))
                .transpose()
                .map_err(usage)?;
            let registries = RegistryConfig::of(&cfg.registries);
            let pushed = crate::oci::push_index(registries.clone(), &target, &login, args.chunk_mib << 20)
                .await
                .map_err(|e| CliError::Registry(e.into_error(&target.to_string())))?;
            let mut out = json!({
                "subject": pushed.subject,
                "indexManifest": pushed.manifest_digest,
                "index": pushed.index_digest,
                "chunkBytes": pushed.chunk,
                "layers": pushed.layers,
                "bytes": pushed.bytes,
            });
            if let Some(signer) = signer {
                let statement = signing::index_statement(&pushed.subject, &pushed.index_digest);
                let bundle = signer.sign(&statement).map_err(|e| usage(format!("the index is pushed: {e}")))?;
                // The manifest indexed, whatever the tag names by now.
                let pinned = reference(&format!("{}/{}@{}", target.registry(), target.repository(), pushed.subject))
                    .map_err(usage)?;
                let signed = crate::oci::push_signature(registries, &pinned, &login, &bundle).await.map_err(|e| {
                    let mut e = e.into_error(&pinned.to_string());
                    e.message = format!("the index is pushed, its signature is not: {}", e.message);
                    CliError::Registry(e)
                })?;
                out["signatureManifest"] = json!(signed.manifest_digest);
                out["bundle"] = json!(signed.bundle_digest);
            }
            out
        }
        ModelCommand::Sign(args) => {
            let target = reference(&args.reference).map_err(usage)?;
            let refused = |e: String| usage(format!("{e}; nothing was pushed"));
            let bytes = read_capped(&args.signature, MAX_BUNDLE_BYTES, "the signature").map_err(refused)?;
            let bundle = SignatureBundle::parse(bytes)
                .map_err(|e| refused(format!("{} is not a model signature: {e}", args.signature.display())))?;
            let login = credentials(&args.login, target.registry())?;
            let signed = crate::oci::push_signature(RegistryConfig::of(&cfg.registries), &target, &login, &bundle)
                .await
                .map_err(|e| CliError::Registry(e.into_error(&target.to_string())))?;
            json!({
                "subject": signed.subject,
                "signatureManifest": signed.manifest_digest,
                "bundle": signed.bundle_digest,
                "predicateType": signed.predicate_type,
            })
        }
    };
    Ok(serde_json::to_string_pretty(&out).expect("JSON values serialize"))
}
