//! Host-side bindings of `wit/plugin.wit` (world `plugin`, contract `mounthost:plugin@0.5.0`),
//! generated at compile time. The rest of the host speaks only these types; plugins built
//! against an older contract are converted to and from them by [`super::adapter_v040`] (and
//! [`super::adapter_v030`], [`super::adapter_v020`] and [`super::adapter`] after it, for 0.3.0,
//! 0.2.0 and 0.1.0).
//!
//! Imports are async and trappable (a host function may fail the call), exports async: every
//! plugin call runs on a fiber so the epoch deadline can yield to tokio and then stop it.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
    imports: { default: async | trappable },
    exports: { default: async },
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});

pub use self::exports::mounthost::plugin::planner;
pub use self::mounthost::plugin::host::Level;
pub use self::mounthost::plugin::types;
