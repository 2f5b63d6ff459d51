//! Host-side bindings of the frozen fourth contract, `wit/v0.4.0/plugin.wit`
//! (`mounthost:plugin@0.4.0`), so plugins built against it keep loading. Only the runtime
//! touches these types: [`super::adapter_v040`] converts requests down to them and the
//! plugin's answers up to the current contract ([`super::bindings`]); a plugin of an earlier
//! contract's go through [`super::adapter_v030`] and the adapters after it too.
//!
//! Generated with the same options as the current bindings, serde included (the 0.4.0 ↔ 0.5.0
//! adapter converts through it).

wasmtime::component::bindgen!({
    path: "../wit/v0.4.0",
    world: "plugin",
    imports: { default: async | trappable },
    exports: { default: async },
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});

pub use self::exports::mounthost::plugin::planner;
pub use self::mounthost::plugin::host::Level;
pub use self::mounthost::plugin::types;
