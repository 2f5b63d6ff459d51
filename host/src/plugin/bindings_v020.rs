//! Host-side bindings of the frozen second contract, `wit/v0.2.0/plugin.wit`
//! (`mounthost:plugin@0.2.0`), so plugins built against it keep loading. Only the runtime
//! touches these types: [`super::adapter_v020`] converts requests down to them and the
//! plugin's answers up to the current contract ([`super::bindings`]); a 0.1.0 plugin's go
//! through [`super::adapter`] first.
//!
//! Generated with the same options as the current bindings.

wasmtime::component::bindgen!({
    path: "../wit/v0.2.0",
    world: "plugin",
    imports: { default: async | trappable },
    exports: { default: async },
    additional_derives: [PartialEq],
});

pub use self::exports::mounthost::plugin::planner;
pub use self::mounthost::plugin::host::Level;
pub use self::mounthost::plugin::types;
