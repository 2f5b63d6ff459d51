//! Which libfuse a program links, read from its ELF file's `DT_NEEDED` entries (what `ldd`
//! starts from), for `plugin check`: a program linked with libfuse 3 (3.3 or later takes an
//! already mounted `/dev/fd/N`) can run on a connection the host mounts (`fuse-mount.host-fd`),
//! one linked with libfuse 2 cannot. A program that needs neither itself (a Go program, a static
//! build, one that gets libfuse through another library) tells nothing here: only running it
//! tells. Only the program's own entries are read, not those of the libraries it needs.

use std::path::Path;

use object::read::elf::{Dyn, ElfFile64, FileHeader};

/// What the program's dynamic section says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Linked {
    /// `libfuse3.so.*`.
    Fuse3(String),
    /// `libfuse.so.2` (or another `libfuse.so.*`).
    Fuse2(String),
    /// An ELF file whose own `DT_NEEDED` entries name no libfuse.
    Neither,
    /// Not something this can read: the reason.
    Unknown(String),
}

/// The libfuse `program` needs, from its ELF `DT_NEEDED` entries (64-bit, the only binaries
/// this host runs).
pub fn linked(program: &Path) -> Linked {
    let file = match std::fs::File::open(program) {
        Ok(f) => f,
        Err(e) => return Linked::Unknown(format!("cannot read it: {e}")),
    };
    // Read as needed (the headers, the dynamic section and its strings), not the whole binary
    // (weed is over 100 MiB).
    let data = object::ReadCache::new(file);
    if object::ReadRef::read_bytes_at(&data, 0, 4) != Ok(b"\x7fELF".as_slice()) {
        return Linked::Unknown("not an ELF file (a script?)".into());
    }
    let elf = match ElfFile64::<object::Endianness, _>::parse(&data) {
        Ok(f) => f,
        Err(e) => return Linked::Unknown(format!("not a 64-bit ELF file it can read: {e}")),
    };
    match needed(&elf) {
        Ok(libs) => of(&libs),
        Err(e) => Linked::Unknown(format!("its dynamic section: {e}")),
    }
}

/// The `DT_NEEDED` names of `elf`, in order.
fn needed<'d, R: object::ReadRef<'d>>(elf: &ElfFile64<'d, object::Endianness, R>) -> object::Result<Vec<String>> {
    let (header, data, endian) = (elf.elf_header(), elf.data(), elf.endian());
    let sections = header.sections(endian, data)?;
    let mut out = Vec::new();
    if let Some((dynamic, link)) = sections.dynamic(endian, data)? {
        let strings = sections.strings(endian, data, link)?;
        for entry in dynamic {
            if entry.tag32(endian) == Some(object::elf::DT_NEEDED as i32) {
                let name = entry.string(endian, strings)?;
                out.push(String::from_utf8_lossy(name).into_owned());
            }
        }
    }
    Ok(out)
}

/// Which libfuse a list of needed libraries names.
fn of(libs: &[String]) -> Linked {
    if let Some(l) = libs.iter().find(|l| l.starts_with("libfuse3.so")) {
        return Linked::Fuse3(l.clone());
    }
    if let Some(l) = libs.iter().find(|l| l.starts_with("libfuse.so")) {
        return Linked::Fuse2(l.clone());
    }
    Linked::Neither
}

impl Linked {
    /// One line for the report: what it links and what that means for `host-fd`.
    pub fn describe(&self) -> String {
        match self {
            Linked::Fuse3(l) => {
                format!("links {l} (libfuse 3: from 3.3 it takes a connection the host mounts, host-fd)")
            }
            Linked::Fuse2(l) => {
                format!(
                    "links {l} (libfuse 2: it cannot take a connection the host mounts; plan fuse-mount.by-program)"
                )
            }
            Linked::Neither => {
                "links no libfuse (a Go or static program: whether it takes /dev/fd/N, only running it tells)"
                    .to_string()
            }
            Linked::Unknown(why) => format!("cannot tell which libfuse it links: {why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tell_the_versions_apart() {
        let libs = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(of(&libs(&["libc.so.6", "libfuse3.so.3"])), Linked::Fuse3("libfuse3.so.3".into()));
        assert_eq!(of(&libs(&["libfuse.so.2", "libc.so.6"])), Linked::Fuse2("libfuse.so.2".into()));
        assert_eq!(of(&libs(&["libc.so.6"])), Linked::Neither);
    }

    #[test]
    fn reads_real_binaries() {
        // This test's own binary is a 64-bit ELF that needs libc and no libfuse.
        let me = std::env::current_exe().unwrap();
        assert_eq!(linked(&me), Linked::Neither);
        let script = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(script.path(), "#!/bin/sh\n").unwrap();
        assert!(matches!(linked(script.path()), Linked::Unknown(w) if w.contains("not an ELF")));
        // Debian 12's, as scripts/test.sh installs them.
        assert!(matches!(linked(Path::new("/usr/bin/sshfs")), Linked::Fuse3(l) if l == "libfuse3.so.3"));
        assert!(matches!(linked(Path::new("/usr/bin/bindfs")), Linked::Fuse2(l) if l == "libfuse.so.2"));
        assert!(matches!(linked(Path::new("/usr/bin/s3fs")), Linked::Fuse2(l) if l == "libfuse.so.2"));
    }
}
