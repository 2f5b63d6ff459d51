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
    /// Run on a connection it cannot take: FAILED_PRECONDITION, its message saying this.
    Permanent(&'static str),
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
    let mount = if args.iter().any(|a| a.contains("{fd}")) { "host-fd" } else { "by-program" };
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

/// The bucket `grants` of the S3 gateway (a directory under `/buckets` of its filer), retried
/// while a filer that has just started drops a connection.
fn make_bucket(weed: &Seaweed) {
    for attempt in 0.. {
        match common::filer_put(&weed.filer, "/buckets/grants/.keep", "") {
            Ok(201) => return,
            other if attempt < 50 => {
                eprintln!("making the bucket: {other:?}");
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            other => panic!("making the bucket: {other:?}"),
        }
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

/// Unstage `id`, retried as kubelet retries while another call on it is in flight.
async fn unstage(node: &mut NodeClient<UnixChannel>, id: &str, staging: &Path) {
    let req =
        csi::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: staging.display().to_string() };
    for attempt in 0.. {
        match node.node_unstage_volume(req.clone()).await {
            Ok(_) => return,
            Err(e) if e.code() == Code::Aborted && attempt < 100 => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            Err(e) => panic!("unstage {id}: {e:?}"),
        }
    }
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
    // A bucket of the S3 gateway (a directory under /buckets of its filer).
    make_bucket(&weed);
    let s3_remote =
        format!(":s3,provider=SeaweedFS,endpoint='http://{s3}',force_path_style=true,no_check_bucket=true:grants");
    // A program that mounts twice: in its own home, then at its mount point. (A mount made
    // after its mount point is ready stays in its namespace too, but the stage is done by then.)
    let twice = dirs.root.path().join("mount-twice");
    std::fs::write(
        &twice,
        "#!/bin/sh\n/usr/bin/bindfs \"$1\" \"$HOME\" && /usr/bin/bindfs \"$1\" \"$2\" && exec sleep 60\n",
    )
    .unwrap();
    std::fs::set_permissions(&twice, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // A program that mounts at its mount point and then, once the stage is done, over the
    // directory holding it (the one its namespace shares with the node while it starts).
    let late = dirs.root.path().join("mount-late");
    std::fs::write(
        &late,
        "#!/bin/sh\n/usr/bin/bindfs \"$1\" \"$2\" && sleep 2 && /usr/bin/bindfs \"$1\" \"$(dirname \"$2\")\"; exec sleep 60\n",
    )
    .unwrap();
    std::fs::set_permissions(&late, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let args = daemon_args(&dirs, &[("mount-twice", &twice), ("mount-late", &late)]);
    let _host = dirs.start_host(&args);
    let _front = dirs.start_front(&args);
    let rt = tokio::runtime::Runtime::new().unwrap();
    use Expect::{Contained, Permanent, Rule};
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
        // rclone under @rclone.
        route("rclone --rc", "rclone", &["mount", "{s3remote}", "{staging}", "--rc"], Rule("unknown-option")),
        route(
            "rclone --rc-addr",
            "rclone",
            &["mount", "{s3remote}", "{staging}", "--rc-addr=127.0.0.1:5572"],
            Rule("unknown-option"),
        ),
        route(
            "rclone --password-command",
            "rclone",
            &["mount", "{s3remote}", "{staging}", "--password-command=sh -c id"],
            Rule("unknown-option"),
        ),
        route(
            "rclone --config=",
            "rclone",
            &["mount", "{s3remote}", "{staging}", "--config={etc}/rclone.conf"],
            Rule("unknown-option"),
        ),
        route(
            "rclone --cache-dir= outside the volume",
            "rclone",
            &["mount", "{s3remote}", "{staging}", "--cache-dir={etc}"],
            Rule("options.--cache-dir"),
        ),
        route("rclone :local: remote", "rclone", &["mount", ":local:{root}", "{staging}"], Rule("positionals.1")),
        route(
            "rclone connection string with ssh=",
            "rclone",
            &["mount", ":sftp,ssh='sh -c id':", "{staging}"],
            Rule("positionals.1"),
        ),
        route(
            "rclone connection string with bearer_token_command",
            "rclone",
            &["mount", ":webdav,url='http://{s3}/',bearer_token_command='id':", "{staging}"],
            Rule("positionals.1"),
        ),
        route("rclone serve", "rclone", &["serve", "webdav", "{root}"], Rule("subcommand")),
        route("rclone copy", "rclone", &["copy", "{etc}", "{s3remote}"], Rule("subcommand")),
        // s3fs under @s3fs.
        route(
            "s3fs -o passwd_file= naming a node file",
            "s3fs",
            &[
                "grants",
                "{staging}",
                "-f",
                "-o",
                "url=http://{s3},use_path_request_style",
                "-o",
                "passwd_file={etc}/passwd-s3fs",
            ],
            Rule("o-options.passwd_file"),
        ),
        route(
            "s3fs -o use_cache= outside the volume",
            "s3fs",
            &["grants", "{staging}", "-f", "-o", "url=http://{s3},use_path_request_style", "-o", "use_cache={etc}"],
            Rule("o-options.use_cache"),
        ),
        route(
            "s3fs -o tmpdir= outside the volume",
            "s3fs",
            &["grants", "{staging}", "-f", "-o", "url=http://{s3},use_path_request_style", "-o", "tmpdir={root}"],
            Rule("o-options.tmpdir"),
        ),
        route(
            "s3fs -o credlib=",
            "s3fs",
            &[
                "grants",
                "{staging}",
                "-f",
                "-o",
                "url=http://{s3},use_path_request_style",
                "-o",
                "credlib={root}/lib.so",
            ],
            Rule("unknown-o-option"),
        ),
        route(
            "s3fs -o modules=",
            "s3fs",
            &["grants", "{staging}", "-f", "-o", "url=http://{s3},use_path_request_style", "-o", "modules=subdir"],
            Rule("unknown-o-option"),
        ),
        // The mount namespace alone (the same binaries under names no rule set is for).
        route(
            "weed mounting elsewhere, without rules",
            "weed-unruled",
            &["-logtostderr", "mount", "-filer={filer}", "-dir={etc}", "-cacheDir={cache}"],
            Contained(Code::Unavailable, "exited before mounting"),
        ),
        route(
            "bindfs mirroring the node's / through /proc, without rules",
            "bindfs-unruled",
            &["-f", "/proc/1/root", "{staging}"],
            Contained(Code::Unavailable, "exited before mounting"),
        ),
        // Programs that cannot take a connection the host mounted, asked to: a permanent
        // error saying so (kubelet retries UNAVAILABLE for ever).
        route(
            "bindfs (libfuse 2) on a host-opened connection, without rules",
            "bindfs-unruled",
            &["-f", "/usr", "{fd}"],
            Permanent("cannot take the FUSE connection the host mounted"),
        ),
        route(
            "s3fs (libfuse 2) on a host-opened connection, without rules",
            "s3fs-unruled",
            &["grants", "{fd}", "-f", "-o", "url=http://{s3},use_path_request_style"],
            Permanent("cannot take the FUSE connection the host mounted"),
        ),
        route(
            "rclone (fusermount) on a host-opened connection, without rules",
            "rclone-unruled",
            &["mount", "{s3remote}", "{fd}"],
            Permanent("cannot take the FUSE connection the host mounted"),
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
                    *a = a.replace("{filer}", &weed.filer).replace("{s3remote}", &s3_remote).replace("{s3}", &s3);
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
                    Permanent(says) => {
                        assert_eq!(status.code(), Code::FailedPrecondition, "{}: {status:?}", r.name);
                        assert!(status.message().contains(says), "{}: {}", r.name, status.message());
                        println!("checked: {}: a permanent error: {}", r.name, status.message());
                    }
                }
                // kubelet retries, then gives up: nothing is staged either way.
                unstage(&mut node, &id, &staging).await;
                assert_eq!(mount_table(), before.0, "{}: the node's mount table changed", r.name);
                assert!(stand.snapshot() == before.1, "{}: a stand-in changed", r.name);
                assert!(pids_with(&staging.display().to_string()).is_empty(), "{}: a program is left", r.name);
            }
            println!("checked: {} routes, the mount table and the stand-ins for / and /etc unchanged", routes.len());
            // Each refusal is counted by program and rule (each route's stage was tried once).
            let metrics = common::Scrape::of(&dirs.host_metrics());
            for (program, rule, at_least) in [
                ("weed", "subcommand", 4.0),
                ("bindfs", "positionals.1", 2.0),
                ("sshfs", "host-fd", 1.0),
                ("rclone", "positionals.1", 3.0),
                ("s3fs", "unknown-o-option", 2.0),
            ] {
                let n = metrics.value("mounthost_policy_refusals_total", &[("program", program), ("rule", rule)]);
                assert!(n >= at_least, "{program} {rule}: {n}\n{}", metrics.dump());
            }
            println!("checked: refusals counted in mounthost_policy_refusals_total by program and rule");
            // Once ready, the directory its namespace shared with the node is its own: the later
            // mount over it stays there.
            let r = route("", "mount-late", &["{cache}", "{staging}"], Rule(""));
            let (id, staging) = ("argv~late", dirs.staging("late"));
            stage(&mut node, request(id, &staging, context(&r, &hosts), &[])).await.unwrap();
            let parent = staging.parent().unwrap().to_path_buf();
            let only_ours = || {
                let below: Vec<PathBuf> =
                    mount_table().into_iter().map(|m| m.0).filter(|p| p.starts_with(&parent)).collect();
                below == [staging.clone()]
            };
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            let pid = *pids_with(&staging.display().to_string()).first().expect("mount-late runs");
            // Its second mount is made (in its namespace) 2 s after the first.
            while std::time::Instant::now() < until {
                let theirs = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
                if theirs.lines().filter(|l| l.contains(" fuse ") || l.contains(" - fuse ")).count() >= 2 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            assert!(only_ours(), "the mount over the directory reached the node: {:?}", mount_table());
            unstage(&mut node, id, &staging).await;
            assert_eq!(mount_table(), before.0, "after the unstage");
            println!("checked: a mount over its mount point's directory made after the stage stayed in the program's namespace");
        })
    });
}

/// Files a program would read by itself, planted in this namespace's `/root` (a tmpfs bound
/// over it) and `/etc` (a copy bound over it): each breaks its program's mount if it is read
/// (or, for s3fs, makes it mount without the plan's credentials).
fn plant(base: &Path, s3_keys: &str) {
    let run = |args: &[&str]| {
        let ok = std::process::Command::new(args[0]).args(&args[1..]).status().unwrap().success();
        assert!(ok, "{args:?}");
    };
    run(&["mount", "-t", "tmpfs", "-o", "mode=0700", "planted-root", "/root"]);
    let etc = base.join("etc-planted");
    run(&["cp", "-a", "/etc", etc.to_str().unwrap()]);
    // weed's security.toml: TLS to its filer, which speaks plain gRPC, so a weed that reads it
    // never mounts (a security.toml that does not parse is skipped, so it would prove nothing).
    let tls = base.join("weed-tls");
    std::fs::create_dir_all(&tls).unwrap();
    let ssl = |args: &str| run(&["sh", "-c", &format!("cd {} && openssl {args} 2>/dev/null", tls.display())]);
    ssl(
        "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.crt -days 1 -subj /CN=ca",
    );
    ssl(
        "req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout client.key -out client.csr -subj /CN=client",
    );
    ssl("x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 1");
    let security = format!(
        "[grpc]\nca = \"{0}/ca.crt\"\n[grpc.client]\ncert = \"{0}/client.crt\"\nkey = \"{0}/client.key\"\n",
        tls.display()
    );
    for (path, text) in [
        (PathBuf::from("/root/.passwd-s3fs"), s3_keys.to_string()),
        // An encrypted configuration: rclone cannot load it without a password, and stops.
        (PathBuf::from("/root/.config/rclone/rclone.conf"), "# Encrypted rclone configuration File\n\nRCLONE_ENCRYPT_V0:\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n".into()),
        (PathBuf::from("/root/.seaweedfs/security.toml"), security.clone()),
        (PathBuf::from("/root/.ssh/config"), "Host *\n  ProxyCommand /bin/false\n".into()),
        (etc.join("passwd-s3fs"), s3_keys.to_string()),
        (etc.join("seaweedfs/security.toml"), security),
    ] {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
    run(&["mount", "--bind", etc.to_str().unwrap(), "/etc"]);
}

/// Which node `dirs` is (its root's name).
fn tag_of(dirs: &NodeDirs) -> String {
    dirs.root.path().display().to_string()
}

/// One case of the planted-files check: a program, its arguments, the secrets of its plan.
struct Case {
    name: &'static str,
    route: Route,
    secrets: Vec<(&'static str, String)>,
}

#[test]
fn honest_plans_work_in_their_namespace_where_no_planted_file_is_read() {
    if !in_private_namespace("honest_plans_work_in_their_namespace_where_no_planted_file_is_read") {
        return;
    }
    let weed = Seaweed::start_s3();
    let s3 = weed.s3.clone().unwrap();
    let (ak, sk) = common::S3_KEYS;
    make_bucket(&weed);
    let sshd = common::sshd::Sshd::start();
    std::fs::write(sshd.data.join("hello.txt"), "over ssh\n").unwrap();
    let hosts = format!("{},{s3},127.0.0.1:{}", weed.filer, sshd.port);
    let s3_remote =
        format!(":s3,provider=SeaweedFS,endpoint='http://{s3}',force_path_style=true,no_check_bucket=true:grants");
    let keys = [("accessKey", ak.to_string()), ("secretKey", sk.to_string())];
    let cases = || {
        vec![
            Case {
                name: "weed (@weed) reads no security.toml of the node's",
                route: route(
                    "",
                    "weed",
                    &[
                        "-logtostderr",
                        "mount",
                        "-filer={filer}",
                        "-filer.path=/buckets/grants",
                        "-dir={staging}",
                        "-cacheDir={cache}",
                    ],
                    Expect::Rule(""),
                ),
                secrets: vec![],
            },
            Case {
                name: "rclone (no rule set) reads no rclone.conf of root's",
                route: route(
                    "",
                    "rclone-unruled",
                    &["mount", &s3_remote, "{staging}", "--cache-dir={cache}"],
                    Expect::Rule(""),
                ),
                secrets: keys.to_vec(),
            },
            Case {
                name: "s3fs (no rule set) reads neither /etc/passwd-s3fs nor root's .passwd-s3fs",
                route: route(
                    "",
                    "s3fs-unruled",
                    &[
                        "grants",
                        "{staging}",
                        "-f",
                        "-o",
                        "url=http://{s3},use_path_request_style",
                        "-o",
                        "use_cache={cache}",
                    ],
                    Expect::Rule(""),
                ),
                secrets: vec![],
            },
            Case {
                name: "ssh of sshfs (no rule set, as root) reads no ssh config of root's or the node's",
                route: route(
                    "",
                    "sshfs-unruled",
                    &[
                        &format!("root@127.0.0.1:{}", sshd.data.display()),
                        "{staging}",
                        "-f",
                        "-o",
                        &format!("port={}", sshd.port),
                        "-o",
                        "IdentityFile={secret:sshPrivateKey}",
                        "-o",
                        "UserKnownHostsFile={secret:sshKnownHosts}",
                        "-o",
                        "BatchMode=yes",
                    ],
                    Expect::Rule(""),
                ),
                secrets: vec![("sshPrivateKey", sshd.user_key.clone()), ("sshKnownHosts", sshd.known_hosts.clone())],
            },
        ]
    };
    let confined = NodeDirs::new();
    let open = NodeDirs::new();
    // rclone without its rule set gets only the variables host config allows (RCLONE_* are on
    // the deny list): its S3 keys.
    // Every plan here also points HOME at root's home (allowed by name), through
    // /proc/<daemon pid>/root: what a program would read there is the planted file.
    let keys_env = "--program-args=rclone-unruled:env=RCLONE_S3_ACCESS_KEY_ID,rclone-unruled:env=RCLONE_S3_SECRET_ACCESS_KEY,\
                    rclone-unruled:env=HOME,weed:env=HOME,s3fs-unruled:env=HOME,sshfs-unruled:env=HOME";
    let mut on = daemon_args(&confined, &[]);
    on.push(keys_env.into());
    let _a = (confined.start_host(&on), confined.start_front(&on));
    let mut off = daemon_args(&open, &[]);
    off.extend([keys_env.to_string(), "--confine-programs=false".into()]);
    let _b = (open.start_host(&off), open.start_front(&off));
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The rclone case's credentials go by environment, as an rclone plugin passes them.
    // HOME is root's home as each daemon sees it, through /proc/<its pid>/root: the route a
    // program's arguments could take to the node's tree from its namespace.
    let homes = [
        (tag_of(&confined), format!("/proc/{}/root/root", _a.0.child.id())),
        (tag_of(&open), format!("/proc/{}/root/root", _b.0.child.id())),
    ];
    let env = "RCLONE_S3_ACCESS_KEY_ID=secret:accessKey;RCLONE_S3_SECRET_ACCESS_KEY=secret:secretKey";
    let outcome = |node: &mut NodeClient<UnixChannel>, dirs: &NodeDirs, case: &Case, tag: &str| {
        let home = &homes.iter().find(|(t, _)| *t == tag_of(dirs)).unwrap().1;
        let mut r = Route { args: case.route.args.clone(), ..route("", case.route.program, &[], Expect::Rule("")) };
        for a in &mut r.args {
            *a = a.replace("{filer}", &weed.filer).replace("{s3}", &s3);
        }
        let mut ctx = context(&r, &hosts);
        // rclone stops on a home it may not read (its namespace's answer to the /proc route):
        // its case names root's home by its own path, which its namespace does not have.
        ctx.insert(
            "env".into(),
            if r.program.starts_with("rclone") { format!("{env};HOME=/root") } else { format!("HOME={home}") },
        );
        let id = format!("argv~{}-{tag}", r.program);
        let staging = dirs.staging(&format!("{}-{tag}", r.program));
        let secrets: Vec<(&str, &str)> = case.secrets.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut node = node.clone();
        let req = request(&id, &staging, ctx, &secrets);
        async move {
            let result = stage(&mut node, req).await;
            unstage(&mut node, &id, &staging).await;
            result.map_err(|s| s.message().to_string())
        }
    };
    guarded(&confined, || {
        rt.block_on(async {
            let ch = channel(&confined.csi_sock);
            common::wait_ready(&ch).await;
            let mut on = NodeClient::new(ch);
            let ch = channel(&open.csi_sock);
            common::wait_ready(&ch).await;
            let mut without = NodeClient::new(ch);
            let before: Vec<_> = {
                let mut v = Vec::new();
                for c in cases() {
                    v.push(outcome(&mut on, &confined, &c, "before").await);
                }
                v
            };
            plant(confined.root.path(), &format!("{ak}:{sk}\n"));
            for (i, c) in cases().iter().enumerate() {
                let after = outcome(&mut on, &confined, c, "after").await;
                let unconfined = outcome(&mut without, &open, c, "off").await;
                assert_eq!(after.is_ok(), before[i].is_ok(), "{}: {:?} then {after:?}", c.name, before[i]);
                assert_ne!(
                    after.is_ok(),
                    unconfined.is_ok(),
                    "{}: the planted file changes nothing even unconfined: {after:?} / {unconfined:?}",
                    c.name
                );
                println!(
                    "checked: {}: before planting {}, after {}; without the namespace the planted file is read: {}",
                    c.name,
                    if before[i].is_ok() { "staged" } else { "failed" },
                    if after.is_ok() { "staged" } else { "failed" },
                    unconfined.err().unwrap_or_else(|| "it staged".into())
                );
            }
            // rclone and s3fs under their rule sets, as honest plugins plan them: a file written
            // through the staging path lands in the bucket (read back through the filer).
            for (program, args, secrets, env) in [
                (
                    "rclone",
                    vec![
                        "mount".to_string(),
                        s3_remote.clone(),
                        "{staging}".into(),
                        "--cache-dir={cache}".into(),
                        // Each write uploaded at its close, before the unstage.
                        "--vfs-cache-mode=off".into(),
                    ],
                    keys.to_vec(),
                    "RCLONE_S3_ACCESS_KEY_ID=secret:accessKey;RCLONE_S3_SECRET_ACCESS_KEY=secret:secretKey",
                ),
                (
                    "s3fs",
                    vec![
                        "grants".to_string(),
                        "{staging}".into(),
                        "-f".into(),
                        "-o".into(),
                        format!("url=http://{s3},use_path_request_style"),
                        "-o".into(),
                        "passwd_file={secret:passwd}".into(),
                        "-o".into(),
                        "use_cache={cache}".into(),
                        "-o".into(),
                        "tmpdir={cache}".into(),
                    ],
                    vec![("passwd", format!("{ak}:{sk}"))],
                    "",
                ),
            ] {
                let r = Route { args, ..route("", program, &[], Expect::Rule("")) };
                let mut ctx = context(&r, &hosts);
                if !env.is_empty() {
                    ctx.insert("env".into(), env.into());
                }
                let id = format!("argv~honest-{program}");
                let staging = confined.staging(&format!("honest-{program}"));
                let secrets: Vec<(&str, &str)> = secrets.iter().map(|(k, v)| (*k, v.as_str())).collect();
                stage(&mut on, request(&id, &staging, ctx, &secrets)).await.unwrap_or_else(|e| panic!("{program}: {e:?}"));
                let text = format!("written through {program}\n");
                std::fs::write(staging.join(format!("{program}.txt")), &text).unwrap();
                unstage(&mut on, &id, &staging).await;
                assert_eq!(weed.read(&format!("/buckets/grants/{program}.txt")), (200, text), "{program}");
                assert!(pids_with(&staging.display().to_string()).is_empty(), "{program} is left");
                println!("checked: {program} under @{program} wrote through its mount into the bucket, and is gone after unstage");
            }
        })
    });
}
