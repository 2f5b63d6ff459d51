//! Program-argument constraints (`--program-args`), every way an option can be spelled, and
//! the missing-grants mode of the policy.

use rstest::rstest;

use super::*;

fn deny(names: &[&str]) -> ArgRules {
    ArgRules { deny: names.iter().map(|n| OptionName::parse(n).unwrap()).collect(), ..ArgRules::default() }
}

fn allow(names: &[&str]) -> ArgRules {
    ArgRules { allow: Some(names.iter().map(|n| OptionName::parse(n).unwrap()).collect()), ..ArgRules::default() }
}

fn sshfs_preset() -> ArgRules {
    ArgRules { deny: option_set("sshfs").unwrap().into_iter().collect(), ..ArgRules::default() }
}

fn lits(args: &[&str]) -> Vec<w::Arg> {
    args.iter().map(|a| lit(a)).collect()
}

/// The fixture with `rules` for its program `fusetest`; checks one spawn with `args`.
fn spawn_with(rules: ArgRules, args: Vec<w::Arg>) -> Result<Plan, PolicyError> {
    let mut f = Fixture::new();
    f.program_args.insert("fusetest".into(), rules);
    f.check(Operation::Stage, vec![spawn("fusetest", args, vec![])])
}

fn secret_file_arg(prefix: &str, key: &str) -> w::Arg {
    w::Arg::SecretFile(w::SecretFileArg { prefix: prefix.into(), key: key.into(), suffix: String::new() })
}

#[rstest]
// -o with the list in the next argument, attached, repeated, among other items
#[case::o_next_arg(lits(&["-o", "ssh_command=sh -c id"]), "ssh_command")]
#[case::o_attached(lits(&["-ossh_command=sh"]), "ssh_command")]
#[case::o_in_list(lits(&["-o", "reconnect,ssh_command=sh"]), "ssh_command")]
#[case::o_repeated(lits(&["-o", "reconnect", "-o", "idmap=user", "-ossh_command=sh"]), "ssh_command")]
#[case::o_without_value(lits(&["-o", "ssh_command"]), "ssh_command")]
// case: ssh options are case-insensitive
#[case::upper_case(lits(&["-o", "SSH_COMMAND=sh"]), "SSH_COMMAND")]
#[case::lower_case_ssh_option(lits(&["-oproxycommand=sh"]), "proxycommand")]
#[case::camel_case_ssh_option(lits(&["-o", "ProxyCommand=sh -c id"]), "ProxyCommand")]
#[case::mixed_case_ssh_option(lits(&["-o", "pRoXyCoMmAnD=sh"]), "pRoXyCoMmAnD")]
// long options
#[case::long_equals(lits(&["--ssh_command=sh"]), "ssh_command")]
#[case::long_next_arg(lits(&["--ssh_command", "sh"]), "ssh_command")]
#[case::long_upper(lits(&["--LocalCommand=sh"]), "LocalCommand")]
// libfuse's escapes in -o lists
#[case::escaped_char(lits(&["-o", "ssh\\_command=sh"]), "ssh_command")]
#[case::escaped_octal(lits(&["-o", "\\163sh_command=sh"]), "ssh_command")]
#[case::escaped_comma(lits(&["-o", "reconnect\\,ssh_command=sh"]), "ssh_command")]
#[case::escaped_equals(lits(&["-o", "ssh_command\\075sh"]), "ssh_command")]
// ssh's config parser: blanks, `keyword value`, quotes
#[case::leading_blank(lits(&["-o", " ProxyCommand=sh"]), "ProxyCommand")]
#[case::blank_separator(lits(&["-o", "ProxyCommand sh -c id"]), "ProxyCommand")]
#[case::quoted_keyword(lits(&["-o", "\"ProxyCommand\"=sh"]), "ProxyCommand")]
// short options: separate, attached, in a cluster, inside an -o list
#[case::short_config_file(lits(&["-F", "/k/evil_config"]), "-F")]
#[case::short_attached(lits(&["-F/k/evil_config"]), "-F")]
#[case::short_in_cluster(lits(&["-fF", "/k/evil_config"]), "-F")]
#[case::short_in_list(lits(&["-o", "-F/k/evil_config"]), "-F")]
#[case::short_in_list_after_item(lits(&["-o", "reconnect,-F/k/evil_config"]), "-F")]
#[case::list_in_list(lits(&["-o", "reconnect,-ossh_command=sh"]), "ssh_command")]
#[case::o_in_cluster_next_arg(lits(&["-fo", "ssh_command=sh"]), "ssh_command")]
#[case::o_in_cluster_attached(lits(&["-foProxyCommand=sh"]), "ProxyCommand")]
// wherever it stands
#[case::after_double_dash(lits(&["--", "-ossh_command=sh"]), "ssh_command")]
#[case::as_a_value(lits(&["-p", "-ossh_command=sh"]), "ssh_command")]
#[case::as_the_host(lits(&["-oProxyCommand=sh:/remote", "/mnt"]), "ProxyCommand")]
// the rest of the preset
#[case::proxy_jump(lits(&["-o", "ProxyJump=evil"]), "ProxyJump")]
#[case::local_command(lits(&["-o", "PermitLocalCommand=yes,LocalCommand=sh"]), "PermitLocalCommand")]
#[case::known_hosts_command(lits(&["-o", "KnownHostsCommand=sh"]), "KnownHostsCommand")]
#[case::pkcs11(lits(&["-o", "PKCS11Provider=/k/evil.so"]), "PKCS11Provider")]
#[case::security_key(lits(&["-o", "SecurityKeyProvider=/k/evil.so"]), "SecurityKeyProvider")]
#[case::control_path(lits(&["-o", "ControlMaster=no,ControlPath=/run/other.sock"]), "ControlMaster")]
#[case::control_path_alone(lits(&["-oControlPath=/run/other.sock"]), "ControlPath")]
#[case::local_command_alone(lits(&["-o", "LocalCommand=sh"]), "LocalCommand")]
#[case::identity_agent(lits(&["-o", "IdentityAgent=/run/agent.sock"]), "IdentityAgent")]
#[case::vsock(lits(&["-o", "vsock=2:22"]), "vsock")]
// the review's finding: ssh_config's alias of PKCS11Provider, which sshfs 3.7.3 passes to ssh
#[case::smartcard_device(lits(&["-o", "SmartcardDevice=/k/evil.so"]), "SmartcardDevice")]
#[case::smartcard_device_attached(lits(&["-osmartcarddevice=/k/evil.so"]), "smartcarddevice")]
#[case::fuse_modules(lits(&["-o", "modules=evil"]), "modules")]
#[case::proxy_use_fdpass(lits(&["-o", "ProxyUseFdpass=yes"]), "ProxyUseFdpass")]
#[case::control_persist(lits(&["-o", "ControlPersist=yes"]), "ControlPersist")]
#[case::forward_agent(lits(&["-o", "ForwardAgent=/run/agent.sock"]), "ForwardAgent")]
#[case::add_keys_to_agent(lits(&["-o", "AddKeysToAgent=yes"]), "AddKeysToAgent")]
#[case::forward_x11(lits(&["-o", "ForwardX11=yes"]), "ForwardX11")]
#[case::forward_x11_trusted(lits(&["-o", "ForwardX11Trusted=yes"]), "ForwardX11Trusted")]
#[case::xauth_location(lits(&["-o", "XAuthLocation=/k/evil"]), "XAuthLocation")]
#[case::local_forward(lits(&["-o", "LocalForward=/k/s /run/containerd/containerd.sock"]), "LocalForward")]
#[case::remote_forward(lits(&["-o", "RemoteForward=2222 /run/containerd/containerd.sock"]), "RemoteForward")]
#[case::dynamic_forward(lits(&["-o", "DynamicForward=1080"]), "DynamicForward")]
#[case::clear_all_forwardings(lits(&["-o", "ClearAllForwardings=no"]), "ClearAllForwardings")]
#[case::gateway_ports(lits(&["-o", "GatewayPorts=yes"]), "GatewayPorts")]
#[case::stream_local_bind_unlink(lits(&["-o", "StreamLocalBindUnlink=yes"]), "StreamLocalBindUnlink")]
#[case::tunnel(lits(&["-o", "Tunnel=ethernet"]), "Tunnel")]
#[case::tunnel_device(lits(&["-o", "TunnelDevice=any"]), "TunnelDevice")]
#[case::hostbased(lits(&["-o", "HostbasedAuthentication=yes"]), "HostbasedAuthentication")]
#[case::enable_ssh_keysign(lits(&["-o", "EnableSSHKeysign=yes"]), "EnableSSHKeysign")]
#[case::gssapi_delegate(lits(&["-o", "GSSAPIDelegateCredentials=yes"]), "GSSAPIDelegateCredentials")]
#[case::update_host_keys(lits(&["-o", "UpdateHostKeys=yes"]), "UpdateHostKeys")]
// what the program receives: paths and secret-file paths filled in
#[case::in_a_path(vec![path_arg("-ocache=", p(DirRoot::Cache, "x,ssh_command=sh"), "")], "ssh_command")]
#[case::in_a_path_suffix(vec![path_arg("-oIdentityFile=", p(DirRoot::Cache, "k"), ",ProxyCommand=sh")], "ProxyCommand")]
#[case::in_a_secret_file_prefix(vec![lit("-o"), secret_file_arg("ssh_command=sh ", "token")], "ssh_command")]
fn the_sshfs_set_refuses_every_spelling(#[case] args: Vec<w::Arg>, #[case] option: &str) {
    let err = spawn_with(sshfs_preset(), args).unwrap_err();
    assert_eq!(err.reason, format!("program \"fusetest\": option {option:?} is denied by host config"), "{err}");
    assert_eq!((err.index, err.kind, err.kind()), (1, "spawn-fuse", ErrorKind::InvalidArgument));
    assert_eq!(err.missing, None, "a denied option is no missing grant");
}

#[test]
fn the_sshfs_set_lets_an_ordinary_sshfs_command_line_through() {
    let args = vec![
        lit("user@sftp.example:/export"),
        path_arg("", p(DirRoot::Staging, ""), ""),
        lit("-f"),
        lit("-p"),
        lit("2222"),
        lit("-C"),
        lit("-o"),
        lit("reconnect,ServerAliveInterval=15,StrictHostKeyChecking=yes,idmap=user"),
        secret_file_arg("-oIdentityFile=", "token"),
        path_arg("-oUserKnownHostsFile=", p(DirRoot::Runtime, "known_hosts"), ""),
        lit("-odirectport=2222"),
    ];
    spawn_with(sshfs_preset(), args).unwrap();
}

#[test]
fn rules_apply_to_their_program_only() {
    let mut f = Fixture::new();
    f.program_args.insert("sshfs".into(), sshfs_preset());
    f.check(Operation::Stage, vec![spawn("fusetest", lits(&["-ossh_command=sh"]), vec![])]).unwrap();
}

#[rstest]
#[case::short(&["-f"])]
#[case::list(&["-o", "reconnect,IDMAP=user"])]
#[case::attached_list(&["-oreconnect"])]
#[case::short_then_value(&["-p", "2222"])]
#[case::positional(&["user@h:/p", "/mnt", "-", "--"])]
#[case::empty_items(&["-o", "reconnect,,", "--="])]
fn an_allow_list_accepts_only_its_names(#[case] args: &[&str]) {
    spawn_with(allow(&["reconnect", "idmap", "-f", "-p"]), lits(args)).unwrap();
}

#[rstest]
#[case::list_item(&["-o", "reconnect,cache=no"], "cache")]
#[case::short(&["-d"], "-d")]
#[case::long(&["--debug"], "debug")]
#[case::cluster(&["-fd"], "-d")]
#[case::attached_value(&["-p2222"], "-2")]
#[case::short_case(&["-F", "x"], "-F")]
#[case::list_argument_item(&["-o", "reconnect,-d"], "-d")]
fn an_allow_list_refuses_other_names(#[case] args: &[&str], #[case] option: &str) {
    let err = spawn_with(allow(&["reconnect", "idmap", "-f", "-p"]), lits(args)).unwrap_err();
    assert_eq!(
        err.reason,
        format!(
            "program \"fusetest\": option {option:?} is not allowed by host config (allowed: -f, -p, idmap, reconnect)"
        ),
        "{args:?}"
    );
}

#[test]
fn single_dash_long_options_are_read_as_go_reads_them() {
    // weed's flags: `-name=value`.
    let rules = allow(&["filer", "dir", "logtostderr"]);
    spawn_with(rules.clone(), lits(&["-logtostderr", "mount", "-filer=f:8888", "-dir=/mnt"])).unwrap();
    let err = spawn_with(rules, lits(&["-cacheDir=/etc"])).unwrap_err();
    assert!(err.reason.contains("option \"cacheDir\" is not allowed"), "{err}");
    for args in [&["-cacheDir=/etc"][..], &["--cachedir", "/etc"], &["-CACHEDIR=/etc"]] {
        let err = spawn_with(deny(&["cacheDir"]), lits(args)).unwrap_err();
        assert!(err.reason.contains("is denied by host config"), "{args:?}: {err}");
    }
}

#[test]
fn deny_wins_over_allow() {
    let rules = ArgRules {
        deny: deny(&["ssh_command"]).deny,
        allow: allow(&["ssh_command", "reconnect"]).allow,
        ..ArgRules::default()
    };
    let err = spawn_with(rules, lits(&["-o", "reconnect,ssh_command=sh"])).unwrap_err();
    assert!(err.reason.ends_with("option \"ssh_command\" is denied by host config"), "{err}");
}

#[test]
fn option_names_in_config_are_validated() {
    assert_eq!(OptionName::parse("ProxyCommand").unwrap(), OptionName::Long("proxycommand".into()));
    assert_eq!(OptionName::parse("-F").unwrap(), OptionName::Short('F'));
    assert_eq!(OptionName::parse("-F").unwrap().to_string(), "-F");
    for (bad, why) in [
        ("--ssh_command", "without dashes"),
        ("-o", "-o introduces an option list"),
        ("-", "must be -X"),
        ("-?", "a short option is"),
        ("", "must be -X"),
        ("a=b", "must be -X"),
        ("a b", "must be -X"),
        ("_x", "must be -X"),
    ] {
        let err = OptionName::parse(bad).unwrap_err();
        assert!(err.contains(why), "{bad:?}: {err}");
    }
    let set = option_set("sshfs").unwrap();
    assert_eq!(set.len(), SSHFS_DENY.len());
    assert!(set.contains(&OptionName::Long("proxycommand".into())) && set.contains(&OptionName::Short('F')));
    assert!(option_set("ssh").is_none());
}

fn stage_spawn(program: &str, fstype: &str, args: Vec<w::Arg>) -> w::Step {
    let w::Step::SpawnFuse(mut s) = spawn(program, args, vec![]) else { unreachable!() };
    s.fstype = fstype.into();
    w::Step::SpawnFuse(s)
}

fn fetch_from(url: &str) -> w::Step {
    w::Step::Fetch(w::Fetch { url: url.into(), headers: vec![], digest: format!("sha256:{}", "a".repeat(64)), size: 1 })
}

fn tmpfs_as(fstype: &str) -> w::Step {
    w::Step::Mount(w::Mount {
        fstype: fstype.into(),
        source: w::MountSource::Named("none".into()),
        target: p(DirRoot::Cache, "m"),
        options: vec![],
        readonly: false,
    })
}

#[test]
fn missing_grants_lists_every_grant_at_once() {
    let f = Fixture::new();
    let ctx = f.ctx(Operation::Stage);
    let plan = w::Plan {
        steps: vec![
            stage_spawn("sshfs", "fuse.sshfs", lits(&["u@h:/p"])),
            fetch_from("https://evil.example/blob"),
            fetch_from("https://registry.local/v2/x"),
            tmpfs_as("ext4"),
        ],
        attributes: vec![],
    };
    // The daemon's mode: the first refusal, which says what it lacks.
    let first = check(&ctx, plan.clone()).unwrap_err();
    assert_eq!((first.index, first.missing.clone()), (1, Some(MissingGrant::Program("sshfs".into()))));
    // The CLI's mode: all of them, each once, in plan order.
    let missing = missing_grants(&ctx, &plan).unwrap();
    assert_eq!(
        missing,
        [
            MissingGrant::Program("sshfs".into()),
            MissingGrant::Binary("sshfs".into()),
            MissingGrant::Fstype("fuse.sshfs".into()),
            MissingGrant::Host("evil.example:443".into()),
            MissingGrant::Fstype("ext4".into()),
        ]
    );
    let flags: Vec<String> = missing.iter().map(|m| m.flag("t")).collect();
    assert_eq!(
        flags,
        [
            "--grant t:program=sshfs",
            "--program sshfs=/absolute/path/to/sshfs",
            "--grant t:fstype=fuse.sshfs",
            "--grant t:host=evil.example:443",
            "--grant t:fstype=ext4",
        ]
    );
    // Granted as the flags say, the plan passes.
    let mut granted = Fixture::new();
    granted.grant.programs.insert("sshfs".into());
    granted.grant.fstypes.extend(["fuse.sshfs".to_string(), "ext4".to_string()]);
    granted.grant.hosts.insert("evil.example:443".into());
    granted.programs.insert("sshfs".into(), "/usr/bin/sshfs".into());
    check(&granted.ctx(Operation::Stage), plan.clone()).unwrap();
    assert_eq!(missing_grants(&granted.ctx(Operation::Stage), &plan).unwrap(), []);
}

#[test]
fn missing_grants_keeps_other_refusals_errors() {
    let mut f = Fixture::new();
    f.program_args.insert("sshfs".into(), sshfs_preset());
    let ctx = f.ctx(Operation::Stage);
    let escape = w::Plan {
        steps: vec![stage_spawn("sshfs", "fuse.sshfs", vec![]), w::Step::Mkdir(p(DirRoot::Cache, "../x"))],
        attributes: vec![],
    };
    let err = missing_grants(&ctx, &escape).unwrap_err();
    assert_eq!((err.index, err.missing.clone()), (2, None));
    assert!(err.reason.contains("would leave the volume's directory"), "{err}");
    // A denied option too, even once the program is granted.
    let denied =
        w::Plan { steps: vec![stage_spawn("sshfs", "fuse.sshfs", lits(&["-ossh_command=sh"]))], attributes: vec![] };
    let err = missing_grants(&ctx, &denied).unwrap_err();
    assert_eq!(err.reason, "program \"sshfs\": option \"ssh_command\" is denied by host config");
}

#[test]
fn registries_and_mirrors_are_missing_hosts_too() {
    let f = Fixture::new();
    let resolve = w::Step::Resolve(w::Resolve {
        reference: "ghcr.example/m:v1".into(),
        mirror: Some("mirror.example:5000".into()),
        auth: w::RegistryAuth::Anonymous,
        insecure: false,
    });
    let plan = w::Plan { steps: vec![resolve], attributes: vec![] };
    let err = check(&f.ctx(Operation::Stage), plan.clone()).unwrap_err();
    assert!(err.reason.contains("--grant t:host=ghcr.example"), "the registry's own hint stays: {err}");
    let missing = missing_grants(&f.ctx(Operation::Stage), &plan).unwrap();
    assert_eq!(
        missing,
        [MissingGrant::Host("ghcr.example:443".into()), MissingGrant::Host("mirror.example:5000".into())]
    );
}

#[test]
fn flags_are_quoted_for_the_shell_where_needed() {
    assert_eq!(MissingGrant::Host("[::1]:8888".into()).flag("p"), "--grant 'p:host=[::1]:8888'");
    assert_eq!(MissingGrant::Fstype("it's".into()).flag("p"), "--grant 'p:fstype=it'\\''s'");
    assert_eq!(MissingGrant::Binary("weed".into()).to_string(), "a binary for program \"weed\"");
}

#[test]
fn every_option_of_the_sshfs_set_is_refused_as_an_o_item() {
    for name in SSHFS_DENY {
        let args = match name.strip_prefix('-') {
            Some(_) => lits(&[name, "/k/x"]),
            None => lits(&["-o", &format!("reconnect,{name}=x")]),
        };
        let err = spawn_with(sshfs_preset(), args).unwrap_err();
        assert_eq!(err.reason, format!("program \"fusetest\": option {name:?} is denied by host config"));
    }
}

/// The fixture with `rules` for its program `fusetest`; checks one spawn with `env`.
fn spawn_env(rules: Option<ArgRules>, env: &[(&str, &str)]) -> Result<Plan, PolicyError> {
    let mut f = Fixture::new();
    if let Some(rules) = rules {
        f.program_args.insert("fusetest".into(), rules);
    }
    let env = env.iter().map(|(n, v)| super::env(n, w::Value::Literal(v.to_string()))).collect();
    f.check(Operation::Stage, vec![spawn("fusetest", lits(&["-f"]), env)])
}

fn with_env(mut rules: ArgRules, names: &[&str]) -> ArgRules {
    rules.env = names.iter().map(|n| n.to_string()).collect();
    rules
}

#[rstest]
// sshfs runs `ssh` from PATH
#[case::path(&[("PATH", "/k/evil-bin")], "PATH")]
// ssh loads the providers (shared libraries) of this OpenSSL configuration
#[case::openssl_conf(&[("OPENSSL_CONF", "/k/evil.cnf")], "OPENSSL_CONF")]
#[case::openssl_modules(&[("OPENSSL_MODULES", "/k")], "OPENSSL_MODULES")]
// ssh runs this program for a passphrase or a host-key confirmation
#[case::askpass(&[("SSH_ASKPASS", "/k/evil"), ("SSH_ASKPASS_REQUIRE", "force")], "SSH_ASKPASS")]
#[case::askpass_require_first(&[("SSH_ASKPASS_REQUIRE", "force"), ("SSH_ASKPASS", "/k/evil")], "SSH_ASKPASS_REQUIRE")]
// ssh loads this library for security keys; signs with the agent at this socket
#[case::sk_provider(&[("SSH_SK_PROVIDER", "/k/evil.so")], "SSH_SK_PROVIDER")]
#[case::auth_sock(&[("SSH_AUTH_SOCK", "/run/agent.sock")], "SSH_AUTH_SOCK")]
#[case::home(&[("HOME", "/k")], "HOME")]
fn a_program_with_rules_gets_no_environment_variable_they_do_not_allow(
    #[case] env: &[(&str, &str)],
    #[case] refused: &str,
) {
    let err = spawn_env(Some(sshfs_preset()), env).unwrap_err();
    assert_eq!(
        err.reason,
        format!("program \"fusetest\": environment variable {refused:?} is not allowed by host config (allowed: none)")
    );
    assert_eq!((err.index, err.kind, err.missing.clone()), (1, "spawn-fuse", None), "{err}");
    // Allowing another variable does not allow this one; allowing it does.
    let err = spawn_env(Some(with_env(sshfs_preset(), &["TZ"])), env).unwrap_err();
    assert!(err.reason.ends_with("is not allowed by host config (allowed: TZ)"), "{err}");
    let names: Vec<&str> = env.iter().map(|(n, _)| *n).collect();
    spawn_env(Some(with_env(sshfs_preset(), &names)), env).unwrap();
}

#[test]
fn a_program_without_rules_gets_no_variable_of_the_deny_list() {
    for listed in crate::plan::policy::env::listed() {
        let name = match listed.strip_suffix('*') {
            Some(prefix) => format!("{prefix}X"),
            None => listed.to_string(),
        };
        for name in [name.clone(), name.to_ascii_lowercase()] {
            let err = spawn_env(None, &[("TZ", "UTC"), (&name, "v")]).unwrap_err();
            assert_eq!((err.index, err.kind), (1, "spawn-fuse"), "{err}");
            assert!(err.reason.starts_with(&format!("program \"fusetest\": environment variable {name:?} ")), "{err}");
            assert!(err.reason.ends_with(&format!("(--program-args fusetest:env={name})")), "{err}");
            // Allowed by name, it passes.
            spawn_env(Some(with_env(ArgRules::default(), &[&name, "TZ"])), &[("TZ", "UTC"), (&name, "v")]).unwrap();
        }
    }
}

#[test]
fn environment_rules_compare_names_exactly_and_apply_to_their_program_only() {
    let rules = with_env(ArgRules::default(), &["TZ", "AWS_REGION"]);
    spawn_env(Some(rules.clone()), &[("TZ", "UTC"), ("AWS_REGION", "eu-west-1")]).unwrap();
    let err = spawn_env(Some(rules.clone()), &[("tz", "UTC")]).unwrap_err();
    assert!(err.reason.contains("environment variable \"tz\" is not allowed by host config (allowed: AWS_REGION, TZ)"));
    // Any rule, an argument rule too, limits the environment; none (the default) keeps the
    // environment as the general rules leave it.
    assert!(spawn_env(Some(deny(&["ssh_command"])), &[("PATH", "/k")]).is_err());
    assert!(spawn_env(Some(allow(&["-f"])), &[("PATH", "/k")]).is_err());
    spawn_env(Some(sshfs_preset()), &[]).unwrap();
    // No rule: the deny list's names are refused, others pass.
    spawn_env(None, &[("TZ", "UTC"), ("AWS_REGION", "eu-west-1")]).unwrap();
    let err = spawn_env(None, &[("TZ", "UTC"), ("OPENSSL_CONF", "/k/x.cnf")]).unwrap_err();
    assert!(err.reason.contains("\"OPENSSL_CONF\" names a program or library"), "{err}");
    // Rules for another program leave this one's environment to the deny list.
    let mut f = Fixture::new();
    f.program_args.insert("sshfs".into(), sshfs_preset());
    let env = vec![super::env("TZ", w::Value::Literal("UTC".into()))];
    f.check(Operation::Stage, vec![spawn("fusetest", vec![], env)]).unwrap();
    let env = vec![super::env("PATH", w::Value::Literal("/k".into()))];
    let err = f.check(Operation::Stage, vec![spawn("fusetest", vec![], env)]).unwrap_err();
    assert!(err.reason.contains("--program-args fusetest:env=PATH"), "{err}");
    // A denied name is allowed by name, for that program only.
    spawn_env(Some(with_env(ArgRules::default(), &["PATH"])), &[("PATH", "/usr/bin")]).unwrap();
    // An allowed name is still subject to the loader rule.
    let err = spawn_env(Some(with_env(ArgRules::default(), &["LD_PRELOAD"])), &[("LD_PRELOAD", "/k/x.so")]);
    assert!(err.unwrap_err().reason.contains("would change what the dynamic loader runs"));
}

#[test]
fn missing_grants_reports_a_refused_environment_variable_as_an_error() {
    let mut f = Fixture::new();
    f.program_args.insert("sshfs".into(), sshfs_preset());
    let w::Step::SpawnFuse(mut s) = stage_spawn("sshfs", "fuse.sshfs", lits(&["u@h:/p"])) else { unreachable!() };
    s.env = vec![super::env("PATH", w::Value::Literal("/k/bin".into()))];
    let plan = w::Plan { steps: vec![w::Step::SpawnFuse(s)], attributes: vec![] };
    let err = missing_grants(&f.ctx(Operation::Stage), &plan).unwrap_err();
    assert_eq!(
        err.reason,
        "program \"sshfs\": environment variable \"PATH\" is not allowed by host config (allowed: none)"
    );
}
