//! `mounthost plugin push FILE REF`: publish a plugin to an OCI registry as an artifact of its
//! own type (`oci::push`), and print the reference pinned by the manifest digest that a
//! StorageClass's `plugin` parameter takes:
//!
//! ```text
//! $ mounthost plugin push target/wasm32-wasip2/plugin/my_plugin.wasm registry.example/plugins/my-plugin:1.0
//! oci://registry.example/plugins/my-plugin@sha256:4f6c...
//! ```
//!
//! The file is loaded first, as the host would load it (a valid component exporting a known
//! contract, allowed imports, a usable `info`), so what is pushed can be selected. The registry
//! is reached under the same rules as the node's pulls: `--registry-ca`, `--insecure-registry`
//! and `--registry-proxy`. Credentials: `--username` with the password from `--password-stdin`
//! or `MOUNTHOST_REGISTRY_PASSWORD`; `--password-stdin` alone sends a bearer token; otherwise
//! the registry's entry in a docker config file (`--auth-file`, else `$DOCKER_CONFIG/config.json`
//! or `~/.docker/config.json` when present; `auth`, `username`/`password` or `registrytoken`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;

use clap::Args;

use super::plugin::CliError;
use crate::config::Config;
use crate::oci::{Credentials, RegistryConfig, credentials_from_docker_config, push_plugin};
use crate::plan::oci_ref::OciRef;
use crate::plugin::PluginRuntime;
use crate::plugin::pulled::{MAX_PULLED_BYTES, NAME_ANNOTATION, SCHEME, VERSION_ANNOTATION};

/// The environment variable holding the password for `--username`.
pub const PASSWORD_ENV: &str = "MOUNTHOST_REGISTRY_PASSWORD";

/// Arguments of `plugin push`.
#[derive(Debug, Args)]
pub struct PushArgs {
    /// The plugin's `.wasm` component.
    pub file: PathBuf,
    /// Where to publish it: REGISTRY/REPOSITORY[:TAG] (an `oci://` prefix is accepted). Without a
    /// tag the manifest is stored under its digest only.
    pub reference: String,
    #[command(flatten)]
    pub login: Login,
}

/// How a command that writes to a registry logs in.
#[derive(Debug, Args)]
pub struct Login {
    /// A docker config JSON holding the registry's credentials [default: $DOCKER_CONFIG/config.json,
    /// else ~/.docker/config.json, when present].
    #[arg(long, env = "MOUNTHOST_REGISTRY_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,
    /// User name for the registry; the password comes from --password-stdin or the
    /// MOUNTHOST_REGISTRY_PASSWORD environment variable (never from argv).
    #[arg(long, env = "MOUNTHOST_REGISTRY_USERNAME")]
    pub username: Option<String>,
    /// Read the password (with --username) or a bearer token (without) from stdin.
    #[arg(long)]
    pub password_stdin: bool,
}

fn usage(message: String) -> CliError {
    CliError::Usage(message)
}

/// Run `plugin push`; returns the pinned reference.
pub async fn run(cfg: &Config, runtime: &PluginRuntime, args: PushArgs) -> Result<String, CliError> {
    let raw = args.reference.strip_prefix(SCHEME).unwrap_or(&args.reference);
    // A reference is no place for credentials, but one written with them is not echoed.
    let shown = crate::oci::redact(&format!("{SCHEME}{raw}"));
    let shown = shown.strip_prefix(SCHEME).unwrap_or(&shown).to_string();
    let target = OciRef::parse(raw).map_err(|e| usage(crate::oci::redact(&format!("reference {shown:?}: {e}"))))?;
    if target.digest().is_some() {
        return Err(usage(format!(
            "reference {raw:?}: push to REGISTRY/REPOSITORY[:TAG]; the digest is what the push prints"
        )));
    }
    let wasm = std::fs::read(&args.file).map_err(|e| usage(format!("reading {}: {e}", args.file.display())))?;
    if wasm.len() as u64 > MAX_PULLED_BYTES {
        return Err(usage(format!(
            "{} is {} bytes; hosts pull plugins of at most {MAX_PULLED_BYTES} bytes",
            args.file.display(),
            wasm.len()
        )));
    }
    let plugin = runtime.load_file(&args.file).await?;
    let credentials = credentials(&args.login, target.registry())?;
    let annotations: BTreeMap<String, String> = [
        (NAME_ANNOTATION.to_string(), plugin.info.name.clone()),
        (VERSION_ANNOTATION.to_string(), plugin.info.version.clone()),
        ("dev.mounthost.plugin.contract".to_string(), plugin.contract().to_string()),
    ]
    .into();
    let title = args.file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let registries = RegistryConfig::of(&cfg.registries);
    let pushed = push_plugin(registries, &target, &credentials, wasm, &title, &annotations)
        .await
        .map_err(|e| CliError::Registry(e.into_error(&target.to_string())))?;
    debug_assert_eq!(pushed.layer_digest, plugin.digest.to_string(), "the layer is the component");
    eprintln!(
        "pushed plugin {} {} ({}, {} bytes) to {target}",
        plugin.info.name, plugin.info.version, plugin.digest, pushed.size
    );
    Ok(pushed.reference)
}

/// The credentials the flags, the environment or a docker config file give for `registry`.
pub fn credentials(args: &Login, registry: &str) -> Result<Credentials, CliError> {
    let stdin = || -> Result<String, CliError> {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(|e| usage(format!("reading stdin: {e}")))?;
        Ok(s.trim_end_matches(['\r', '\n']).to_string())
    };
    if let Some(username) = &args.username {
        let password = if args.password_stdin {
            stdin()?
        } else {
            std::env::var(PASSWORD_ENV)
                .map_err(|_| usage(format!("--username needs a password: --password-stdin or {PASSWORD_ENV}")))?
        };
        return Ok(Credentials::Basic { username: username.clone(), password });
    }
    if args.password_stdin {
        return Ok(Credentials::Bearer(stdin()?));
    }
    let file = match &args.auth_file {
        Some(f) => Some(f.clone()),
        None => std::env::var_os("DOCKER_CONFIG")
            .map(|d| PathBuf::from(d).join("config.json"))
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker/config.json")))
            .filter(|f| f.is_file()),
    };
    let Some(file) = file else { return Ok(Credentials::Anonymous) };
    let json = std::fs::read_to_string(&file).map_err(|e| usage(format!("reading {}: {e}", file.display())))?;
    credentials_from_docker_config(&json, &registry.to_ascii_lowercase())
        .map_err(|e| usage(format!("{}: {e}", file.display())))
}
