//! Lazy volumes (`lazy: "true"`, docs/lazy.md): the host serves a stage plan's unpacked blobs
//! through its own FUSE server instead of linking them from the cache once they are all there.
//!
//! [`lower`] is a pure function of a checked plan: every `unpack` step goes into one
//! `spawn-fuse` of the host's lazy server ([`LAZY_PROGRAM`]) mounted at the directory they
//! unpack into (the source of a later `bind`; for a container image, whose layers all unpack
//! into one directory, that directory even when the bind takes a directory below it: the
//! image's `path`), with the blobs in the steps' order, and the
//! `fetch-blob` steps go (nothing waits for the blobs: the server fetches what its readers
//! ask for, and the fill the rest). What the plan's other steps say (the `resolve`, the binds
//! onto the staging path or a dynamic mount's directory) stays as it is; so does what the
//! volume holds once the fill is done: the same files at the same paths, byte for byte.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{Archive, HostMount, Lazy, LazyLayer, Plan, SpawnArg, Step};

/// The program name of the host's lazy FUSE server in plans and logs.
pub const LAZY_PROGRAM: &str = "mounthost-lazy";
/// The fstype its mounts show.
pub const LAZY_FSTYPE: &str = "fuse.mounthost-lazy";
/// The source its mounts show.
pub const LAZY_SOURCE: &str = "mounthost-lazy";
/// How long a lazy server may take to answer its mount and the host's opening.
pub const LAZY_READY_MS: u32 = 30_000;
/// The control socket of a volume's own (stage) lazy server, in its runtime directory.
pub const STAGE_CONTROL: &str = "lazy.sock";

/// The control socket of the stage's server (records written before it was named).
pub fn default_control() -> String {
    STAGE_CONTROL.to_string()
}

/// The control socket of dynamic mount `id`'s server (ids are checked: lowercase letters,
/// digits and dashes).
pub fn mount_control(id: &str) -> String {
    format!("lazy-{id}.sock")
}

/// Why a plan cannot be served lazily.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotLazy {
    /// It unpacks nothing.
    #[error("the plan unpacks no blob, so there is nothing to serve lazily")]
    NothingUnpacked,
    /// No bind takes the directory the blobs are unpacked into.
    #[error(
        "the plan's unpack steps do not all go into one directory that a bind step then mounts ({0}); lazy volumes need that shape (the model plugin's)"
    )]
    NoSharedRoot(String),
    /// An unpack names a blob the plan does not fetch.
    #[error("unpack of {0} without a fetch-blob step for it")]
    NotFetched(String),
}

/// `plan` served by the host's lazy FUSE server at `server` (the host's own executable).
pub fn lower(plan: Plan, server: &Path) -> Result<Plan, NotLazy> {
    let unpacks: Vec<(&String, Archive, &PathBuf)> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Unpack { digest, format, dest, .. } => Some((digest, *format, dest)),
            _ => None,
        })
        .collect();
    if unpacks.is_empty() {
        return Err(NotLazy::NothingUnpacked);
    }
    let root = plan
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Bind { source, .. } if unpacks.iter().all(|(_, _, d)| d.starts_with(source)) => Some(source.clone()),
            _ => None,
        })
        // A container image: every layer unpacked into one directory, and a bind of it or of
        // a directory below it (the model inside the image). The server is mounted at that
        // directory; the bind's source is then inside it, and stays as it is.
        .or_else(|| {
            let dest = unpacks[0].2;
            let shared = unpacks.iter().all(|(_, _, d)| *d == dest);
            let bound = plan.steps.iter().any(|s| matches!(s, Step::Bind { source, .. } if source.starts_with(dest)));
            (shared && bound).then(|| dest.clone())
        })
        .ok_or_else(|| {
            NotLazy::NoSharedRoot(
                unpacks.iter().map(|(_, _, d)| d.display().to_string()).collect::<Vec<_>>().join(", "),
            )
        })?;
    let fetched: BTreeMap<&str, (u64, &str)> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::FetchBlob { digest, size, media_type } => Some((digest.as_str(), (*size, media_type.as_str()))),
            _ => None,
        })
        .collect();
    let mut layers = Vec::with_capacity(unpacks.len());
    for (digest, format, dest) in &unpacks {
        let (size, media_type) = fetched.get(digest.as_str()).ok_or_else(|| NotLazy::NotFetched((*digest).clone()))?;
        let rel = dest.strip_prefix(&root).expect("found by starts_with");
        layers.push(LazyLayer {
            digest: (*digest).clone(),
            size: *size,
            media_type: media_type.to_string(),
            format: *format,
            dest: rel.to_string_lossy().into_owned(),
        });
    }
    let spawn = Step::SpawnFuse {
        program: LAZY_PROGRAM.into(),
        executable: server.to_path_buf(),
        args: vec![
            SpawnArg::Text("lazyfs".into()),
            SpawnArg::FuseFd { prefix: "--fuse=".into(), suffix: String::new() },
            SpawnArg::Text(format!("--control=/dev/fd/{}", super::CONTROL_FD)),
        ],
        env: Vec::new(),
        mountpoint: root,
        fstype: LAZY_FSTYPE.into(),
        ready_timeout_ms: LAZY_READY_MS,
        memory_limit_bytes: None,
        host_mount: Some(HostMount {
            source: LAZY_SOURCE.into(),
            options: vec!["default_permissions".into()],
            readonly: true,
        }),
        lazy: Some(Box::new(Lazy { layers, index: None, control: STAGE_CONTROL.into() })),
    };
    let first = plan.steps.iter().position(|s| matches!(s, Step::FetchBlob { .. } | Step::Unpack { .. }));
    let mut steps: Vec<Step> = Vec::with_capacity(plan.steps.len());
    let mut spawn = Some(spawn);
    for (i, step) in plan.steps.into_iter().enumerate() {
        if Some(i) == first {
            steps.extend(spawn.take());
        }
        if !matches!(step, Step::FetchBlob { .. } | Step::Unpack { .. }) {
            steps.push(step);
        }
    }
    Ok(Plan { steps, ..plan })
}

/// The lazy layers of a plan's server, if it runs one.
pub fn layers(plan: &Plan) -> Option<&Lazy> {
    layers_of(&plan.steps)
}

/// The lazy layers of the server these steps run, if they run one.
pub fn layers_of(steps: &[Step]) -> Option<&Lazy> {
    steps.iter().find_map(|s| match s {
        Step::SpawnFuse { lazy: Some(l), .. } => Some(&**l),
        _ => None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::plan::RegistryAuth;

    fn d(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    pub(crate) fn model_plan() -> Plan {
        let cache = PathBuf::from("/s/cache/v/model");
        Plan {
            plugin: "model".into(),
            digest: "sha256:p".into(),
            steps: vec![
                Step::Resolve {
                    reference: "r.io/m:1".into(),
                    mirror: None,
                    auth: RegistryAuth::Anonymous,
                    insecure: false,
                },
                Step::FetchBlob {
                    digest: d('a'),
                    size: 10,
                    media_type: "application/vnd.cncf.model.weight.v1.raw".into(),
                },
                Step::FetchBlob {
                    digest: d('b'),
                    size: 2048,
                    media_type: "application/vnd.cncf.model.doc.v1.tar".into(),
                },
                Step::Unpack {
                    digest: d('a'),
                    format: Archive::Raw,
                    dest: cache.join("w/model.safetensors"),
                    layering: Default::default(),
                },
                Step::Unpack {
                    digest: d('b'),
                    format: Archive::Tar,
                    dest: cache.clone(),
                    layering: Default::default(),
                },
                Step::Bind {
                    source: cache,
                    target: "/k/staging".into(),
                    readonly: true,
                    options: vec!["nosuid".into()],
                },
            ],
            attributes: vec![("reference".into(), "r.io/m:1".into())],
        }
    }

    #[test]
    fn the_unpacks_become_one_lazy_server_at_the_bound_directory() {
        let plan = lower(model_plan(), Path::new("/usr/bin/mounthost")).unwrap();
        assert_eq!(plan.steps.len(), 3, "{:#?}", plan.steps);
        assert!(matches!(plan.steps[0], Step::Resolve { .. }));
        assert!(matches!(plan.steps[2], Step::Bind { .. }), "the bind stays, after the server");
        let Step::SpawnFuse { program, executable, mountpoint, fstype, host_mount, lazy, args, .. } = &plan.steps[1]
        else {
            panic!("{:?}", plan.steps[1])
        };
        assert_eq!((program.as_str(), fstype.as_str()), (LAZY_PROGRAM, LAZY_FSTYPE));
        assert_eq!(executable, Path::new("/usr/bin/mounthost"));
        assert_eq!(mountpoint, Path::new("/s/cache/v/model"));
        assert!(host_mount.as_ref().is_some_and(|h| h.readonly), "read-only, mounted by the host");
        let rendered: Vec<String> = args.iter().map(|a| a.render_at(Path::new("/x"))).collect();
        assert_eq!(rendered, ["lazyfs", "--fuse=/dev/fd/3", "--control=/dev/fd/4"]);
        let lazy = lazy.as_ref().unwrap();
        assert_eq!(lazy.layers.len(), 2);
        assert_eq!((lazy.layers[0].dest.as_str(), lazy.layers[0].size), ("w/model.safetensors", 10));
        assert_eq!((lazy.layers[1].dest.as_str(), lazy.layers[1].format), ("", Archive::Tar));
        assert_eq!(layers(&plan), Some(&**lazy));
        assert_eq!(plan.attributes, model_plan().attributes, "attributes stay");
    }

    /// A container image's plan: its layers unpacked in order into `model/`, the bind of
    /// `path` below it (or of `model/` itself).
    fn image_plan(bound: &str) -> Plan {
        let root = PathBuf::from("/s/cache/v/model");
        let mut steps = vec![Step::Resolve {
            reference: "r.io/img:1".into(),
            mirror: None,
            auth: RegistryAuth::Anonymous,
            insecure: false,
        }];
        let layers = [
            ('a', "application/vnd.oci.image.layer.v1.tar+gzip", Archive::TarGzip),
            ('b', "application/vnd.oci.image.layer.v1.tar", Archive::Tar),
            ('c', "application/vnd.docker.image.rootfs.diff.tar.gzip", Archive::TarGzip),
        ];
        for (c, media_type, _) in layers {
            steps.push(Step::FetchBlob { digest: d(c), size: 512, media_type: media_type.into() });
        }
        for (c, media_type, format) in layers {
            let layering = crate::plan::tar_rules::Layering::of(media_type);
            steps.push(Step::Unpack { digest: d(c), format, dest: root.clone(), layering });
        }
        steps.push(Step::Bind {
            source: root.join(bound),
            target: "/k/staging".into(),
            readonly: true,
            options: vec!["nosuid".into()],
        });
        Plan { plugin: "model".into(), digest: "sha256:p".into(), steps, attributes: Vec::new() }
    }

    #[test]
    fn an_images_layers_are_served_at_their_directory_and_the_bind_below_it_stays() {
        for bound in ["models", "models/llama", ""] {
            let plan = lower(image_plan(bound), Path::new("/m")).unwrap();
            assert_eq!(plan.steps.len(), 3, "{:#?}", plan.steps);
            let Step::SpawnFuse { mountpoint, lazy: Some(lazy), .. } = &plan.steps[1] else {
                panic!("{:?}", plan.steps[1])
            };
            assert_eq!(mountpoint, Path::new("/s/cache/v/model"), "{bound:?}");
            let got: Vec<(&str, Archive, &str)> =
                lazy.layers.iter().map(|l| (l.digest.as_str(), l.format, l.dest.as_str())).collect();
            assert_eq!(
                got,
                [(d('a').as_str(), Archive::TarGzip, ""), (&d('b'), Archive::Tar, ""), (&d('c'), Archive::TarGzip, "")],
                "every layer in the manifest's order, at the root"
            );
            assert_eq!(lazy.layers[2].media_type, "application/vnd.docker.image.rootfs.diff.tar.gzip");
            let Step::Bind { source, .. } = &plan.steps[2] else { panic!("{:?}", plan.steps[2]) };
            assert_eq!(source, &Path::new("/s/cache/v/model").join(bound), "the bind is the plan's own");
        }
    }

    #[test]
    fn a_bind_below_the_unpacks_needs_them_all_in_one_directory() {
        // Layers in two directories, a bind below one of them: no directory holds them all.
        let mut p = image_plan("models");
        if let Some(Step::Unpack { dest, .. }) = p.steps.iter_mut().rfind(|s| matches!(s, Step::Unpack { .. })) {
            *dest = PathBuf::from("/s/cache/v/model/other");
        }
        assert!(matches!(lower(p, Path::new("/m")).unwrap_err(), NotLazy::NoSharedRoot(_)));
        // A bind beside the directory, not below it.
        let mut p = image_plan("models");
        if let Some(Step::Bind { source, .. }) = p.steps.last_mut() {
            *source = PathBuf::from("/s/cache/v/elsewhere");
        }
        assert!(matches!(lower(p, Path::new("/m")).unwrap_err(), NotLazy::NoSharedRoot(_)));
        // The model plugin's shape keeps its root: the bind's source, above the unpacks.
        let plan = lower(model_plan(), Path::new("/m")).unwrap();
        assert!(
            matches!(&plan.steps[1], Step::SpawnFuse { mountpoint, .. } if mountpoint == Path::new("/s/cache/v/model"))
        );
    }

    #[test]
    fn plans_of_another_shape_are_refused_with_the_reason() {
        let mut p = model_plan();
        p.steps.retain(|s| !matches!(s, Step::Unpack { .. }));
        assert_eq!(lower(p, Path::new("/m")).unwrap_err(), NotLazy::NothingUnpacked);
        let mut p = model_plan();
        p.steps.retain(|s| !matches!(s, Step::Bind { .. }));
        assert!(matches!(lower(p, Path::new("/m")).unwrap_err(), NotLazy::NoSharedRoot(_)));
        let mut p = model_plan();
        p.steps.retain(|s| !matches!(s, Step::FetchBlob { size: 10, .. }));
        assert_eq!(lower(p, Path::new("/m")).unwrap_err(), NotLazy::NotFetched(d('a')));
    }
}
