//! A real `sshd` on 127.0.0.1 for the sshfs tests, and what ssh needs of the node to run as a
//! FUSE id.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

pub const SSHFS: &str = "/usr/bin/sshfs";
pub const SSHD: &str = "/usr/sbin/sshd";
pub const SSH_KEYGEN: &str = "/usr/bin/ssh-keygen";
/// The first of the host's default FUSE ids: the first volume's user and group.
pub const FUSE_ID: u32 = 2147418112;

/// Entries for the first `n` FUSE ids in `/etc/passwd` and `/etc/group`, bound over them in
/// this (private) mount namespace.
pub fn provide_fuse_users(dir: &Path, n: u32) {
    let ids = FUSE_ID..FUSE_ID + n;
    let passwd: String =
        ids.clone().map(|id| format!("mounthost-fuse-{id}:x:{id}:{id}::/nonexistent:/usr/sbin/nologin\n")).collect();
    let group: String = ids.map(|id| format!("mounthost-fuse-{id}:x:{id}:\n")).collect();
    for (file, entries) in [("passwd", passwd), ("group", group)] {
        let etc = Path::new("/etc").join(file);
        let text = std::fs::read_to_string(&etc).unwrap() + &entries;
        let copy = dir.join(file);
        std::fs::write(&copy, text).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
        let ok = Command::new("mount").arg("--bind").arg(&copy).arg(&etc).status().unwrap().success();
        assert!(ok, "binding {} over {}", copy.display(), etc.display());
    }
}

/// Whether the binaries are here. Missing: skip, but fail under `CI=true`.
pub fn binaries_present() -> bool {
    let missing: Vec<&str> = [SSHFS, SSHD, SSH_KEYGEN].into_iter().filter(|b| !Path::new(b).exists()).collect();
    if missing.is_empty() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{missing:?} missing under CI=true: scripts/test.sh installs sshfs and openssh-server");
    }
    eprintln!("skipped: {missing:?} not installed (apt-get install sshfs openssh-server)");
    false
}

/// An `sshd` on a free loopback port serving `data` to root, by a generated key only.
pub struct Sshd {
    pub _dir: tempfile::TempDir,
    pub child: Child,
    pub port: u16,
    pub data: PathBuf,
    pub user_key: String,
    pub known_hosts: String,
}

impl Sshd {
    pub fn start() -> Sshd {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for name in ["host_key", "user_key"] {
            let ok = Command::new(SSH_KEYGEN)
                .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
                .arg(d.join(name))
                .status()
                .unwrap()
                .success();
            assert!(ok, "ssh-keygen {name}");
        }
        std::fs::copy(d.join("user_key.pub"), d.join("authorized_keys")).unwrap();
        let data = d.join("data");
        std::fs::create_dir(&data).unwrap();
        let port = free_port();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {dir}/host_key\nAuthorizedKeysFile {dir}/authorized_keys\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
             PermitRootLogin prohibit-password\nAllowUsers root\nPidFile none\nSubsystem sftp internal-sftp\n",
            dir = d.display()
        );
        std::fs::write(d.join("sshd_config"), config).unwrap();
        // sshd's privilege separation directory.
        std::fs::create_dir_all("/run/sshd").unwrap();
        let log = std::fs::File::create(d.join("sshd.log")).unwrap();
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < until,
                "sshd did not listen: {}",
                std::fs::read_to_string(d.join("sshd.log")).unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let host_pub = std::fs::read_to_string(d.join("host_key.pub")).unwrap();
        let known_hosts =
            format!("[127.0.0.1]:{port} {}\n", host_pub.split_whitespace().take(2).collect::<Vec<_>>().join(" "));
        let user_key = std::fs::read_to_string(d.join("user_key")).unwrap();
        Sshd { _dir: dir, child, port, data, user_key, known_hosts }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
