//! The contract's constants, as the host and the SDK each state them, held
//! to `wit/tool.wit`.

use keel_host::contract;

/// The text between `before` and `after`, where `before` first occurs.
fn between<'a>(text: &'a str, before: &str, after: &str) -> &'a str {
    let start = text.find(before).unwrap_or_else(|| panic!("the WIT says {before:?}")) + before.len();
    let len = text[start..].find(after).unwrap();
    &text[start..start + len]
}

#[test]
fn the_host_and_the_sdk_state_the_constants_the_wit_states() {
    let wit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../wit/tool.wit")).unwrap();
    let version = between(&wit, "package keel:tool@", ";");
    assert_eq!(contract::CONTRACT_VERSION, version);
    assert_eq!(keel_guest::CONTRACT_VERSION, version);
    let mount = between(&wit, "is mounted at `", "`");
    assert_eq!(contract::WORKSPACE_MOUNT, mount);
    assert_eq!(keel_guest::WORKSPACE_MOUNT, mount);
    let fallback = between(&wit, "bounds its own output.\n    /// Fallback: ", ".");
    let fallback: u64 = fallback.replace(',', "").parse().unwrap();
    assert_eq!(contract::DEFAULT_MAX_RESULT_SIZE_CHARS, fallback);
    assert_eq!(keel_guest::DEFAULT_MAX_RESULT_SIZE_CHARS, fallback);
}
