//! Choosing one manifest of an image index (or a Docker manifest list) by platform: the
//! node's own unless a volume names another (`platform: os/architecture[/variant]`).
//!
//! An index none of whose entries names a platform (a ModelPack index, say) resolves to its
//! first manifest, as it always has. Otherwise the first entry whose `os` and `architecture`
//! equal the wanted ones, and whose `variant` does too when one is wanted (an entry without a
//! variant matches `arm64/v8`, the only variant `arm64` has); no match is an error naming the
//! platforms the index has.

use std::fmt;

/// `os/architecture[/variant]`, as the image spec spells them (`linux/amd64`, `linux/arm/v7`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// `linux`, `windows`, ...
    pub os: String,
    /// `amd64`, `arm64`, `arm`, ...
    pub architecture: String,
    /// `v7`, `v8`, ...; `None`: any.
    pub variant: Option<String>,
}

impl Platform {
    /// This node's platform: Linux and the architecture the host was built for, in the image
    /// spec's (Go's) names.
    pub fn node() -> Platform {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "arm" => "arm",
            "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
            "s390x" => "s390x",
            "riscv64" => "riscv64",
            "loongarch64" => "loong64",
            other => other,
        };
        Platform { os: "linux".into(), architecture: architecture.into(), variant: None }
    }

    /// `os/architecture[/variant]`, each part lower-case letters, digits, `_` or `.`.
    pub fn parse(raw: &str) -> Result<Platform, String> {
        let parts: Vec<&str> = raw.split('/').collect();
        if !(2..=3).contains(&parts.len()) {
            return Err("not os/architecture or os/architecture/variant".into());
        }
        if let Some(bad) = parts.iter().find(|p| {
            p.is_empty()
                || p.len() > 32
                || !p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.')
        }) {
            return Err(format!("{bad:?} is not a platform name (lower-case letters, digits, _ and ., at most 32)"));
        }
        Ok(Platform {
            os: parts[0].into(),
            architecture: parts[1].into(),
            variant: parts.get(2).map(|v| v.to_string()),
        })
    }

    /// Whether an index entry's `platform` object is this one.
    fn matches(&self, p: &serde_json::Value) -> bool {
        let field = |k: &str| p.get(k).and_then(|v| v.as_str());
        if field("os") != Some(&self.os) || field("architecture") != Some(&self.architecture) {
            return false;
        }
        match (&self.variant, field("variant")) {
            (None, _) => true,
            (Some(want), Some(have)) => want == have,
            (Some(want), None) => self.architecture == "arm64" && want == "v8",
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// The digest of the manifest of the index `doc` for `want`, or why there is none.
pub fn choose<'a>(doc: &'a serde_json::Value, want: &Platform) -> Result<&'a str, String> {
    let entries = doc.get("manifests").and_then(|m| m.as_array()).filter(|m| !m.is_empty());
    let entries = entries.ok_or("the image index lists no manifest")?;
    let digest = |e: &'a serde_json::Value| {
        e.get("digest").and_then(|d| d.as_str()).ok_or_else(|| "an entry of the image index has no digest".to_string())
    };
    if entries.iter().all(|e| e.get("platform").is_none()) {
        return digest(&entries[0]);
    }
    if let Some(e) = entries.iter().find(|e| e.get("platform").is_some_and(|p| want.matches(p))) {
        return digest(e);
    }
    let mut have: Vec<String> = entries
        .iter()
        .filter_map(|e| e.get("platform"))
        .map(|p| {
            let field = |k: &str| p.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_string();
            let variant = p.get("variant").and_then(|v| v.as_str()).map(|v| format!("/{v}")).unwrap_or_default();
            format!("{}/{}{variant}", field("os"), field("architecture"))
        })
        .collect();
    have.dedup();
    have.truncate(16);
    Err(format!(
        "the image index has no manifest for platform {want} (it has {}); name one with the volume attribute platform",
        have.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn index() -> serde_json::Value {
        json!({"manifests": [
            {"digest": "sha256:arm", "platform": {"os": "linux", "architecture": "arm64"}},
            {"digest": "sha256:amd", "platform": {"os": "linux", "architecture": "amd64"}},
            {"digest": "sha256:v7", "platform": {"os": "linux", "architecture": "arm", "variant": "v7"}},
            {"digest": "sha256:att", "platform": {"os": "unknown", "architecture": "unknown"}},
        ]})
    }

    #[test]
    fn an_index_resolves_by_platform() {
        let p = |s: &str| Platform::parse(s).unwrap();
        assert_eq!(choose(&index(), &p("linux/amd64")), Ok("sha256:amd"));
        assert_eq!(choose(&index(), &p("linux/arm64/v8")), Ok("sha256:arm"));
        assert_eq!(choose(&index(), &p("linux/arm/v7")), Ok("sha256:v7"));
        let e = choose(&index(), &p("linux/s390x")).unwrap_err();
        assert!(
            e.contains(
                "no manifest for platform linux/s390x (it has linux/arm64, linux/amd64, linux/arm/v7, unknown/unknown)"
            ),
            "{e}"
        );
        // Without any platform: the first entry, as before.
        let plain = json!({"manifests": [{"digest": "sha256:first"}, {"digest": "sha256:second"}]});
        assert_eq!(choose(&plain, &p("linux/s390x")), Ok("sha256:first"));
        assert!(choose(&json!({"manifests": []}), &p("linux/amd64")).is_err());
    }

    #[test]
    fn platforms_are_parsed_strictly() {
        assert_eq!(Platform::parse("linux/arm/v7").unwrap().to_string(), "linux/arm/v7");
        for bad in ["linux", "linux/", "Linux/amd64", "a/b/c/d", "linux/amd 64", "/amd64"] {
            assert!(Platform::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Platform::node().os, "linux");
    }
}
