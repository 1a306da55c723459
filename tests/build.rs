//! Builds every guest the integration tests load, the example tools and the
//! hostile test guests, into one directory named by `KEEL_TEST_GUESTS_DIR`.

#[path = "../host/build/guests.rs"]
mod guests;

/// The guests the tests load, with their directories in the workspace.
const TEST_GUESTS: &[(&str, &str)] = &[
    ("keel-tool-cd", "example-tools/cd"),
    ("keel-tool-echo", "example-tools/echo"),
    ("keel-tool-grep", "example-tools/grep"),
    ("keel-tool-hash", "example-tools/hash"),
    ("keel-tool-sleep", "example-tools/sleep"),
    ("keel-tool-write-file", "example-tools/write_file"),
    ("keel-guest-trap-queries", "tests/guests/trap-queries"),
    ("keel-guest-probe", "tests/guests/probe"),
    ("keel-guest-hostile", "tests/guests/hostile"),
    ("keel-guest-trap-load", "tests/guests/trap-load"),
];

fn main() {
    let dir = guests::build(TEST_GUESTS);
    println!("cargo:rustc-env=KEEL_TEST_GUESTS_DIR={}", dir.display());
}
