//! The environment variables no program gets from a plan unless host config allows them by
//! name: those that make a program run or load other code, read its configuration from
//! somewhere else, or send its traffic or credentials elsewhere.
//!
//! The loader's own variables (`LD_*`, `GCONV_PATH`, `MALLOC_*`, `GLIBC_TUNABLES`) are refused
//! earlier, for every program and whatever host config says ([`super::env_name`]). The names
//! here are refused for a program without `--program-args` rules, and for a program with
//! rules unless a `PROGRAM:env=NAME` rule names them (such a program gets nothing else anyway,
//! see [`super::ArgRules::check_env`]). Names are compared ignoring ASCII case: `http_proxy` is
//! read as much as `HTTP_PROXY`.

/// One entry of the deny list: a name, or a prefix when it ends with `*`, and why.
struct Denied {
    name: &'static str,
    why: &'static str,
}

const fn d(name: &'static str, why: &'static str) -> Denied {
    Denied { name, why }
}

const RUNS: &str = "names a program or library the program would run or load";
const CONFIG: &str = "moves where the program reads its configuration from";
const SHELL: &str = "makes a shell the program starts run other commands";
const TRAFFIC: &str = "sends the program's connections or their keys elsewhere";
const TRUST: &str = "changes which TLS certificates or credentials the program trusts or uses";

/// Every denied name or prefix, with the programs that read it.
const DENIED: &[Denied] = &[
    // Where helper programs come from: sshfs starts `ssh` from PATH, fusermount3 likewise.
    d("PATH", RUNS),
    // ssh runs SSH_ASKPASS (with SSH_ASKPASS_REQUIRE=force even without a terminal, else when
    // DISPLAY is set), loads SSH_SK_PROVIDER, signs with the agent at SSH_AUTH_SOCK, and runs
    // ProxyCommand and LocalCommand with $SHELL.
    d("SSH_ASKPASS", RUNS),
    d("SSH_ASKPASS_REQUIRE", RUNS),
    d("SUDO_ASKPASS", RUNS),
    d("DISPLAY", RUNS),
    d("SSH_SK_PROVIDER", RUNS),
    d("SSH_PKCS11_PROVIDER", RUNS),
    d("SSH_AUTH_SOCK", TRUST),
    d("SHELL", RUNS),
    // OpenSSL (inside ssh, curl and others) loads the engines and providers its config names.
    d("OPENSSL_CONF", RUNS),
    d("OPENSSL_ENGINES", RUNS),
    d("OPENSSL_MODULES", RUNS),
    d("SSLKEYLOGFILE", TRAFFIC),
    d("SSL_CERT_FILE", TRUST),
    d("SSL_CERT_DIR", TRUST),
    d("CURL_CA_BUNDLE", TRUST),
    d("REQUESTS_CA_BUNDLE", TRUST),
    // Shells: startup files, exported functions, and the hooks they run.
    d("BASH_ENV", SHELL),
    d("ENV", SHELL),
    d("BASH_FUNC_*", SHELL),
    d("SHELLOPTS", SHELL),
    d("BASHOPTS", SHELL),
    d("PS4", SHELL),
    d("PROMPT_COMMAND", SHELL),
    d("IFS", SHELL),
    d("CDPATH", SHELL),
    // Interpreters a program may start load code from these.
    d("PYTHON*", RUNS),
    d("PERL5LIB", RUNS),
    d("PERL5OPT", RUNS),
    d("PERLLIB", RUNS),
    d("PERL5DB", RUNS),
    d("RUBYOPT", RUNS),
    d("RUBYLIB", RUNS),
    d("NODE_OPTIONS", RUNS),
    d("NODE_PATH", RUNS),
    d("LUA_PATH*", RUNS),
    d("LUA_CPATH*", RUNS),
    d("LUA_INIT*", RUNS),
    d("JAVA_TOOL_OPTIONS", RUNS),
    d("_JAVA_OPTIONS", RUNS),
    d("JDK_JAVA_OPTIONS", RUNS),
    d("CLASSPATH", RUNS),
    // Programs run to show or edit text, and git's hooks, helpers and config.
    d("EDITOR", RUNS),
    d("VISUAL", RUNS),
    d("PAGER", RUNS),
    d("MANPAGER", RUNS),
    d("BROWSER", RUNS),
    d("LESSOPEN", RUNS),
    d("LESSCLOSE", RUNS),
    d("GIT_*", RUNS),
    // glibc: message catalogs and locales from other files, resolver behaviour.
    d("NLSPATH", CONFIG),
    d("LOCPATH", CONFIG),
    d("HOSTALIASES", TRAFFIC),
    d("RESOLV_HOST_CONF", TRAFFIC),
    d("RES_OPTIONS", TRAFFIC),
    d("LOCALDOMAIN", TRAFFIC),
    // Where programs read their configuration: weed reads security.toml (TLS, JWT keys) from
    // $HOME/.seaweedfs, rclone its remotes from $XDG_CONFIG_HOME or $HOME, git and ssh-based
    // tools their own files.
    d("HOME", CONFIG),
    d("XDG_*", CONFIG),
    d("LIBMOUNT_*", CONFIG),
    // fusermount3 and libfuse hand the FUSE connection over through these.
    d("_FUSE_*", TRUST),
    // rclone reads every one of its flags from RCLONE_<FLAG> (`--rc`, `--config`,
    // `--password-command`) and whole remotes from RCLONE_CONFIG_<REMOTE>_*.
    d("RCLONE_*", RUNS),
    // Proxies: every Go, curl and reqwest client honours them.
    d("HTTP_PROXY", TRAFFIC),
    d("HTTPS_PROXY", TRAFFIC),
    d("ALL_PROXY", TRAFFIC),
    d("NO_PROXY", TRAFFIC),
    d("FTP_PROXY", TRAFFIC),
    // Go's runtime settings can turn off TLS and certificate checks (`x509ignoreCN`,
    // `tlsrsakex`), and weed is a Go program.
    d("GODEBUG", TRUST),
    // Kerberos: another configuration, or the node's tickets and keys.
    d("KRB5_CONFIG", TRUST),
    d("KRB5CCNAME", TRUST),
    d("KRB5_KTNAME", TRUST),
    d("KRB5_CLIENT_KTNAME", TRUST),
    // A session bus is a way to ask other processes to run things.
    d("DBUS_SESSION_BUS_ADDRESS", RUNS),
    d("DBUS_SYSTEM_BUS_ADDRESS", RUNS),
];

/// Why `name` is on the deny list, or `None`.
pub fn denied(name: &str) -> Option<&'static str> {
    let upper = name.to_ascii_uppercase();
    DENIED
        .iter()
        .find(|d| match d.name.strip_suffix('*') {
            Some(prefix) => upper.starts_with(prefix),
            None => upper == d.name,
        })
        .map(|d| d.why)
}

/// Judge a variable a plan sets for `program`, which has no host config rule naming it.
pub fn check(program: &str, name: &str) -> Result<(), String> {
    match denied(name) {
        None => Ok(()),
        Some(why) => Err(format!(
            "program {program:?}: environment variable {name:?} {why}; host config allows it by name \
             (--program-args {program}:env={name})"
        )),
    }
}

/// The deny list as documentation shows it: names, and prefixes ending in `*`.
pub fn listed() -> impl Iterator<Item = &'static str> {
    DENIED.iter().map(|d| d.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_prefixes_are_matched_ignoring_case() {
        for name in ["PATH", "path", "http_proxy", "GIT_SSH_COMMAND", "RCLONE_RC", "XDG_CONFIG_HOME", "PYTHONPATH"] {
            assert!(denied(name).is_some(), "{name}");
        }
        for name in ["PATHX", "MYPATH", "TZ", "AWS_REGION", "WEED_JWT_SIGNING_KEY", "GITX", "SSH_ASKPASSWORD"] {
            assert!(denied(name).is_none(), "{name}");
        }
        let err = check("weed", "HOME").unwrap_err();
        assert_eq!(
            err,
            "program \"weed\": environment variable \"HOME\" moves where the program reads its configuration from; \
             host config allows it by name (--program-args weed:env=HOME)"
        );
    }

    #[test]
    fn docs_policy_md_lists_every_entry() {
        let doc = include_str!("../../../../docs/policy.md");
        let section = &doc[doc.find("A program without rules gets any valid name").expect("the section")..];
        let section = &section[..section.find("### ").unwrap_or(section.len())];
        for name in listed() {
            assert!(section.contains(&format!("`{name}`")), "docs/policy.md does not list {name}");
        }
        // And the table names nothing the code does not deny.
        for row in section.lines().filter(|l| l.starts_with("| `")) {
            let first = row.split('|').nth(1).unwrap();
            for name in first.split('`').skip(1).step_by(2) {
                assert!(listed().any(|l| l == name), "docs/policy.md lists {name}, which the code does not deny");
            }
        }
    }

    #[test]
    fn every_entry_is_a_valid_name_or_prefix_and_listed_once() {
        let mut seen = std::collections::BTreeSet::new();
        for name in listed() {
            let bare = name.strip_suffix('*').unwrap_or(name);
            assert!(super::super::env_name(bare).is_ok(), "{name}");
            assert_eq!(bare, bare.to_ascii_uppercase(), "{name} is written in upper case");
            assert!(seen.insert(name), "{name} twice");
        }
    }
}
