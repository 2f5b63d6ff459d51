//! Load-time check of what a plugin component imports.
//!
//! Plugins get no filesystem, network or HTTP: a component that imports any interface outside
//! this list is refused before it ever runs, with the offending imports named.

use wasmtime::Engine;
use wasmtime::component::Component;

use super::contract::Contract;

/// Interfaces a plugin may import (any version for WASI; WASI grants nothing here anyway).
const ALLOWED_WASI: &[&str] = &[
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
];

/// Our own interfaces, at exactly the contract version the component exports (a 0.1.0 plugin
/// imports `host@0.1.0`, a 0.2.0 one `host@0.2.0`; the linker offers both).
const ALLOWED_OWN: &[&str] = &["mounthost:plugin/host", "mounthost:plugin/types"];

/// Imports of `component`, a plugin of contract `contract`, that are not allowed (empty when
/// it may load).
pub fn refused(engine: &Engine, component: &Component, contract: Contract) -> Vec<String> {
    component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name)
        .filter(|name| !allowed(name, contract))
        .map(str::to_string)
        .collect()
}

fn allowed(import: &str, contract: Contract) -> bool {
    let (iface, version) = import.split_once('@').unwrap_or((import, ""));
    if ALLOWED_OWN.contains(&iface) {
        return version == contract.version();
    }
    ALLOWED_WASI.contains(&iface)
}

#[cfg(test)]
mod tests {
    use super::allowed;
    use crate::plugin::contract::Contract;

    #[test]
    fn allow_list() {
        for contract in Contract::ALL {
            assert!(allowed("wasi:cli/environment@0.2.6", contract));
            assert!(!allowed("wasi:filesystem/preopens@0.2.6", contract));
            assert!(!allowed("wasi:sockets/tcp@0.2.6", contract));
            assert!(!allowed("wasi:http/outgoing-handler@0.2.6", contract));
        }
        assert!(allowed("mounthost:plugin/host@0.1.0", Contract::V010));
        assert!(allowed("mounthost:plugin/types@0.2.0", Contract::V020));
        // Our interfaces only at the version the plugin exports.
        assert!(!allowed("mounthost:plugin/host@0.2.0", Contract::V010));
        assert!(!allowed("mounthost:plugin/host@0.1.0", Contract::V020));
        assert!(!allowed("mounthost:plugin/host@0.3.0", Contract::V020));
    }
}
