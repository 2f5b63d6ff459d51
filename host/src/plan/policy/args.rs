//! Constraints on a granted program's arguments and environment (host config
//! `--program-args`).
//!
//! A program grant is a trust decision: the program runs with whatever arguments and
//! environment a plan gives it, and some programs run other programs on request. `sshfs` runs
//! `-o ssh_command=CMD` instead of ssh, and ssh runs `-o ProxyCommand=CMD` and
//! `-o LocalCommand=CMD`; sshfs runs `ssh` from `PATH`, and ssh loads the library
//! `SSH_SK_PROVIDER` names and the providers of the OpenSSL configuration `OPENSSL_CONF` names.
//! So the operator may deny option names per program, or allow only some, and the policy
//! judges the arguments the program would receive (paths and secret-file paths filled in)
//! before anything runs. A program with any rule gets only the environment variables its rules
//! allow (none unless `env=NAME` allows one).
//!
//! Programs parse their arguments in different ways, so the host reads every option name an
//! argument *could* carry, whichever way the program reads it ([`readings`]):
//!
//! - `--NAME`, `--NAME=VALUE`: `NAME`.
//! - `-o LIST` (the list in the next argument), `-oLIST`, and an `o` inside a cluster of short
//!   options (`-fo LIST`, `-foLIST`): every item of LIST, split at every `,` (libfuse's
//!   escaped `\,` too), each with libfuse's backslash escapes (`\c`, `\NNN`) undone, up to its
//!   first `=` or blank, quotes dropped (ssh's config parser strips them). An item that starts
//!   with `-` is read as an argument of its own: libfuse matches such items against the
//!   program's `-F`-style templates.
//! - any other `-XYZ`: the short options `-X`, `-Y`, `-Z` as getopt reads a cluster (up to an
//!   `o`, which starts an option list) and, with two or more characters, also the single-dash
//!   long option `XYZ` as Go's `flag` package reads it (`-filer=host`).
//! - Every argument is read wherever it stands: after `--`, and as the value of an option
//!   before it (a value that looks like an option is judged as one).
//! - Arguments that do not start with `-` name nothing.
//!
//! Long names (and `-o` items) are compared ignoring ASCII case, as ssh and sshfs compare ssh
//! options; short options exactly (`-f` is not `-F`). A denied name anywhere refuses the plan.
//! With an allow-list every name must be allowed, where for an argument that has two readings
//! (a single dash and several characters) one reading naming only allowed options is enough.

use std::collections::BTreeSet;
use std::fmt;

/// An option name, in host config or read from a program's arguments.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OptionName {
    /// A short option, `-F`: compared exactly.
    Short(char),
    /// A long option (`--name`, `-name`) or an item of an `-o` list (`name=value`), kept in
    /// ASCII lower case: compared ignoring case.
    Long(String),
}

impl OptionName {
    /// A name as host config writes it: `-X` (a short option: one ASCII letter or digit), or a
    /// long or `-o` option name without dashes (ASCII letters, digits, `_`, `.` and `-`,
    /// starting with a letter or digit), e.g. `ssh_command`, `ProxyCommand`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut chars = s.chars();
        if let (Some('-'), Some(c), None) = (chars.next(), chars.next(), chars.next()) {
            return match c {
                'o' => Err(format!(
                    "option name {s:?}: -o introduces an option list; name the options in it (e.g. ssh_command)"
                )),
                c if c.is_ascii_alphanumeric() => Ok(OptionName::Short(c)),
                _ => Err(format!("option name {s:?}: a short option is - and one letter or digit")),
            };
        }
        if s.starts_with('-') && !s.trim_start_matches('-').is_empty() {
            return Err(format!(
                "option name {s:?}: write long and -o option names without dashes (e.g. {:?}), short options as -X",
                s.trim_start_matches('-')
            ));
        }
        let valid = s.len() <= 128
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !valid {
            return Err(format!(
                "option name {s:?} must be -X or ASCII letters, digits, '_', '.' and '-' starting with a letter or digit"
            ));
        }
        Ok(OptionName::Long(s.to_ascii_lowercase()))
    }
}

impl fmt::Display for OptionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionName::Short(c) => write!(f, "-{c}"),
            OptionName::Long(n) => f.write_str(n),
        }
    }
}

/// What host config lets one program's arguments name, and the environment variables it may
/// be given. A program with rules gets only the variables in `env`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArgRules {
    /// Option names refused wherever an argument could carry them.
    pub deny: BTreeSet<OptionName>,
    /// When set, the only option names accepted.
    pub allow: Option<BTreeSet<OptionName>>,
    /// The only environment variables a plan may set for the program (names compared
    /// exactly); empty: none.
    pub env: BTreeSet<String>,
}

impl ArgRules {
    /// Judge one environment variable a plan sets for `program`.
    pub fn check_env(&self, program: &str, name: &str) -> Result<(), String> {
        if self.env.contains(name) {
            return Ok(());
        }
        let allowed: Vec<&str> = self.env.iter().map(String::as_str).collect();
        let allowed = if allowed.is_empty() { "none".to_string() } else { allowed.join(", ") };
        Err(format!(
            "program {program:?}: environment variable {name:?} is not allowed by host config (allowed: {allowed})"
        ))
    }

    /// Judge the arguments `program` would receive, in order; the error names the program and
    /// the first option refused.
    pub fn check(&self, program: &str, args: &[String]) -> Result<(), String> {
        for (i, arg) in args.iter().enumerate() {
            let readings = readings(arg, args.get(i + 1).map(String::as_str));
            if let Some(f) = readings.iter().flatten().find(|f| self.deny.contains(&f.name)) {
                return Err(format!("program {program:?}: option {:?} is denied by host config", f.shown));
            }
            let Some(allow) = &self.allow else { continue };
            let refused = |r: &Vec<Found>| {
                r.iter().filter(|f| !allow.contains(&f.name)).map(|f| &f.name).collect::<BTreeSet<_>>().len()
            };
            if readings.is_empty() || readings.iter().any(|r| refused(r) == 0) {
                continue;
            }
            // The reading that refuses the fewest names says best what is wrong (the first on a tie:
            // the short options and -o lists).
            let closest = readings.iter().min_by_key(|r| refused(r)).expect("readings is not empty");
            let f = closest.iter().find(|f| !allow.contains(&f.name)).expect("a refused reading refuses a name");
            let allowed: Vec<String> = allow.iter().map(ToString::to_string).collect();
            let allowed = if allowed.is_empty() { "none".to_string() } else { allowed.join(", ") };
            return Err(format!(
                "program {program:?}: option {:?} is not allowed by host config (allowed: {allowed})",
                f.shown
            ));
        }
        Ok(())
    }
}

/// Options of sshfs(1), libfuse and ssh_config(5) through which sshfs's arguments run a
/// command, load a library, read another ssh configuration or reach a socket, a device or a
/// credential other than the server and the key the plan names: the option set `@sshfs` of
/// `--program-args PROGRAM:deny=@sshfs`. Checked against sshfs 3.7.3 and OpenSSH 9.2; sshfs
/// passes ssh only the ssh options it knows (3.7.3: the ones marked "passed"), and those it
/// does not are denied too, in case a later sshfs passes them. One line each, the reason:
pub const SSHFS_DENY: &[&str] = &[
    // sshfs runs this command instead of `ssh`.
    "ssh_command",
    // An ssh_config file, which can set every ssh option (those below, `Include`, `Match exec`).
    "-F",
    // sshfs connects to a VM socket (AF_VSOCK) instead of the server (later sshfs releases).
    "vsock",
    // libfuse loads `libfusemod_NAME.so` for a module it does not have built in.
    "modules",
    // ssh runs a command (through the shell) to connect; passed.
    "ProxyCommand",
    // ssh runs another `ssh` to a jump host, with text from the option; passed.
    "ProxyJump",
    // ssh takes its connection from the ProxyCommand's descriptor: only with ProxyCommand; passed.
    "ProxyUseFdpass",
    // ssh runs LocalCommand after connecting when PermitLocalCommand is yes; both passed.
    "LocalCommand",
    "PermitLocalCommand",
    // ssh runs a command to read host keys.
    "KnownHostsCommand",
    // ssh loads that shared library into itself; passed (SmartcardDevice is its alias).
    "PKCS11Provider",
    "SmartcardDevice",
    // ssh loads that shared library (FIDO security keys).
    "SecurityKeyProvider",
    // ssh creates a master socket at ControlPath, or uses another session's listening there,
    // and ControlPersist keeps a master running in the background; passed.
    "ControlMaster",
    "ControlPath",
    "ControlPersist",
    // ssh connects to the agent socket at that path and signs with its keys; passed.
    "IdentityAgent",
    // ssh hands the agent (SSH_AUTH_SOCK or a socket path) to the server, which signs with it.
    "ForwardAgent",
    // ssh adds the key it used to the agent socket (another session's).
    "AddKeysToAgent",
    // ssh connects the server to the node's X display (its socket) and runs xauth
    // (XAuthLocation names the program).
    "ForwardX11",
    "ForwardX11Trusted",
    "XAuthLocation",
    // ssh listens on the node (TCP, or a socket file at any path), or lets the server connect to
    // any socket on the node (a container runtime's, say). sshfs sets ClearAllForwardings=yes
    // first; the others only matter with a forward (GatewayPorts opens it to the network,
    // StreamLocalBindUnlink removes the file at the socket path first).
    "LocalForward",
    "RemoteForward",
    "DynamicForward",
    "ClearAllForwardings",
    "GatewayPorts",
    "StreamLocalBindUnlink",
    // ssh opens a tun/tap device on the node and bridges it to the server's network.
    "Tunnel",
    "TunnelDevice",
    // ssh runs ssh-keysign to sign with the node's host key (hostbased authentication passed).
    "HostbasedAuthentication",
    "EnableSSHKeysign",
    // ssh hands the node's Kerberos credentials to the server; passed.
    "GSSAPIDelegateCredentials",
    // ssh rewrites the known-hosts file (a path the plan names) with keys the server sends; passed.
    "UpdateHostKeys",
];

/// The built-in option sets host config names as `@NAME`.
pub const OPTION_SETS: &[(&str, &[&str])] = &[("sshfs", SSHFS_DENY)];

/// The names of the option set `@name`, if there is one.
pub fn option_set(name: &str) -> Option<Vec<OptionName>> {
    let (_, names) = OPTION_SETS.iter().find(|(n, _)| *n == name)?;
    Some(names.iter().map(|n| OptionName::parse(n).expect("built-in option names are valid")).collect())
}

/// An option name read from an argument, and how the argument spelled it (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Found {
    name: OptionName,
    shown: String,
}

impl Found {
    fn short(c: char) -> Self {
        Found { name: OptionName::Short(c), shown: format!("-{c}") }
    }

    /// The name in `text` (an `-o` item, or what follows `--` or `-`): up to the first `=` or
    /// blank, leading blanks skipped, quotes dropped. `None` if that is empty.
    fn long(text: &str) -> Option<Self> {
        let text = text.trim_start();
        let end = text.find(|c: char| c == '=' || c.is_whitespace()).unwrap_or(text.len());
        let shown: String = text[..end].chars().filter(|c| !matches!(c, '"' | '\'')).collect();
        (!shown.is_empty()).then(|| Found { name: OptionName::Long(shown.to_ascii_lowercase()), shown })
    }
}

/// The ways `arg` can be read, each the option names it carries; `next` is the argument after
/// it (an `-o` list). Empty for an argument that names no option.
fn readings(arg: &str, next: Option<&str>) -> Vec<Vec<Found>> {
    let Some(body) = arg.strip_prefix('-') else { return Vec::new() };
    if body.is_empty() || body == "-" {
        return Vec::new();
    }
    if let Some(long) = body.strip_prefix('-') {
        return vec![Found::long(long).into_iter().collect()];
    }
    let (mut shorts, list) = cluster(body);
    match list {
        Some("") => shorts.extend(next.map(list_names).unwrap_or_default()),
        Some(list) => shorts.extend(list_names(list)),
        None => {}
    }
    let mut readings = vec![shorts];
    if let Some(long) = single_dash_long(body) {
        readings.push(vec![long]);
    }
    readings
}

/// `XYZ` of `-XYZ` read as getopt reads a cluster: the short options before the first `o`,
/// and what follows that `o` (its option list; empty: the list is the next argument).
fn cluster(body: &str) -> (Vec<Found>, Option<&str>) {
    let mut shorts = Vec::new();
    for (i, c) in body.char_indices() {
        if c == 'o' {
            return (shorts, Some(&body[i + 1..]));
        }
        shorts.push(Found::short(c));
    }
    (shorts, None)
}

/// `XYZ` of `-XYZ` read as a single-dash long option (Go's `flag`), when the name has two or
/// more characters (one is the short option `-X`).
fn single_dash_long(body: &str) -> Option<Found> {
    Found::long(body).filter(|f| f.shown.chars().nth(1).is_some())
}

/// The option names of an `-o` list, every way its items can be read. Items that are
/// arguments themselves (`-F/path`, `-oitem`) are read in turn, without recursion.
fn list_names(list: &str) -> Vec<Found> {
    let mut names = Vec::new();
    let mut lists = vec![list.to_string()];
    while let Some(list) = lists.pop() {
        for item in list.split(',') {
            let item = unescape(item);
            let Some(body) = item.strip_prefix('-') else {
                names.extend(Found::long(&item));
                continue;
            };
            if let Some(long) = body.strip_prefix('-') {
                names.extend(Found::long(long));
                continue;
            }
            let (shorts, inner) = cluster(body);
            names.extend(shorts);
            lists.extend(inner.filter(|l| !l.is_empty()).map(str::to_string));
            names.extend(single_dash_long(body));
        }
    }
    names
}

/// An `-o` item as libfuse hands it to the program: `\NNN` (octal, `\000` to `\377`) is that
/// byte, `\c` is `c`, a trailing `\` stays.
fn unescape(item: &str) -> String {
    let b = item.as_bytes();
    let octal = |i: usize, hi: u8| b.get(i).is_some_and(|c| (b'0'..=hi).contains(c));
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            if octal(i + 1, b'3') && octal(i + 2, b'7') && octal(i + 3, b'7') {
                out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
                i += 4;
            } else {
                out.push(b[i + 1]);
                i += 2;
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
