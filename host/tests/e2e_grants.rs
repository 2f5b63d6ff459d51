//! A hostile plugin granted real programs, through the real daemons (issue 40): the `argv` test
//! plugin plans whatever program and arguments a route asks for, and every route is refused
//! with its rule named, or contained by the program's own mount namespace
//! (docs/policy.md#confinement). Root, in a private mount namespace; real SeaweedFS (filer and
//! S3 gateway) and `sshd` on 127.0.0.1.
//!
//! After every route: the node's mount table is what it was, and the stand-ins for `/` and
//! `/etc` (directories of files the routes aim at) hold exactly what they held, no FUSE program
//! is left. Each route prints a `checked:` line naming what stopped it.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::{NodeDirs, Seaweed, guarded, in_private_namespace, multi_writer, pids_with};
use mounthost::proto::csi;
use mounthost::proto::csi::node_client::NodeClient;
use mounthost::unpriv::grpc::{UnixChannel, channel};
use tonic::Code;

/// What a route's stage must end in.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Refused by the policy: INVALID_ARGUMENT naming this rule of the program's rule set.
    Rule(&'static str),
    /// Run, and contained: the stage fails with `code`, its message saying this.
    Contained(Code, &'static str),
}

/// One route: a program, its mount, its fstype, its arguments (`{...}` references of the
/// `argv` plugin), and what must stop it.
struct Route {
    name: &'static str,
    program: &'static str,
    mount: &'static str,
    fstype: &'static str,
    args: Vec<String>,
    expect: Expect,
}

fn route(name: &'static str, program: &'static str, args: &[&str], expect: Expect) -> Route {
    let fstype = match program {
        "weed" | "weed-unruled" => "fuse.seaweedfs",
        "sshfs" | "sshfs-unruled" => "fuse.sshfs",
        "rclone" | "rclone-unruled" => "fuse.rclone",
        "s3fs" | "s3fs-unruled" => "fuse.s3fs",
        _ => "fuse",
    };
    let mount = if program == "sshfs" && args.iter().any(|a| a.contains("{fd}")) { "host-fd" } else { "by-program" };
    Route { name, program, mount, fstype, args: args.iter().map(|a| a.to_string()).collect(), expect }
}

/// Everything below `dir`: each entry's relative path, kind, mode, owner, size, inode, mtime
/// and content (files only).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u32, u32, u64, u64, i64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let content = if meta.is_file() { std::fs::read(&path).unwrap() } else { Vec::new() };
            if meta.is_dir() {
                stack.push(path.clone());
            }
            out.insert(
                path.strip_prefix(dir).unwrap().to_path_buf(),
                (meta.mode(), meta.uid(), meta.size(), meta.ino(), meta.mtime(), content),
            );
        }
    }
    out
}

/// The mount table, without mount ids: mount point, source, fstype, options.
fn mount_table() -> Vec<(PathBuf, String, String, String)> {
    mounthost::exec::mountinfo::read()
        .unwrap()
        .into_iter()
        .map(|m| (m.mount_point, m.source, m.fstype, m.mount_options))
        .collect()
}

/// The volume context of `r`, with `hosts` granted by it (an endpoint parameter).
fn context(r: &Route, hosts: &str) -> HashMap<String, String> {
    [
        ("plugin", "argv"),
        ("program", r.program),
        ("mount", r.mount),
        ("fstype", r.fstype),
        ("hosts", hosts),
        ("timeout", "10000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([("args".to_string(), r.args.join("\n"))])
    .collect()
}

fn request(
    id: &str,
    staging: &Path,
    ctx: HashMap<String, String>,
    secrets: &[(&str, &str)],
) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(multi_writer()),
        volume_context: ctx,
        secrets: secrets.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    }
}

/// The stand-ins: a `/` and an `/etc` of the node's, as directories the routes aim at.
struct StandIns {
    root: PathBuf,
    etc: PathBuf,
}

impl StandIns {
    fn new(base: &Path) -> StandIns {
        let root = base.join("standin-root");
        let etc = base.join("standin-etc");
        for d in [root.join("bin"), root.join("var/lib"), etc.join("ssh")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(root.join("bin/tool"), "#!/bin/sh\necho node tool\n").unwrap();
        std::fs::write(root.join("var/lib/data"), "node data\n").unwrap();
        std::fs::write(etc.join("passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
        std::fs::write(etc.join("shadow"), "root:$6$node-secret:19000:0:99999:7:::\n").unwrap();
        std::fs::write(etc.join("ssh/ssh_host_ed25519_key"), "node host key\n").unwrap();
        StandIns { root, etc }
    }

    fn snapshot(
        &self,
    ) -> (BTreeMap<PathBuf, (u32, u32, u64, u64, i64, Vec<u8>)>, BTreeMap<PathBuf, (u32, u32, u64, u64, i64, Vec<u8>)>)
    {
        (snapshot(&self.root), snapshot(&self.etc))
    }

    /// `{root}` and `{etc}` in a route's arguments become the stand-ins' paths.
    fn fill(&self, r: &mut Route) {
        for a in &mut r.args {
            *a =
                a.replace("{root}", &self.root.display().to_string()).replace("{etc}", &self.etc.display().to_string());
        }
    }
}

async fn stage(node: &mut NodeClient<UnixChannel>, req: csi::NodeStageVolumeRequest) -> Result<(), tonic::Status> {
    node.node_stage_volume(req).await.map(drop)
}

async fn unstage(node: &mut NodeClient<UnixChannel>, id: &str, staging: &Path) {
    let req =
        csi::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: staging.display().to_string() };
    node.node_unstage_volume(req).await.unwrap();
}

/// The daemons' flags: the `argv` plugin granted every program the routes use, each under its
/// built-in rule set, and the same binaries under other names (`*-unruled`), which no rule set
/// is named for: what stops those is the mount namespace alone.
fn daemon_args(dirs: &NodeDirs, extra_programs: &[(&str, &Path)]) -> Vec<String> {
    let plugins = dirs.root.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(mounthost::stock::fixtures::path("argv"), plugins.join("argv.wasm")).unwrap();
    let weed = common::weed_binary();
    let mut programs: Vec<(String, PathBuf)> = vec![
        ("weed".into(), weed.clone()),
        ("sshfs".into(), "/usr/bin/sshfs".into()),
        ("bindfs".into(), "/usr/bin/bindfs".into()),
        ("rclone".into(), "/usr/bin/rclone".into()),
        ("s3fs".into(), "/usr/bin/s3fs".into()),
    ];
    let unruled: Vec<(String, PathBuf)> = programs.iter().map(|(n, p)| (format!("{n}-unruled"), p.clone())).collect();
    programs.extend(unruled);
    programs.extend(extra_programs.iter().map(|(n, p)| (n.to_string(), p.to_path_buf())));
    let mut args = vec![format!("--plugin-dir={}", plugins.display())];
    for (name, path) in &programs {
        args.push(format!("--program={name}={}", path.display()));
        args.push(format!("--grant=argv:program={name}"));
    }
    for fstype in ["fuse", "fuse.seaweedfs", "fuse.sshfs", "fuse.rclone", "fuse.s3fs"] {
        args.push(format!("--grant=argv:fstype={fstype}"));
    }
    args
}

#[test]
fn a_hostile_plugin_granted_real_programs_is_refused_or_contained_on_every_route() {
    if !in_private_namespace("a_hostile_plugin_granted_real_programs_is_refused_or_contained_on_every_route") {
        return;
    }
    let dirs = NodeDirs::new();
    let stand = StandIns::new(dirs.root.path());
    let weed = Seaweed::start_s3();
    let s3 = weed.s3.clone().unwrap();
    let hosts = format!("{},{s3}", weed.filer);
    // A program that mounts twice: in its own home, then at its mount point. (A mount made
    // after its mount point is ready stays in its namespace too, but the stage is done by then.)
    let twice = dirs.root.path().join("mount-twice");
    std::fs::write(
        &twice,
        "#!/bin/sh\n/usr/bin/bindfs \"$1\" \"$HOME\" && /usr/bin/bindfs \"$1\" \"$2\" && exec sleep 60\n",
    )
    .unwrap();
    std::fs::set_permissions(&twice, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let args = daemon_args(&dirs, &[("mount-twice", &twice)]);
    let _host = dirs.start_host(&args);
    let _front = dirs.start_front(&args);
    let rt = tokio::runtime::Runtime::new().unwrap();
    use Expect::{Contained, Rule};
    let mut routes = vec![
        // weed under @weed.
        route(
            "weed mounting elsewhere (-dir=)",
            "weed",
            &["mount", "-filer={filer}", "-dir={etc}"],
            Rule("options.-dir"),
        ),
        route("weed shell", "weed", &["shell"], Rule("subcommand")),
        route("weed server", "weed", &["server", "-dir={root}"], Rule("subcommand")),
        route("weed filer", "weed", &["filer"], Rule("subcommand")),
        route("weed upload", "weed", &["upload", "-dir={root}", "{etc}/shadow"], Rule("subcommand")),
        route(
            "weed -cacheDir= outside the volume",
            "weed",
            &["mount", "-dir={staging}", "-cacheDir={etc}"],
            Rule("options.-cacheDir"),
        ),
        route(
            "weed -options= naming a file",
            "weed",
            &["mount", "-dir={staging}", "-options={etc}/passwd"],
            Rule("unknown-option"),
        ),
        // bindfs under @bindfs.
        route("bindfs mirroring /", "bindfs", &["-f", "/", "{staging}"], Rule("positionals.1")),
        route("bindfs mirroring a node directory", "bindfs", &["-f", "{root}", "{staging}"], Rule("positionals.1")),
        route("bindfs mounting elsewhere", "bindfs", &["-f", "{cache}", "{etc}"], Rule("positionals.2")),
        route(
            "bindfs with a second mount point",
            "bindfs",
            &["-f", "{cache}", "{staging}", "{root}"],
            Rule("extra-positional"),
        ),
        // sshfs under @sshfs.
        route(
            "sshfs -o ssh_command=",
            "sshfs",
            &["root@127.0.0.1:/", "{fd}", "-o", "ssh_command=sh -c id"],
            Rule("unknown-o-option"),
        ),
        route(
            "sshfs -o ProxyCommand=",
            "sshfs",
            &["root@127.0.0.1:/", "{fd}", "-oProxyCommand=sh -c id"],
            Rule("unknown-o-option"),
        ),
        route("sshfs -F", "sshfs", &["root@127.0.0.1:/", "{fd}", "-F", "{etc}/ssh/config"], Rule("unknown-option")),
        route(
            "sshfs -o IdentityFile= naming a node file",
            "sshfs",
            &["root@127.0.0.1:/", "{fd}", "-o", "IdentityFile={etc}/ssh/ssh_host_ed25519_key"],
            Rule("o-options.IdentityFile"),
        ),
        route(
            "sshfs evil@host:/ /etc, mounting by itself",
            "sshfs",
            &["evil@127.0.0.1:/", "{etc}", "-f", "-o", "port=22"],
            Rule("host-fd"),
        ),
        // The mount namespace alone (the same binaries under names no rule set is for).
        route(
            "weed mounting elsewhere, without rules",
            "weed-unruled",
            &["-logtostderr", "mount", "-filer={filer}", "-dir={etc}", "-cacheDir={cache}"],
            Contained(Code::Unavailable, "exited before mounting"),
        ),
        route(
            "a second mount by a program that mounts by itself",
            "mount-twice",
            &["{cache}", "{staging}"],
            Contained(Code::InvalidArgument, "mounted fuse at /tmp/home besides its mount point"),
        ),
    ];
    guarded(&dirs, || {
        rt.block_on(async {
            let ch = channel(&dirs.csi_sock);
            common::wait_ready(&ch).await;
            let mut node = NodeClient::new(ch);
            let before = (mount_table(), stand.snapshot());
            for (i, r) in routes.iter_mut().enumerate() {
                stand.fill(r);
                for a in &mut r.args {
                    *a = a.replace("{filer}", &weed.filer);
                }
                let id = format!("argv~route-{i}");
                let staging = dirs.staging(&format!("route-{i}"));
                let result = stage(&mut node, request(&id, &staging, context(r, &hosts), &[])).await;
                let status = result.expect_err(r.name);
                match r.expect {
                    Rule(rule) => {
                        assert_eq!(status.code(), Code::InvalidArgument, "{}: {status:?}", r.name);
                        let named = status.message().contains(&format!("rule {rule})"))
                            || (rule == "host-fd" && status.message().contains("host-fd: required"));
                        assert!(named, "{}: {}", r.name, status.message());
                        println!("checked: {}: refused, rule {rule}: {}", r.name, status.message());
                    }
                    Contained(code, says) => {
                        assert_eq!(status.code(), code, "{}: {status:?}", r.name);
                        assert!(status.message().contains(says), "{}: {}", r.name, status.message());
                        println!("checked: {}: contained by its mount namespace: {}", r.name, status.message());
                    }
                }
                // kubelet retries, then gives up: nothing is staged either way.
                unstage(&mut node, &id, &staging).await;
                assert_eq!(mount_table(), before.0, "{}: the node's mount table changed", r.name);
                assert!(stand.snapshot() == before.1, "{}: a stand-in changed", r.name);
                assert!(pids_with(&staging.display().to_string()).is_empty(), "{}: a program is left", r.name);
            }
            println!("checked: {} routes, the mount table and the stand-ins for / and /etc unchanged", routes.len());
        })
    });
}
