//! Host bindings generated from `wit/`: all `bindgen!` output lives here.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "keel:tool/tool",
    imports: { default: async },
    exports: { default: async },
    // Load-time answers are kept in the compile cache.
    additional_derives: [serde::Serialize, serde::Deserialize],
});

pub use self::exports::keel::tool::guest::ToolMetadata;
pub use self::keel::tool::types::{CallPlan, InterruptBehavior, LogLevel, PermissionDecision};
