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

/// Contract 0.4.0: a tool may fix its plan, and say that its check never
/// refuses, once at load. Its types are 0.3.0's, unchanged.
pub mod v0_4 {
    wasmtime::component::bindgen!({
        path: "../wit/v0.4.0",
        world: "keel:tool/tool",
        imports: { default: async },
        exports: { default: async },
        with: { "keel:tool/types@0.4.0": super::v0_3::keel::tool::types },
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
    /// `keel:tool@0.4.0`.
    V0_4,
}

impl Version {
    /// The version as the WIT package names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_2 => "0.2.0",
            Version::V0_3 => "0.3.0",
            Version::V0_4 => "0.4.0",
        }
    }

    /// Every version, oldest first: `contract::SUPPORTED_CONTRACT_VERSIONS`,
    /// as the test below holds it.
    pub const ALL: [Version; 3] = [Version::V0_2, Version::V0_3, Version::V0_4];

    /// The version of `number`, if the host loads it.
    pub fn from_number(number: &str) -> Option<Self> {
        Version::ALL.into_iter().find(|version| version.as_str() == number)
    }
}

/// A component linked for one contract version, ready to instantiate.
pub enum GuestPre<T: 'static> {
    /// A 0.2.0 component.
    V0_2(Box<v0_2::ToolPre<T>>),
    /// A component of 0.3.0 or later.
    Indexed(IndexedPre<T>),
}

/// A component of 0.3.0 or later linked, with where each export of its
/// guest interface is. An instance looks up only the exports it is asked,
/// where the bindings' `ToolPre` would look up and type-check all of them
/// with every instance (a fresh one per call).
pub struct IndexedPre<T: 'static> {
    pre: InstancePre<T>,
    exports: Arc<Exports>,
}

/// Where each function of the guest interface (0.3.0 or later) is in one
/// component, and whether their types were checked.
struct Exports {
    /// The contract version whose interface they are.
    version: Version,
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
    /// `fixed-plan` and `checks-input`, since 0.4.0.
    fixed: Option<(ComponentExportIndex, ComponentExportIndex)>,
    /// Set once every function's type was checked against the bindings',
    /// in the component's first instance: what makes `IndexedGuest::call`
    /// sound.
    typed: OnceLock<()>,
}

impl Exports {
    fn new(component: &Component, version: Version) -> wasmtime::Result<Self> {
        let interface_name = format!("{GUEST_INTERFACE}@{}", version.as_str());
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
        let fixed = match version {
            Version::V0_2 | Version::V0_3 => None,
            Version::V0_4 => Some((lookup("fixed-plan")?, lookup("checks-input")?)),
        };
        Ok(Exports {
            version,
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
            fixed,
            typed: OnceLock::new(),
        })
    }
}

impl<T: Send + 'static> GuestPre<T> {
    /// Check that `pre` exports the guest interface of `version`.
    pub fn new(version: Version, pre: InstancePre<T>) -> wasmtime::Result<Self> {
        Ok(match version {
            Version::V0_2 => GuestPre::V0_2(Box::new(v0_2::ToolPre::new(pre)?)),
            Version::V0_3 | Version::V0_4 => {
                let exports = Arc::new(Exports::new(pre.component(), version)?);
                GuestPre::Indexed(IndexedPre { pre, exports })
            }
        })
    }

    /// The engine it was linked in.
    pub fn engine(&self) -> &wasmtime::Engine {
        match self {
            GuestPre::V0_2(pre) => pre.engine(),
            GuestPre::Indexed(pre) => pre.pre.engine(),
        }
    }

    /// Its contract version.
    pub fn version(&self) -> Version {
        match self {
            GuestPre::V0_2(_) => Version::V0_2,
            GuestPre::Indexed(pre) => pre.exports.version,
        }
    }

    /// Instantiate it in `store`.
    pub async fn instantiate_async(&self, mut store: impl AsContextMut<Data = T>) -> wasmtime::Result<Guest> {
        Ok(match self {
            GuestPre::V0_2(pre) => Guest::V0_2(Box::new(pre.instantiate_async(store).await?)),
            GuestPre::Indexed(IndexedPre { pre, exports }) => {
                let instance = pre.instantiate_async(&mut store).await?;
                if exports.typed.get().is_none() {
                    // As the bindings would with every instance: a function
                    // of the wrong type fails here, in the component's first
                    // instance.
                    match exports.version {
                        Version::V0_4 => {
                            v0_4::ToolIndices::new(pre)?.load(&mut store, &instance)?;
                        }
                        Version::V0_2 | Version::V0_3 => {
                            v0_3::ToolIndices::new(pre)?.load(&mut store, &instance)?;
                        }
                    }
                    let _ = exports.typed.set(());
                }
                Guest::Indexed(IndexedGuest { instance, exports: exports.clone() })
            }
        })
    }
}

/// A live instance of a tool, asked in the newest version's terms.
pub enum Guest {
    /// A 0.2.0 instance.
    V0_2(Box<v0_2::Tool>),
    /// An instance of 0.3.0 or later.
    Indexed(IndexedGuest),
}

/// A live instance of 0.3.0 or later and where its component's functions
/// are. Made only by [`GuestPre::instantiate_async`], once the types were
/// checked.
pub struct IndexedGuest {
    instance: Instance,
    exports: Arc<Exports>,
}

impl IndexedGuest {
    /// Call the function `export` picks of the interface, and give its one
    /// result.
    async fn call<S, P, A>(
        &self,
        mut store: S,
        export: fn(&Exports) -> &ComponentExportIndex,
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
        // (`typed` is set only then, and an `IndexedGuest` is made only after),
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
                Guest::Indexed(live) => live.call(store, |exports| &exports.$name, (input, context)).await,
            }
        }
    )*};
}

impl Guest {
    /// `metadata`.
    pub async fn metadata<S: AsContextMut<Data: Send>>(&self, store: S) -> wasmtime::Result<ToolMetadata> {
        match self {
            Guest::V0_2(tool) => tool.keel_tool_guest().call_metadata(store).await.map(metadata_of_v0_2),
            Guest::Indexed(live) => live.call(store, |exports| &exports.metadata, ()).await,
        }
    }

    /// `is-enabled`.
    pub async fn is_enabled<S: AsContextMut<Data: Send>>(&self, store: S) -> wasmtime::Result<bool> {
        match self {
            Guest::V0_2(tool) => tool.keel_tool_guest().call_is_enabled(store).await,
            Guest::Indexed(live) => live.call(store, |exports| &exports.is_enabled, ()).await,
        }
    }

    /// `max-result-size`.
    pub async fn max_result_size<S: AsContextMut<Data: Send>>(
        &self,
        store: S,
    ) -> wasmtime::Result<Option<u64>> {
        match self {
            Guest::V0_2(tool) => tool.keel_tool_guest().call_max_result_size(store).await,
            Guest::Indexed(live) => live.call(store, |exports| &exports.max_result_size, ()).await,
        }
    }

    /// `requires-user-interaction`.
    pub async fn requires_user_interaction<S: AsContextMut<Data: Send>>(
        &self,
        store: S,
    ) -> wasmtime::Result<bool> {
        match self {
            Guest::V0_2(tool) => tool.keel_tool_guest().call_requires_user_interaction(store).await,
            Guest::Indexed(live) => live.call(store, |exports| &exports.requires_user_interaction, ()).await,
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
            Guest::Indexed(live) => live.call(store, |exports| &exports.inputs_equivalent, (a, b)).await,
        }
    }

    /// `fixed-plan`: none before 0.4.0, whose tools are asked `plan` per call.
    pub async fn fixed_plan<S: AsContextMut<Data: Send>>(
        &self,
        store: S,
    ) -> wasmtime::Result<Option<CallPlan>> {
        match self {
            Guest::Indexed(live) if live.exports.fixed.is_some() => {
                live.call(store, |exports| &exports.fixed.as_ref().expect("checked above").0, ()).await
            }
            _ => Ok(None),
        }
    }

    /// `checks-input`: true before 0.4.0, whose tools are asked `check` per
    /// call.
    pub async fn checks_input<S: AsContextMut<Data: Send>>(&self, store: S) -> wasmtime::Result<bool> {
        match self {
            Guest::Indexed(live) if live.exports.fixed.is_some() => {
                live.call(store, |exports| &exports.fixed.as_ref().expect("checked above").1, ()).await
            }
            _ => Ok(true),
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
            Guest::Indexed(live) => live.call(store, |exports| &exports.call, (input, context)).await,
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
