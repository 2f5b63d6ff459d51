//! Reading an argv the way its program's [`Style`] reads it, judging every piece by a rule.
//! A spelling the style does not read one way only is refused, never guessed at.

use std::collections::BTreeMap;

use super::class::Refused;
use super::{ArgRefusal, Class, RuleSet, Style, Values};

/// A spelling a rule set may give an option: `-name` for style `go`; `-X` (one letter or
/// digit) or `--name` for the others.
pub(super) fn check_spelling(style: Style, spelled: &str) -> Result<(), String> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.len() <= 128
            && n.starts_with(|c: char| c.is_ascii_alphanumeric())
            && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    let ok = match style {
        Style::Go => spelled.strip_prefix('-').is_some_and(|n| name_ok(n)),
        Style::Fuse | Style::Gnu => match spelled.strip_prefix("--") {
            Some(long) => name_ok(long),
            None => spelled.strip_prefix('-').is_some_and(|s| s.len() == 1 && name_ok(s)),
        },
    };
    if ok {
        Ok(())
    } else {
        let form = match style {
            Style::Go => "-name",
            _ => "-X (one letter or digit) or --name",
        };
        Err(format!("option {spelled:?} is not spelled {form}"))
    }
}

struct Judge<'a> {
    set: &'a RuleSet,
    args: &'a [String],
    values: &'a Values<'a>,
    positional: usize,
    /// The options (spellings) and `-o` items (names) given, for `required`.
    given: std::collections::BTreeSet<String>,
}

impl Judge<'_> {
    fn refuse(&self, index: usize, rule: impl Into<String>, reason: impl Into<String>) -> ArgRefusal {
        ArgRefusal {
            position: index + 1,
            argument: self.args.get(index).cloned().unwrap_or_default(),
            rule: rule.into(),
            reason: reason.into(),
            ungranted: None,
        }
    }

    /// A refusal by a value class (which may name a host that is not granted).
    fn refused(&self, index: usize, rule: String, what: &str, e: Refused) -> ArgRefusal {
        ArgRefusal { ungranted: e.ungranted, ..self.refuse(index, rule, format!("{what}: {}", e.reason)) }
    }

    fn accepted(map: &BTreeMap<String, Class>) -> String {
        if map.is_empty() { "none".into() } else { map.keys().cloned().collect::<Vec<_>>().join(", ") }
    }

    /// An option `spelled` at `index`, with `value` (`None`: given without one).
    fn option(
        &mut self,
        index: usize,
        map: &BTreeMap<String, Class>,
        section: &str,
        spelled: &str,
        value: Option<&str>,
    ) -> Result<(), ArgRefusal> {
        let Some(class) = map.get(spelled) else {
            return Err(self.refuse(
                index,
                "unknown-option",
                format!("option {spelled} is not in the rule set (accepted {section}: {})", Self::accepted(map)),
            ));
        };
        class
            .check(value, self.values)
            .map_err(|e| self.refused(index, format!("{section}.{spelled}"), &format!("option {spelled}"), e))?;
        self.given.insert(spelled.to_string());
        Ok(())
    }

    /// A Go flag at `index`: `-name` or `-name=value`, exactly one dash.
    fn go_option(&mut self, index: usize, map: &BTreeMap<String, Class>, section: &str) -> Result<(), ArgRefusal> {
        let arg = &self.args[index];
        if arg.starts_with("--") {
            return Err(self.refuse(
                index,
                "spelling",
                "write Go flags with one dash (-name or -name=value); the rule set reads no other spelling",
            ));
        }
        let body = &arg[1..];
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        let spelled = format!("-{name}");
        // Go takes the next argument as the value of a flag that is not boolean: the host reads
        // a value only after `=`, so a valued option without one is refused by its class.
        self.option(index, map, section, &spelled, value)
    }

    fn positional(&mut self, index: usize) -> Result<(), ArgRefusal> {
        let arg = &self.args[index];
        let Some(rule) = self.set.positionals.get(self.positional) else {
            return Err(self.refuse(
                index,
                "extra-positional",
                format!(
                    "a positional argument beyond the {} the rule set names ({})",
                    self.set.positionals.len(),
                    self.set.positionals.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ")
                ),
            ));
        };
        self.positional += 1;
        rule.class.check(Some(arg), self.values).map_err(|e| {
            self.refused(index, format!("positionals.{}", self.positional), &format!("positional {}", rule.name), e)
        })
    }

    /// An `-o` list at `index` (the list itself is `list`).
    fn o_list(&mut self, index: usize, list: &str) -> Result<(), ArgRefusal> {
        for item in list.split(',') {
            if item.is_empty() {
                return Err(self.refuse(index, "spelling", "an -o list with an empty item"));
            }
            if item.contains('\\') {
                return Err(self.refuse(
                    index,
                    "spelling",
                    format!("-o item {item:?} holds a backslash, which libfuse reads as an escape"),
                ));
            }
            if item.starts_with('-') {
                return Err(self.refuse(
                    index,
                    "spelling",
                    format!("-o item {item:?} starts with '-', which libfuse reads as an argument of its own"),
                ));
            }
            let (name, value) = match item.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (item, None),
            };
            let Some(class) = self.set.o_options.get(name) else {
                return Err(self.refuse(
                    index,
                    "unknown-o-option",
                    format!(
                        "-o option {name} is not in the rule set (accepted: {})",
                        Self::accepted(&self.set.o_options)
                    ),
                ));
            };
            class
                .check(value, self.values)
                .map_err(|e| self.refused(index, format!("o-options.{name}"), &format!("-o option {name}"), e))?;
            self.given.insert(name.to_string());
        }
        Ok(())
    }
}

pub(super) fn check(set: &RuleSet, args: &[String], values: &Values<'_>) -> Result<(), ArgRefusal> {
    let mut j = Judge { set, args, values, positional: 0, given: Default::default() };
    let mut i = 0;
    if set.style == Style::Go && !set.subcommand.is_empty() {
        while i < args.len() && args[i].starts_with('-') && args[i] != "-" && args[i] != "--" {
            j.go_option(i, &set.global_options, "global-options")?;
            i += 1;
        }
    }
    for word in &set.subcommand {
        if args.get(i) != Some(word) {
            return Err(ArgRefusal {
                position: i + 1,
                argument: args.get(i).cloned().unwrap_or_default(),
                rule: "subcommand".into(),
                reason: format!("the subcommand must be `{}`", set.subcommand.join(" ")),
                ungranted: None,
            });
        }
        i += 1;
    }
    let mut after_positional = false;
    while i < args.len() {
        let arg = args[i].as_str();
        if arg == "-" || arg == "--" {
            return Err(j.refuse(i, "spelling", format!("{arg:?} alone: the rule set reads no such argument")));
        }
        if set.style == Style::Go && after_positional && arg.starts_with('-') {
            // Go reads it as positional, but weed's flag parser (fla9) still takes
            // `-options=FILE` from among its positional arguments: read no way at all.
            return Err(j.refuse(
                i,
                "spelling",
                "an option after a positional argument, which Go programs read in different ways",
            ));
        }
        if !arg.starts_with('-') {
            // Go reads every argument after the first positional one as positional.
            j.positional(i)?;
            after_positional = true;
            i += 1;
            continue;
        }
        match set.style {
            Style::Go => j.go_option(i, &set.options, "options")?,
            Style::Fuse | Style::Gnu => {
                if let Some(long) = arg.strip_prefix("--") {
                    let (name, value) = match long.split_once('=') {
                        Some((n, v)) => (n, Some(v)),
                        None => (long, None),
                    };
                    // A valued long option's value only after `=`: `--name VALUE` is refused by
                    // its class (the next argument is judged on its own).
                    j.option(i, &set.options, "options", &format!("--{name}"), value)?;
                } else if set.style == Style::Fuse && arg.starts_with("-o") {
                    if arg == "-o" {
                        let Some(list) = args.get(i + 1) else {
                            return Err(j.refuse(i, "spelling", "-o without its list"));
                        };
                        j.o_list(i + 1, list)?;
                        i += 1;
                    } else {
                        j.o_list(i, &arg[2..])?;
                    }
                } else if arg.chars().count() == 2 {
                    match set.options.get(arg) {
                        Some(Class::Flag | Class::Bool) => j.option(i, &set.options, "options", arg, None)?,
                        Some(_) => {
                            // getopt takes the next argument as the value, whatever it holds.
                            let Some(value) = args.get(i + 1) else {
                                return Err(j.refuse(
                                    i,
                                    format!("options.{arg}"),
                                    format!("option {arg} needs a value"),
                                ));
                            };
                            j.option(i + 1, &set.options, "options", arg, Some(value))?;
                            i += 1;
                        }
                        None => j.option(i, &set.options, "options", arg, None)?,
                    }
                } else {
                    return Err(j.refuse(
                        i,
                        "spelling",
                        "a cluster of short options or a single-dash long option, which programs read in different \
                         ways: give each short option alone (-f -d) and a long one as --name",
                    ));
                }
            }
        }
        i += 1;
    }
    if let Some(missing) = set.required.iter().find(|r| !j.given.contains(*r)) {
        return Err(ArgRefusal {
            position: 0,
            argument: String::new(),
            rule: format!("required.{missing}"),
            reason: format!(
                "option {missing} is required (without it the program would pick a default no one granted)"
            ),
            ungranted: None,
        });
    }
    if let Some(missing) = set.positionals.get(j.positional) {
        return Err(ArgRefusal {
            position: 0,
            argument: String::new(),
            rule: format!("positionals.{}", j.positional + 1),
            reason: format!("positional argument {} ({}) is missing", j.positional + 1, missing.name),
            ungranted: None,
        });
    }
    Ok(())
}
