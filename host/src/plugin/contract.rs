//! Which version of the plugin contract (`package mounthost:plugin@<version>`) a component
//! implements. The host speaks the current one, [`Contract::CURRENT`], and keeps loading
//! components of every earlier released version through [`super::adapter`]; the version is
//! read from the component's own type (the `planner` interface it exports), before anything
//! is instantiated.

use std::fmt;

use serde::Serialize;
use wasmtime::Engine;
use wasmtime::component::Component;

/// The WIT package every contract version belongs to.
pub const PLUGIN_PACKAGE: &str = "mounthost:plugin";

/// A released version of the plugin contract, ordered oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Contract {
    /// The first release (`wit/v0.1.0/plugin.wit`), loaded through both adapters.
    V010,
    /// The second release (`wit/v0.2.0/plugin.wit`): OCI resolve and blob steps, secret files
    /// and templates, path values and path-argument suffixes. Loaded through an adapter.
    V020,
    /// The third release (`wit/v0.3.0/plugin.wit`): FUSE servers the host mounts for and runs
    /// unprivileged (`fuse-mount.host-fd`, `arg.fuse-fd`). Loaded through an adapter, the host
    /// answering the operations it lacks (expand, capacity, list, describe) with defaults.
    V030,
    /// The fourth release (`wit/v0.4.0/plugin.wit`): expansion, capacity, listing and
    /// describing volumes, planning-time lookups, socket calls to running programs. Loaded
    /// through an adapter.
    V040,
    /// The current contract (`wit/plugin.wit`): the parameter kind `url` and the error
    /// `unsupported`.
    V050,
}

impl Contract {
    /// The version the host's own types follow.
    pub const CURRENT: Contract = Contract::V050;
    /// Every version the host loads, newest first.
    pub const ALL: [Contract; 5] = [Contract::V050, Contract::V040, Contract::V030, Contract::V020, Contract::V010];

    /// The package version, e.g. `0.2.0`.
    pub fn version(self) -> &'static str {
        match self {
            Contract::V010 => "0.1.0",
            Contract::V020 => "0.2.0",
            Contract::V030 => "0.3.0",
            Contract::V040 => "0.4.0",
            Contract::V050 => "0.5.0",
        }
    }

    /// The fully qualified name of the `planner` interface a plugin of this version exports.
    pub fn planner_export(self) -> String {
        format!("{PLUGIN_PACKAGE}/planner@{}", self.version())
    }

    /// The contract whose `planner` interface `component` exports (the newest, should it
    /// export several), or `None` when it exports none that the host knows.
    pub fn detect(engine: &Engine, component: &Component) -> Option<Contract> {
        let ty = component.component_type();
        let exports: Vec<&str> = ty.exports(engine).map(|(name, _)| name).collect();
        Contract::ALL.into_iter().find(|c| exports.contains(&c.planner_export().as_str()))
    }

    /// Every planner export the host knows, for messages.
    pub fn known_exports() -> String {
        Contract::ALL.map(Contract::planner_export).join(" or ")
    }
}

impl fmt::Display for Contract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.version())
    }
}

impl Serialize for Contract {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.version())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_exports() {
        assert_eq!(Contract::CURRENT.to_string(), "0.5.0");
        assert_eq!(Contract::V010.planner_export(), "mounthost:plugin/planner@0.1.0");
        assert_eq!(
            Contract::known_exports(),
            "mounthost:plugin/planner@0.5.0 or mounthost:plugin/planner@0.4.0 or \
             mounthost:plugin/planner@0.3.0 or mounthost:plugin/planner@0.2.0 or mounthost:plugin/planner@0.1.0"
        );
        assert_eq!(serde_json::to_string(&Contract::V010).unwrap(), "\"0.1.0\"");
    }
}
