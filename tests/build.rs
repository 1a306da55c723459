//! Builds every guest the integration tests load, the example tools and the
//! hostile test guests, into one directory named by `KEEL_TEST_GUESTS_DIR`.

#[path = "../host/cli/build/guests.rs"]
mod guests;

/// The hostile and probing guests the tests load beside the example tools,
/// with their directories in the workspace: `legacy` and `legacy-v0-3` are
/// components of the previous contracts (0.2.0 and 0.3.0), `fixed` answers
/// its plan and checks at load and traps if asked them per call, `rich` hands back
/// images and structured values, `net` drives wasi:http, sockets and name
/// lookups directly, and `conformance-*` are the tools the MCP conformance
/// suite calls by name.
const TEST_GUESTS: &[(&str, &str)] = &[
    ("keel-guest-trap-queries", "tests/guests/trap-queries"),
    ("keel-guest-probe", "tests/guests/probe"),
    ("keel-guest-hostile", "tests/guests/hostile"),
    ("keel-guest-trap-load", "tests/guests/trap-load"),
    ("keel-guest-legacy", "tests/guests/legacy"),
    ("keel-guest-legacy-v0-3", "tests/guests/legacy-v0-3"),
    ("keel-guest-fixed", "tests/guests/fixed"),
    ("keel-guest-rich", "tests/guests/rich"),
    ("keel-guest-net", "tests/guests/net"),
    // The tools the MCP conformance suite calls by name.
    ("keel-guest-conformance-error", "tests/guests/conformance-error"),
    ("keel-guest-conformance-image", "tests/guests/conformance-image"),
    ("keel-guest-conformance-logging", "tests/guests/conformance-logging"),
    ("keel-guest-conformance-progress", "tests/guests/conformance-progress"),
    ("keel-guest-conformance-reconnection", "tests/guests/conformance-reconnection"),
    ("keel-guest-conformance-schema", "tests/guests/conformance-schema"),
    ("keel-guest-conformance-text", "tests/guests/conformance-text"),
];

fn main() {
    let all: Vec<(&str, &str)> = guests::EXAMPLE_TOOLS.iter().chain(TEST_GUESTS).copied().collect();
    let dir = guests::build(&all);
    println!("cargo:rustc-env=KEEL_TEST_GUESTS_DIR={}", dir.display());
}
