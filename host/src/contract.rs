//! The constants of the contract between the host and its tools, as
//! `wit/tool.wit` states them. The guest SDK restates them; a test
//! (`tests/all/contract.rs`) holds both to the WIT text.

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

    #[test]
    fn the_guest_interface_carries_the_contract_version() {
        assert_eq!(GUEST_INTERFACE, format!("keel:tool/guest@{CONTRACT_VERSION}"));
    }
}
