//! Builds the bundled tools, the host's default plugin directory.
//!
//! Set `KEEL_SKIP_GUEST_BUILD` to build the library without the
//! `wasm32-wasip2` target: the directory is then still named, but holds
//! whatever an earlier build left there.

#[path = "build/guests.rs"]
mod guests;

fn main() {
    println!("cargo:rerun-if-env-changed=KEEL_SKIP_GUEST_BUILD");
    // The tests build their hostile guests into the same directory; the
    // bundled tools get a directory of their own, so `keel run` without
    // `--plugins` loads exactly these and never a test guest.
    let bundled = guests::components_dir().join("bundled");
    if std::env::var_os("KEEL_SKIP_GUEST_BUILD").is_none() {
        let built = guests::build(guests::EXAMPLE_TOOLS);
        std::fs::create_dir_all(&bundled).expect("failed to create the bundled tools directory");
        for (package, _) in guests::EXAMPLE_TOOLS {
            let file = format!("{}.wasm", package.replace('-', "_"));
            std::fs::copy(built.join(&file), bundled.join(&file))
                .unwrap_or_else(|error| panic!("failed to copy {file} to {}: {error}", bundled.display()));
        }
    }
    println!("cargo:rustc-env=KEEL_BUNDLED_TOOLS_DIR={}", bundled.display());
}
