//! The constants of the contract between the host and its tools, as
//! `wit/tool.wit` states them. The guest SDK restates them; a test on each
//! side holds them to the WIT text.

/// The contract version this host speaks: the version of the `keel:tool`
/// package in `wit/`.
pub const CONTRACT_VERSION: &str = "0.2.0";

/// The name of the interface every tool exports, with its version.
pub(crate) const GUEST_INTERFACE: &str = "keel:tool/guest@0.2.0";

/// Where the workspace appears inside the sandbox.
pub const WORKSPACE_MOUNT: &str = "/workspace";

/// Characters of output before persisting, for a tool that does not say
/// (`max-result-size`'s fallback and the SDK's default).
pub const DEFAULT_MAX_RESULT_SIZE_CHARS: u64 = 50_000;

#[cfg(test)]
mod tests {
    use super::*;

    fn wit() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../wit/tool.wit");
        std::fs::read_to_string(path).unwrap()
    }

    /// The text between `before` and `after` in the first place `before` occurs.
    fn between<'a>(text: &'a str, before: &str, after: &str) -> &'a str {
        let start = text.find(before).unwrap_or_else(|| panic!("the WIT says {before:?}")) + before.len();
        let len = text[start..].find(after).unwrap();
        &text[start..start + len]
    }

    #[test]
    fn the_constants_are_the_ones_the_wit_states() {
        let wit = wit();
        assert_eq!(between(&wit, "package keel:tool@", ";"), CONTRACT_VERSION);
        assert_eq!(GUEST_INTERFACE, format!("keel:tool/guest@{CONTRACT_VERSION}"));
        assert_eq!(between(&wit, "is mounted at `", "`"), WORKSPACE_MOUNT);
        let fallback = between(&wit, "bounds its own output.\n    /// Fallback: ", ".");
        assert_eq!(fallback.replace(',', "").parse::<u64>().unwrap(), DEFAULT_MAX_RESULT_SIZE_CHARS);
    }
}
