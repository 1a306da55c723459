//! Build guest components from a build script.
//!
//! Shared by `host/cli/build.rs` (the bundled tools) and `tests/build.rs` (the
//! example and hostile guests the tests load) through
//! `#[path = "..."] mod guests;`, so both build the same way into the same place.
//!
//! The guests are built by a nested `cargo build --release --target
//! wasm32-wasip2` into `<target>/guests`, a target directory of its own: the
//! outer cargo holds the lock on its build directories while build scripts
//! run (on `target/release` for a `--release` build, which the nested build
//! needs for its own build scripts), and a nested cargo sharing them would wait
//! for it forever.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The example tools: what `keel` bundles, and what the tests load beside
/// their own guests.
pub const EXAMPLE_TOOLS: &[(&str, &str)] = &[
    ("keel-tool-cd", "example-tools/cd"),
    ("keel-tool-echo", "example-tools/echo"),
    ("keel-tool-edit", "example-tools/edit"),
    ("keel-tool-fetch", "example-tools/fetch"),
    ("keel-tool-glob", "example-tools/glob"),
    ("keel-tool-grep", "example-tools/grep"),
    ("keel-tool-hash", "example-tools/hash"),
    ("keel-tool-sleep", "example-tools/sleep"),
    ("keel-tool-thumbnail", "example-tools/thumbnail"),
    ("keel-tool-wc", "example-tools/wc"),
    ("keel-tool-write-file", "example-tools/write_file"),
];

/// The target the guests are built for.
const TARGET: &str = "wasm32-wasip2";

/// Variables the outer cargo sets for a build script (or inherits from its
/// caller) that would change what the nested cargo builds or how: its flags
/// are for the host target, its target directory is locked, its jobserver is
/// not ours to join, and a workspace wrapper (such as `clippy-driver` under
/// `cargo clippy`) would lint the guests instead of building them.
const OUTER_BUILD_VARS: &[&str] = &[
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_ENCODED_RUSTDOCFLAGS",
    "RUSTFLAGS",
    "RUSTDOCFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "CARGO_MAKEFLAGS",
    "MAKEFLAGS",
    "MFLAGS",
    "CARGO_PRIMARY_PACKAGE",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
    "OUT_DIR",
    "TARGET",
    "HOST",
    "NUM_JOBS",
    "OPT_LEVEL",
    "DEBUG",
    "PROFILE",
];

/// Prefixes of variables the outer cargo sets per package or per target
/// (`CARGO_CFG_UNIX`, `CARGO_FEATURE_*`, `DEP_*`, ...). Left in place they
/// would leak the host target's cfgs into the guests' build scripts.
const OUTER_BUILD_PREFIXES: &[&str] = &["CARGO_CFG_", "CARGO_FEATURE_", "DEP_"];

/// The workspace root: the nearest directory above the crate whose build
/// script is running that holds the workspace's `Cargo.toml`.
fn workspace_root() -> PathBuf {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR is set by cargo"));
    manifest_dir
        .ancestors()
        .skip(1)
        .find(|dir| {
            std::fs::read_to_string(dir.join("Cargo.toml")).is_ok_and(|text| text.contains("[workspace]"))
        })
        .expect("the crate is inside the workspace")
        .to_path_buf()
}

/// `<target>/guests`: `<target>` is `$CARGO_TARGET_DIR` if set, else
/// `<workspace root>/target`. A `build.target-dir` in cargo's config files is
/// not visible to build scripts, so set `CARGO_TARGET_DIR` to move it.
fn guests_target_dir() -> PathBuf {
    let target = match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root().join("target"),
    };
    target.join("guests")
}

/// Where [`build`] puts the `.wasm` components:
/// `<target>/guests/wasm32-wasip2/release`.
///
/// A build script that skips the build still knows where the components
/// would be.
pub fn components_dir() -> PathBuf {
    guests_target_dir().join(TARGET).join("release")
}

/// Build workspace packages as components and return [`components_dir`], where
/// each package's component is `<crate name with `_`>.wasm`.
///
/// `packages` pairs each package's name with its directory relative to the
/// workspace root, such as `("keel-tool-grep", "example-tools/grep")`: the
/// directory is what cargo is told to watch, and naming it here spares a
/// `cargo metadata` run on every build.
///
/// Panics, as a build script should, with the exact `rustup` line when the
/// target is missing, and with the nested cargo's stderr when the build fails.
pub fn build(packages: &[(&str, &str)]) -> PathBuf {
    let root = workspace_root();
    for watched in ["wit", "guest-sdk/src", "guest-sdk/Cargo.toml", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    for (_, dir) in packages {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");

    check_target_installed();

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(&root)
        .arg("build")
        // Errors and warnings still print; the progress lines would only bury
        // them in the panic message.
        .arg("--quiet")
        .arg("--release")
        // The workspace's release profile links the host with whole-program
        // LTO; the guests gain nothing from it but build time.
        .args(["--config", "profile.release.lto=false", "--config", "profile.release.codegen-units=16"])
        .arg("--target")
        .arg(TARGET)
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(guests_target_dir());
    for (package, _) in packages {
        command.arg("-p").arg(package);
    }
    for var in OUTER_BUILD_VARS {
        command.env_remove(var);
    }
    for (var, _) in env::vars_os() {
        let Some(var) = var.to_str() else { continue };
        if OUTER_BUILD_PREFIXES.iter().any(|prefix| var.starts_with(prefix)) {
            command.env_remove(var);
        }
    }

    let names: Vec<&str> = packages.iter().map(|(package, _)| *package).collect();
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("failed to run cargo to build the guests {names:?}: {error}"));
    if !output.status.success() {
        panic!(
            "failed to build the guests {names:?} for {TARGET} ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }

    let dir = components_dir();
    for package in &names {
        let component = dir.join(format!("{}.wasm", package.replace('-', "_")));
        assert!(
            component.is_file(),
            "cargo built {package} but {} is missing; is its crate type `cdylib`?",
            component.display()
        );
    }
    dir
}

/// Fail early, with the fix, when the standard library for the target is not
/// installed; the nested cargo's own error would bury it under a page of
/// "can't find crate for `core`".
fn check_target_installed() {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = Command::new(&rustc)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .unwrap_or_else(|error| panic!("failed to run {}: {error}", Path::new(&rustc).display()));
    let libdir = String::from_utf8_lossy(&output.stdout);
    let libdir = Path::new(libdir.trim());
    if !output.status.success() || libdir.as_os_str().is_empty() || !libdir.is_dir() {
        panic!(
            "the {TARGET} target is not installed; the guest components need it. \
             Install it with:\n\nrustup target add {TARGET}\n"
        );
    }
}
