//! The golden batch fixtures of `tests/fixtures/`, one test each: a batch in,
//! the exact tool_result message and event trace out. A mismatch prints a
//! diff; `KEEL_BLESS=1 cargo test -p keel-tests --test golden` rewrites the
//! expectations.

use std::path::Path;

use keel_cli::fixture::{self, Case};
use keel_host::Host;
use libtest_mimic::{Arguments, Failed, Trial};

fn main() {
    let arguments = Arguments::from_args();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let cases = fixture::discover(&dir).expect("the fixtures directory is readable");
    assert!(!cases.is_empty(), "no fixture cases in {}", dir.display());
    let trials = cases.into_iter().map(|case| Trial::test(case.name.clone(), move || check(&case))).collect();
    libtest_mimic::run(&arguments, trials).exit();
}

fn check(case: &Case) -> Result<(), Failed> {
    let builder = Host::builder()
        .plugins(env!("KEEL_TEST_GUESTS_DIR"))
        .cache_dir(Some(Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache")));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let produced = runtime.block_on(case.run(builder))?;
    if fixture::bless_requested() {
        case.bless(&produced)?;
        return Ok(());
    }
    case.compare(&produced).map_err(|diff| {
        format!("{diff}\nto accept the new output: KEEL_BLESS=1 cargo test -p keel-tests --test golden")
            .into()
    })
}
