//! Compile tests of `keel_guest::export!`: misuse fails with a spanned error
//! that says what to write instead, and the minimal tool compiles.
//!
//! After changing an error message, regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p keel-guest --test ui` and read the diff.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
    cases.pass("tests/ui/pass/*.rs");
}
