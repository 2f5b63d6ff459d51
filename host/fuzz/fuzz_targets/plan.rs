//! Plans as a hostile plugin could return them, built from the fuzzer's bytes (steps of every
//! kind that carries text: directories, spawns with arguments and environment, mounts, binds,
//! fetches, HTTP calls, resolves, unpacks), judged by the host's policy for each operation.
//! Nothing panics, and what the policy accepts keeps its promises: every path it names is
//! inside one of the volume's directories, and no secret value appears in the checked plan or
//! in a refusal.
#![no_main]
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

/// The built-in rule sets, parsed once.
static BUILTIN_SETS: std::sync::LazyLock<ProgramRules> = std::sync::LazyLock::new(ProgramRules::builtin);
use mounthost::plan::Step;
use mounthost::plan::policy::{self, ArgRules, Context, Grant, Operation, OptionName};
use mounthost::plan::rules::ProgramRules;
use mounthost::plugin::bindings::types as w;
use mounthost::secrets::Secrets;
use mounthost::volume::VolumeDirs;

const SECRET: &str = "hunter22";
/// Texts the policy gives meaning to, so the fuzzer reaches past the first checks.
const WORDS: &[&str] = &[
    "",
    ".",
    "..",
    "/",
    "a",
    "a/b",
    "../x",
    "a//b",
    "fusetest",
    "tmpfs",
    "fuse.test",
    "overlay",
    "-o",
    "ssh_command=sh",
    "-ossh_command=x",
    "reconnect,ssh_command=x",
    "--",
    "-f",
    "PATH",
    "LD_PRELOAD",
    "HOME",
    "http_proxy",
    "TZ",
    "token",
    SECRET,
    "x-hunter22-y",
    "http://registry.local/v2/",
    "https://filer:8888/a?b",
    "http://user:pw@registry.local/",
    "registry.local/m:v1",
    "registry.local/m@sha256:",
    "sha256:",
    "sha256:0000000000000000000000000000000000000000000000000000000000000000",
    "nosuid",
    "ro",
    "size=1m",
    "lowerdir=a",
    "Host",
    "Authorization",
    "GET",
    "POST",
    "\n",
    "\0",
    "a\nb",
];

fn text(u: &mut Unstructured<'_>) -> Result<String> {
    Ok(match u.int_in_range(0..=3)? {
        0 => u.arbitrary::<String>()?,
        1 => format!("{}{}", u.choose(WORDS)?, u.choose(WORDS)?),
        _ => u.choose(WORDS)?.to_string(),
    })
}

fn texts(u: &mut Unstructured<'_>) -> Result<Vec<String>> {
    let n = u.int_in_range(0..=4)?;
    (0..n).map(|_| text(u)).collect()
}

fn path_ref(u: &mut Unstructured<'_>) -> Result<w::PathRef> {
    let root = *u.choose(&[w::DirRoot::Staging, w::DirRoot::Target, w::DirRoot::Cache, w::DirRoot::Runtime])?;
    Ok(w::PathRef { root, rel: text(u)? })
}

fn value(u: &mut Unstructured<'_>) -> Result<w::Value> {
    Ok(match u.int_in_range(0..=4)? {
        0 => w::Value::Literal(text(u)?),
        1 => w::Value::Secret(text(u)?),
        2 => w::Value::SecretTemplate(w::SecretTemplate { prefix: text(u)?, key: text(u)?, suffix: text(u)? }),
        3 => w::Value::Path(path_ref(u)?),
        _ => w::Value::SecretFile(text(u)?),
    })
}

fn arg(u: &mut Unstructured<'_>) -> Result<w::Arg> {
    Ok(match u.int_in_range(0..=3)? {
        0 | 1 => w::Arg::Literal(text(u)?),
        2 => w::Arg::Path(w::PathArg { prefix: text(u)?, path: path_ref(u)?, suffix: text(u)? }),
        _ => w::Arg::SecretFile(w::SecretFileArg { prefix: text(u)?, key: text(u)?, suffix: text(u)? }),
    })
}

fn list<T>(u: &mut Unstructured<'_>, f: fn(&mut Unstructured<'_>) -> Result<T>) -> Result<Vec<T>> {
    let n = u.int_in_range(0..=5)?;
    (0..n).map(|_| f(u)).collect()
}

fn header(u: &mut Unstructured<'_>) -> Result<w::Header> {
    Ok(w::Header { name: text(u)?, value: value(u)? })
}

fn step(u: &mut Unstructured<'_>) -> Result<w::Step> {
    Ok(match u.int_in_range(0..=9)? {
        0 => w::Step::Mkdir(path_ref(u)?),
        1 => w::Step::Remove(path_ref(u)?),
        2 => w::Step::SpawnFuse(w::SpawnFuse {
            program: text(u)?,
            args: list(u, arg)?,
            env: list(u, |u| Ok(w::EnvVar { name: text(u)?, value: value(u)? }))?,
            mountpoint: path_ref(u)?,
            fstype: text(u)?,
            ready_timeout_ms: u.arbitrary()?,
            memory_limit_bytes: u.arbitrary()?,
            mount: if u.arbitrary()? {
                w::FuseMount::ByProgram
            } else {
                w::FuseMount::HostFd(w::HostFdMount { source: text(u)?, options: texts(u)?, readonly: u.arbitrary()? })
            },
        }),
        3 => w::Step::Mount(w::Mount {
            fstype: text(u)?,
            source: if u.arbitrary()? { w::MountSource::Named(text(u)?) } else { w::MountSource::Path(path_ref(u)?) },
            target: path_ref(u)?,
            options: list(u, arg)?,
            readonly: u.arbitrary()?,
        }),
        4 => w::Step::Bind(w::Bind {
            source: path_ref(u)?,
            target: path_ref(u)?,
            readonly: u.arbitrary()?,
            options: texts(u)?,
        }),
        5 => w::Step::Fetch(w::Fetch {
            url: text(u)?,
            headers: list(u, header)?,
            digest: text(u)?,
            size: u.arbitrary()?,
        }),
        6 => w::Step::Http(w::HttpCall {
            method: text(u)?,
            urls: texts(u)?,
            headers: list(u, header)?,
            body: u.arbitrary()?,
            ok_status: u.arbitrary()?,
        }),
        7 => w::Step::Resolve(w::Resolve {
            reference: text(u)?,
            mirror: if u.arbitrary()? { Some(text(u)?) } else { None },
            auth: match u.int_in_range(0..=3)? {
                0 => w::RegistryAuth::Anonymous,
                1 => w::RegistryAuth::Basic(w::BasicAuth { username_key: text(u)?, password_key: text(u)? }),
                2 => w::RegistryAuth::Token(text(u)?),
                _ => w::RegistryAuth::DockerConfig(text(u)?),
            },
            insecure: u.arbitrary()?,
        }),
        8 => w::Step::FetchBlob(w::FetchBlob { digest: text(u)?, size: u.arbitrary()?, media_type: text(u)? }),
        _ => w::Step::Unpack(w::Unpack {
            digest: text(u)?,
            format: *u.choose(&[w::Archive::Raw, w::Archive::Tar, w::Archive::TarGzip, w::Archive::TarZstd])?,
            dest: path_ref(u)?,
        }),
    })
}

fn inside(p: &Path, dirs: &VolumeDirs) -> bool {
    [&dirs.staging, &dirs.target, &dirs.cache, &dirs.runtime, &dirs.fuse_files]
        .into_iter()
        .flatten()
        .any(|root| p.starts_with(root))
        && !p.components().any(|c| matches!(c, std::path::Component::ParentDir | std::path::Component::CurDir))
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let operation = *u.choose(&[
        Operation::Provision,
        Operation::Delete,
        Operation::Stage,
        Operation::Publish,
        Operation::Unstage,
        Operation::DynamicMount,
        Operation::Expand,
        Operation::NodeExpand,
    ])?;
    let rules: bool = u.arbitrary()?;
    // fusetest runs under no rule set, or under one of the built-in ones (the argv judge).
    let set = *u.choose(&[None, Some("weed"), Some("sshfs"), Some("bindfs"), Some("rclone"), Some("s3fs")])?;
    let steps = list(u, step)?;
    let grant = Grant {
        programs: ["fusetest".to_string()].into(),
        fstypes: ["fuse.test".to_string(), "tmpfs".to_string()].into(),
        hosts: ["registry.local".to_string()].into(),
    };
    let programs: BTreeMap<String, PathBuf> = [("fusetest".to_string(), PathBuf::from("/usr/bin/fusetest"))].into();
    let mut program_args = BTreeMap::new();
    if rules {
        let mut r = ArgRules::default();
        r.deny.insert(OptionName::parse("ssh_command").unwrap());
        r.env.insert("TZ".into());
        program_args.insert("fusetest".to_string(), r);
    }
    let mut program_rules = ProgramRules::default();
    if let Some(name) = set {
        program_rules.sets.insert("fusetest".into(), BUILTIN_SETS.sets[name].clone());
    }
    let dirs = VolumeDirs {
        staging: Some("/k/plugins/x/globalmount".into()),
        target: Some("/k/pods/u/mount".into()),
        cache: Some("/s/cache/ab".into()),
        runtime: Some("/s/run/ab".into()),
        fuse_files: Some("/f/ab".into()),
    };
    let secrets: Secrets = [("token".to_string(), SECRET.to_string())].into_iter().collect();
    let ctx = Context {
        operation,
        plugin: "t",
        digest: "sha256:00".into(),
        grant: &grant,
        programs: &programs,
        program_args: &program_args,
        rules: &program_rules,
        endpoint_hosts: ["filer:8888".to_string()].into(),
        dirs: &dirs,
        secrets: &secrets,
    };
    let plan = w::Plan { steps, attributes: vec![] };
    if let Err(e) = policy::missing_grants(&ctx, &plan) {
        assert!(!e.to_string().contains(SECRET), "a secret value in a refusal: {e}");
    }
    let checked = match policy::check(&ctx, plan) {
        Ok(checked) => checked,
        Err(e) => {
            assert!(!e.to_string().contains(SECRET), "a secret value in a refusal: {e}");
            return Ok(());
        }
    };
    assert!(!format!("{checked:?}").contains(SECRET), "a secret value in an accepted plan: {checked:?}");
    for s in &checked.steps {
        let paths: Vec<&PathBuf> = match s {
            Step::Mkdir { path } | Step::Remove { path } => vec![path],
            Step::SpawnFuse { mountpoint, .. } => vec![mountpoint],
            Step::Mount { target, .. } => vec![target],
            Step::Bind { source, target, .. } => vec![source, target],
            _ => vec![],
        };
        for p in paths {
            assert!(inside(p, &dirs), "{} accepted outside the volume: {s:?}", p.display());
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
