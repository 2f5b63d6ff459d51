//! Test fixture: a plugin that misbehaves on request, so the host's containment can be shown.
//! Its `stage` planner reads the `mode` parameter:
//!
//! | mode            | what it does                                                |
//! |-----------------|-------------------------------------------------------------|
//! | `ok`            | plans a tmpfs mount at the staging path                     |
//! | `spin`          | loops forever (the host's deadline must stop it)            |
//! | `alloc`         | allocates 1 GiB (the host's memory cap must refuse it)      |
//! | `trap`          | panics, which traps (`panic = "abort"`)                     |
//! | `escape`        | plans a bind whose target climbs out of the volume (`..`)   |
//! | `program-path`  | plans a spawn naming `/bin/sh` instead of a program name    |
//! | `absolute`      | plans a mkdir at an absolute path                           |
//! | `argv-secret`   | puts the secret `token` into argv                           |
//! | `bad-fstype`    | plans a mount of fstype `ext4`                              |
//! | `bad-env`       | plans a spawn with an invalid environment variable name     |
//! | `log-flood`     | logs 10,000 lines, then plans like `ok`                     |
//! | `error`         | returns `not-found` from the backend                        |
//! | `host-fd`       | spawns `fusetest` unprivileged on a connection the host mounts |
//!
//! Its `provision` planner, with `mode` `short`, answers a volume of half the `required_bytes`
//! asked for and plans nothing (a size outside the range, which the host must refuse); with any
//! other mode it provisions nothing, as the SDK's default.

use mounthost_plugin_sdk::*;

struct Misbehave;

fn tmpfs() -> Step {
    Step::Mount(Mount {
        fstype: "tmpfs".into(),
        source: MountSource::Named("tmpfs".into()),
        target: staging(""),
        options: vec![arg("size=1m")],
        readonly: false,
    })
}

fn spawn(program: &str, args: Vec<Arg>, env: Vec<EnvVar>) -> Step {
    Step::SpawnFuse(SpawnFuse {
        program: program.into(),
        args,
        env,
        mountpoint: staging(""),
        fstype: "fuse.test".into(),
        ready_timeout_ms: 1000,
        memory_limit_bytes: None,
        mount: FuseMount::ByProgram,
    })
}

fn plan(steps: Vec<Step>) -> Result<Plan, BackendError> {
    Ok(Plan { steps, attributes: vec![kv("mode", "planned")] })
}

impl Plugin for Misbehave {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "misbehave".into(),
            version: "0.1.0".into(),
            description: "Test fixture that misbehaves on request.".into(),
            parameters: vec![ParamDoc {
                name: "mode".into(),
                doc: "What to do when asked to stage.".into(),
                kind: ParamKind::Choice,
                source: ParamSource::Parameter,
                required: false,
                default_value: Some("ok".into()),
            }],
            programs: vec!["fusetest".into()],
            fstypes: vec!["tmpfs".into(), "fuse.test".into()],
        }
    }

    fn stage(req: StageRequest) -> Result<Plan, BackendError> {
        let params = Params::new("parameter", &req.context)?;
        match params.text("mode")?.unwrap_or("ok") {
            "ok" => plan(vec![tmpfs()]),
            "spin" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "alloc" => {
                let big: Vec<u8> = vec![1u8; 1 << 30];
                plan(vec![Step::Mkdir(staging(&big.len().to_string()))])
            }
            "trap" => panic!("misbehave asked to trap"),
            "escape" => plan(vec![Step::Bind(Bind {
                source: staging(""),
                target: staging("../../etc"),
                readonly: false,
                options: vec![],
            })]),
            "program-path" => plan(vec![spawn("/bin/sh", vec![arg("-c"), arg("id")], vec![])]),
            "absolute" => plan(vec![Step::Mkdir(cache("/etc/cron.d"))]),
            "argv-secret" => {
                let secrets = Params::new("secret", &req.secrets)?;
                let token = secrets.required("token")?;
                plan(vec![spawn("fusetest", vec![arg(format!("-token={token}"))], vec![])])
            }
            "bad-fstype" => plan(vec![Step::Mount(Mount {
                fstype: "ext4".into(),
                source: MountSource::Named("/dev/sda1".into()),
                target: staging(""),
                options: vec![],
                readonly: false,
            })]),
            "bad-env" => plan(vec![spawn(
                "fusetest",
                vec![],
                vec![EnvVar { name: "LD_PRELOAD=x".into(), value: Value::Literal("y".into()) }],
            )]),
            "log-flood" => {
                for i in 0..10_000 {
                    log(Level::Info, &format!("line {i}"));
                }
                plan(vec![tmpfs()])
            }
            "error" => Err(BackendError::NotFound("the thing is not there".into())),
            "host-fd" => plan(vec![Step::SpawnFuse(SpawnFuse {
                program: "fusetest".into(),
                args: vec![fuse_fd_arg("", "")],
                env: vec![],
                mountpoint: staging(""),
                fstype: "fuse.test".into(),
                ready_timeout_ms: 10_000,
                memory_limit_bytes: None,
                mount: host_fd("misbehave", &[], false),
            })]),
            other => Err(params::invalid(format!("unknown mode {other:?}"))),
        }
    }

    fn provision(req: ProvisionRequest) -> Result<ProvisionPlan, BackendError> {
        let params = Params::new("parameter", &req.parameters)?;
        match params.text("mode")? {
            Some("short") => Ok(ProvisionPlan {
                volume_id: req.name,
                capacity_bytes: req.required_bytes / 2,
                context: Vec::new(),
                steps: Vec::new(),
            }),
            _ => Err(BackendError::InvalidArgument(
                "plugin misbehave does not provision volumes; create a static PersistentVolume instead".into(),
            )),
        }
    }
}

export_plugin!(Misbehave);
