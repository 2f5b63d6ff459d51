//! The built-in rule sets against the programs installed here (issue 40). Each set was checked
//! against one version of its program (its `checked` entry, shown in docs/policy.md): an option
//! a later version adds is refused until someone allows it, but one whose meaning changes is
//! not noticed by the rules. So a machine with another version fails here, and whoever upgrades
//! a program checks its set again and moves its version.
//!
//! A program that is not installed fails the test under `CI=true` (scripts/test.sh installs
//! every one) and is skipped otherwise.

mod common;

use std::path::PathBuf;
use std::process::Command;

use mounthost::plan::rules::{BUILTIN, builtin};

/// The binary of `program`: SeaweedFS's from the test venv, the others from PATH.
fn binary(program: &str) -> Option<PathBuf> {
    if program == "weed" {
        return Some(common::weed_binary());
    }
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(program)).find(|b| b.is_file()))
}

#[test]
fn every_builtin_rule_set_names_the_installed_version_of_its_program() {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let mut checked = Vec::new();
    for (name, _) in BUILTIN {
        let set = builtin(name).unwrap();
        let Some(program) = binary(name).filter(|p| p.exists()) else {
            assert!(!ci, "{name} is not installed under CI=true (scripts/test.sh installs it)");
            eprintln!("skipped: {name} is not installed");
            continue;
        };
        let out = Command::new(&program).args(&set.checked.command).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or_default();
        assert!(
            text.split(|c: char| c.is_whitespace() || c == 'v' || c == 'V' || c == '-')
                .any(|w| w == set.checked.version),
            "@{name} was checked against {name} {}, and {} {} prints {first:?}: check the rule set against this \
             version (docs/policy.md#rule-sets), then set its checked.version",
            set.checked.version,
            program.display(),
            set.checked.command.join(" ")
        );
        checked.push(format!("{name} {}", set.checked.version));
    }
    println!("checked: installed versions match their rule sets: {}", checked.join(", "));
}
