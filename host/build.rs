//! Assembles `src/load/canary.wat`, keel's own warm-up tool, into the
//! component `Host::warm_up` calls (README, Performance: levers kept).

fn main() {
    let source = "src/load/canary.wat";
    println!("cargo::rerun-if-changed={source}");
    let wasm = wat::parse_file(source).unwrap_or_else(|error| panic!("{source}: {error}"));
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("canary.wasm"), wasm).expect("OUT_DIR is writable");
}
