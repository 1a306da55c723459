//! Glue between the [`Tool`] trait and the generated component bindings.
//! Not part of the public API: only [`export!`](crate::export) names it.

use std::any::Any;
use std::cell::RefCell;

use schemars::JsonSchema;
use serde_json::Value;

use crate::{Block, Context, Interrupt, Permission, Tool};

#[expect(missing_docs, reason = "generated from wit/, which carries the docs")]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit/v0.4.0",
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
    CallOutput, CallPlan, ContentBlock, Image as WitImage, InterruptBehavior,
    PermissionDecision as WitPermission,
};

/// Names the user's tool type for the generated `Guest` impl below.
pub trait Exports {
    /// The type the author passed to `export!`.
    type Tool: Tool;
}

fn parse<T: Tool>(input: &str) -> Result<T::Input, String> {
    serde_json::from_str(input).map_err(|error| format!("invalid input: {error}"))
}

/// The context as the host sent it: a JSON object.
fn parse_context(context: &str) -> Result<Context, String> {
    #[cfg(test)]
    tests::CONTEXT_PARSES.set(tests::CONTEXT_PARSES.get() + 1);
    match serde_json::from_str::<Value>(context) {
        Ok(value @ Value::Object(_)) => Ok(Context::new(value)),
        Ok(_) => Err("invalid context from host: not a JSON object".to_string()),
        Err(error) => Err(format!("invalid context from host: {error}")),
    }
}

/// The input this instance parsed last, beside its text. The host asks one
/// instance `plan`, then `check`, then `call` on the same input: parsed once,
/// it serves all three.
struct Parsed {
    text: String,
    input: Box<dyn Any>,
}

/// The context this instance parsed last, beside its text: every question
/// about one call comes with the same context, parsed once like the input.
struct ParsedContext {
    text: String,
    context: Context,
}

thread_local! {
    static PARSED: RefCell<Option<Parsed>> = const { RefCell::new(None) };
    static CONTEXT: RefCell<Option<ParsedContext>> = const { RefCell::new(None) };
}

/// Apply `f` to the parsed context (parsing it only if the last context
/// parsed was another), or give `Err` when it does not parse.
fn with_context<R>(text: &str, f: impl FnOnce(&Context) -> R) -> Result<R, String> {
    CONTEXT.with_borrow_mut(|parsed| {
        let context = match parsed.as_ref().filter(|parsed| parsed.text == text) {
            Some(parsed) => &parsed.context,
            None => {
                let context = parse_context(text)?;
                &parsed.insert(ParsedContext { text: text.to_owned(), context }).context
            }
        };
        Ok(f(context))
    })
}

/// Apply `f` to the parsed input and context (parsing each only if the last
/// one parsed was another), or give `Err` when either does not parse.
fn parsed<T: Tool, R>(
    text: &str,
    context: &str,
    f: impl FnOnce(&T::Input, &Context) -> R,
) -> Result<R, String> {
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
        with_context(context, |context| f(input, context))
    })
}

/// The parsed input and context, by value, for `call`: taken from the caches
/// when they hold these texts, since nothing is asked after the call.
fn take_parsed<T: Tool>(text: &str, context: &str) -> Result<(T::Input, Context), String> {
    let cached = PARSED.take().filter(|parsed| parsed.text == text);
    let input = match cached.map(|parsed| parsed.input.downcast::<T::Input>()) {
        Some(Ok(input)) => *input,
        _ => parse::<T>(text)?,
    };
    let context = match CONTEXT.take().filter(|parsed| parsed.text == context) {
        Some(parsed) => parsed.context,
        None => parse_context(context)?,
    };
    Ok((input, context))
}

/// Apply `f` to the parsed input and context, or give the conservative
/// `fallback` when either does not parse (the host checks the schema first
/// and always sends an object, so this is only reached by a host that did not).
fn with_input<T: Tool, R>(
    input: &str,
    context: &str,
    fallback: R,
    f: impl FnOnce(&T::Input, &Context) -> R,
) -> R {
    parsed::<T, R>(input, context, f).unwrap_or(fallback)
}

/// The input schema as JSON text, derived from the input type as
/// [`schema_for`](crate::schema_for) derives any schema.
pub fn input_schema<I: JsonSchema>() -> String {
    crate::schema_for::<I>().to_string()
}

/// The call's output in the contract's terms.
fn call_output(output: crate::Output) -> CallOutput {
    CallOutput {
        content: output
            .content
            .into_iter()
            .map(|block| match block {
                Block::Text(text) => ContentBlock::Text(text),
                Block::Image(image) => {
                    ContentBlock::Image(WitImage { media_type: image.media_type, data: image.data })
                }
            })
            .collect(),
        structured: output.structured.map(|value| value.to_string()),
        context_modifier: output.context_modifier.map(|patch| patch.to_string()),
    }
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

    fn plan(input: String, context: String) -> CallPlan {
        let conservative = CallPlan { concurrency_safe: false, read_only: false };
        with_input::<E::Tool, _>(&input, &context, conservative, |input, cx| CallPlan {
            concurrency_safe: E::Tool::is_concurrency_safe(input, cx),
            read_only: E::Tool::is_read_only(input, cx),
        })
    }

    fn is_destructive(input: String, context: String) -> bool {
        with_input::<E::Tool, _>(&input, &context, true, E::Tool::is_destructive)
    }

    fn max_result_size() -> Option<u64> {
        E::Tool::MAX_RESULT_SIZE
    }

    fn check(input: String, context: String) -> Result<WitPermission, String> {
        parsed::<E::Tool, _>(&input, &context, |input, cx| {
            E::Tool::validate_input(input, cx).map_err(|error| error.0)?;
            Ok(match E::Tool::check_permissions(input, cx) {
                Permission::Allow => WitPermission::Allow(None),
                Permission::AllowWithInput(updated) => WitPermission::Allow(Some(updated.to_string())),
                Permission::Deny(message) => WitPermission::Deny(message),
                Permission::Ask(message) => WitPermission::Ask(message),
            })
        })?
    }

    fn permission_subject(input: String, context: String) -> Option<String> {
        with_input::<E::Tool, _>(&input, &context, None, E::Tool::permission_subject)
    }

    fn classifier_input(input: String, context: String) -> String {
        with_input::<E::Tool, _>(&input, &context, String::new(), E::Tool::classifier_input)
    }

    fn user_facing_name(input: String, context: String) -> String {
        with_input::<E::Tool, _>(&input, &context, E::Tool::NAME.to_string(), E::Tool::user_facing_name)
    }

    fn activity_description(input: String, context: String) -> Option<String> {
        with_input::<E::Tool, _>(&input, &context, None, E::Tool::activity_description)
    }

    fn is_open_world(input: String, context: String) -> bool {
        with_input::<E::Tool, _>(&input, &context, false, E::Tool::is_open_world)
    }

    fn is_search_or_read(input: String, context: String) -> bool {
        with_input::<E::Tool, _>(&input, &context, false, E::Tool::is_search_or_read)
    }

    fn requires_user_interaction() -> bool {
        E::Tool::REQUIRES_USER_INTERACTION
    }

    fn fixed_plan() -> Option<CallPlan> {
        E::Tool::FIXED_PLAN
            .map(|plan| CallPlan { concurrency_safe: plan.concurrency_safe, read_only: plan.read_only })
    }

    fn checks_input() -> bool {
        E::Tool::CHECKS_INPUT
    }

    fn inputs_equivalent(a: String, b: String) -> bool {
        match (serde_json::from_str::<Value>(&a), serde_json::from_str::<Value>(&b)) {
            (Ok(a), Ok(b)) => E::Tool::inputs_equivalent(&a, &b),
            _ => a == b,
        }
    }

    fn call(input: String, context: String) -> Result<CallOutput, String> {
        let (input, context) = take_parsed::<E::Tool>(&input, &context)?;
        claims_hold::<E::Tool>(&input, &context)?;
        let output = E::Tool::call(input, &context).map_err(|error| error.0)?;
        Ok(call_output(output))
    }
}

/// Hold the claims a tool makes once, at load, to its own answers for this
/// call. The host never asks a question a claim answers: a tool that
/// overrides one and answers otherwise than it claimed would be run on an
/// answer it never gave (a call it says must run alone run beside others,
/// a refusal of its `validate_input` never heard). Such a call fails here,
/// before the tool runs, naming the claim and the answer; a tool whose
/// answers are the defaults passes at no cost.
fn claims_hold<T: Tool>(input: &T::Input, cx: &Context) -> Result<(), String> {
    if !T::HOLD_CLAIMS {
        return Ok(());
    }
    let name = T::NAME;
    if let Some(plan) = T::FIXED_PLAN {
        let safe = T::is_concurrency_safe(input, cx);
        let read_only = T::is_read_only(input, cx);
        if (safe, read_only) != (plan.concurrency_safe, plan.read_only) {
            return Err(format!(
                "tool `{name}` claims FIXED_PLAN (concurrency-safe {}, read-only {}), but for this input \
                 is_concurrency_safe answers {safe} and is_read_only {read_only}: the call was not run",
                plan.concurrency_safe, plan.read_only
            ));
        }
    }
    if !T::CHECKS_INPUT {
        if let Err(error) = T::validate_input(input, cx) {
            return Err(format!(
                "tool `{name}` claims CHECKS_INPUT = false, but its validate_input refused this input \
                 ({}): the call was not run",
                error.0
            ));
        }
        let answer = match T::check_permissions(input, cx) {
            Permission::Allow => return Ok(()),
            Permission::AllowWithInput(_) => "allow with another input".to_owned(),
            Permission::Deny(message) => format!("deny ({message})"),
            Permission::Ask(message) => format!("ask ({message})"),
        };
        return Err(format!(
            "tool `{name}` claims CHECKS_INPUT = false, but its check_permissions answered {answer}: \
             the call was not run"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;
    use crate::{Image, Output, Result, json};

    thread_local! {
        /// How many times this thread parsed a context.
        pub(super) static CONTEXT_PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[derive(Deserialize, JsonSchema)]
    struct Input {
        path: String,
    }

    /// A tool that answers every question from its input and the context.
    struct Paths;

    impl Tool for Paths {
        type Input = Input;
        const NAME: &str = "paths";
        const DESCRIPTION: &str = "Test tool.";

        fn is_concurrency_safe(_input: &Input, _cx: &Context) -> bool {
            true
        }

        fn is_read_only(input: &Input, cx: &Context) -> bool {
            cx.workspace_relative(&input.path).starts_with("docs")
        }

        fn is_destructive(_input: &Input, _cx: &Context) -> bool {
            false
        }

        fn validate_input(input: &Input, cx: &Context) -> Result<()> {
            if cx.get("refuse").is_some() {
                crate::bail!("refused {}", input.path);
            }
            Ok(())
        }

        fn permission_subject(input: &Input, cx: &Context) -> Option<String> {
            Some(cx.workspace_relative(&input.path))
        }

        fn call(input: Input, cx: &Context) -> Result<Output> {
            Ok(Output::text(cx.resolve(&input.path).display().to_string())
                .with_image(Image::png([1, 2, 3]))
                .with_context_modifier(json!({ "seen": input.path })))
        }
    }

    struct Export;
    impl Exports for Export {
        type Tool = Paths;
    }

    const SECRETS: &str = r#"{"cwd": "/workspace/secrets"}"#;

    fn input(path: &str) -> String {
        json!({ "path": path }).to_string()
    }

    /// A tool whose plan and check hold for every input.
    struct Fixed;

    impl Tool for Fixed {
        type Input = Input;
        const NAME: &str = "fixed";
        const DESCRIPTION: &str = "Test tool.";
        const FIXED_PLAN: Option<crate::Plan> = Some(crate::Plan::SAFE_READ_ONLY);
        const CHECKS_INPUT: bool = false;

        fn call(input: Input, _cx: &Context) -> Result<Output> {
            Ok(Output::text(input.path))
        }
    }

    struct ExportFixed;
    impl Exports for ExportFixed {
        type Tool = Fixed;
    }

    #[test]
    fn a_fixed_plan_is_said_at_load_and_is_what_plan_answers() {
        assert!(Export::fixed_plan().is_none());
        assert!(Export::checks_input());
        let fixed = ExportFixed::fixed_plan().expect("a fixed plan");
        assert!(fixed.concurrency_safe && fixed.read_only);
        assert!(!ExportFixed::checks_input());
        let asked = ExportFixed::plan(input("a"), SECRETS.into());
        assert_eq!((asked.concurrency_safe, asked.read_only), (fixed.concurrency_safe, fixed.read_only));
        assert!(matches!(ExportFixed::check(input("a"), SECRETS.into()), Ok(WitPermission::Allow(None))));
    }

    #[test]
    fn every_question_receives_the_context() {
        assert_eq!(
            Export::permission_subject(input("k.txt"), SECRETS.into()).as_deref(),
            Some("secrets/k.txt")
        );
        let plan = Export::plan(input("../docs/a.md"), SECRETS.into());
        assert!(plan.concurrency_safe && plan.read_only);
        let plan = Export::plan(input("../src/a.rs"), SECRETS.into());
        assert!(plan.concurrency_safe && !plan.read_only);
        let refusing = r#"{"cwd": "/workspace", "refuse": true}"#;
        assert_eq!(Export::check(input("a"), refusing.into()).unwrap_err(), "refused a");
        assert!(matches!(Export::check(input("a"), SECRETS.into()), Ok(WitPermission::Allow(None))));
    }

    #[test]
    fn the_context_is_parsed_once_for_the_questions_on_it() {
        let before = CONTEXT_PARSES.get();
        Export::plan(input("a"), SECRETS.into());
        Export::permission_subject(input("a"), SECRETS.into());
        Export::check(input("b"), SECRETS.into()).unwrap();
        assert_eq!(CONTEXT_PARSES.get() - before, 1, "the cached context serves every question");
        let cached = CONTEXT.with_borrow(|parsed| parsed.as_ref().map(|parsed| parsed.text.clone()));
        assert_eq!(cached.as_deref(), Some(SECRETS));

        let other = r#"{"cwd": "/workspace/docs"}"#;
        assert_eq!(Export::permission_subject(input("a"), other.into()).as_deref(), Some("docs/a"));
        let cached = CONTEXT.with_borrow(|parsed| parsed.as_ref().map(|parsed| parsed.text.clone()));
        assert_eq!(cached.as_deref(), Some(other), "another context replaces the cached one");
        assert_eq!(CONTEXT_PARSES.get() - before, 2);
    }

    #[test]
    fn an_unparsable_context_gets_the_conservative_answers() {
        for context in ["{not json", "[1, 2]", "\"/workspace\""] {
            let plan = Export::plan(input("a"), context.into());
            assert!(!plan.concurrency_safe && !plan.read_only, "{context}");
            assert!(Export::is_destructive(input("a"), context.into()), "{context}");
            assert_eq!(Export::permission_subject(input("a"), context.into()), None, "{context}");
            assert_eq!(Export::user_facing_name(input("a"), context.into()), "paths", "{context}");
            let error = Export::check(input("a"), context.into()).unwrap_err();
            assert!(error.starts_with("invalid context from host: "), "{error}");
            let error = Export::call(input("a"), context.into()).unwrap_err();
            assert!(error.starts_with("invalid context from host: "), "{error}");
        }
    }

    #[test]
    fn an_unparsable_input_still_gets_the_conservative_answers() {
        let plan = Export::plan("{}".into(), SECRETS.into());
        assert!(!plan.concurrency_safe && !plan.read_only);
        assert!(Export::is_destructive("{}".into(), SECRETS.into()));
        assert!(Export::check("{}".into(), SECRETS.into()).unwrap_err().starts_with("invalid input: "));
    }

    #[test]
    fn call_runs_in_the_context_and_hands_back_every_block() {
        assert!(Export::check(input("k.txt"), SECRETS.into()).is_ok());
        let output = Export::call(input("k.txt"), SECRETS.into()).unwrap();
        assert!(matches!(
            output.content.as_slice(),
            [ContentBlock::Text(text), ContentBlock::Image(WitImage { media_type, data })]
                if text == "/workspace/secrets/k.txt" && media_type == "image/png" && data == &[1, 2, 3]
        ));
        assert_eq!(output.structured, None);
        assert_eq!(output.context_modifier.as_deref(), Some(r#"{"seen":"k.txt"}"#));
        assert!(CONTEXT.with_borrow(Option::is_none), "the call takes the cached context");
    }

    /// A tool whose claims its own answers contradict for some inputs: a
    /// plan fixed safe and read-only, yet a path under `src` is neither, and
    /// no input to check, yet `secret` is refused and `ask` asks.
    struct Contradicted;

    impl Tool for Contradicted {
        type Input = Input;
        const NAME: &str = "contradicted";
        const DESCRIPTION: &str = "Test tool.";
        const FIXED_PLAN: Option<crate::Plan> = Some(crate::Plan::SAFE_READ_ONLY);
        const CHECKS_INPUT: bool = false;

        fn is_concurrency_safe(input: &Input, _cx: &Context) -> bool {
            !input.path.starts_with("src")
        }

        fn is_read_only(input: &Input, _cx: &Context) -> bool {
            !input.path.starts_with("src")
        }

        fn validate_input(input: &Input, _cx: &Context) -> Result<()> {
            if input.path == "secret" {
                crate::bail!("no secrets");
            }
            Ok(())
        }

        fn check_permissions(input: &Input, _cx: &Context) -> Permission {
            if input.path == "ask" { Permission::Ask("sure?".into()) } else { Permission::Allow }
        }

        fn call(input: Input, _cx: &Context) -> Result<Output> {
            Ok(Output::text(input.path))
        }
    }

    struct ExportContradicted;
    impl Exports for ExportContradicted {
        type Tool = Contradicted;
    }

    #[test]
    fn a_call_its_own_answers_contradict_the_tools_claims_for_is_not_run() {
        let plan = ExportContradicted::call(input("src/a.rs"), SECRETS.into()).unwrap_err();
        assert_eq!(
            plan,
            "tool `contradicted` claims FIXED_PLAN (concurrency-safe true, read-only true), but for this \
             input is_concurrency_safe answers false and is_read_only false: the call was not run"
        );
        let refused = ExportContradicted::call(input("secret"), SECRETS.into()).unwrap_err();
        assert_eq!(
            refused,
            "tool `contradicted` claims CHECKS_INPUT = false, but its validate_input refused this input \
             (no secrets): the call was not run"
        );
        let asked = ExportContradicted::call(input("ask"), SECRETS.into()).unwrap_err();
        assert_eq!(
            asked,
            "tool `contradicted` claims CHECKS_INPUT = false, but its check_permissions answered ask \
             (sure?): the call was not run"
        );
        let output = ExportContradicted::call(input("docs/a.md"), SECRETS.into()).unwrap();
        assert!(matches!(output.content.as_slice(), [ContentBlock::Text(text)] if text == "docs/a.md"));
        // A tool whose claims its answers keep runs as before.
        assert!(ExportFixed::call(input("src/a.rs"), SECRETS.into()).is_ok());
    }

    #[test]
    fn a_structured_value_is_handed_back_as_json_text() {
        let output = call_output(Output::structured(&json!({ "count": 2 })).unwrap());
        assert!(output.content.is_empty());
        assert_eq!(output.structured.as_deref(), Some(r#"{"count":2}"#));
    }
}
