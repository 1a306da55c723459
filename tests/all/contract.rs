//! The contract's constants, as the host and the SDK each state them, held
//! to the WIT files under `wit/`, one directory per released version.

use keel_host::contract;

/// The text between `before` and `after`, where `before` first occurs.
fn between<'a>(text: &'a str, before: &str, after: &str) -> &'a str {
    let start = text.find(before).unwrap_or_else(|| panic!("the WIT says {before:?}")) + before.len();
    let len = text[start..].find(after).unwrap();
    &text[start..start + len]
}

/// Every `wit/v<version>/tool.wit`, by version, oldest first.
fn released() -> Vec<(String, String)> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../wit");
    let mut versions: Vec<(String, String)> = std::fs::read_dir(root)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_dir())
        .map(|dir| {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            let version = name.strip_prefix('v').unwrap_or_else(|| panic!("wit/{name} is not v<version>"));
            (version.to_string(), std::fs::read_to_string(dir.join("tool.wit")).unwrap())
        })
        .collect();
    versions.sort_by_key(|(version, _)| {
        version.split('.').map(|part| part.parse::<u32>().unwrap()).collect::<Vec<_>>()
    });
    versions
}

#[test]
fn the_host_loads_every_released_version_and_the_sdk_builds_the_newest() {
    let released = released();
    for (version, wit) in &released {
        assert_eq!(between(wit, "package keel:tool@", ";"), version, "wit/v{version} holds its version");
    }
    let versions: Vec<&str> = released.iter().map(|(version, _)| version.as_str()).collect();
    assert_eq!(contract::SUPPORTED_CONTRACT_VERSIONS.as_slice(), versions.as_slice());
    let newest = *versions.last().unwrap();
    assert_eq!(contract::CONTRACT_VERSION, newest);
    assert_eq!(keel_guest::CONTRACT_VERSION, newest);
}

#[test]
fn the_host_and_the_sdk_state_the_constants_the_wit_states() {
    let (_, wit) = released().pop().unwrap();
    let mount = between(&wit, "is mounted at `", "`");
    assert_eq!(contract::WORKSPACE_MOUNT, mount);
    assert_eq!(keel_guest::WORKSPACE_MOUNT, mount);
    let fallback = between(&wit, "bounds its own output.\n    /// Fallback: ", ".");
    let fallback: u64 = fallback.replace(',', "").parse().unwrap();
    assert_eq!(contract::DEFAULT_MAX_RESULT_SIZE_CHARS, fallback);
    assert_eq!(keel_guest::DEFAULT_MAX_RESULT_SIZE_CHARS, fallback);
}
