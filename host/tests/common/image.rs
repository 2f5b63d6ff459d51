//! Ordinary container images for the `model` plugin's image tests (issue 45), built with the
//! real tools, and the trees a volume of one must show.
//!
//! [`fixtures`] builds the images once with `umoci` (`init`, `new`, `unpack`, a change of the
//! bundle's rootfs, `repack --refresh-bundle`, per layer; one hand-made layer with an opaque
//! directory, added by `umoci raw add-layer`, because umoci never writes one), unpacks each with
//! `umoci unpack` into the tree a volume must equal (for [`Image::Hostile`], whose top layer umoci
//! must not be trusted with, the tree of the same image with a layer of its legitimate entries
//! alone), and copies each with `skopeo copy` into a
//! `dir:` layout per push variant: gzip layers (as umoci wrote them), zstd
//! (`--dest-compress --dest-compress-format zstd`), uncompressed (`--dest-decompress`) and a
//! Docker v2 schema 2 manifest (`--format v2s2`). [`push`] then sends one variant to a registry
//! with `skopeo copy --preserve-digests`, byte for byte: skopeo 1.9 pushing straight from an
//! OCI layout to a registry with a compression flag reuses the blobs it saw before (its blob
//! info cache) and silently keeps gzip, and `--dest-decompress` acts on `dir:` destinations only.
//!
//! The build takes a few seconds and its result never changes for a given builder (this file)
//! and tool versions, so it is kept below the test target's temporary directory
//! (`CARGO_TARGET_TMPDIR`), keyed by both: each test of a binary runs in a process of its own
//! (`in_private_namespace` re-executes it), and the first one to want the fixtures builds them
//! under a file lock while the others wait.
//!
//! [`tree`] lists what a directory shows (type, content, link target, numeric owner, mode,
//! inode) and [`assert_same_tree`] compares a volume with the expected tree; [`OpenView`] and
//! [`read_as`] read a volume as another user would.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use super::registry::{Registry, random_file, sha256_digest, sha256_file};

/// The images [`fixtures`] builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Image {
    /// linux/amd64, four layers: a `/models` tree of every kind of entry, then a whiteout and a
    /// replaced file, then a directory removed and made again plus a file outside `/models`,
    /// then (by hand) an opaque directory.
    Main,
    /// linux/arm64, one layer, other content: the second platform of an index.
    Arm64,
    /// linux/amd64, two layers: a lower one with large files and [`LAZY_DELETED`], an upper one
    /// that deletes it (a whiteout) and adds another large file.
    Lazy,
    /// linux/amd64: [`Image::Main`]'s layers and a hand-made hostile one (see [`hostile_layer`]);
    /// its [`Fixtures::expected`] tree is Main with the legitimate entries of that layer alone.
    Hostile,
}

impl Image {
    fn tag(self) -> &'static str {
        match self {
            Image::Main => "main",
            Image::Arm64 => "arm64",
            Image::Lazy => "lazy",
            Image::Hostile => "hostile",
        }
    }
}

/// How an image's manifest and layers are pushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// OCI manifest, `tar+gzip` layers (umoci's own).
    Gzip,
    /// OCI manifest, `tar+zstd` layers.
    Zstd,
    /// OCI manifest, uncompressed `tar` layers.
    Tar,
    /// Docker v2 schema 2 manifest, `rootfs.diff.tar.gzip` layers.
    V2s2,
    /// [`Image::Lazy`] only: the lower layer uncompressed, the upper one gzip.
    Mixed,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Gzip => "gzip",
            Variant::Zstd => "zstd",
            Variant::Tar => "tar",
            Variant::V2s2 => "v2s2",
            Variant::Mixed => "mixed",
        }
    }

    /// The media type every layer of this variant has (`Mixed`: none).
    pub fn layer_type(self) -> Option<&'static str> {
        match self {
            Variant::Gzip => Some(OCI_LAYER_GZIP),
            Variant::Zstd => Some("application/vnd.oci.image.layer.v1.tar+zstd"),
            Variant::Tar => Some(OCI_LAYER_TAR),
            Variant::V2s2 => Some("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Variant::Mixed => None,
        }
    }

    /// The `skopeo copy` flags that make this variant from umoci's layout.
    fn skopeo_flags(self) -> &'static [&'static str] {
        match self {
            Variant::Gzip | Variant::Mixed => &[],
            Variant::Zstd => &["--dest-compress", "--dest-compress-format", "zstd"],
            Variant::Tar => &["--dest-decompress"],
            Variant::V2s2 => &["--format", "v2s2"],
        }
    }
}

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";

/// [`Image::Main`]: the 0600 file owned by 1000:1000.
pub const PRIVATE: &str = "models/private";
/// [`Image::Main`]: a hard-link pair made in the same layer.
pub const HARD_LINKS: (&str, &str) = ("models/hard-a", "models/hard-b");
/// [`Image::Main`]: a set-user-id file (4755, owned by 1000): its volume mode is 0755.
pub const SET_UID: &str = "models/tool";
/// [`Image::Main`]: a set-group-id directory (2775): 0775 in a volume.
pub const SET_GID_DIR: &str = "models/shared";
/// [`Image::Main`]: a relative and an absolute symlink, and a symlink to a directory.
pub const SYMLINKS: [&str; 3] = ["models/rel-link", "models/abs-link", "models/dir-link"];
/// [`Image::Main`]: entries an upper layer deleted (whiteouts, and an opaque directory's).
pub const DELETED: [&str; 5] =
    ["models/doomed.txt", "models/old/x", "models/old/y", "models/sub/nested/deep.txt", "models/sub/nested"];
/// [`Image::Main`]: an absolute symlink to `/etc`: a `path` through it must never reach the
/// node's `/etc`.
pub const ESCAPE: &str = "models/escape";
/// [`Image::Main`]: a FIFO and a character device, which a volume leaves out (umoci unpacks
/// them; the fixtures remove them from the expected tree).
pub const SPECIAL: [&str; 2] = ["models/fifo", "models/null"];
/// [`Image::Main`]: a regular file of the image, for a `path` that names no directory.
pub const A_FILE: &str = "models/config.json";
/// [`Image::Lazy`]: the file of the lower (uncompressed) layer that the upper (gzip) one deletes.
pub const LAZY_DELETED: &str = "models/doomed.bin";
/// [`Image::Lazy`]: a small file of the lower layer that stays.
pub const LAZY_KEPT: &str = "models/keep.txt";
/// [`Image::Lazy`]: sizes of its large random files, lower layer and upper layer.
pub const LAZY_SIZES: (u64, u64) = (24 << 20, 8 << 20);
/// [`Image::Hostile`]: names of entries its top layer puts where they must never be: below a
/// symbolic link of the same layer (`models/lnk -> /etc`), and above the archive's root
/// (`../escape.bin`, [`HOSTILE_ESCAPE_SIZE`] bytes). Neither may exist anywhere on the node.
pub const HOSTILE_NEVER: [&str; 2] = ["passwd-x", "escape.bin"];
/// [`Image::Hostile`]: the size of `../escape.bin`, more than a tar reader's allowance for what
/// lies between two entries (1 MiB), so that skipping it must skip its data as data.
pub const HOSTILE_ESCAPE_SIZE: usize = 2 << 20;

/// The built fixtures (below `root`).
#[derive(Debug)]
pub struct Fixtures {
    pub root: PathBuf,
}

impl Fixtures {
    /// The tree a volume of the whole `image` shows (umoci's unpacked rootfs, without its FIFO
    /// and device node).
    pub fn expected(&self, image: Image) -> PathBuf {
        self.root.join("expected").join(image.tag()).join("rootfs")
    }

    /// The `dir:` layout (skopeo's directory transport) of `image` as `variant`.
    pub fn variant(&self, image: Image, variant: Variant) -> PathBuf {
        self.root.join("variants").join(format!("{}-{}", image.tag(), variant.name()))
    }
}

/// The fixtures, built on first use (see the module's documentation).
pub fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
        std::fs::create_dir_all(base).unwrap();
        let mut key = Sha256::new();
        key.update(include_str!("image.rs"));
        for tool in ["umoci", "skopeo"] {
            let out = Command::new(tool).arg("--version").output().unwrap_or_else(|e| {
                panic!("running {tool} ({e}): scripts/test.sh installs it (apt-get install -y umoci skopeo)")
            });
            key.update(&out.stdout);
        }
        let root = base.join(format!("e2e-images-{}", &hex::encode(key.finalize())[..16]));
        let lock = File::create(base.join("e2e-images.lock")).unwrap();
        let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .unwrap_or_else(|(_, e)| panic!("locking the image fixtures: {e}"));
        if !root.join("complete").exists() {
            let building = base.join(format!("e2e-images-building-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&building);
            std::fs::create_dir_all(&building).unwrap();
            let t = std::time::Instant::now();
            build(&building);
            File::create(building.join("complete")).unwrap();
            let _ = std::fs::remove_dir_all(&root);
            std::fs::rename(&building, &root).unwrap();
            eprintln!("image fixtures built in {:?} at {}", t.elapsed(), root.display());
            // Fixtures of older builders.
            for old in std::fs::read_dir(base).unwrap().flatten() {
                let name = old.file_name().to_string_lossy().into_owned();
                if name.starts_with("e2e-images-") && old.path() != root && !name.contains("building") {
                    let _ = std::fs::remove_dir_all(old.path());
                }
            }
        }
        Fixtures { root }
    })
}

/// Run a command to success; its stdout.
fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr) + String::from_utf8_lossy(&out.stdout)
    );
    out.stdout
}

fn umoci(dir: &Path, args: &[&str]) {
    run(Command::new("umoci").current_dir(dir).args(args));
}

fn sh(dir: &Path, script: &str) {
    run(Command::new("sh").current_dir(dir).args(["-euc", script]));
}

/// One layer of `image:tag` in `layout`: unpacked once into `bundle` (on the first call),
/// changed by `script` (run in the bundle's rootfs), repacked.
fn layer(work: &Path, tag: &str, script: &str) {
    let bundle = format!("bundle-{tag}");
    let image = format!("layout:{tag}");
    if !work.join(&bundle).exists() {
        umoci(work, &["unpack", "--image", &image, &bundle]);
    }
    sh(&work.join(&bundle).join("rootfs"), script);
    umoci(work, &["repack", "--refresh-bundle", "--image", &image, &bundle]);
}

fn build(work: &Path) {
    umoci(work, &["init", "--layout", "layout"]);

    // Image::Main.
    umoci(work, &["new", "--image", "layout:main"]);
    let (weights, _) = random_file(work, (1 << 20) + 3);
    let (page, _) = random_file(work, 4096);
    let script = format!(
        "mkdir -p models/sub/nested models/keep/nested models/old etc
         printf '{{\"architectures\":[\"Test\"]}}' > models/config.json
         : > models/empty
         printf x > models/one-byte
         mv {weights} models/weights.bin
         mv {page} models/page.bin
         head -c 70001 /dev/zero | tr '\\0' 'z' > models/zeros.txt
         echo deep > models/sub/nested/deep.txt
         echo first > models/sub/first.txt
         echo kept > models/keep/nested/kept.txt
         echo secret of 1000 > {PRIVATE}; chown 1000:1000 {PRIVATE}; chmod 0600 {PRIVATE}
         echo linked > models/hard-a; ln models/hard-a models/hard-b
         ln -s config.json models/rel-link
         ln -s /models/config.json models/abs-link
         ln -s sub models/dir-link
         ln -s /etc {ESCAPE}
         echo not a program > {SET_UID}; chown 1000:1000 {SET_UID}; chmod 4755 {SET_UID}
         mkdir {SET_GID_DIR}; chmod 2775 {SET_GID_DIR}; echo s > {SET_GID_DIR}/f
         mkdir models/sticky; chmod 1777 models/sticky
         mkdir models/home; chown 1000:1000 models/home; chmod 0750 models/home; echo h > models/home/h.txt
         mkfifo models/fifo; mknod models/null c 1 3
         echo doomed > models/doomed.txt
         echo first version > models/replace.txt
         echo x > models/old/x; echo y > models/old/y
         echo main > etc/hostname
         echo linux/amd64 > models/platform.txt",
        weights = weights.display(),
        page = page.display(),
    );
    layer(work, "main", &script);
    layer(work, "main", "rm models/doomed.txt; echo the second, longer version > models/replace.txt");
    layer(
        work,
        "main",
        "rm -rf models/old; mkdir models/old; echo z > models/old/z; mkdir -p opt; echo o > opt/outside.txt",
    );
    // An opaque directory, its marker after a sibling of its own layer (which stays).
    let opaque = work.join("opaque.tar");
    {
        let mut tar = tar::Builder::new(File::create(&opaque).unwrap());
        let mut entry = |path: &str, kind: tar::EntryType, mode: u32, data: &[u8]| {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(data.len() as u64);
            h.set_mtime(1_700_000_000);
            tar.append_data(&mut h, path, data).unwrap();
        };
        entry("models/", tar::EntryType::Directory, 0o755, b"");
        entry("models/sub/", tar::EntryType::Directory, 0o755, b"");
        entry("models/sub/fresh.txt", tar::EntryType::Regular, 0o644, b"fresh\n");
        entry("models/sub/.wh..wh..opq", tar::EntryType::Regular, 0o644, b"");
        tar.finish().unwrap();
    }
    umoci(work, &["raw", "add-layer", "--image", "layout:main", "opaque.tar"]);

    // Image::Hostile, and the image of its legitimate entries alone (the expected tree).
    hostile_layer(&work.join("hostile.tar"), true);
    hostile_layer(&work.join("hostile-legit.tar"), false);
    umoci(work, &["raw", "add-layer", "--image", "layout:main", "--tag", "hostile", "hostile.tar"]);
    umoci(work, &["raw", "add-layer", "--image", "layout:main", "--tag", "hostile-legit", "hostile-legit.tar"]);

    // Image::Arm64.
    umoci(work, &["new", "--image", "layout:arm64"]);
    umoci(work, &["config", "--image", "layout:arm64", "--architecture", "arm64", "--os", "linux"]);
    layer(
        work,
        "arm64",
        "mkdir -p models/arm; echo linux/arm64 > models/platform.txt; echo arm > models/arm/only-here.txt",
    );

    // Image::Lazy.
    umoci(work, &["new", "--image", "layout:lazy"]);
    let (big, _) = random_file(work, LAZY_SIZES.0);
    let (doomed, _) = random_file(work, 64 << 10);
    let (late, _) = random_file(work, LAZY_SIZES.1);
    layer(
        work,
        "lazy",
        &format!(
            "mkdir models; mv {} models/big.bin; mv {} {LAZY_DELETED}; echo kept > {LAZY_KEPT}",
            big.display(),
            doomed.display()
        ),
    );
    layer(work, "lazy", &format!("rm {LAZY_DELETED}; mv {} models/late.bin", late.display()));

    // What each volume must show.
    for image in [Image::Main, Image::Arm64, Image::Lazy, Image::Hostile] {
        let dest = format!("expected/{}", image.tag());
        std::fs::create_dir_all(work.join("expected")).unwrap();
        let source = if image == Image::Hostile { "hostile-legit" } else { image.tag() };
        umoci(work, &["unpack", "--image", &format!("layout:{source}"), &dest]);
        let rootfs = work.join(&dest).join("rootfs");
        for (path, entry) in tree(&rootfs) {
            if matches!(entry.kind, Kind::Special(_)) {
                assert!(SPECIAL.contains(&path.as_str()), "umoci unpacked an unexpected special file {path}");
                std::fs::remove_file(rootfs.join(&path)).unwrap();
            }
        }
    }
    let main = tree(&work.join("expected/main/rootfs"));
    for gone in DELETED {
        assert!(!main.contains_key(gone), "umoci kept {gone}");
    }
    let (a, b) = (&main[HARD_LINKS.0], &main[HARD_LINKS.1]);
    assert_eq!(a.ino, b.ino, "umoci unpacked the hard links apart");
    assert_eq!(main[SET_UID].mode & 0o7777, 0o4755);

    // The push variants.
    std::fs::create_dir_all(work.join("variants")).unwrap();
    for (image, variants) in [
        (Image::Main, &[Variant::Gzip, Variant::Zstd, Variant::Tar, Variant::V2s2][..]),
        (Image::Arm64, &[Variant::Gzip, Variant::V2s2]),
        (Image::Lazy, &[Variant::Gzip, Variant::Tar]),
        (Image::Hostile, &[Variant::Gzip, Variant::Zstd, Variant::Tar]),
    ] {
        for &v in variants {
            let dest = format!("dir:variants/{}-{}", image.tag(), v.name());
            run(Command::new("skopeo")
                .current_dir(work)
                .args(["copy", "-q"])
                .args(v.skopeo_flags())
                .arg(format!("oci:layout:{}", image.tag()))
                .arg(dest));
            let manifest = read_json(&work.join(format!("variants/{}-{}/manifest.json", image.tag(), v.name())));
            let types = layer_types(&manifest);
            assert!(types.iter().all(|t| Some(t.as_str()) == v.layer_type()), "{image:?} {v:?}: {types:?}");
        }
    }
    mixed_lazy(work);
    for bundle in ["bundle-main", "bundle-arm64", "bundle-lazy"] {
        std::fs::remove_dir_all(work.join(bundle)).unwrap();
    }
}

/// [`Image::Hostile`]'s top layer, written to `path` (an uncompressed tar, its headers made
/// by hand: the tar crate refuses to write `..`), over [`Image::Main`]; `hostile` false: its
/// legitimate entries alone, the layer whose image umoci unpacks into the expected tree.
///
/// In archive order: an explicit `models/`; whiteouts of no name a lower layer can have
/// (`models/.wh..`, `models/.wh...`, `.wh...`: `.`, `..`), and a legitimate one
/// (`models/.wh.one-byte`); a symbolic link `models/lnk -> /etc` (kept: an image's links keep
/// any target) and a file below it, `models/lnk/passwd-x`; `../escape.bin` of
/// [`HOSTILE_ESCAPE_SIZE`] bytes; a directory `models/.wh.dir/` (a whiteout's name) with a child;
/// two explicit directories of 1000 (0700 and 0750), one holding a file named
/// `.wh..wh..implicit` (the unpacker's own marker of a directory the layer only implies) and the
/// other a directory of that name with a child; and last, after all of them, an ordinary file
/// (the layer was read to its end).
fn hostile_layer(path: &Path, hostile: bool) {
    use tar::EntryType::{Directory as D, Regular as F, Symlink as L};
    let mut tar = tar::Builder::new(File::create(path).unwrap());
    let mut entry = |name: &str, kind: tar::EntryType, mode: u32, owner: u32, data: &[u8], link: &str| {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(owner.into());
        h.set_gid(owner.into());
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        let old = h.as_old_mut();
        assert!(name.len() < old.name.len() && link.len() < old.linkname.len());
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_cksum();
        tar.append(&h, data).unwrap();
    };
    let escape = vec![b'e'; HOSTILE_ESCAPE_SIZE];
    entry("models/", D, 0o755, 0, b"", "");
    if hostile {
        entry("models/.wh..", F, 0o644, 0, b"", "");
        entry("models/.wh...", F, 0o644, 0, b"", "");
        entry(".wh...", F, 0o644, 0, b"", "");
    }
    entry("models/.wh.one-byte", F, 0o644, 0, b"", "");
    entry("models/lnk", L, 0o777, 0, b"", "/etc");
    if hostile {
        entry("models/lnk/passwd-x", F, 0o644, 0, b"x:0:0::/:/bin/sh\n", "");
        entry("../escape.bin", F, 0o644, 0, &escape, "");
        entry("models/.wh.dir/", D, 0o755, 0, b"", "");
        entry("models/.wh.dir/child", F, 0o644, 0, b"child\n", "");
    }
    entry("models/hostile-a/", D, 0o700, 1000, b"", "");
    if hostile {
        entry("models/hostile-a/.wh..wh..implicit", F, 0o644, 0, b"", "");
    }
    entry("models/hostile-a/ok.txt", F, 0o644, 1000, b"ok\n", "");
    entry("models/hostile-b/", D, 0o750, 1000, b"", "");
    if hostile {
        entry("models/hostile-b/.wh..wh..implicit/", D, 0o755, 0, b"", "");
        entry("models/hostile-b/.wh..wh..implicit/child", F, 0o644, 0, b"child\n", "");
    }
    entry("models/after.txt", F, 0o644, 0, b"after the hostile entries\n", "");
    tar.finish().unwrap();
}

/// [`Variant::Mixed`] of [`Image::Lazy`]: the manifest of its uncompressed copy, the upper
/// layer swapped for the gzip one (the config's diff IDs stay right: they are the digests of
/// the uncompressed layers).
fn mixed_lazy(work: &Path) {
    let (tar_dir, gzip_dir) = (work.join("variants/lazy-tar"), work.join("variants/lazy-gzip"));
    let dest = work.join("variants/lazy-mixed");
    std::fs::create_dir_all(&dest).unwrap();
    let mut manifest = read_json(&tar_dir.join("manifest.json"));
    let gzip = read_json(&gzip_dir.join("manifest.json"));
    manifest["layers"][1] = gzip["layers"][1].clone();
    let blob = |m: &serde_json::Value| m["digest"].as_str().unwrap().trim_start_matches("sha256:").to_string();
    for (from, desc) in
        [(&tar_dir, &manifest["config"]), (&tar_dir, &manifest["layers"][0]), (&gzip_dir, &manifest["layers"][1])]
    {
        std::fs::copy(from.join(blob(desc)), dest.join(blob(desc))).unwrap();
    }
    std::fs::copy(tar_dir.join("version"), dest.join("version")).unwrap();
    std::fs::write(dest.join("manifest.json"), serde_json::to_vec(&manifest).unwrap()).unwrap();
    assert_eq!(layer_types(&manifest), [OCI_LAYER_TAR, OCI_LAYER_GZIP]);
}

/// The first `len` bytes of `file` (fewer if it is shorter).
pub fn try_read_head(file: &Path, len: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(len);
    File::open(file)?.take(len as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// [`try_read_head`], which must succeed.
pub fn read_head(file: &Path, len: usize) -> Vec<u8> {
    try_read_head(file, len).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn layer_types(manifest: &serde_json::Value) -> Vec<String> {
    manifest["layers"].as_array().unwrap().iter().map(|l| l["mediaType"].as_str().unwrap().to_string()).collect()
}

/// A manifest in a registry.
#[derive(Clone, Debug)]
pub struct Pushed {
    /// `127.0.0.1:PORT/repo:tag`.
    pub reference: String,
    /// `sha256:<hex>` of the manifest.
    pub digest: String,
    pub size: u64,
    /// Its media type (the registry's `Content-Type`).
    pub media_type: String,
    /// Its layers' media types.
    pub layer_types: Vec<String>,
}

/// Push the `dir:` layout `dir` (a [`Fixtures::variant`]) to `repo:tag` with skopeo, byte for
/// byte (`--preserve-digests`), and read back what the registry holds.
pub fn push(registry: &Registry, dir: &Path, repo: &str, tag: &str) -> Pushed {
    run(Command::new("skopeo")
        .args(["copy", "-q", "--preserve-digests", "--dest-tls-verify=false"])
        .arg(format!("dir:{}", dir.display()))
        .arg(format!("docker://{}", registry.reference(repo, tag))));
    let accept = format!("{OCI_MANIFEST}, {DOCKER_MANIFEST}, {OCI_INDEX}, {DOCKER_LIST}");
    let got = registry.request("GET", &format!("/v2/{repo}/manifests/{tag}"), &[("Accept", &accept)]);
    assert_eq!(got.status, 200, "{repo}:{tag}: {}", got.text());
    let sent = std::fs::read(dir.join("manifest.json")).unwrap();
    assert_eq!(got.body, sent, "the registry holds {repo}:{tag} as skopeo found it");
    let manifest: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    Pushed {
        reference: registry.reference(repo, tag),
        digest: sha256_digest(&got.body),
        size: got.body.len() as u64,
        media_type: got.header("content-type").unwrap_or_default().to_string(),
        layer_types: layer_types(&manifest),
    }
}

/// A platform of an index entry.
#[derive(Clone, Copy, Debug)]
pub struct Platform {
    pub os: &'static str,
    pub architecture: &'static str,
    pub variant: Option<&'static str>,
}

pub const LINUX_AMD64: Platform = Platform { os: "linux", architecture: "amd64", variant: None };
pub const LINUX_ARM64_V8: Platform = Platform { os: "linux", architecture: "arm64", variant: Some("v8") };

/// PUT an index of `entries` (an OCI image index, or a Docker manifest list when `docker`) at
/// `repo:tag`; its reference.
pub fn push_index(registry: &Registry, repo: &str, tag: &str, docker: bool, entries: &[(&Pushed, Platform)]) -> String {
    let manifests: Vec<serde_json::Value> = entries
        .iter()
        .map(|(m, p)| {
            let mut platform = serde_json::json!({ "os": p.os, "architecture": p.architecture });
            if let Some(v) = p.variant {
                platform["variant"] = v.into();
            }
            serde_json::json!({ "mediaType": m.media_type, "digest": m.digest, "size": m.size, "platform": platform })
        })
        .collect();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": if docker { DOCKER_LIST } else { OCI_INDEX },
        "manifests": manifests,
    });
    registry.push_manifest(repo, tag, &serde_json::to_string_pretty(&index).unwrap());
    registry.reference(repo, tag)
}

/// What an entry of a tree is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File {
        size: u64,
        sha256: String,
    },
    Symlink(PathBuf),
    /// A FIFO, socket or device node.
    Special(&'static str),
}

/// One entry of a [`tree`].
#[derive(Clone, Debug)]
pub struct Entry {
    pub kind: Kind,
    /// `st_mode & 0o7777`.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// `(st_dev, st_ino)`.
    pub ino: (u64, u64),
}

impl Entry {
    /// What a volume must keep of it: the type, content or link target, owner, and the mode
    /// without the set-id bits.
    fn kept(&self) -> (Kind, u32, u32, u32) {
        (self.kind.clone(), self.mode & 0o1777, self.uid, self.gid)
    }
}

/// Every entry below `root` (not `root` itself), by relative path, without following symlinks.
pub fn tree(root: &Path) -> BTreeMap<String, Entry> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Entry>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
        for e in entries {
            let p = e.unwrap_or_else(|e| panic!("listing {}: {e}", dir.display())).path();
            let meta = std::fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
            let ft = meta.file_type();
            let kind = if ft.is_dir() {
                Kind::Dir
            } else if ft.is_symlink() {
                Kind::Symlink(std::fs::read_link(&p).unwrap())
            } else if ft.is_file() {
                let (sha256, size) = sha256_file(&p);
                Kind::File { size, sha256 }
            } else {
                use std::os::unix::fs::FileTypeExt;
                Kind::Special(if ft.is_fifo() {
                    "fifo"
                } else if ft.is_char_device() {
                    "char device"
                } else if ft.is_block_device() {
                    "block device"
                } else {
                    "socket"
                })
            };
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let entry = Entry {
                kind,
                mode: meta.mode() & 0o7777,
                uid: meta.uid(),
                gid: meta.gid(),
                ino: (meta.dev(), meta.ino()),
            };
            let is_dir = entry.kind == Kind::Dir;
            out.insert(rel, entry);
            if is_dir {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The differences between the tree a volume shows at `got` and the `expected` one (empty when
/// equal): entries missing or extra, any difference in type, content, link target, numeric
/// owner or mode (`& 0o1777`), a set-id bit left in the volume, and hard links of the image
/// (entries sharing an inode) no longer one inode.
pub fn tree_differences(expected: &Path, got: &Path) -> Vec<String> {
    let (want, have) = (tree(expected), tree(got));
    let mut out = Vec::new();
    for (path, w) in &want {
        match have.get(path) {
            None => out.push(format!("{path}: missing (want {:?})", w.kept())),
            Some(h) if h.kept() != w.kept() => out.push(format!("{path}: want {:?}, got {:?}", w.kept(), h.kept())),
            Some(h) if h.mode & 0o6000 != 0 => out.push(format!("{path}: set-id bits kept: {:o}", h.mode)),
            Some(_) => {}
        }
    }
    for (path, h) in &have {
        if !want.contains_key(path) {
            out.push(format!("{path}: unexpected {:?}", h.kept()));
        }
    }
    let mut links: BTreeMap<(u64, u64), Vec<&String>> = BTreeMap::new();
    for (path, w) in want.iter().filter(|(_, w)| matches!(w.kind, Kind::File { .. })) {
        links.entry(w.ino).or_default().push(path);
    }
    for group in links.values().filter(|g| g.len() > 1) {
        let inodes: BTreeSet<Option<(u64, u64)>> = group.iter().map(|p| have.get(*p).map(|h| h.ino)).collect();
        if inodes.len() != 1 {
            out.push(format!("hard links {group:?} are not one inode in the volume: {inodes:?}"));
        }
    }
    out
}

/// Assert that `got` shows the `expected` tree ([`tree_differences`]).
#[track_caller]
pub fn assert_same_tree(expected: &Path, got: &Path, what: &str) {
    let diff = tree_differences(expected, got);
    assert!(
        diff.is_empty(),
        "{what}: {} differs from umoci's {} in {} entries:\n{}",
        got.display(),
        expected.display(),
        diff.len(),
        diff.join("\n")
    );
}

/// A volume bound (in this mount namespace) onto a directory every user may reach, so that
/// another user's access is decided by the volume's own modes and not by the 0700 temporary
/// directories the node's paths are in. Unmounted on drop.
pub struct OpenView {
    dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl OpenView {
    pub fn of(volume: &Path) -> OpenView {
        let dir = tempfile::Builder::new().prefix("mounthost-view-").tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("volume");
        std::fs::create_dir(&path).unwrap();
        nix::mount::mount(Some(volume), &path, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>)
            .unwrap_or_else(|e| panic!("binding {} onto {}: {e}", volume.display(), path.display()));
        OpenView { dir, path }
    }
}

impl Drop for OpenView {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// `file`'s content as read by `cat` run as uid and gid `id` without supplementary groups
/// (`setpriv`), or cat's error.
pub fn read_as(id: u32, file: &Path) -> Result<Vec<u8>, String> {
    let out = Command::new("setpriv")
        .args(["--reuid", &id.to_string(), "--regid", &id.to_string(), "--clear-groups", "cat"])
        .arg(file)
        .output()
        .expect("running setpriv (util-linux)");
    if out.status.success() { Ok(out.stdout) } else { Err(String::from_utf8_lossy(&out.stderr).trim().to_string()) }
}
