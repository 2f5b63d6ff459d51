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
//! | `unsupported`   | returns `unsupported` (a stage a plugin cannot decline)      |
//! | `host-fd`       | spawns `fusetest` unprivileged on a connection the host mounts |
//!
//! Its `provision` planner, with `mode` `short`, answers a volume of half the `required_bytes`
//! asked for and plans nothing (a size outside the range, which the host must refuse); with
//! `http`, plans a PUT to its `url` parameter (kind `url`; `stage` plans as with `ok`); with any
//! other mode it does not provision (`unsupported`), as the SDK's default.

use mounthost_plugin_sdk::*;

struct Misbehave;

fn tmpfs() -> Step {
    Step::Mount(Mount::new("tmpfs", MountSource::Named("tmpfs".into()), staging("")).with_options([arg("size=1m")]))
}

fn spawn(program: &str, args: Vec<Arg>, env: Vec<EnvVar>) -> Step {
    Step::SpawnFuse(SpawnFuse::new(program, args, staging(""), "fuse.test").with_env(env).with_ready_timeout_ms(1000))
}

fn plan(steps: Vec<Step>) -> Result<Plan, BackendError> {
    Ok(Plan::new(steps).with_attributes([kv("mode", "planned")]))
}

impl Plugin for Misbehave {
    fn info() -> PluginInfo {
        PluginInfo::new("misbehave", "0.1.0", "Test fixture that misbehaves on request.")
            .with_parameters([
                ParamDoc::new("mode", ParamKind::Choice, "What to do when asked to stage.")
                    .with_default_value("ok".to_string()),
                ParamDoc::new("url", ParamKind::Url, "What provision's mode `http` calls."),
            ])
            .with_programs(["fusetest"])
            .with_fstypes(["tmpfs", "fuse.test"])
    }

    fn stage(req: StageRequest) -> Result<Plan, BackendError> {
        let params = Params::new("parameter", &req.context)?;
        match params.text("mode")?.unwrap_or("ok") {
            "ok" | "http" => plan(vec![tmpfs()]),
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
            "escape" => plan(vec![Step::Bind(Bind::new(staging(""), staging("../../etc")))]),
            "program-path" => plan(vec![spawn("/bin/sh", vec![arg("-c"), arg("id")], vec![])]),
            "absolute" => plan(vec![Step::Mkdir(cache("/etc/cron.d"))]),
            "argv-secret" => {
                let secrets = Params::new("secret", &req.secrets)?;
                let token = secrets.required("token")?;
                plan(vec![spawn("fusetest", vec![arg(format!("-token={token}"))], vec![])])
            }
            "bad-fstype" => {
                plan(vec![Step::Mount(Mount::new("ext4", MountSource::Named("/dev/sda1".into()), staging("")))])
            }
            "bad-env" => plan(vec![spawn("fusetest", vec![], vec![EnvVar::new("LD_PRELOAD=x", literal("y"))])]),
            "log-flood" => {
                for i in 0..10_000 {
                    log(Level::Info, &format!("line {i}"));
                }
                plan(vec![tmpfs()])
            }
            "error" => Err(BackendError::NotFound("the thing is not there".into())),
            "unsupported" => Err(BackendError::Unsupported("misbehave does not stage today".into())),
            "host-fd" => plan(vec![Step::SpawnFuse(
                SpawnFuse::new("fusetest", [fuse_fd_arg("", "")], staging(""), "fuse.test")
                    .with_ready_timeout_ms(10_000)
                    .with_mount(host_fd("misbehave", &[], false)),
            )]),
            other => Err(params::invalid(format!("unknown mode {other:?}"))),
        }
    }

    fn provision(req: ProvisionRequest) -> Result<ProvisionPlan, BackendError> {
        let params = Params::new("parameter", &req.parameters)?;
        match params.text("mode")? {
            Some("short") => Ok(ProvisionPlan::new(req.name, req.required_bytes / 2)),
            Some("http") => {
                let url = params.url("url")?.ok_or_else(|| params::invalid("mode http needs a url"))?;
                let call = HttpCall::new("PUT", [url], [201]);
                Ok(ProvisionPlan::new(req.name, req.required_bytes).with_steps([Step::Http(call)]))
            }
            _ => Err(BackendError::Unsupported(
                "plugin misbehave does not provision volumes; create a static PersistentVolume instead".into(),
            )),
        }
    }
}

export_plugin!(Misbehave);
