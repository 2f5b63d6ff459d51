//! Which of a model's files a volume holds: `include`/`exclude` patterns on the file path,
//! `weights` and `types` on the layer's class.
//!
//! ModelPack packs one file (or one directory) per layer and says what it is in the layer's
//! media type (its *class*: weights, weight configuration, documentation, code, datasets) and
//! where it goes in the `org.cncf.model.filepath` annotation. Filters choose layers by both, so
//! a serving pod can mount the weights and their configuration but not a 40 GB dataset, and
//! the host never fetches what no volume selects.
//!
//! Patterns behave like `.gitignore` lines: `*`, `?` and `[...]` stay within one path
//! component, `**` spans several, `{a,b}` is either; a pattern without `/` is matched against
//! each component of the path (so `*.safetensors` matches at any depth), one with `/` against
//! the path from the model's root; and a pattern that matches a directory matches everything
//! below it (`exclude=original` drops `original/consolidated.00.pth`). Commas inside `{...}`
//! or `[...]` belong to the pattern, not to the list.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use mounthost_plugin_sdk::BackendError;
use mounthost_plugin_sdk::params::invalid;

/// The class of a ModelPack layer, from its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Model weights (`...model.weight.v1.*`).
    Weight,
    /// Configuration of the weights: `config.json`, tokenizers (`...model.weight.config.v1.*`).
    Config,
    /// Documentation: README, LICENSE (`...model.doc.v1.*`).
    Doc,
    /// Code: scripts, modelling files (`...model.code.v1.*`).
    Code,
    /// Datasets (`...model.dataset.v1.*`).
    Dataset,
}

impl Class {
    /// Every class, in the order `types` is documented and canonicalised.
    pub const ALL: [Class; 5] = [Class::Weight, Class::Config, Class::Doc, Class::Code, Class::Dataset];

    /// The name `types` uses.
    pub fn name(self) -> &'static str {
        match self {
            Class::Weight => "weight",
            Class::Config => "config",
            Class::Doc => "doc",
            Class::Code => "code",
            Class::Dataset => "dataset",
        }
    }

    fn from_name(name: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// The `types` default: every class.
pub const ALL_TYPES: &str = "weight,config,doc,code,dataset";

/// What `weights` says about weight layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weights {
    /// Like any other class (the default).
    Include,
    /// Weight layers only.
    Only,
    /// Everything but weight layers.
    Exclude,
}

/// The accepted `weights` values.
pub const WEIGHTS: &[&str] = &["include", "only", "exclude"];

/// The filters' raw values, as the parameters give them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Raw<'a> {
    /// `include`.
    pub include: Option<&'a str>,
    /// `exclude`.
    pub exclude: Option<&'a str>,
    /// `weights`.
    pub weights: Option<&'a str>,
    /// `types`.
    pub types: Option<&'a str>,
}

/// A compiled list of patterns.
#[derive(Debug, Clone)]
struct Patterns {
    /// The patterns, trimmed, without a trailing `/`, sorted, without duplicates.
    texts: Vec<String>,
    /// Patterns without `/`, matched against each path component.
    by_name: GlobSet,
    /// Patterns with `/`, matched against the path and each of its parent directories.
    by_path: GlobSet,
}

impl Patterns {
    fn parse(key: &str, value: &str) -> Result<Self, BackendError> {
        let accepted = "a comma-separated list of patterns relative to the model's root, such as \
                        *.safetensors,tokenizer/**,config.json: * ? [..] {a,b} within a path \
                        component, ** across components, no leading /, no . or .. components";
        let mut texts: Vec<String> = Vec::new();
        for item in split_list(value) {
            let p = item.trim().trim_end_matches('/');
            let why = if p.is_empty() {
                Some("an empty pattern")
            } else if p.starts_with('/') {
                Some("a pattern starting with /")
            } else if p.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
                Some("a pattern with an empty, . or .. component")
            } else if p.chars().any(char::is_control) {
                Some("a control character")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(invalid(format!("parameter {key:?} has {why} ({item:?}); give {accepted}")));
            }
            if !texts.iter().any(|t| t == p) {
                texts.push(p.to_string());
            }
        }
        texts.sort();
        let mut by_name = GlobSetBuilder::new();
        let mut by_path = GlobSetBuilder::new();
        for p in &texts {
            let glob = GlobBuilder::new(p).literal_separator(true).build().map_err(|e| {
                invalid(format!("parameter {key:?}: pattern {p:?} is not a valid glob ({}); give {accepted}", e.kind()))
            })?;
            if p.contains('/') {
                by_path.add(glob)
            } else {
                by_name.add(glob)
            };
        }
        let build = |b: GlobSetBuilder| {
            b.build().map_err(|e| invalid(format!("parameter {key:?}: the patterns cannot be compiled ({e})")))
        };
        Ok(Patterns { by_name: build(by_name)?, by_path: build(by_path)?, texts })
    }

    /// True if a pattern matches the path, one of its components (patterns without `/`) or
    /// one of its parent directories (patterns with `/`).
    fn matches(&self, path: &str) -> bool {
        if path.split('/').any(|c| self.by_name.is_match(c)) {
            return true;
        }
        path.match_indices('/').map(|(i, _)| &path[..i]).chain([path]).any(|prefix| self.by_path.is_match(prefix))
    }
}

/// Every filter of a volume, parsed and validated.
#[derive(Debug, Clone)]
pub struct Filters {
    include: Option<Patterns>,
    exclude: Option<Patterns>,
    /// The classes left after `types` and `weights`, in [`Class::ALL`] order; never empty.
    classes: Vec<Class>,
    /// The raw values that are set, as `key "value"`, for messages.
    given: Vec<String>,
}

impl Filters {
    /// Parse and check the filters; `types` and `weights` that leave no class are refused.
    pub fn parse(raw: Raw<'_>) -> Result<Self, BackendError> {
        let include = raw.include.map(|v| Patterns::parse("include", v)).transpose()?;
        let exclude = raw.exclude.map(|v| Patterns::parse("exclude", v)).transpose()?;
        let weights = match raw.weights {
            None | Some("include") => Weights::Include,
            Some("only") => Weights::Only,
            Some("exclude") => Weights::Exclude,
            Some(v) => {
                return Err(invalid(format!("parameter \"weights\" must be one of {}, not {v:?}", WEIGHTS.join(", "))));
            }
        };
        let types = match raw.types {
            None => Class::ALL.to_vec(),
            Some(v) => parse_types(v)?,
        };
        let classes: Vec<Class> = types
            .iter()
            .copied()
            .filter(|c| match weights {
                Weights::Include => true,
                Weights::Only => *c == Class::Weight,
                Weights::Exclude => *c != Class::Weight,
            })
            .collect();
        if classes.is_empty() {
            return Err(invalid(format!(
                "parameter \"weights\" is {:?} and parameter \"types\" is {:?}: together they select \
                 no layer class; add weight to types, or change weights",
                raw.weights.unwrap_or("include"),
                raw.types.unwrap_or(ALL_TYPES)
            )));
        }
        let given =
            [("include", raw.include), ("exclude", raw.exclude), ("weights", raw.weights), ("types", raw.types)]
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| format!("{k} {v:?}")))
                .collect();
        Ok(Filters { include, exclude, classes, given })
    }

    /// True if a layer of `class` whose file path is `path` belongs in the volume.
    pub fn selects(&self, path: &str, class: Class) -> bool {
        self.classes.contains(&class)
            && self.include.as_ref().is_none_or(|p| p.matches(path))
            && !self.exclude.as_ref().is_some_and(|p| p.matches(path))
    }

    /// The filters that are set, for messages: `include "*.md", weights "exclude"`, or
    /// `no filters`.
    pub fn describe(&self) -> String {
        if self.given.is_empty() { "no filters".to_string() } else { self.given.join(", ") }
    }

    /// A canonical text of what the filters select (pattern order, duplicates and the way
    /// classes were spelled do not matter), for the volume id.
    pub fn canonical(&self) -> String {
        let list = |p: &Option<Patterns>| p.as_ref().map(|p| p.texts.join(",")).unwrap_or_default();
        let classes: Vec<&str> = self.classes.iter().map(|c| c.name()).collect();
        format!("include={}\nexclude={}\nclasses={}", list(&self.include), list(&self.exclude), classes.join(","))
    }
}

/// Split a pattern list at the commas that separate patterns, not those inside `{a,b}` or
/// `[...]`; a backslash escapes the next character.
fn split_list(value: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut start, mut braces, mut class, mut escaped) = (0, 0usize, false, false);
    for (i, c) in value.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '[' if !class => class = true,
            ']' if class => class = false,
            '{' if !class => braces += 1,
            '}' if !class => braces = braces.saturating_sub(1),
            ',' if !class && braces == 0 => {
                items.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&value[start..]);
    items
}

fn parse_types(v: &str) -> Result<Vec<Class>, BackendError> {
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim) {
        let class = Class::from_name(item).ok_or_else(|| {
            invalid(format!(
                "parameter \"types\": {item:?} is not a layer class; give a comma-separated list of \
                 {}",
                ALL_TYPES.replace(',', ", ")
            ))
        })?;
        if out.contains(&class) {
            return Err(invalid(format!("parameter \"types\" lists {item:?} twice")));
        }
        out.push(class);
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn patterns(v: &str) -> Patterns {
        Patterns::parse("include", v).unwrap()
    }

    #[rstest]
    #[case("*.safetensors", "model.safetensors", true)]
    #[case("*.safetensors", "shards/model-00001.safetensors", true)]
    #[case("*.safetensors", "model.safetensors.index.json", false)]
    #[case("config.json", "config.json", true)]
    #[case("config.json", "sub/config.json", true)]
    #[case("tokenizer/*", "tokenizer/vocab.json", true)]
    #[case("tokenizer/*", "tokenizer/a/b.json", true)]
    #[case("tokenizer/*.json", "tokenizer/a/b.json", false)]
    #[case("tokenizer/**/*.json", "tokenizer/a/b.json", true)]
    #[case("**/*.md", "docs/x/README.md", true)]
    #[case("original", "original/consolidated.00.pth", true)]
    #[case("original/", "original/params.json", true)]
    #[case("a/b", "a/b/c/d", true)]
    #[case("a/b", "a/bc", false)]
    #[case("a/b", "x/a/b", false)]
    #[case("{config,generation_config}.json", "generation_config.json", true)]
    #[case("model-0000?-of-*.safetensors", "model-00002-of-00004.safetensors", true)]
    #[case("[ab].txt", "c.txt", false)]
    fn pattern_semantics(#[case] pattern: &str, #[case] path: &str, #[case] matched: bool) {
        assert_eq!(patterns(pattern).matches(path), matched, "{pattern:?} on {path:?}");
    }

    #[rstest]
    #[case("a,,b", "empty pattern")]
    #[case("", "empty pattern")]
    #[case("/abs", "starting with /")]
    #[case("a/../b", ". or ..")]
    #[case("./a", ". or ..")]
    #[case("a//b", "empty, . or ..")]
    #[case("a[", "not a valid glob")]
    #[case("{a,b", "not a valid glob")]
    fn bad_patterns(#[case] v: &str, #[case] says: &str) {
        let Err(BackendError::InvalidArgument(m)) = Patterns::parse("include", v) else { panic!("{v:?} accepted") };
        assert!(m.starts_with("parameter \"include\""), "{m}");
        assert!(m.contains(says), "{v:?}: {m}");
    }

    fn filters(include: Option<&str>, exclude: Option<&str>, weights: Option<&str>, types: Option<&str>) -> Filters {
        Filters::parse(Raw { include, exclude, weights, types }).unwrap()
    }

    #[test]
    fn lists_split_outside_braces_and_classes() {
        assert_eq!(split_list("a,{b,c}.json,[,]x,d"), ["a", "{b,c}.json", "[,]x", "d"]);
        assert_eq!(split_list("a\\,b,c"), ["a\\,b", "c"]);
        assert_eq!(split_list(""), [""]);
        assert_eq!(
            patterns("{config,generation_config}.json, *.md").texts,
            ["*.md", "{config,generation_config}.json"]
        );
    }

    #[test]
    fn classes_follow_weights_and_types() {
        let all = filters(None, None, None, None);
        assert!(Class::ALL.iter().all(|c| all.selects("f", *c)));
        assert_eq!(all.describe(), "no filters");
        let only = filters(None, None, Some("only"), None);
        assert_eq!(only.classes, vec![Class::Weight]);
        let no_weights = filters(None, None, Some("exclude"), Some("doc , weight"));
        assert_eq!(no_weights.classes, vec![Class::Doc]);
        let typed = filters(None, None, Some("include"), Some("dataset,config"));
        assert_eq!(typed.classes, vec![Class::Config, Class::Dataset]);
    }

    #[test]
    fn exclude_wins_over_include() {
        let f = filters(Some("*.safetensors,*.json"), Some("consolidated*,original"), None, None);
        assert!(f.selects("model.safetensors", Class::Weight));
        assert!(f.selects("config.json", Class::Config));
        assert!(!f.selects("consolidated.safetensors", Class::Weight));
        assert!(!f.selects("original/params.json", Class::Config));
        assert!(!f.selects("README.md", Class::Doc));
        assert_eq!(f.describe(), "include \"*.safetensors,*.json\", exclude \"consolidated*,original\"");
    }

    #[rstest]
    #[case(Some("only"), Some("config,doc"), "select no layer class")]
    #[case(Some("exclude"), Some("weight"), "select no layer class")]
    #[case(Some("some"), None, "must be one of include, only, exclude")]
    #[case(None, Some("weights"), "\"weights\" is not a layer class")]
    #[case(None, Some("doc,,code"), "\"\" is not a layer class")]
    #[case(None, Some("doc,doc"), "lists \"doc\" twice")]
    fn bad_classes(#[case] weights: Option<&str>, #[case] types: Option<&str>, #[case] says: &str) {
        let Err(BackendError::InvalidArgument(m)) = Filters::parse(Raw { weights, types, ..Raw::default() }) else {
            panic!("accepted")
        };
        assert!(m.contains(says), "{m}");
    }

    #[test]
    fn canonical_ignores_order_and_spelling() {
        let a = filters(Some("b,a,a"), None, Some("exclude"), None);
        let b = filters(Some("a, b/"), None, None, Some("config,doc,code,dataset"));
        assert_eq!(a.canonical(), b.canonical());
        assert_eq!(a.canonical(), "include=a,b\nexclude=\nclasses=config,doc,code,dataset");
        assert_ne!(a.canonical(), filters(None, Some("a,b"), Some("exclude"), None).canonical());
    }
}
