//! End to end, as root, in a private mount namespace: the HTTP API of a dynamic volume's socket
//! under fuzzed and hostile requests, against the real host daemon (models from a real
//! `docker-registry`, kubelet-length paths).
//!
//! A seeded generator (`MOUNTHOST_FUZZ_SEED` replays a run, `MOUNTHOST_FUZZ_REQUESTS` sets how
//! many) sends raw requests: garbage methods and paths, too many or too large headers, bad
//! bytes, duplicate and lying `Content-Length`s, broken chunked bodies, JSON that is truncated,
//! mistyped, nested or too large, mount requests the validation or the plugin must refuse,
//! pipelined and kept-alive requests, HTTP/1.0 and HTTP/2 prefaces. Meanwhile a few connections
//! trickle bytes or send nothing. Every answer must be a well-formed HTTP answer that is never a
//! 5xx, every API 4xx carries `{code, message}`, every 2xx shows the one mount the test made;
//! the daemon keeps serving and the volume's mounts stay byte for byte what they were.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::dynamic::*;
use common::registry::{Registry, RegistryOptions};
use common::{guarded, in_private_namespace, mounts_below};
use mounthost::proto::csi;
use serde_json::{Value, json};

/// kubelet-shaped names: a pod uid and a PV name as long as real ones.
const POD: &str = "3c9a7e51-2b4d-4f8e-a6c1-0d9e8f7a6b5c";
const PV: &str = "pvc-6d2e8f1a-9c3b-4e7d-b5a0-1f2e3d4c5b6a";
/// The one mount the test makes; nothing the fuzzer sends may change or remove it.
const KEPT: &str = "base-copy";
/// The largest request body the API takes (`api::MAX_BODY`).
const MAX_BODY: usize = 64 << 10;
/// Longest the test waits for one exchange to be answered or closed.
const EXCHANGE_LIMIT: Duration = Duration::from_secs(15);
/// The content type of the API.
const JSON: &str = "application/json";
/// Statuses hyper answers malformed HTTP with itself, without a body.
const HYPER_STATUSES: [u16; 4] = [400, 413, 414, 431];

fn run(node: &DynNode, body: impl AsyncFnOnce()) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    guarded(&node.dirs, || rt.block_on(body()));
}

// ---------------------------------------------------------------------------------------------
// A seeded generator.

/// splitmix64: tiny, seedable, good enough to pick cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// 0..n (0 when n is 0).
    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }

    /// lo..=hi.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }

    /// A length up to `max`, small ones far likelier (log-uniform).
    fn len(&mut self, max: usize) -> usize {
        let bits = usize::BITS - max.leading_zeros();
        let b = self.below(bits as usize + 1);
        self.below((1usize << b).min(max + 1))
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// `n` characters of `alphabet`.
    fn text(&mut self, alphabet: &[u8], n: usize) -> Vec<u8> {
        (0..n).map(|_| alphabet[self.below(alphabet.len())]).collect()
    }

    /// lo..=hi random bytes.
    fn bytes_in(&mut self, lo: usize, hi: usize) -> Vec<u8> {
        let n = self.range(lo, hi);
        self.bytes(n)
    }

    /// Up to `max` random bytes, few likelier ([`Rng::len`]).
    fn bytes_upto(&mut self, max: usize) -> Vec<u8> {
        let n = self.len(max);
        self.bytes(n)
    }

    /// lo..=hi characters of `alphabet`.
    fn text_in(&mut self, alphabet: &[u8], lo: usize, hi: usize) -> Vec<u8> {
        let n = self.range(lo, hi);
        self.text(alphabet, n)
    }

    /// Up to `max` characters of `alphabet`, few likelier.
    fn text_upto(&mut self, alphabet: &[u8], max: usize) -> Vec<u8> {
        let n = self.len(max);
        self.text(alphabet, n)
    }
}

const LOWER_DIGITS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-";
const TOKEN: &[u8] = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const PRINTABLE: &[u8] =
    b" !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~";
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// ---------------------------------------------------------------------------------------------
// Requests.

/// What one fuzz case sends on one connection.
struct Case {
    kind: &'static str,
    /// Sent first, on its own, and answered before `bytes` go out (a kept-alive connection).
    prefix: Option<Vec<u8>>,
    bytes: Vec<u8>,
    /// The method of each request in `bytes`, in order (a HEAD answer has no body).
    methods: Vec<Vec<u8>>,
    /// Where each request starts in `bytes`, when the generator knows.
    starts: Vec<usize>,
}

/// What the generator needs to know.
struct Ctx {
    /// The reference of the model `base-copy` mounts (granted to the volume).
    base_ref: String,
}

/// A valid mount id, never [`KEPT`] (it ends with a digit).
fn valid_id(r: &mut Rng) -> String {
    let n = r.range(1, 63).min(r.range(1, 63));
    let mut id = r.text(LOWER_DIGITS, n);
    id[0] = b'a' + r.below(26) as u8;
    let last = id.len() - 1;
    id[last] = b'0' + r.below(10) as u8;
    String::from_utf8(id).unwrap()
}

/// Is `id` a valid mount id (the API's documented rule: a DNS label)?
fn id_ok(id: &str) -> bool {
    (1..=63).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.starts_with('-')
        && !id.ends_with('-')
}

/// An id the API refuses.
fn bad_id(r: &mut Rng) -> String {
    loop {
        let id = maybe_bad_id(r);
        if !id_ok(&id) {
            return id;
        }
    }
}

fn maybe_bad_id(r: &mut Rng) -> String {
    match r.below(4) {
        0 => r
            .pick(&[
                "",
                ".",
                "..",
                "-a",
                "a-",
                "A",
                "Base-Copy",
                "a.b",
                "a/b",
                "/etc",
                "../x",
                "a%2fb",
                "a\0b",
                "é",
                "a b",
                "a\nb",
                "a\\b",
                "\u{202e}x",
                "x\u{0}",
                "--",
                "a_b",
            ])
            .to_string(),
        1 => "x".repeat(r.range(64, 300)),
        2 => {
            let mut id = valid_id(r).into_bytes();
            let at = r.below(id.len() + 1);
            let bad = r.pick(&[".", "/", "%", "A", "_", " ", "\0", "é", "\u{7f}", "~"]);
            id.splice(at..at, bad.bytes());
            String::from_utf8(id).unwrap()
        }
        _ => String::from_utf8_lossy(&r.bytes_in(1, 80)).into_owned(),
    }
}

fn method(r: &mut Rng) -> Vec<u8> {
    match r.below(20) {
        0..=11 => r.pick(&["GET", "POST", "DELETE"]).into(),
        12..=13 => r.pick(&["PUT", "PATCH", "HEAD", "OPTIONS", "TRACE", "CONNECT"]).into(),
        14..=15 => r.pick(&["get", "post", "delete", "Get", "GETT", "G", "POSTX", "M-SEARCH", "PRI", "BREW"]).into(),
        16 => r.text_in(TOKEN, 1, 100),
        17 => vec![b'A'; r.range(16, 20_000)],
        _ => r
            .pick(&[&b""[..], b"GE T", b"GET\0", "GÉT".as_bytes(), b"G\tET", b"{}", b"GET/", b"\xff\xfe", b"(GET)"])
            .to_vec(),
    }
}

/// A request target (for DELETE never the kept mount's).
fn target(r: &mut Rng, method: &[u8]) -> Vec<u8> {
    let id = |r: &mut Rng| if r.one_in(2) { valid_id(r) } else { bad_id(r) };
    match r.below(24) {
        0..=5 => b"/mounts".to_vec(),
        6..=9 => format!("/mounts/{}", id(r)).into_bytes(),
        10 if method != b"DELETE" => format!("/mounts/{KEPT}").into_bytes(),
        11 => format!("/mounts/{}", "a".repeat(r.range(64, 10_000))).into_bytes(),
        12 => format!("/mounts/{}", "%2f".repeat(r.range(1, 3000))).into_bytes(),
        13 => {
            let mut t = b"/mounts/".to_vec();
            t.extend(r.bytes_in(1, 200).into_iter().filter(|b| !b" \r\n".contains(b)));
            t
        }
        14 => {
            let mut t = b"/".to_vec();
            t.extend(r.text_upto(PRINTABLE, 300).into_iter().filter(|b| *b != b' '));
            t
        }
        _ => r
            .pick(&[
                "/mounts/..",
                "/mounts/../..",
                "/mounts/../../../etc/passwd",
                "/mounts/%2e%2e",
                "/mounts/..%2f..%2fb",
                "/mounts/a%00b",
                "/mounts/%00",
                "/mounts/é",
                "/mounts/\u{202e}x",
                "/mounts/",
                "/mounts//",
                "/mounts//x",
                "/mounts/a/b",
                "/mounts/./x",
                "/./mounts",
                "/mounts%2f",
                "/mounts?x=1",
                "/mounts/?",
                "/mounts#f",
                "/MOUNTS",
                "/volumes",
                "//",
                "/",
                "*",
                "",
                "http://volume/mounts",
                "http://volume/mounts/x",
                "https://evil.example:443/mounts/..",
                "volume:80",
                "mounts",
                "/mounts\t",
                "/%",
            ])
            .into(),
    }
}

fn version(r: &mut Rng) -> Vec<u8> {
    match r.below(20) {
        0..=16 => b"HTTP/1.1".to_vec(),
        17 => b"HTTP/1.0".to_vec(),
        _ => r
            .pick(&["HTTP/2.0", "HTTP/0.9", "HTTP/1.2", "HTTP/9.9", "http/1.1", "HTTP/1", "HTTP/11", "", "HTTP/1.1x"])
            .into(),
    }
}

/// Mount parameters the validation, the plugin or the policy refuse (never a mount that works).
fn refused_parameters(r: &mut Rng, ctx: &Ctx) -> Value {
    let evil = |r: &mut Rng| {
        let host = r.pick(&["evil.example:5000", "registry.invalid", "10.0.0.1:5000", "[::1]:5000", "evil.example"]);
        let repo = r.pick(&["m", "models/base", "a/b/c", "library/ubuntu", "x--y"]);
        let tail = match r.below(3) {
            0 => String::new(),
            1 => format!(":{}", r.pick(&["v1", "latest", "1.0-rc"])),
            _ => format!("@sha256:{}", "ab".repeat(32)),
        };
        format!("{host}/{repo}{tail}")
    };
    let mut p = serde_json::Map::new();
    match r.below(6) {
        // A registry the volume is not granted, with any filters.
        0 | 1 => {
            p.insert("reference".into(), evil(r).into());
            for key in ["include", "exclude", "weights", "types"] {
                if r.one_in(3) {
                    let v = match r.below(3) {
                        0 => r
                            .pick(&[
                                "*.safetensors",
                                "**",
                                "[",
                                "[z-a]",
                                "{a,b}",
                                "\\",
                                "***/**",
                                "a,,b",
                                ",",
                                "only",
                                "bogus",
                                "weight,config",
                                "doc,dataset,code",
                                "../x",
                                "/abs/*",
                            ])
                            .to_string(),
                        1 => String::from_utf8_lossy(&r.text_upto(PRINTABLE, 300)).into_owned(),
                        _ => "*".repeat(r.range(1, 4000)),
                    };
                    p.insert(key.into(), v.into());
                }
            }
        }
        // A key a pod may not give, next to a granted reference.
        2 => {
            p.insert("reference".into(), ctx.base_ref.clone().into());
            let key = r.pick(&[
                "mirror",
                "insecure",
                "username",
                "password",
                "token",
                ".dockerconfigjson",
                "volume",
                "mounthost.resolved.reference",
                "mounthost.resolved.manifestDigest",
                "csi.storage.k8s.io/pod.name",
                "Reference",
            ]);
            p.insert(key.into(), r.pick(&["evil.example:5000", "true", "x", ""]).into());
        }
        // A reference that is not one.
        3 => {
            let v = match r.below(8) {
                0 => format!("http://{}", ctx.base_ref),
                1 => format!("{} x", ctx.base_ref),
                2 => format!("{}\t", ctx.base_ref),
                3 => String::new(),
                4 => "models/base:v1".into(),
                5 => format!("evil.example/{}", "A".repeat(r.range(1, 300))),
                6 => format!("evil.example/m:{}", "t".repeat(r.range(129, 4000))),
                _ => String::from_utf8_lossy(&r.text_upto(PRINTABLE, 200)).into_owned(),
            };
            p.insert("reference".into(), v.into());
        }
        // No reference.
        4 => {
            if r.one_in(2) {
                p.insert("include".into(), "*".into());
            }
        }
        // What `check_parameters` refuses.
        _ => match r.below(5) {
            0 => {
                for i in 0..r.range(65, 200) {
                    p.insert(format!("k{i}"), "v".into());
                }
            }
            1 => {
                p.insert("k".repeat(r.range(129, 1000)), "v".into());
            }
            2 => {
                p.insert(r.pick(&["", "a b", "a/b", "é", "a\0", "a:b", "{}"]).into(), "v".into());
            }
            3 => {
                p.insert("reference".into(), "x".repeat(r.range(4097, 20_000)).into());
            }
            _ => {
                let bad = r.pick(&["\n", "\0", "\u{7f}", "\u{85}", "\r", "\u{1b}[31m"]);
                p.insert("reference".into(), format!("{}{bad}", ctx.base_ref).into());
            }
        },
    }
    Value::Object(p)
}

/// A mount request that must not create anything.
fn refused_create(r: &mut Rng, ctx: &Ctx) -> Value {
    let id = match r.below(10) {
        0..=5 => valid_id(r),
        6..=8 => bad_id(r),
        // The kept mount with other parameters: a conflict.
        _ => KEPT.to_string(),
    };
    let mut v = json!({"id": id, "parameters": refused_parameters(r, ctx)});
    if r.one_in(4) {
        let plugin = match r.below(3) {
            0 => "model".to_string(),
            1 => r.pick(&["seaweedfs", "", "nope", "../model", "MODEL", " model", "model\0"]).to_string(),
            _ => "p".repeat(r.range(64, 5000)),
        };
        v["plugin"] = plugin.into();
    }
    // Sometimes a granted reference under an invalid id (refused before anything else).
    if r.one_in(12) {
        v = json!({"id": bad_id(r), "parameters": {"reference": ctx.base_ref}});
    }
    v
}

/// A body for `POST /mounts`.
fn body(r: &mut Rng, ctx: &Ctx) -> Vec<u8> {
    match r.below(26) {
        0..=7 => {
            let v = refused_create(r, ctx);
            if r.one_in(3) { serde_json::to_vec_pretty(&v).unwrap() } else { serde_json::to_vec(&v).unwrap() }
        }
        // The kept mount asked again, unchanged: 200 and the mount as it is.
        8 => {
            let mut v = json!({"id": KEPT, "parameters": {"reference": ctx.base_ref}});
            if r.one_in(2) {
                v["plugin"] = "model".into();
            }
            serde_json::to_vec(&v).unwrap()
        }
        // Truncated.
        9..=10 => {
            let v = serde_json::to_vec(&refused_create(r, ctx)).unwrap();
            v[..r.below(v.len())].to_vec()
        }
        // Unknown fields.
        11..=12 => {
            let mut v = refused_create(r, ctx);
            let field = r.pick(&["volume", "Id", "extra", "parameters ", "volumeId", "mounthost"]);
            v[field] = r.pick(&[json!(PV), json!(1), json!(null), json!({"a": []})]);
            serde_json::to_vec(&v).unwrap()
        }
        // Wrong types and shapes.
        13..=15 => r
            .pick(&[
                r#"{"id": 5}"#,
                r#"{"id": null, "parameters": {}}"#,
                r#"{"id": ["a"], "parameters": {}}"#,
                r#"{"id": "a", "parameters": []}"#,
                r#"{"id": "a", "parameters": {"reference": 1}}"#,
                r#"{"id": "a", "parameters": {"reference": null}}"#,
                r#"{"id": "a", "parameters": {"reference": ["x"]}}"#,
                r#"{"id": "a", "parameters": "reference=x"}"#,
                r#"{"id": "a", "plugin": 3}"#,
                r#"{"id": "a", "plugin": null, "parameters": null}"#,
                r#"{"id": "a", "id": "b", "parameters": {}}"#,
                r#"{"parameters": {"reference": "evil.example/m"}}"#,
                r#"{}"#,
                r#"[]"#,
                r#""a""#,
                r#"null"#,
                r#"true"#,
                r#"1e999"#,
                r#"-0"#,
                r#"{"id": "\ud800"}"#,
                r#"{"id": "a\u0000b", "parameters": {}}"#,
                "\u{feff}{\"id\": \"a\", \"parameters\": {}}",
                r#"{"id": "a", "parameters": {}} trailing"#,
                r#"{"id": "a", "parameters": {}}{"id": "b"}"#,
                r#"{"id": 'a'}"#,
                r#"{id: "a"}"#,
                r#"{"id": "a",}"#,
                r#"{"id": "a", "parameters": {"reference": "evil.example/m", "reference": "x"}}"#,
            ])
            .into(),
        // Deeply nested.
        16..=17 => {
            let n = r.range(100, 30_000);
            let (open, close) = r.pick(&[("[", "]"), ("{\"a\":", "}"), ("[{\"id\":", "}]")]);
            let mut v = Vec::new();
            let inside = r.pick(&[&b"{\"id\":\"a\"}"[..], b"1", b"", b"\"x\""]);
            match r.below(2) {
                0 => {
                    v.extend(open.repeat(n).bytes());
                    v.extend_from_slice(inside);
                    v.extend(close.repeat(n).bytes());
                }
                _ => {
                    v.extend(b"{\"id\":\"a\",\"parameters\":{\"reference\":");
                    v.extend(open.repeat(n).bytes());
                    v.extend(close.repeat(n).bytes());
                    v.extend(b"}}");
                }
            }
            v
        }
        // Random bytes.
        18..=19 => r.bytes_upto(4000),
        // Over the limit.
        20 => {
            let n = MAX_BODY + r.range(1, 3 * MAX_BODY);
            match r.below(3) {
                0 => vec![b' '; n],
                1 => {
                    let mut v = serde_json::to_vec(&json!({"id": "a", "parameters": {"x": "y".repeat(n)}})).unwrap();
                    v.truncate(n.max(MAX_BODY + 1));
                    v
                }
                _ => r.bytes(n),
            }
        }
        // Right at the limit: a refused request padded with spaces.
        21 => {
            let mut v = serde_json::to_vec(&refused_create(r, ctx)).unwrap();
            let want = MAX_BODY - 2 + r.below(5);
            if v.len() < want {
                v.resize(want, b' ');
            }
            v
        }
        22 => Vec::new(),
        // Text and Unicode around a mount request.
        _ => {
            let id = String::from_utf8_lossy(&r.bytes_in(1, 40)).into_owned();
            serde_json::to_vec(&json!({"id": id, "parameters": {"reference": "evil.example/m", "include": "ü*"}}))
                .unwrap()
        }
    }
}

/// How `Content-Length` is told.
fn content_length(r: &mut Rng, len: usize, headers: &mut Vec<Vec<u8>>) {
    let cl = |v: &str| format!("Content-Length: {v}").into_bytes();
    match r.below(20) {
        0..=13 => headers.push(cl(&len.to_string())),
        14 => {}
        15 => headers.push(cl(&(len + r.range(1, 100_000)).to_string())),
        16 => headers.push(cl(&len.saturating_sub(r.range(1, 50)).to_string())),
        17 => {
            headers.push(cl(&len.to_string()));
            headers.push(cl(&len.to_string()));
        }
        18 => {
            headers.push(cl(&len.to_string()));
            headers.push(cl(&(len + 1).to_string()));
        }
        _ => headers.push(cl(r.pick(&[
            "abc",
            "-1",
            "+5",
            " 5",
            "5 5",
            "5,5",
            "0x10",
            "99999999999999999999999",
            "18446744073709551615",
            "",
            "1e3",
        ]))),
    }
}

/// Random headers: names and values, some huge, some with bytes HTTP does not allow.
fn extra_headers(r: &mut Rng, headers: &mut Vec<Vec<u8>>, count: usize) {
    for _ in 0..count {
        let h: Vec<u8> = match r.below(30) {
            0..=14 => {
                let mut h = b"X-".to_vec();
                h.extend(r.text_in(TOKEN, 1, 30));
                h.extend(b": ");
                h.extend(r.text_upto(PRINTABLE, 200));
                h
            }
            15..=21 => r
                .pick(&[
                    "Connection: close",
                    "Connection: keep-alive",
                    "Connection: Upgrade",
                    "Expect: 100-continue",
                    "Expect: 999-nope",
                    "Upgrade: h2c",
                    "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA",
                    "Accept: */*",
                    "Accept-Encoding: gzip, br",
                    "Content-Encoding: gzip",
                    "Transfer-Encoding: identity",
                    "Content-Type: text/plain",
                    "Content-Type: application/json; charset=utf-8",
                    "Host: other",
                    "Host: volume",
                    "Cookie: a=b",
                    "Range: bytes=0-1",
                    "TE: trailers",
                    "Trailer: X-T",
                    "Proxy-Connection: keep-alive",
                    "Authorization: Bearer x",
                ])
                .into(),
            22..=23 => {
                let mut h = b"X-Big: ".to_vec();
                h.extend(vec![b'v'; r.range(1000, 20_000)]);
                h
            }
            _ => r
                .pick(&[
                    &b"NoColon"[..],
                    b"Bad Name: x",
                    b"X-Nul: a\0b",
                    b"X-Del: \x7f",
                    b" folded continuation",
                    b"\tfolded",
                    b": empty-name",
                    b"X-Bin: \xff\xfe",
                    b"X-CR: a\rb",
                    b"X-Space : x",
                    "X-Ünicode: v".as_bytes(),
                    b"X-Utf8: \xc3\xa9",
                ])
                .to_vec(),
        };
        headers.push(h);
    }
}

/// One request from its parts.
fn assemble(method: &[u8], target: &[u8], version: &[u8], headers: &[Vec<u8>], body: &[u8], eol: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + body.len());
    out.extend_from_slice(method);
    out.push(b' ');
    out.extend_from_slice(target);
    if !version.is_empty() {
        out.push(b' ');
        out.extend_from_slice(version);
    }
    out.extend_from_slice(eol);
    for h in headers {
        out.extend_from_slice(h);
        out.extend_from_slice(eol);
    }
    out.extend_from_slice(eol);
    out.extend_from_slice(body);
    out
}

/// A request with every part fuzzed.
fn structured(r: &mut Rng, ctx: &Ctx) -> (Vec<u8>, Vec<u8>) {
    let m = method(r);
    let t = target(r, &m);
    let v = version(r);
    let b = if m == b"POST" || r.one_in(6) { body(r, ctx) } else { Vec::new() };
    let mut headers = Vec::new();
    if !r.one_in(8) {
        headers.push(b"Host: volume".to_vec());
    }
    match r.below(10) {
        0..=6 => headers.push(b"Content-Type: application/json".to_vec()),
        7 => {}
        _ => headers.push(
            r.pick(&[
                &b"Content-Type: text/plain"[..],
                b"Content-Type: APPLICATION/JSON",
                b"Content-Type: application/jsonx",
                b"Content-Type: ",
                b"Content-Type: application/json\x01",
                b"Content-Type: ;application/json",
                b"Content-Type: multipart/form-data; boundary=x",
            ])
            .to_vec(),
        ),
    }
    if !b.is_empty() || r.one_in(2) {
        content_length(r, b.len(), &mut headers);
    }
    let n = if r.one_in(10) { r.range(0, 60) } else { r.len(6) };
    extra_headers(r, &mut headers, n);
    shuffle(r, &mut headers);
    let eol: &[u8] = if r.one_in(25) { b"\n" } else { b"\r\n" };
    (assemble(&m, &t, &v, &headers, &b, eol), m)
}

fn shuffle<T>(r: &mut Rng, xs: &mut [T]) {
    for i in (1..xs.len()).rev() {
        let j = r.below(i + 1);
        xs.swap(i, j);
    }
}

/// A well-formed request (the ones a pipeline is mostly made of).
fn sane(r: &mut Rng, ctx: &Ctx) -> (Vec<u8>, Vec<u8>) {
    let m: Vec<u8> = r.pick(&["GET", "GET", "POST", "DELETE", "HEAD", "PUT"]).into();
    let t: Vec<u8> = match r.below(4) {
        0 | 1 => b"/mounts".to_vec(),
        2 if m != b"DELETE" => format!("/mounts/{KEPT}").into_bytes(),
        _ => format!("/mounts/{}", valid_id(r)).into_bytes(),
    };
    let b = if m == b"POST" { serde_json::to_vec(&refused_create(r, ctx)).unwrap() } else { Vec::new() };
    let headers = vec![
        b"Host: volume".to_vec(),
        b"Content-Type: application/json".to_vec(),
        format!("Content-Length: {}", b.len()).into_bytes(),
    ];
    (assemble(&m, &t, b"HTTP/1.1", &headers, &b, b"\r\n"), m)
}

/// `POST /mounts` with a chunked body, the chunks broken in one of many ways.
fn chunked(r: &mut Rng, ctx: &Ctx) -> (Vec<u8>, Vec<u8>) {
    let m: Vec<u8> = if r.one_in(5) { r.pick(&["GET", "DELETE", "PUT"]).into() } else { b"POST".to_vec() };
    let t: Vec<u8> = if m == b"DELETE" { format!("/mounts/{}", valid_id(r)).into_bytes() } else { b"/mounts".to_vec() };
    let te = if r.one_in(4) {
        r.pick(&[
            "Chunked",
            "chunked, chunked",
            "gzip, chunked",
            "chunked, gzip",
            "gzip",
            "identity",
            "chunked\x00",
            "x",
        ])
    } else {
        "chunked"
    };
    let mut headers = vec![
        b"Host: volume".to_vec(),
        b"Content-Type: application/json".to_vec(),
        format!("Transfer-Encoding: {te}").into_bytes(),
    ];
    if r.one_in(6) {
        headers.push(format!("Content-Length: {}", r.range(0, 100)).into_bytes());
    }
    let data = if r.one_in(5) { body(r, ctx) } else { serde_json::to_vec(&refused_create(r, ctx)).unwrap() };
    let mut b = Vec::new();
    let mut rest = &data[..];
    while !rest.is_empty() {
        let n = r.range(1, rest.len().min(5000));
        let (chunk, tail) = rest.split_at(n);
        match r.below(40) {
            0 => b.extend(b"zz\r\n"),
            1 => b.extend(b"-1\r\n"),
            2 => b.extend(b"ffffffffffffffffffffffff\r\n"),
            3 => b.extend(format!("{:x}\r\n", n + r.range(1, 1000)).bytes()),
            4 => b.extend(format!("{n:x};ext=\x01\r\n").bytes()),
            5 => b.extend(format!("{n:x}\n").bytes()),
            6 => b.extend(format!(" {n:x}\r\n").bytes()),
            7 => b.extend(format!("0x{n:x}\r\n").bytes()),
            8 => b.extend(format!("{:0>40x}\r\n", n).bytes()),
            9 => b.extend(format!("{n:X};a=b;c=\"d\"\r\n").bytes()),
            _ => b.extend(format!("{n:x}\r\n").bytes()),
        }
        b.extend_from_slice(chunk);
        if !r.one_in(30) {
            b.extend(b"\r\n");
        }
        rest = tail;
    }
    match r.below(8) {
        0 => {}
        1 => b.extend(b"0\r\n"),
        2 => b.extend(b"0\r\nX-T: v\r\n\r\n"),
        3 => b.extend(b"0\r\nbad trailer\r\n\r\n"),
        4 => b.extend(b"0\r\n\r\ntrailing garbage"),
        _ => b.extend(b"0\r\n\r\n"),
    }
    (assemble(&m, &t, b"HTTP/1.1", &headers, &b, b"\r\n"), m)
}

/// Bytes that are hardly HTTP.
fn garbage(r: &mut Rng) -> (Vec<u8>, Vec<u8>) {
    let bytes = match r.below(12) {
        0..=2 => r.bytes_upto(4000),
        3 => {
            let mut v = HTTP2_PREFACE.to_vec();
            if r.one_in(2) {
                // An empty SETTINGS frame, then random frames.
                v.extend(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00");
                v.extend(r.bytes_upto(500));
            }
            v
        }
        4 => HTTP2_PREFACE[..r.range(1, HTTP2_PREFACE.len())].to_vec(),
        5 => b"GET /mounts\r\n\r\n".to_vec(),
        6 => b"\r\n".repeat(r.range(1, 3000)),
        7 => b"GET /mounts HTTP/1.1".to_vec(),
        8 => {
            // A TLS ClientHello's first bytes.
            let mut v = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec();
            v.extend(r.bytes(200));
            v
        }
        9 => {
            let mut v = b"\r\n".repeat(r.range(1, 10));
            v.extend(b"GET /mounts HTTP/1.1\r\nHost: v\r\n\r\n");
            v
        }
        10 => r.text_upto(PRINTABLE, 3000),
        _ => Vec::new(),
    };
    (bytes, Vec::new())
}

/// Many headers and large ones on a request that is otherwise fine.
fn header_heavy(r: &mut Rng) -> (Vec<u8>, Vec<u8>) {
    let mut headers = vec![b"Host: volume".to_vec()];
    let n = r.range(0, 60);
    extra_headers(r, &mut headers, n);
    if r.one_in(3) {
        let dup = headers[r.below(headers.len())].clone();
        headers.extend(std::iter::repeat_n(dup, r.range(1, 40)));
    }
    shuffle(r, &mut headers);
    let m: Vec<u8> = r.pick(&["GET", "HEAD", "DELETE"]).into();
    let t: Vec<u8> = if m == b"DELETE" { format!("/mounts/{}", valid_id(r)).into_bytes() } else { b"/mounts".to_vec() };
    (assemble(&m, &t, b"HTTP/1.1", &headers, b"", b"\r\n"), m)
}

/// HTTP/1.0 requests.
fn http10(r: &mut Rng, ctx: &Ctx) -> (Vec<u8>, Vec<u8>) {
    let m: Vec<u8> = r.pick(&["GET", "POST", "DELETE", "HEAD"]).into();
    let t: Vec<u8> = match r.below(3) {
        0 if m != b"DELETE" => format!("/mounts/{KEPT}").into_bytes(),
        1 => format!("/mounts/{}", valid_id(r)).into_bytes(),
        _ => b"/mounts".to_vec(),
    };
    let b = if m == b"POST" { body(r, ctx) } else { Vec::new() };
    let mut headers = Vec::new();
    if r.one_in(2) {
        headers.push(b"Connection: keep-alive".to_vec());
    }
    if r.one_in(4) {
        headers.push(b"Transfer-Encoding: chunked".to_vec());
    }
    if !b.is_empty() && !r.one_in(4) {
        headers.push(format!("Content-Length: {}", b.len()).into_bytes());
    }
    (assemble(&m, &t, b"HTTP/1.0", &headers, &b, b"\r\n"), m)
}

/// One fuzz case.
fn case(r: &mut Rng, ctx: &Ctx) -> Case {
    let one =
        |kind, (bytes, m): (Vec<u8>, Vec<u8>)| Case { kind, prefix: None, bytes, methods: vec![m], starts: Vec::new() };
    match r.below(100) {
        0..=34 => one("structured", structured(r, ctx)),
        35..=54 => {
            let b = body(r, ctx);
            let mut headers = vec![b"Host: volume".to_vec(), b"Content-Type: application/json".to_vec()];
            headers.push(format!("Content-Length: {}", b.len()).into_bytes());
            one("create", (assemble(b"POST", b"/mounts", b"HTTP/1.1", &headers, &b, b"\r\n"), b"POST".to_vec()))
        }
        55..=62 => one("chunked", chunked(r, ctx)),
        63..=70 => {
            // Content-Length larger than what is sent, then the write side closed.
            let (m, t): (Vec<u8>, Vec<u8>) = match r.below(3) {
                0 => (b"GET".to_vec(), b"/mounts".to_vec()),
                1 => (b"DELETE".to_vec(), format!("/mounts/{}", valid_id(r)).into_bytes()),
                _ => (b"POST".to_vec(), b"/mounts".to_vec()),
            };
            let full = serde_json::to_vec(&refused_create(r, ctx)).unwrap();
            let sent = &full[..r.below(full.len() + 1)];
            let claimed = full.len() + r.below(3 * MAX_BODY);
            let headers = vec![
                b"Host: volume".to_vec(),
                b"Content-Type: application/json".to_vec(),
                format!("Content-Length: {claimed}").into_bytes(),
            ];
            one("truncated", (assemble(&m, &t, b"HTTP/1.1", &headers, sent, b"\r\n"), m))
        }
        71..=78 => {
            // Well-framed requests ("pipelined": each must be answered, in order), or those and
            // one of any shape last ("pipelined+": whatever follows its end is answered as more
            // requests).
            let mut c =
                Case { kind: "pipelined", prefix: None, bytes: Vec::new(), methods: Vec::new(), starts: Vec::new() };
            let n = if r.one_in(10) { r.range(2, 150) } else { r.range(2, 6) };
            for i in 0..n {
                let (bytes, m) = if i == n - 1 && r.one_in(3) {
                    c.kind = "pipelined+";
                    structured(r, ctx)
                } else {
                    sane(r, ctx)
                };
                c.starts.push(c.bytes.len());
                c.bytes.extend(bytes);
                c.methods.push(m);
            }
            c
        }
        79..=83 => {
            let (bytes, m) = if r.one_in(2) { structured(r, ctx) } else { garbage(r) };
            Case {
                kind: "kept-alive",
                prefix: Some(b"GET /mounts HTTP/1.1\r\nHost: volume\r\n\r\n".to_vec()),
                bytes,
                methods: vec![m],
                starts: Vec::new(),
            }
        }
        84..=89 => one("garbage", garbage(r)),
        90..=94 => one("headers", header_heavy(r)),
        _ => one("http/1.0", http10(r, ctx)),
    }
}

// ---------------------------------------------------------------------------------------------
// Answers.

/// One HTTP answer.
struct Answer {
    version: String,
    status: u16,
    body: Vec<u8>,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.version, self.status, shown(&self.body))
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parse one answer at the start of `buf`: `Ok(None)` while it is incomplete.
fn parse_answer(buf: &[u8], head_only: bool, eof: bool) -> Result<Option<(Answer, usize)>, String> {
    if buf.is_empty() {
        return Ok(None);
    }
    let Some(end) = find(buf, b"\r\n\r\n") else {
        let n = buf.len().min(9);
        if !b"HTTP/1.1 "[..n].eq(&buf[..n]) && !b"HTTP/1.0 "[..n].eq(&buf[..n]) {
            return Err("not an HTTP answer".into());
        }
        return if eof { Err("an answer cut short in its head".into()) } else { Ok(None) };
    };
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| "an answer head that is not UTF-8".to_string())?;
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let (version, rest) = first.split_once(' ').ok_or("no status line")?;
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(format!("status line {first:?}"));
    }
    let status: u16 = rest.get(..3).and_then(|s| s.parse().ok()).ok_or_else(|| format!("status line {first:?}"))?;
    let mut length = None;
    for line in lines {
        let (k, v) = line.split_once(':').ok_or_else(|| format!("header line {line:?}"))?;
        if k.eq_ignore_ascii_case("content-length") {
            length = Some(v.trim().parse::<usize>().map_err(|_| format!("header line {line:?}"))?);
        } else if k.eq_ignore_ascii_case("transfer-encoding") {
            return Err(format!("a {line:?} answer (the server answers with whole bodies)"));
        }
    }
    let start = end + 4;
    let length = if head_only || (100..200).contains(&status) || status == 204 || status == 304 {
        0
    } else if let Some(l) = length {
        l
    } else if eof {
        buf.len() - start
    } else {
        return Ok(None);
    };
    if buf.len() < start + length {
        return if eof { Err("an answer cut short in its body".into()) } else { Ok(None) };
    }
    let answer = Answer { version: version.into(), status, body: buf[start..start + length].to_vec() };
    Ok(Some((answer, start + length)))
}

/// A client connection to the socket, reading answers as they come.
struct Conn {
    s: UnixStream,
    buf: Vec<u8>,
    eof: bool,
    /// How the server's side ended: `None` while open, else "closed" or the error.
    end: Option<String>,
}

impl Conn {
    fn open(dir: &Path) -> std::io::Result<Conn> {
        let s = connect(dir)?;
        s.set_write_timeout(Some(Duration::from_secs(5)))?;
        Ok(Conn { s, buf: Vec::new(), eof: false, end: None })
    }

    /// Write what the server takes; a server that closed or stopped reading is not an error here.
    fn send(&mut self, bytes: &[u8]) {
        let _ = self.s.write_all(bytes);
    }

    fn close_write(&mut self) {
        let _ = self.s.shutdown(std::net::Shutdown::Write);
    }

    /// Read more; false when `deadline` passed first.
    fn fill(&mut self, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        self.s.set_read_timeout(Some(left)).unwrap();
        let mut chunk = [0u8; 16 << 10];
        match self.s.read(&mut chunk) {
            Ok(0) => {
                self.eof = true;
                self.end = Some("closed".into());
            }
            Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // Reset (the server closed with bytes of ours unread) or the like: the end.
            Err(e) => {
                self.eof = true;
                self.end = Some(e.to_string());
            }
        }
        true
    }

    /// The next final answer (1xx ones counted in `informational`); `Ok(None)` once the server
    /// closed without another.
    fn answer(
        &mut self,
        head_only: bool,
        deadline: Instant,
        informational: &mut usize,
    ) -> Result<Option<Answer>, String> {
        loop {
            match parse_answer(&self.buf, head_only, self.eof).map_err(|e| format!("{e}: {}", shown(&self.buf)))? {
                Some((a, used)) => {
                    self.buf.drain(..used);
                    if (100..200).contains(&a.status) {
                        *informational += 1;
                        continue;
                    }
                    return Ok(Some(a));
                }
                None if self.eof && self.buf.is_empty() => return Ok(None),
                None => {
                    if !self.fill(deadline) {
                        return Err(format!("neither answered nor closed within {EXCHANGE_LIMIT:?}"));
                    }
                }
            }
        }
    }
}

/// What one case got back.
struct Outcome {
    answers: Vec<Answer>,
    informational: usize,
    problem: Option<String>,
    took: Duration,
    /// How the connection ended (see [`Conn::end`]).
    end: Option<String>,
}

fn exchange(dir: &Path, c: &Case) -> Outcome {
    let start = Instant::now();
    let deadline = start + EXCHANGE_LIMIT;
    let mut out = Outcome { answers: Vec::new(), informational: 0, problem: None, took: Duration::ZERO, end: None };
    let mut conn = match Conn::open(dir) {
        Ok(conn) => conn,
        Err(e) => {
            out.problem = Some(format!("connecting: {e}"));
            return out;
        }
    };
    if let Some(prefix) = &c.prefix {
        conn.send(prefix);
        match conn.answer(false, deadline, &mut out.informational) {
            Ok(Some(a)) if a.status == 200 => {}
            other => {
                out.problem = Some(format!("the kept-alive connection's first GET /mounts: {other:?}"));
                return out;
            }
        }
    }
    conn.send(&c.bytes);
    conn.close_write();
    loop {
        let head_only = c.methods.get(out.answers.len()).is_some_and(|m| m == b"HEAD");
        match conn.answer(head_only, deadline, &mut out.informational) {
            Ok(Some(a)) => out.answers.push(a),
            Ok(None) => break,
            Err(e) => {
                out.problem = Some(e);
                break;
            }
        }
    }
    out.took = start.elapsed();
    out.end = conn.end.take();
    out
}

/// What the test knows the volume holds.
struct Known {
    list: Value,
    kept: Value,
}

/// Is this answer one the API may give? `Err`: why not.
fn judge(a: &Answer, head_only: bool, known: &Known) -> Result<(), String> {
    let json = || serde_json::from_slice::<Value>(&a.body).map_err(|e| format!("a body that is not JSON ({e})"));
    match a.status {
        200..=299 => {
            if head_only && a.body.is_empty() {
                return Ok(());
            }
            let v = json()?;
            if v == known.list || (a.status == 200 && v == known.kept) {
                Ok(())
            } else {
                Err(format!("a success showing what the test does not know: {v}"))
            }
        }
        400..=499 => {
            if a.body.is_empty() && (head_only || HYPER_STATUSES.contains(&a.status)) {
                return Ok(());
            }
            let v = json()?;
            if v["code"].is_string() && v["message"].is_string() && v.as_object().is_some_and(|o| o.len() == 2) {
                Ok(())
            } else {
                Err(format!("an error body without code and message: {v}"))
            }
        }
        500..=599 => Err(format!("a server error for a client's request: {}", String::from_utf8_lossy(&a.body))),
        s => Err(format!("status {s}")),
    }
}

/// Bytes for a message: escaped, the middle of long ones left out.
fn shown(bytes: &[u8]) -> String {
    if bytes.len() <= 400 {
        return bytes.escape_ascii().to_string();
    }
    format!("{}…({} bytes)…{}", bytes[..300].escape_ascii(), bytes.len(), bytes[bytes.len() - 60..].escape_ascii())
}

// ---------------------------------------------------------------------------------------------
// Slow clients.

/// How a slow client ended: when, and what came back.
struct Slow {
    what: &'static str,
    took: Duration,
    answers: Vec<Answer>,
    problem: Option<String>,
}

/// Open a connection now; in a thread, send `head` at once, then `trickle` one byte every
/// `every`, while reading until the server answers `want` times or closes (at most 20 s).
fn slow(
    dir: &Path,
    what: &'static str,
    head: &[u8],
    trickle: Vec<u8>,
    every: Duration,
    want: usize,
) -> std::thread::JoinHandle<Slow> {
    let mut conn = Conn::open(dir).expect("connecting a slow client");
    let head = head.to_vec();
    std::thread::spawn(move || {
        let start = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let mut writer = conn.s.try_clone().unwrap();
        let stopped = stop.clone();
        let trickler = std::thread::spawn(move || {
            let _ = writer.write_all(&head);
            for b in trickle {
                if stopped.load(Ordering::Relaxed) || writer.write_all(&[b]).is_err() {
                    return;
                }
                std::thread::sleep(every);
            }
        });
        let deadline = start + Duration::from_secs(20);
        let mut out = Slow { what, took: Duration::ZERO, answers: Vec::new(), problem: None };
        let mut informational = 0;
        while out.answers.len() < want {
            match conn.answer(false, deadline, &mut informational) {
                Ok(Some(a)) => out.answers.push(a),
                Ok(None) => break,
                Err(e) => {
                    out.problem = Some(e);
                    break;
                }
            }
        }
        out.took = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        let _ = conn.s.shutdown(std::net::Shutdown::Both);
        trickler.join().unwrap();
        out
    })
}

// ---------------------------------------------------------------------------------------------

fn env_number(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

/// GET /mounts on a fresh connection: its answer and how long it took.
fn list(dir: &Path) -> (Option<Answer>, Duration) {
    let start = Instant::now();
    let c = Case {
        kind: "list",
        prefix: None,
        bytes: b"GET /mounts HTTP/1.1\r\nHost: volume\r\n\r\n".to_vec(),
        methods: vec![b"GET".to_vec()],
        starts: Vec::new(),
    };
    let mut out = exchange(dir, &c);
    (out.answers.pop(), start.elapsed())
}

/// A directed case: what it is, the request, the status it must get (`None`: no answer), and
/// the `code` an API error carries.
type Bound = (&'static str, Vec<u8>, Option<u16>, Option<&'static str>);

/// Directed cases at the documented bounds.
fn bounds(ctx: &Ctx) -> Vec<Bound> {
    let get_with = |headers: Vec<String>| {
        let mut req = b"GET /mounts HTTP/1.1\r\n".to_vec();
        for h in headers {
            req.extend(h.bytes());
            req.extend(b"\r\n");
        }
        req.extend(b"\r\n");
        req
    };
    let post = |body: &[u8], content_type: &str| {
        let mut req = format!(
            "POST /mounts HTTP/1.1\r\nHost: v\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        req
    };
    let refused =
        serde_json::to_vec(&json!({"id": "x", "parameters": {"reference": "evil.example:5000/m:v1"}})).unwrap();
    let padded = |n: usize| {
        let mut b = refused.clone();
        b.resize(n, b' ');
        b
    };
    vec![
        ("32 headers", get_with((0..32).map(|i| format!("X-H{i}: v")).collect()), Some(200), None),
        ("33 headers", get_with((0..33).map(|i| format!("X-H{i}: v")).collect()), Some(431), None),
        ("a 15000-byte header", get_with(vec![format!("X-Big: {}", "v".repeat(15_000))]), Some(200), None),
        ("a 17000-byte header", get_with(vec![format!("X-Big: {}", "v".repeat(17_000))]), Some(431), None),
        ("a body of 64 KiB", post(&padded(MAX_BODY), JSON), Some(400), Some("invalid_parameters")),
        ("a body of 64 KiB + 1", post(&padded(MAX_BODY + 1), JSON), Some(413), Some("too_large")),
        ("a body that is not JSON", post(b"{", JSON), Some(400), Some("bad_json")),
        ("a text/plain body", post(&refused, "text/plain"), Some(415), Some("bad_request")),
        (
            "a body shorter than its Content-Length",
            format!("POST /mounts HTTP/1.1\r\nHost: v\r\nContent-Length: {}\r\n\r\n{{\"id\"", refused.len())
                .into_bytes(),
            Some(400),
            Some("bad_request"),
        ),
        (
            "two different Content-Lengths",
            b"POST /mounts HTTP/1.1\r\nHost: v\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}".to_vec(),
            Some(400),
            None,
        ),
        (
            "the kept mount asked again",
            post(&serde_json::to_vec(&json!({"id": KEPT, "parameters": {"reference": ctx.base_ref}})).unwrap(), JSON),
            Some(200),
            None,
        ),
        (
            "the kept mount with another model",
            post(
                &serde_json::to_vec(&json!({"id": KEPT, "parameters": {"reference": "evil.example/m"}})).unwrap(),
                JSON,
            ),
            Some(409),
            Some("conflict"),
        ),
        ("DELETE of an id with ..", b"DELETE /mounts/.. HTTP/1.1\r\n\r\n".to_vec(), Some(400), Some("bad_id")),
        ("the HTTP/2 preface", HTTP2_PREFACE.to_vec(), None, None),
        ("HTTP/1.0", b"GET /mounts HTTP/1.0\r\n\r\n".to_vec(), Some(200), None),
    ]
}

#[test]
fn the_dynamic_api_survives_fuzzed_requests() {
    if !in_private_namespace("the_dynamic_api_survives_fuzzed_requests") {
        return;
    }
    let seed = env_number("MOUNTHOST_FUZZ_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)
    });
    let requests = env_number("MOUNTHOST_FUZZ_REQUESTS").unwrap_or(1500) as usize;
    println!("checked: fuzz seed {seed:#x} ({requests} cases; MOUNTHOST_FUZZ_SEED={seed:#x} replays them)");

    let registry = Registry::start(RegistryOptions::default());
    let base = tiny_model(&registry, "models/base", "v1", b"base weights");
    let node = DynNode::start(&registry);
    run(&node, async || {
        let started = Instant::now();
        let mut csi = node.node().await;
        let a = node.dynamic_volume(&mut csi, PV, POD, &dynamic_ctx(&base.reference)).await;
        assert!(a.join("csi.sock").as_os_str().len() > 108, "the test uses kubelet-length paths");
        mount(&a, KEPT, &base.reference);
        let mounts_dir = a.join("mounts");
        let snap0 = snapshot(&mounts_dir);
        assert_eq!(regular_files(&snapshot(&mounts_dir.join(KEPT))), files_of(&base));
        let mount_points0 = mounts_below(&a);
        let (status, list0) = call(&a, "GET", "/mounts", None);
        assert_eq!(status, 200, "{list0}");
        let (status, kept0) = call(&a, "GET", &format!("/mounts/{KEPT}"), None);
        assert_eq!((status, kept0["state"].as_str()), (200, Some("ready")), "{kept0}");
        assert_eq!(list0, json!({"mounts": [kept0]}));
        let known = Known { list: list0.clone(), kept: kept0 };
        let ctx = Ctx { base_ref: base.reference.clone() };

        let check = |when: &str| {
            assert!(node.host_alive(), "{when}: the host daemon exited");
            let (status, list) = call(&a, "GET", "/mounts", None);
            assert_eq!((status, &list), (200, &list0), "{when}: GET /mounts");
            assert_eq!(snapshot(&mounts_dir), snap0, "{when}: the volume's mounts changed");
            assert_eq!(mounts_below(&a), mount_points0, "{when}: the mount points below the volume changed");
        };

        // The documented bounds, each with its answer.
        for (what, req, want, code) in bounds(&ctx) {
            let c =
                Case { kind: "bound", prefix: None, bytes: req, methods: vec![b"GET".to_vec()], starts: Vec::new() };
            let out = exchange(&a, &c);
            assert!(out.problem.is_none(), "{what}: {:?}", out.problem);
            let got = out.answers.first();
            assert_eq!(got.map(|a| a.status), want, "{what}: {}: {got:?}", shown(&c.bytes));
            if let Some(got) = got {
                judge(got, false, &known).unwrap_or_else(|e| panic!("{what}: {e}"));
                let v: Value = serde_json::from_slice(&got.body).unwrap_or(Value::Null);
                if let Some(code) = code {
                    assert_eq!(v["code"], code, "{what}: {v}");
                }
            }
            if what == "HTTP/1.0" {
                assert_eq!(got.unwrap().version, "HTTP/1.0");
            }
            println!("checked: bound: {what} -> {want:?}");
        }
        check("after the bounds");

        // Slow clients, hanging while the fuzz runs: 3 that send nothing, 2 that trickle a
        // request within the head timeout, 1 that trickles one too slowly, 1 whose body
        // trickles past the body timeout, 1 that idles after an answer on a kept-alive
        // connection. 8 of the 16 connection slots.
        let get = b"GET /mounts HTTP/1.1\r\nHost: volume\r\nConnection: close\r\n\r\n".to_vec();
        let mut slow_clients = Vec::new();
        for _ in 0..3 {
            slow_clients.push(slow(&a, "silent", b"", Vec::new(), Duration::ZERO, 1));
        }
        for _ in 0..2 {
            slow_clients.push(slow(&a, "trickle", b"", get.clone(), Duration::from_millis(60), 1));
        }
        let mut too_slow = get[..get.len() - 2].to_vec();
        too_slow.extend(b"X-Slow: ");
        too_slow.extend(vec![b'a'; 60]);
        slow_clients.push(slow(&a, "too slow", b"", too_slow, Duration::from_millis(500), 1));
        let slow_head =
            b"POST /mounts HTTP/1.1\r\nHost: volume\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n";
        slow_clients.push(slow(&a, "slow body", slow_head, vec![b' '; 60], Duration::from_millis(500), 1));
        let idle = b"GET /mounts HTTP/1.1\r\nHost: volume\r\n\r\n";
        slow_clients.push(slow(&a, "idle", idle, Vec::new(), Duration::ZERO, 2));
        let hanging = slow_clients.len();
        std::thread::sleep(Duration::from_millis(300));
        let mut prompt = Duration::ZERO;
        for _ in 0..5 {
            let (answer, took) = list(&a);
            assert_eq!(
                answer.as_ref().map(|a| a.status),
                Some(200),
                "GET /mounts beside {hanging} hanging connections"
            );
            prompt = prompt.max(took);
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(prompt < Duration::from_secs(2), "GET /mounts beside {hanging} hanging connections took {prompt:?}");
        println!("checked: beside {hanging} hanging connections GET /mounts answers 200 in at most {prompt:?}");
        let slow_started = Instant::now();

        // The fuzz.
        let mut r = Rng(seed);
        let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
        let (mut sent, mut closed, mut informational) = (0usize, 0usize, 0usize);
        let mut by_kind = std::collections::BTreeMap::<&str, usize>::new();
        let mut by_code = std::collections::BTreeMap::<String, usize>::new();
        let mut failures: Vec<String> = Vec::new();
        let mut slowest = (Duration::ZERO, String::new());
        let mut while_hanging = (0usize, Duration::ZERO);
        for i in 1..=requests {
            let c = case(&mut r, &ctx);
            *by_kind.entry(c.kind).or_default() += 1;
            sent += c.methods.len().max(1);
            let out = exchange(&a, &c);
            informational += out.informational;
            if out.took > slowest.0 {
                slowest = (out.took, format!("#{i} {}: {}", c.kind, shown(&c.bytes)));
            }
            if slow_started.elapsed() < Duration::from_secs(9) {
                while_hanging = (while_hanging.0 + 1, while_hanging.1.max(out.took));
            }
            if out.answers.is_empty() {
                closed += 1;
            }
            let mut problems: Vec<String> = out.problem.into_iter().collect();
            for (n, answer) in out.answers.iter().enumerate() {
                *by_status.entry(answer.status).or_default() += 1;
                if let Ok(v) = serde_json::from_slice::<Value>(&answer.body)
                    && let Some(code) = v["code"].as_str()
                {
                    *by_code.entry(code.to_string()).or_default() += 1;
                }
                let head_only = c.methods.get(n).is_some_and(|m| m == b"HEAD");
                if let Err(e) = judge(answer, head_only, &known) {
                    problems.push(format!("answer {} ({}): {e}", n + 1, answer.status));
                }
            }
            // Well-framed pipelined requests are all answered, in order; except that hyper
            // closes the connection after answering a request whose body the handler left
            // unread (a 404 or 405 to a POST) unless the whole body is already in its buffer,
            // which HTTP allows (a client sends the rest again on a new connection).
            let n = out.answers.len();
            let cut_after_body = n > 0
                && c.methods.get(n - 1).is_some_and(|m| m == b"POST")
                && c.starts.get(n - 1).is_some_and(|&at| !c.bytes[at..].starts_with(b"POST /mounts "));
            if c.kind == "pipelined" && n != c.methods.len() && !cut_after_body {
                let next = c
                    .starts
                    .get(n)
                    .map(|&at| shown(&c.bytes[at..c.starts.get(n + 1).copied().unwrap_or(c.bytes.len())]));
                let statuses: Vec<u16> = out.answers.iter().map(|a| a.status).collect();
                problems.push(format!(
                    "{n} answers to {} well-framed requests ({statuses:?}), then the connection ended ({:?}); the first one unanswered: {next:?}",
                    c.methods.len(),
                    out.end
                ));
            }
            if !problems.is_empty() {
                failures.push(format!(
                    "#{i} {} (seed {seed:#x}): {}\n    request: {}",
                    c.kind,
                    problems.join("; "),
                    shown(&c.bytes)
                ));
            }
            if i % 100 == 0 || i == requests {
                assert!(failures.is_empty(), "after {i} cases:\n{}", failures.join("\n"));
                check(&format!("after {i} cases"));
            }
        }
        let fuzz_took = slow_started.elapsed();

        // The slow clients' ends.
        for handle in slow_clients {
            let s = handle.join().unwrap();
            let statuses: Vec<u16> = s.answers.iter().map(|a| a.status).collect();
            for a in &s.answers {
                judge(a, false, &known).unwrap_or_else(|e| panic!("{}: {e}", s.what));
            }
            match s.what {
                "trickle" => {
                    assert_eq!((statuses.as_slice(), &s.problem), (&[200][..], &None), "{}: {:?}", s.what, s.took);
                    assert!(s.took < Duration::from_secs(9), "{}: {:?}", s.what, s.took);
                }
                "slow body" => {
                    assert!(s.problem.is_none(), "{}: {:?}", s.what, s.problem);
                    assert_eq!(statuses, [408], "{}: the body timeout's answer", s.what);
                    assert!(
                        (Duration::from_secs(9)..Duration::from_secs(15)).contains(&s.took),
                        "{}: answered or closed after {:?}",
                        s.what,
                        s.took
                    );
                }
                what => {
                    assert!(s.problem.is_none(), "{}: {:?}", s.what, s.problem);
                    let want: &[u16] = if what == "idle" { &[200] } else { &[] };
                    assert_eq!(statuses, want, "{}", s.what);
                    assert!(
                        (Duration::from_secs(9)..Duration::from_secs(15)).contains(&s.took),
                        "{}: closed after {:?}",
                        s.what,
                        s.took
                    );
                }
            }
            println!("checked: slow client {}: {statuses:?} after {:?}", s.what, s.took);
        }
        check("after the slow clients");

        let log = std::fs::read_to_string(node.dirs.root.path().join("host.log")).unwrap_or_default();
        assert!(!log.contains("panicked"), "the host daemon panicked:\n{log}");

        println!(
            "checked: fuzz summary: seed {seed:#x}, {requests} cases ({sent} requests) in {fuzz_took:?}; answers by status {by_status:?}, by code {by_code:?}; \
             {closed} connections closed without an answer; {informational} 1xx; cases {by_kind:?}; \
             {} answered while {hanging} connections hung, the slowest in {:?}",
            while_hanging.0, while_hanging.1
        );
        println!("checked: slowest case {:?}: {}", slowest.0, slowest.1.chars().take(200).collect::<String>());

        // Unpublish and unstage: nothing left mounted.
        csi.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: PV.into(),
            target_path: a.display().to_string(),
        })
        .await
        .unwrap();
        assert!(!a.exists(), "the target is gone");
        csi.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: PV.into(),
            staging_target_path: node.dirs.staging(PV).display().to_string(),
        })
        .await
        .unwrap();
        assert_eq!(mounts_below(node.dirs.root.path()), Vec::<PathBuf>::new());
        assert!(node.host_alive());
        println!("checked: unpublished and unstaged cleanly; total {:?}", started.elapsed());
    });
}
