//! CSI secrets: kept out of logs, argv, plans and state files.
//!
//! The CSI spec says secrets "MUST NOT" be logged by the plugin. Plans reference secrets by
//! key and the executor fills them in; anything a plugin says back (errors, log lines) is
//! scrubbed of secret values before it reaches a log or a client.

use std::collections::BTreeMap;
use std::fmt;

/// Secrets of one request. `Debug` prints only the keys.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secrets(BTreeMap<String, String>);

/// Secret values shorter than this are not searched for in text: a 1-3 byte value would match
/// ordinary words and numbers, and is not a meaningful secret.
pub const MIN_SCRUBBED_LEN: usize = 4;

impl Secrets {
    /// Wrap a key → value map.
    pub fn new(map: BTreeMap<String, String>) -> Self {
        Secrets(map)
    }

    /// The value of one secret.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Keys and values, for handing to a plugin.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// True if `text` contains the value of any secret (of at least [`MIN_SCRUBBED_LEN`]).
    pub fn leaks_into(&self, text: &str) -> Option<&str> {
        self.0.iter().find(|(_, v)| v.len() >= MIN_SCRUBBED_LEN && text.contains(v.as_str())).map(|(k, _)| k.as_str())
    }

    /// `text` with every secret value replaced by `<redacted:KEY>`.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (k, v) in &self.0 {
            if v.len() >= MIN_SCRUBBED_LEN && out.contains(v.as_str()) {
                out = out.replace(v.as_str(), &format!("<redacted:{k}>"));
            }
        }
        out
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl FromIterator<(String, String)> for Secrets {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Secrets(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s() -> Secrets {
        [("jwt".to_string(), "s3cr3t-value".to_string()), ("pin".to_string(), "12".to_string())].into_iter().collect()
    }

    #[test]
    fn debug_shows_keys_only() {
        assert_eq!(format!("{:?}", s()), r#"{"jwt", "pin"}"#);
    }

    #[test]
    fn scrub_and_leak_detection() {
        let s = s();
        assert_eq!(s.scrub("token s3cr3t-value!"), "token <redacted:jwt>!");
        assert_eq!(s.leaks_into("-x=s3cr3t-value"), Some("jwt"));
        // Short values are not searched: "12" would match any number.
        assert_eq!(s.leaks_into("-size=12"), None);
    }
}
