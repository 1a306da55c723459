//! Glue between the [`Tool`] trait and the generated component bindings.
//! Not part of the public API: only [`export!`](crate::export) names it.

use std::any::Any;
use std::cell::RefCell;

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
use bindings::keel::tool::types::{
    CallOutput, CallPlan, InterruptBehavior, PermissionDecision as WitPermission,
};

/// Names the user's tool type for the generated `Guest` impl below.
pub trait Exports {
    /// The type the author passed to `export!`.
    type Tool: Tool;
}

fn parse<T: Tool>(input: &str) -> Result<T::Input, String> {
    serde_json::from_str(input).map_err(|error| format!("invalid input: {error}"))
}

/// The input this instance parsed last, beside its text. The host asks one
/// instance `plan`, then `check`, then `call` on the same input: parsed once,
/// it serves all three.
struct Parsed {
    text: String,
    input: Box<dyn Any>,
}

thread_local! {
    static PARSED: RefCell<Option<Parsed>> = const { RefCell::new(None) };
}

/// Apply `f` to the parsed input (parsing it only if the last input parsed
/// was another), or give `Err` when it does not parse.
fn parsed<T: Tool, R>(text: &str, f: impl FnOnce(&T::Input) -> R) -> Result<R, String> {
    PARSED.with_borrow_mut(|parsed| {
        let cached = parsed.as_ref().filter(|parsed| parsed.text == text);
        let input = match cached.and_then(|parsed| parsed.input.downcast_ref::<T::Input>()) {
            Some(input) => input,
            None => {
                let input = Box::new(parse::<T>(text)?);
                parsed
                    .insert(Parsed { text: text.to_owned(), input })
                    .input
                    .downcast_ref()
                    .expect("just stored")
            }
        };
        Ok(f(input))
    })
}

/// The parsed input, by value, for `call`: taken from the cache when it holds
/// this input, since nothing is asked after the call.
fn take_parsed<T: Tool>(text: &str) -> Result<T::Input, String> {
    let cached = PARSED.take().filter(|parsed| parsed.text == text);
    match cached.map(|parsed| parsed.input.downcast::<T::Input>()) {
        Some(Ok(input)) => Ok(*input),
        _ => parse::<T>(text),
    }
}

/// Apply `f` to the parsed input, or give the conservative `fallback` when the
/// input does not parse (the host checks the schema first, so this is only
/// reached by a host that did not).
fn with_input<T: Tool, R>(input: &str, fallback: R, f: impl FnOnce(&T::Input) -> R) -> R {
    parsed::<T, R>(input, f).unwrap_or(fallback)
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

    fn plan(input: String) -> CallPlan {
        let conservative = CallPlan { concurrency_safe: false, read_only: false };
        with_input::<E::Tool, _>(&input, conservative, |input| CallPlan {
            concurrency_safe: E::Tool::is_concurrency_safe(input),
            read_only: E::Tool::is_read_only(input),
        })
    }

    fn is_destructive(input: String) -> bool {
        with_input::<E::Tool, _>(&input, true, E::Tool::is_destructive)
    }

    fn max_result_size() -> Option<u64> {
        E::Tool::MAX_RESULT_SIZE
    }

    fn check(input: String) -> Result<WitPermission, String> {
        parsed::<E::Tool, _>(&input, |input| {
            E::Tool::validate_input(input).map_err(|error| error.0)?;
            Ok(match E::Tool::check_permissions(input) {
                Permission::Allow => WitPermission::Allow(None),
                Permission::AllowWithInput(updated) => WitPermission::Allow(Some(updated.to_string())),
                Permission::Deny(message) => WitPermission::Deny(message),
                Permission::Ask(message) => WitPermission::Ask(message),
            })
        })?
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
        let input = take_parsed::<E::Tool>(&input)?;
        let context =
            serde_json::from_str(&context).map_err(|error| format!("invalid context from host: {error}"))?;
        let output = E::Tool::call(input, &Context::new(context)).map_err(|error| error.0)?;
        Ok(CallOutput {
            content: output.content,
            context_modifier: output.context_modifier.map(|patch| patch.to_string()),
        })
    }
}
