//! Host-side bindings of `wit/plugin.wit` (world `plugin`), generated at compile time.
//!
//! Imports are async and trappable (a host function may fail the call), exports async: every
//! plugin call runs on a fiber so the epoch deadline can yield to tokio and then stop it.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
    imports: { default: async | trappable },
    exports: { default: async },
    additional_derives: [PartialEq],
});

pub use self::exports::mounthost::plugin::planner;
pub use self::mounthost::plugin::host::Level;
pub use self::mounthost::plugin::types;
