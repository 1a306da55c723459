//! The SDK's restatement of the contract, held to `wit/tool.wit`.

use keel_guest::{CONTRACT_VERSION, DEFAULT_MAX_RESULT_SIZE_CHARS, WORKSPACE_MOUNT};

/// The text between `before` and `after`, where `before` first occurs.
fn between<'a>(text: &'a str, before: &str, after: &str) -> &'a str {
    let start = text.find(before).unwrap_or_else(|| panic!("the WIT says {before:?}")) + before.len();
    let len = text[start..].find(after).unwrap();
    &text[start..start + len]
}

#[test]
fn the_constants_are_the_ones_the_wit_states() {
    let wit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../wit/tool.wit")).unwrap();
    assert_eq!(between(&wit, "package keel:tool@", ";"), CONTRACT_VERSION);
    assert_eq!(between(&wit, "is mounted at `", "`"), WORKSPACE_MOUNT);
    let fallback = between(&wit, "bounds its own output.\n    /// Fallback: ", ".");
    assert_eq!(fallback.replace(',', "").parse::<u64>().unwrap(), DEFAULT_MAX_RESULT_SIZE_CHARS);
}
