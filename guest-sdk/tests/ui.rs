//! Compile tests of `keel_guest::export!`: misuse fails with a spanned error
//! that says what to write instead, and the minimal tool compiles.
//!
//! After changing an error message, regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p keel-guest --test ui` and read the diff.

/// The expected errors are rustc's whole output, which each release words
/// and lays out a little differently: they are compared on the release
/// they were written with (the workspace's `rust-version`), and left out,
/// as ignored, on any other. Regenerate them there to move them on.
#[rustversion::attr(not(stable(1.95)), ignore = "the expected errors are those of rustc 1.95")]
#[test]
fn misuse_fails_with_an_error_that_says_what_to_write() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}

#[test]
fn the_minimal_tool_compiles() {
    trybuild::TestCases::new().pass("tests/ui/pass/*.rs");
}
