//! Rule sets and the host-fd rules through the policy (issue 40): every argument judged, the
//! refusal naming the program, the argument, its position and the rule.

use super::*;
use crate::plan::rules::builtin;

/// The fixture granting `weed` (under `@weed`) and `sshfs` (under `@sshfs`).
fn granted() -> Fixture {
    let mut f = Fixture::new();
    for (name, fstype) in [("weed", "fuse.seaweedfs"), ("sshfs", "fuse.sshfs")] {
        f.grant.programs.insert(name.into());
        f.grant.fstypes.insert(fstype.into());
        f.programs.insert(name.into(), PathBuf::from(format!("/usr/bin/{name}")));
        f.rules.sets.insert(name.into(), builtin(name).unwrap());
    }
    f
}

fn weed(args: Vec<w::Arg>, env: Vec<w::EnvVar>) -> w::Step {
    let w::Step::SpawnFuse(mut s) = spawn("weed", args, env) else { unreachable!() };
    s.fstype = "fuse.seaweedfs".into();
    w::Step::SpawnFuse(s)
}

/// The stock plugin's argv, with `extra` after it.
fn weed_args(extra: &[w::Arg]) -> Vec<w::Arg> {
    let mut a = vec![
        lit("-logtostderr"),
        lit("mount"),
        lit("-filer=filer:8888"),
        lit("-filer.path=/buckets/pv"),
        path_arg("-dir=", p(DirRoot::Staging, ""), ""),
        path_arg("-cacheDir=", p(DirRoot::Cache, ""), ""),
        path_arg("-localSocket=", p(DirRoot::Runtime, "mount.sock"), ""),
    ];
    a.extend(extra.iter().cloned());
    a
}

#[test]
fn the_stock_weed_plan_passes_weed() {
    let f = granted();
    let env = vec![env("WEED_JWT_SIGNING_KEY", w::Value::Secret("token".into()))];
    f.check(Operation::Stage, vec![weed(weed_args(&[lit("-readOnly")]), env)]).unwrap();
}

#[test]
fn a_refusal_names_program_argument_position_and_rule() {
    let f = granted();
    let err = f.check(Operation::Stage, vec![weed(weed_args(&[lit("-cacheDir=/etc")]), vec![])]).unwrap_err();
    assert_eq!(err.rule, Some(RuleRef { program: "weed".into(), rule: "options.-cacheDir".into() }));
    assert!(
        err.reason.starts_with("program \"weed\", argument 8 \"-cacheDir=/etc\": option -cacheDir: \"/etc\" is not the volume's cache directory (/s/cache/ab)")
            && err.reason.ends_with("(rule set @weed, rule options.-cacheDir)"),
        "{}",
        err.reason
    );
    assert_eq!((err.index, err.kind), (1, "spawn-fuse"));
}

#[test]
fn a_rule_sets_environment_is_all_a_plan_may_set() {
    let mut f = granted();
    let err = f
        .check(Operation::Stage, vec![weed(weed_args(&[]), vec![env("GOGC", w::Value::Literal("50".into()))])])
        .unwrap_err();
    assert_eq!(err.rule.map(|r| r.rule), Some("env".into()));
    assert!(err.reason.contains("--program-args weed:env=GOGC"), "{}", err.reason);
    // Host config adds one.
    f.program_args.entry("weed".into()).or_default().env.insert("GOGC".into());
    f.check(Operation::Stage, vec![weed(weed_args(&[]), vec![env("GOGC", w::Value::Literal("50".into()))])]).unwrap();
}

#[test]
fn program_args_rules_add_to_a_rule_set() {
    let mut f = granted();
    f.program_args.entry("weed".into()).or_default().deny.insert(OptionName::parse("readOnly").unwrap());
    let err = f.check(Operation::Stage, vec![weed(weed_args(&[lit("-readOnly")]), vec![])]).unwrap_err();
    assert_eq!(err.rule.map(|r| r.rule), Some("program-args".into()));
}

fn sshfs_host_fd(args: Vec<w::Arg>) -> w::Step {
    let w::Step::SpawnFuse(mut s) = spawn("sshfs", args, vec![]) else { unreachable!() };
    s.fstype = "fuse.sshfs".into();
    s.mount = w::FuseMount::HostFd(w::HostFdMount { source: "u@h:/p".into(), options: vec![], readonly: false });
    w::Step::SpawnFuse(s)
}

fn fd_arg() -> w::Arg {
    w::Arg::FuseFd(w::FuseFdArg { prefix: String::new(), suffix: String::new() })
}

#[test]
fn a_program_that_must_run_unprivileged_cannot_mount_by_itself() {
    let mut f = granted();
    f.grant.hosts.insert("sftp.example.com".into());
    // @sshfs: host-fd: required.
    let by_program = {
        let w::Step::SpawnFuse(mut s) =
            spawn("sshfs", vec![lit("u@sftp.example.com:/"), lit("/k/plugins/x/globalmount")], vec![])
        else {
            unreachable!()
        };
        s.fstype = "fuse.sshfs".into();
        w::Step::SpawnFuse(s)
    };
    let err = f.check(Operation::Stage, vec![by_program.clone()]).unwrap_err();
    assert_eq!(err.rule.as_ref().map(|r| r.rule.as_str()), Some("host-fd"));
    assert!(err.reason.contains("rule set @sshfs: host-fd: required"), "{}", err.reason);
    // On the connection the host mounts, it passes.
    f.check(Operation::Stage, vec![sshfs_host_fd(vec![lit("u@sftp.example.com:/"), fd_arg(), lit("-f")])]).unwrap();
    // The node flag requires it of a program without such a rule set.
    f.rules.sets.remove("sshfs");
    f.check(Operation::Stage, vec![by_program.clone()]).unwrap();
    f.rules.host_fd_required.insert("sshfs".into());
    let err = f.check(Operation::Stage, vec![by_program]).unwrap_err();
    assert!(err.reason.contains("--require-host-fd sshfs"), "{}", err.reason);
}

#[test]
fn a_program_that_cannot_take_a_host_connection_is_refused_one() {
    let f = granted();
    let step = {
        let w::Step::SpawnFuse(mut s) = weed(weed_args(&[]), vec![]) else { unreachable!() };
        s.mount = w::FuseMount::HostFd(w::HostFdMount { source: "x".into(), options: vec![], readonly: false });
        s.args.push(fd_arg());
        w::Step::SpawnFuse(s)
    };
    let err = f.check(Operation::Stage, vec![step]).unwrap_err();
    assert!(err.reason.contains("host-fd: unsupported") && err.reason.contains("by-program"), "{}", err.reason);
}

#[test]
fn a_program_that_mounts_by_itself_mounts_where_kubelet_looks() {
    let f = Fixture::new();
    let w::Step::SpawnFuse(mut s) = spawn("fusetest", vec![], vec![]) else { unreachable!() };
    s.mountpoint = p(DirRoot::Cache, "m");
    let err = f.check(Operation::Stage, vec![w::Step::SpawnFuse(s)]).unwrap_err();
    assert!(err.reason.contains("staging or target directory"), "{}", err.reason);
}

#[test]
fn a_plan_runs_one_fuse_program() {
    let f = Fixture::new();
    let err = f
        .check(
            Operation::Stage,
            vec![
                spawn("fusetest", vec![], vec![]),
                w::Step::Mkdir(p(DirRoot::Cache, "x")),
                spawn("fusetest", vec![], vec![]),
            ],
        )
        .unwrap_err();
    assert_eq!(err.index, 0);
    assert!(err.reason.contains("steps 1 and 3 both spawn a FUSE program"), "{}", err.reason);
}
