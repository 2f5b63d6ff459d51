//! Host-side bindings of the frozen third contract, `wit/v0.3.0/plugin.wit`
//! (`mounthost:plugin@0.3.0`), so plugins built against it keep loading. Only the runtime
//! touches these types: [`super::adapter_v030`] converts requests down to them and the
//! plugin's answers up to contract 0.4.0 ([`super::bindings_v040`]); a 0.2.0 plugin's go
//! through [`super::adapter_v020`] too, a 0.1.0 plugin's through [`super::adapter`] as well.
//!
//! Generated with the same options as the current bindings, serde included (the 0.3.0 ↔ 0.4.0
//! adapter converts through it).

wasmtime::component::bindgen!({
    path: "../wit/v0.3.0",
    world: "plugin",
    imports: { default: async | trappable },
    exports: { default: async },
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});

pub use self::exports::mounthost::plugin::planner;
pub use self::mounthost::plugin::host::Level;
pub use self::mounthost::plugin::types;
