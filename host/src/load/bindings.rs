//! Host bindings generated from `wit/`, one module per contract version, and
//! [`Guest`], which asks a component of any of them in the newest version's
//! terms: all `bindgen!` output lives here.
//!
//! An older version's answers are mapped to the newest types; a question the
//! older version cannot hear (the context) is simply not passed on. What the
//! host must judge differently for an older tool (a permission subject it
//! named without seeing the working directory) is decided by the caller, from
//! the component's [`Version`].

use std::sync::{Arc, OnceLock};

use wasmtime::AsContextMut;
use wasmtime::component::{
    Component, ComponentExportIndex, ComponentNamedList, Instance, InstancePre, Lift, Lower, TypedFunc,
};

use crate::contract::GUEST_INTERFACE;

/// Contract 0.2.0: questions see the input alone; output is one string.
pub mod v0_2 {
    wasmtime::component::bindgen!({
        path: "../wit/v0.2.0",
        world: "keel:tool/tool",
        imports: { default: async },
        exports: { default: async },
    });
}

/// Contract 0.3.0: questions see the context; output is content blocks.
pub mod v0_3 {
    wasmtime::component::bindgen!({
        path: "../wit/v0.3.0",
        world: "keel:tool/tool",
        imports: { default: async },
        exports: { default: async },
        // Load-time answers are kept in the compile cache.
        additional_derives: [serde::Serialize, serde::Deserialize],
    });
}

pub use self::v0_3::exports::keel::tool::guest::ToolMetadata;
pub use self::v0_3::keel::tool::types::{
    CallOutput, CallPlan, ContentBlock, InterruptBehavior, LogLevel, PermissionDecision,
};

/// The contract versions the host loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Version {
    /// `keel:tool@0.2.0`.
    V0_2,
    /// `keel:tool@0.3.0`.
    V0_3,
}

impl Version {
    /// The version as the WIT package names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_2 => "0.2.0",
            Version::V0_3 => "0.3.0",
        }
    }

    /// Every version, oldest first: `contract::SUPPORTED_CONTRACT_VERSIONS`,
    /// as the test below holds it.
    pub const ALL: [Version; 2] = [Version::V0_2, Version::V0_3];

    /// The version of `number`, if the host loads it.
    pub fn from_number(number: &str) -> Option<Self> {
        Version::ALL.into_iter().find(|version| version.as_str() == number)
    }
}

/// A component linked for one contract version, ready to instantiate.
pub enum GuestPre<T: 'static> {
    /// A 0.2.0 component.
    V0_2(Box<v0_2::ToolPre<T>>),
    /// A 0.3.0 component.
    V0_3(PreV0_3<T>),
}

/// A 0.3.0 component linked, with where each export of its guest interface
/// is. An instance looks up only the exports it is asked, where the
/// bindings' `ToolPre` would look up and type-check all fifteen with every
/// instance (a fresh one per call).
pub struct PreV0_3<T: 'static> {
    pre: InstancePre<T>,
    exports: Arc<ExportsV0_3>,
}

/// Where each function of the 0.3.0 guest interface is in one component,
/// and whether their types were checked.
struct ExportsV0_3 {
    metadata: ComponentExportIndex,
    is_enabled: ComponentExportIndex,
    max_result_size: ComponentExportIndex,
    requires_user_interaction: ComponentExportIndex,
    inputs_equivalent: ComponentExportIndex,
    plan: ComponentExportIndex,
    is_destructive: ComponentExportIndex,
    check: ComponentExportIndex,
    permission_subject: ComponentExportIndex,
    classifier_input: ComponentExportIndex,
    activity_description: ComponentExportIndex,
    is_open_world: ComponentExportIndex,
    is_search_or_read: ComponentExportIndex,
    call: ComponentExportIndex,
    /// Set once every function's type was checked against the bindings',
    /// in the component's first instance: what makes `LiveV0_3::call` sound.
    typed: OnceLock<()>,
}

impl ExportsV0_3 {
    fn new(component: &Component) -> wasmtime::Result<Self> {
        let interface_name = format!("{GUEST_INTERFACE}@{}", Version::V0_3.as_str());
        let interface = component
            .get_export_index(None, &interface_name)
            .ok_or_else(|| wasmtime::format_err!("no exported instance named `{interface_name}`"))?;
        let lookup = |name: &str| {
            component.get_export_index(Some(&interface), name).ok_or_else(|| {
                wasmtime::format_err!("instance export `{interface_name}` does not have export `{name}`")
            })
        };
        // `user-facing-name` is part of the interface but never asked: the
        // name shown comes from `metadata`.
        lookup("user-facing-name")?;
        Ok(ExportsV0_3 {
            metadata: lookup("metadata")?,
            is_enabled: lookup("is-enabled")?,
            max_result_size: lookup("max-result-size")?,
            requires_user_interaction: lookup("requires-user-interaction")?,
            inputs_equivalent: lookup("inputs-equivalent")?,
            plan: lookup("plan")?,
            is_destructive: lookup("is-destructive")?,
            check: lookup("check")?,
            permission_subject: lookup("permission-subject")?,
            classifier_input: lookup("classifier-input")?,
            activity_description: lookup("activity-description")?,
            is_open_world: lookup("is-open-world")?,
            is_search_or_read: lookup("is-search-or-read")?,
            call: lookup("call")?,
            typed: OnceLock::new(),
        })
    }
}

impl<T: Send + 'static> GuestPre<T> {
    /// Check that `pre` exports the guest interface of `version`.
    pub fn new(version: Version, pre: InstancePre<T>) -> wasmtime::Result<Self> {
        Ok(match version {
            Version::V0_2 => GuestPre::V0_2(Box::new(v0_2::ToolPre::new(pre)?)),
            Version::V0_3 => {
                let exports = Arc::new(ExportsV0_3::new(pre.component())?);
                GuestPre::V0_3(PreV0_3 { pre, exports })
            }
        })
    }

    /// The engine it was linked in.
    pub fn engine(&self) -> &wasmtime::Engine {
        match self {
            GuestPre::V0_2(pre) => pre.engine(),
            GuestPre::V0_3(pre) => pre.pre.engine(),
        }
    }

    /// Its contract version.
    pub fn version(&self) -> Version {
        match self {
            GuestPre::V0_2(_) => Version::V0_2,
            GuestPre::V0_3(_) => Version::V0_3,
        }
    }

    /// Instantiate it in `store`.
    pub async fn instantiate_async(&self, mut store: impl AsContextMut<Data = T>) -> wasmtime::Result<Guest> {
        Ok(match self {
            GuestPre::V0_2(pre) => Guest::V0_2(Box::new(pre.instantiate_async(store).await?)),
            GuestPre::V0_3(PreV0_3 { pre, exports }) => {
                let instance = pre.instantiate_async(&mut store).await?;
                if exports.typed.get().is_none() {
                    // As the bindings would with every instance: a function
                    // of the wrong type fails here, at the plugin's load.
                    v0_3::ToolIndices::new(pre)?.load(&mut store, &instance)?;
                    let _ = exports.typed.set(());
                }
                Guest::V0_3(LiveV0_3 { instance, exports: exports.clone() })
            }
        })
    }
}

/// A live instance of a tool, asked in the newest version's terms.
pub enum Guest {
    /// A 0.2.0 instance.
    V0_2(Box<v0_2::Tool>),
    /// A 0.3.0 instance.
    V0_3(LiveV0_3),
}

/// A live 0.3.0 instance and where its component's functions are. Made only
/// by [`GuestPre::instantiate_async`], once the types were checked.
pub struct LiveV0_3 {
    instance: Instance,
    exports: Arc<ExportsV0_3>,
}

impl LiveV0_3 {
    /// Call the function `export` picks of the interface, and give its one
    /// result.
    async fn call<S, P, A>(
        &self,
        mut store: S,
        export: fn(&ExportsV0_3) -> &ComponentExportIndex,
        params: P,
    ) -> wasmtime::Result<A>
    where
        S: AsContextMut<Data: Send>,
        P: ComponentNamedList + Lower + Send + Sync,
        (A,): ComponentNamedList + Lift + Send + Sync + 'static,
    {
        let func = self
            .instance
            .get_func(&mut store, export(&self.exports))
            .ok_or_else(|| wasmtime::format_err!("failed to find function export"))?;
        // SAFETY: every function of the interface had its type checked
        // against these bindings' in this component's first instance
        // (`typed` is set only then, and a `LiveV0_3` is made only after),
        // and a component's export types are the same in every instance.
        let func = unsafe { TypedFunc::<P, (A,)>::new_unchecked(func) };
        let (answer,) = func.call_async(&mut store, params).await?;
        Ok(answer)
    }
}

/// Ask one question of whichever version the guest is, passing the
/// context only to a version that hears it, and map the answer.
macro_rules! per_input {
    ($(#[$doc:meta] $name:ident($call:ident) -> $answer:ty, $v2:expr;)*) => {$(
        #[$doc]
        pub async fn $name<S>(&self, store: S, input: &str, context: &str) -> wasmtime::Result<$answer>
        where
            S: AsContextMut<Data: Send>,
        {
            match self {
                Guest::V0_2(tool) => tool.keel_tool_guest().$call(store, input).await.map($v2),
                Guest::V0_3(live) => live.call(store, |exports| &exports.$name, (input, context)).await,
            }
        }
    )*};
}

impl Guest {
    /// `metadata`.
    pub async fn metadata<S: AsContextMut<Data: Send>>(&self, store: S) -> wasmtime::Result<ToolMetadata> {
        match self {
            Guest::V0_2(tool) => tool.keel_tool_guest().call_metadata(store).await.map(metadata_of_v0_2),
            Guest::V0_3(live) => live.call(store, |exports| &exports.metadata, ()).await,
        }
    }

    /// `is-enabled`.
    pub async fn is_enabled<S: AsContextMut<Data: Send>>(&self, store: S) -> wasmtime::Result<bool> {
        match self {
            Guest::V0_2(tool) => tool.keel_tool_guest().call_is_enabled(store).await,
            Guest::V0_3(live) => live.call(store, |exports| &exports.is_enabled, ()).await,
        }
    }

    /// `max-result-size`.
    pub async fn max_result_size<S: AsContextMut<Data: Send>>(
        &self,
        store: S,
    ) -> wasmtime::Result<Option<u64>> {
        match self {
            Guest::V0_2(tool) => tool.keel_tool_guest().call_max_result_size(store).await,
            Guest::V0_3(live) => live.call(store, |exports| &exports.max_result_size, ()).await,
        }
    }

    /// `requires-user-interaction`.
    pub async fn requires_user_interaction<S: AsContextMut<Data: Send>>(
        &self,
        store: S,
    ) -> wasmtime::Result<bool> {
        match self {
            Guest::V0_2(tool) => tool.keel_tool_guest().call_requires_user_interaction(store).await,
            Guest::V0_3(live) => live.call(store, |exports| &exports.requires_user_interaction, ()).await,
        }
    }

    /// `inputs-equivalent`.
    pub async fn inputs_equivalent<S: AsContextMut<Data: Send>>(
        &self,
        store: S,
        a: &str,
        b: &str,
    ) -> wasmtime::Result<bool> {
        match self {
            Guest::V0_2(tool) => tool.keel_tool_guest().call_inputs_equivalent(store, a, b).await,
            Guest::V0_3(live) => live.call(store, |exports| &exports.inputs_equivalent, (a, b)).await,
        }
    }

    per_input! {
        /// `plan`.
        plan(call_plan) -> CallPlan, |plan| CallPlan {
            concurrency_safe: plan.concurrency_safe,
            read_only: plan.read_only,
        };
        /// `is-destructive`.
        is_destructive(call_is_destructive) -> bool, |answer| answer;
        /// `check`.
        check(call_check) -> Result<PermissionDecision, String>, |checked| checked.map(decision_of_v0_2);
        /// `permission-subject`.
        permission_subject(call_permission_subject) -> Option<String>, |answer| answer;
        /// `classifier-input`.
        classifier_input(call_classifier_input) -> String, |answer| answer;
        /// `activity-description`.
        activity_description(call_activity_description) -> Option<String>, |answer| answer;
        /// `is-open-world`.
        is_open_world(call_is_open_world) -> bool, |answer| answer;
        /// `is-search-or-read`.
        is_search_or_read(call_is_search_or_read) -> bool, |answer| answer;
    }

    /// `call`: a 0.2.0 tool's one string becomes one text block.
    pub async fn call<S>(
        &self,
        store: S,
        input: &str,
        context: &str,
    ) -> wasmtime::Result<Result<CallOutput, String>>
    where
        S: AsContextMut<Data: Send>,
    {
        match self {
            Guest::V0_2(tool) => {
                let output = tool.keel_tool_guest().call_call(store, input, context).await?;
                Ok(output.map(|output| CallOutput {
                    content: vec![ContentBlock::Text(output.content)],
                    structured: None,
                    context_modifier: output.context_modifier,
                }))
            }
            Guest::V0_3(live) => live.call(store, |exports| &exports.call, (input, context)).await,
        }
    }
}

fn metadata_of_v0_2(metadata: v0_2::exports::keel::tool::guest::ToolMetadata) -> ToolMetadata {
    use v0_2::keel::tool::types::InterruptBehavior as Old;
    ToolMetadata {
        name: metadata.name,
        aliases: metadata.aliases,
        description: metadata.description,
        prompt: metadata.prompt,
        input_schema: metadata.input_schema,
        output_schema: metadata.output_schema,
        search_hint: metadata.search_hint,
        should_defer: metadata.should_defer,
        always_load: metadata.always_load,
        strict: metadata.strict,
        interrupt_behavior: match metadata.interrupt_behavior {
            Old::Cancel => InterruptBehavior::Cancel,
            Old::Block => InterruptBehavior::Block,
        },
        user_facing_name: metadata.user_facing_name,
    }
}

fn decision_of_v0_2(decision: v0_2::keel::tool::types::PermissionDecision) -> PermissionDecision {
    use v0_2::keel::tool::types::PermissionDecision as Old;
    match decision {
        Old::Allow(input) => PermissionDecision::Allow(input),
        Old::Deny(message) => PermissionDecision::Deny(message),
        Old::Ask(message) => PermissionDecision::Ask(message),
    }
}

/// A 0.2.0 guest's log level, in the newest version's terms.
pub fn log_level_of_v0_2(level: v0_2::keel::tool::types::LogLevel) -> LogLevel {
    use v0_2::keel::tool::types::LogLevel as Old;
    match level {
        Old::Trace => LogLevel::Trace,
        Old::Debug => LogLevel::Debug,
        Old::Info => LogLevel::Info,
        Old::Warn => LogLevel::Warn,
        Old::Error => LogLevel::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_versions_are_the_supported_ones() {
        assert_eq!(Version::ALL.map(Version::as_str), crate::contract::SUPPORTED_CONTRACT_VERSIONS);
    }
}
