//! `trap_load`: a hostile test guest whose input-independent exports, the
//! ones the host asks once at load, all misbehave: `is-enabled`,
//! `max-result-size`, `fixed-plan` and `checks-input` trap,
//! `requires-user-interaction` spins forever. The
//! host must load it with the fallback answers (and leave it out of the pool,
//! since `is-enabled` falls back to false), and carry on.
//!
//! Like `hostile`, it implements the WIT exports directly: the SDK cannot
//! make `max-result-size` trap, since it answers with a constant.

// Only a wasm32 build exports the tool; natively nothing calls it. `allow`,
// not `expect`: the lint fires in some native targets and not in others.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use std::hint::black_box;

use keel_guest::__private::bindings::exports::keel::tool::guest::{Guest, ToolMetadata};
use keel_guest::__private::bindings::keel::tool::types::{
    CallOutput, CallPlan, ContentBlock, InterruptBehavior, PermissionDecision,
};

struct TrapLoad;

impl Guest for TrapLoad {
    fn metadata() -> ToolMetadata {
        ToolMetadata {
            name: "trap_load".into(),
            aliases: vec![],
            description: "Test guest: traps or spins in every export asked at load.".into(),
            prompt: String::new(),
            input_schema: r#"{"type":"object"}"#.into(),
            output_schema: None,
            search_hint: None,
            should_defer: false,
            always_load: false,
            strict: false,
            interrupt_behavior: InterruptBehavior::Block,
            user_facing_name: String::new(),
        }
    }

    fn is_enabled() -> bool {
        panic!("trap_load: trapping in is-enabled")
    }

    fn max_result_size() -> Option<u64> {
        panic!("trap_load: trapping in max-result-size")
    }

    fn fixed_plan() -> Option<CallPlan> {
        panic!("trap_load: trapping in fixed-plan")
    }

    fn checks_input() -> bool {
        panic!("trap_load: trapping in checks-input")
    }

    fn requires_user_interaction() -> bool {
        let mut n: u64 = 0;
        loop {
            n = black_box(n.wrapping_add(1));
        }
    }

    fn plan(_input: String, _context: String) -> CallPlan {
        CallPlan { concurrency_safe: true, read_only: true }
    }

    fn is_destructive(_input: String, _context: String) -> bool {
        false
    }

    fn check(_input: String, _context: String) -> Result<PermissionDecision, String> {
        Ok(PermissionDecision::Allow(None))
    }

    fn permission_subject(_input: String, _context: String) -> Option<String> {
        None
    }

    fn classifier_input(_input: String, _context: String) -> String {
        String::new()
    }

    fn user_facing_name(_input: String, _context: String) -> String {
        "trap_load".into()
    }

    fn activity_description(_input: String, _context: String) -> Option<String> {
        None
    }

    fn is_open_world(_input: String, _context: String) -> bool {
        false
    }

    fn is_search_or_read(_input: String, _context: String) -> bool {
        false
    }

    fn inputs_equivalent(a: String, b: String) -> bool {
        a == b
    }

    fn call(_input: String, _context: String) -> Result<CallOutput, String> {
        Ok(CallOutput {
            content: vec![ContentBlock::Text("trap_load ran".into())],
            structured: None,
            context_modifier: None,
        })
    }
}

// Only a wasm32 build is a component; a native build (under `cargo test
// --workspace`) checks the code and exports nothing.
#[cfg(target_arch = "wasm32")]
keel_guest::__private::export_tool!(TrapLoad with_types_in keel_guest::__private::bindings);
