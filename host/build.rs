//! Builds the bundled tools, the host's default plugin directory.
//!
//! Set `KEEL_SKIP_GUEST_BUILD` to build the library without the
//! `wasm32-wasip2` target: the directory is then still named, but holds
//! whatever an earlier build left there.

#[path = "build/guests.rs"]
mod guests;

/// The tools shipped with the host, with their directories in the workspace.
const BUNDLED_TOOLS: &[(&str, &str)] = &[
    ("keel-tool-cd", "example-tools/cd"),
    ("keel-tool-echo", "example-tools/echo"),
    ("keel-tool-grep", "example-tools/grep"),
    ("keel-tool-hash", "example-tools/hash"),
    ("keel-tool-sleep", "example-tools/sleep"),
    ("keel-tool-write-file", "example-tools/write_file"),
];

fn main() {
    println!("cargo:rerun-if-env-changed=KEEL_SKIP_GUEST_BUILD");
    let dir = if std::env::var_os("KEEL_SKIP_GUEST_BUILD").is_some() {
        guests::components_dir()
    } else {
        guests::build(BUNDLED_TOOLS)
    };
    println!("cargo:rustc-env=KEEL_BUNDLED_TOOLS_DIR={}", dir.display());
}
