//! Glue between the [`Tool`] trait and the generated component bindings.
//! Not part of the public API: only [`export!`](crate::export) names it.

use schemars::JsonSchema;
use serde_json::Value;

use crate::{Context, Interrupt, Permission, Tool};

#[expect(missing_docs, reason = "generated from wit/, which carries the docs")]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "keel:tool/tool",
        runtime_path: "::keel_guest::__private::wit_bindgen::rt",
        default_bindings_module: "::keel_guest::__private::bindings",
        export_macro_name: "export_tool",
        pub_export_macro: true,
    });
}

pub use bindings::export_tool;
pub use wit_bindgen;

use bindings::exports::keel::tool::guest::{Guest, ToolMetadata as Metadata};
use bindings::keel::tool::types::{CallOutput, InterruptBehavior, PermissionDecision as WitPermission};

/// Names the user's tool type for the generated `Guest` impl below.
pub trait Exports {
    /// The type the author passed to `export!`.
    type Tool: Tool;
}

fn parse<T: Tool>(input: &str) -> Result<T::Input, String> {
    serde_json::from_str(input).map_err(|error| format!("invalid input: {error}"))
}

/// Apply `f` to the parsed input, or give the conservative `fallback` when the
/// input does not parse (the host checks the schema first, so this is only
/// reached by a host that did not).
fn with_input<T: Tool, R>(input: &str, fallback: R, f: impl FnOnce(&T::Input) -> R) -> R {
    match parse::<T>(input) {
        Ok(input) => f(&input),
        Err(_) => fallback,
    }
}

/// The input schema as JSON text, derived from the input type.
pub fn input_schema<I: JsonSchema>() -> String {
    serde_json::to_string(&schemars::schema_for!(I)).expect("a derived schema is valid JSON")
}

impl<E: Exports> Guest for E {
    fn metadata() -> Metadata {
        let user_facing_name = match <E::Tool as Tool>::USER_FACING_NAME {
            "" => E::Tool::NAME,
            name => name,
        };
        Metadata {
            name: E::Tool::NAME.to_string(),
            aliases: E::Tool::ALIASES.iter().map(|alias| alias.to_string()).collect(),
            description: E::Tool::DESCRIPTION.to_string(),
            prompt: E::Tool::PROMPT.to_string(),
            input_schema: input_schema::<<E::Tool as Tool>::Input>(),
            output_schema: E::Tool::output_schema().map(|schema| schema.to_string()),
            search_hint: E::Tool::SEARCH_HINT.map(str::to_string),
            should_defer: E::Tool::SHOULD_DEFER,
            always_load: E::Tool::ALWAYS_LOAD,
            strict: E::Tool::STRICT,
            interrupt_behavior: match E::Tool::INTERRUPT {
                Interrupt::Cancel => InterruptBehavior::Cancel,
                Interrupt::Block => InterruptBehavior::Block,
            },
            user_facing_name: user_facing_name.to_string(),
        }
    }

    fn is_enabled() -> bool {
        E::Tool::is_enabled()
    }

    fn is_concurrency_safe(input: String) -> bool {
        with_input::<E::Tool, _>(&input, false, E::Tool::is_concurrency_safe)
    }

    fn is_read_only(input: String) -> bool {
        with_input::<E::Tool, _>(&input, false, E::Tool::is_read_only)
    }

    fn is_destructive(input: String) -> bool {
        with_input::<E::Tool, _>(&input, true, E::Tool::is_destructive)
    }

    fn max_result_size() -> Option<u64> {
        E::Tool::MAX_RESULT_SIZE
    }

    fn validate_input(input: String) -> Result<(), String> {
        let input = parse::<E::Tool>(&input)?;
        E::Tool::validate_input(&input).map_err(|error| error.0)
    }

    fn check_permissions(input: String) -> WitPermission {
        let input = match parse::<E::Tool>(&input) {
            Ok(input) => input,
            Err(error) => return WitPermission::Deny(error),
        };
        match E::Tool::check_permissions(&input) {
            Permission::Allow => WitPermission::Allow(None),
            Permission::AllowWithInput(updated) => WitPermission::Allow(Some(updated.to_string())),
            Permission::Deny(message) => WitPermission::Deny(message),
            Permission::Ask(message) => WitPermission::Ask(message),
        }
    }

    fn permission_subject(input: String) -> Option<String> {
        with_input::<E::Tool, _>(&input, None, E::Tool::permission_subject)
    }

    fn classifier_input(input: String) -> String {
        with_input::<E::Tool, _>(&input, String::new(), E::Tool::classifier_input)
    }

    fn user_facing_name(input: String) -> String {
        with_input::<E::Tool, _>(&input, E::Tool::NAME.to_string(), E::Tool::user_facing_name)
    }

    fn activity_description(input: String) -> Option<String> {
        with_input::<E::Tool, _>(&input, None, E::Tool::activity_description)
    }

    fn is_open_world(input: String) -> bool {
        with_input::<E::Tool, _>(&input, false, E::Tool::is_open_world)
    }

    fn is_search_or_read(input: String) -> bool {
        with_input::<E::Tool, _>(&input, false, E::Tool::is_search_or_read)
    }

    fn requires_user_interaction() -> bool {
        E::Tool::REQUIRES_USER_INTERACTION
    }

    fn inputs_equivalent(a: String, b: String) -> bool {
        match (serde_json::from_str::<Value>(&a), serde_json::from_str::<Value>(&b)) {
            (Ok(a), Ok(b)) => E::Tool::inputs_equivalent(&a, &b),
            _ => a == b,
        }
    }

    fn call(input: String, context: String) -> Result<CallOutput, String> {
        let input = parse::<E::Tool>(&input)?;
        let context =
            serde_json::from_str(&context).map_err(|error| format!("invalid context from host: {error}"))?;
        let output = E::Tool::call(input, &Context::new(context)).map_err(|error| error.0)?;
        Ok(CallOutput {
            content: output.content,
            context_modifier: output.context_modifier.map(|patch| patch.to_string()),
        })
    }
}
