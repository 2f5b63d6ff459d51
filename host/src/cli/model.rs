//! `mounthost model`: what a model's publisher runs against its registry.
//!
//! `mounthost model index REF` reads every layer of the model once and publishes its chunk
//! index as an OCI referrer of the manifest (`oci::index`, docs/lazy.md#per-chunk-verification):
//! a lazy volume of that manifest then checks every chunk before a reader gets its bytes.
//! Registry access follows the node's rules (`--registry-ca`, `--insecure-registry`,
//! `--registry-proxy`); credentials as for `plugin push`.

use clap::{Args, Subcommand};
use serde_json::json;

use super::plugin::CliError;
use super::plugin_push::{Login, credentials};
use crate::config::Config;
use crate::oci::RegistryConfig;
use crate::plan::oci_ref::OciRef;

/// `mounthost model ...`.
#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Publish the chunk index of a model (REGISTRY/REPOSITORY[:TAG][@sha256:...]) as a
    /// referrer of its manifest; prints what it pushed as JSON.
    Index(IndexArgs),
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
    #[command(flatten)]
    pub login: Login,
}

fn parse_chunk(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if (1..=64).contains(&n) && n.is_power_of_two() => Ok(n),
        _ => Err(format!("{s:?} is not a power of two from 1 to 64")),
    }
}

/// Run a `model` command; its JSON output.
pub async fn run(cfg: &Config, cmd: ModelCommand) -> Result<String, CliError> {
    match cmd {
        ModelCommand::Index(args) => {
            let target = OciRef::parse(&args.reference)
                .map_err(|e| CliError::Usage(crate::oci::redact(&format!("reference {:?}: {e}", args.reference))))?;
            let login = credentials(&args.login, target.registry())?;
            let pushed =
                crate::oci::push_index(RegistryConfig::of(&cfg.registries), &target, &login, args.chunk_mib << 20)
                    .await
                    .map_err(|e| CliError::Registry(e.into_error(&target.to_string())))?;
            let out = json!({
                "subject": pushed.subject,
                "indexManifest": pushed.manifest_digest,
                "index": pushed.index_digest,
                "chunkBytes": pushed.chunk,
                "layers": pushed.layers,
                "bytes": pushed.bytes,
            });
            Ok(serde_json::to_string_pretty(&out).expect("JSON values serialize"))
        }
    }
}
