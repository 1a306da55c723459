//! Loading plugins, and the error for each kind of bad file.

use keel_host::Host;
use keel_host::tool::{InterruptBehavior, ResultSize, ToolOrigin};

use crate::{block_on, example_host, guest, shared_cache};

#[test]
fn loads_each_example_tool_with_its_metadata() {
    let workspace = tempfile::tempdir().unwrap();
    let host = block_on(example_host(workspace.path()).build()).unwrap();
    let names: Vec<&str> = host.pool().entries().iter().map(|e| e.tool.spec().name.as_str()).collect();
    assert_eq!(names, ["Read", "grep", "write_file"], "built-ins first, then plugins, each sorted");

    let grep = host.pool().get("grep").unwrap().tool.spec();
    assert_eq!(grep.max_result_size, ResultSize::Chars(50_000));
    assert_eq!(grep.interrupt, InterruptBehavior::Cancel);
    assert_eq!(grep.origin, ToolOrigin::Plugin { path: guest("keel_tool_grep"), contract: "0.4.0" });
    assert_eq!(grep.input_schema["required"], serde_json::json!(["pattern"]));
    assert_eq!(grep.input_schema["properties"]["glob"]["type"], serde_json::json!(["string", "null"]));

    let write = host.pool().get("write_file").unwrap().tool.spec();
    assert_eq!(write.interrupt, InterruptBehavior::Block, "the SDK default");
    assert!(write.input_schema["properties"]["content"]["description"].as_str().unwrap().contains("content"));
}

#[test]
fn loads_every_component_of_a_directory() {
    let workspace = tempfile::tempdir().unwrap();
    let tools = tempfile::tempdir().unwrap();
    for name in ["keel_tool_grep", "keel_tool_write_file"] {
        std::fs::copy(guest(name), tools.path().join(format!("{name}.wasm"))).unwrap();
    }
    std::fs::write(tools.path().join("README.md"), "not a plugin").unwrap();
    let host = block_on(
        Host::builder()
            .workspace(workspace.path())
            .plugins(tools.path())
            .cache_dir(Some(shared_cache()))
            .build(),
    )
    .unwrap();
    assert_eq!(host.pool().entries().len(), 3);
}

fn load_error(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.wasm");
    std::fs::write(&path, bytes).unwrap();
    let result = block_on(Host::builder().workspace(dir.path()).plugins(&path).cache_dir(None).build());
    let error = result.err().expect("the bad file must not load").to_string();
    let prefix = format!("failed to load plugin {}: ", path.display());
    error.strip_prefix(&prefix).unwrap_or_else(|| panic!("error does not name the file: {error}")).to_string()
}

#[test]
fn a_file_that_is_not_wasm_is_refused_by_name() {
    assert_eq!(load_error(b"#!/bin/sh\necho hi\n"), "not a WebAssembly file (no `\\0asm` header)");
}

#[test]
fn a_core_module_is_refused_with_how_to_build_a_component() {
    let module = wat::parse_str("(module (func (export \"call\")))").unwrap();
    assert_eq!(
        load_error(&module),
        "is a core WebAssembly module, not a component; build the tool with \
         `cargo build --target wasm32-wasip2` and the keel-guest SDK"
    );
}

#[test]
fn a_malformed_component_is_refused() {
    let mut component = wat::parse_str("(component)").unwrap();
    component.extend_from_slice(&[0x01, 0xff, 0xff]);
    let error = load_error(&component);
    assert!(error.starts_with("not a valid component: "), "{error}");
}

#[test]
fn a_component_without_the_contract_is_refused() {
    let component = wat::parse_str("(component)").unwrap();
    assert_eq!(
        load_error(&component),
        "does not export `keel:tool/guest@<version>` (it exports nothing); is it a keel tool? \
         This host loads contracts 0.2.0, 0.3.0 and 0.4.0"
    );
}

#[test]
fn a_component_of_a_contract_version_the_host_does_not_know_is_refused_naming_those_it_does() {
    for version in ["0.1.0", "0.5.0"] {
        let wat = format!(
            r#"(component (instance $guest) (export "keel:tool/guest@{version}" (instance $guest)))"#
        );
        assert_eq!(
            load_error(&wat::parse_str(wat).unwrap()),
            format!(
                "was built against keel tool contract {version}, which this host does not know; it loads \
                 contracts 0.2.0, 0.3.0 and 0.4.0: rebuild the tool with a keel-guest of one of them"
            )
        );
    }
}

#[test]
fn a_component_missing_an_export_is_refused_naming_it() {
    for version in ["0.2.0", "0.3.0", "0.4.0"] {
        let wat = format!(
            r#"(component (instance $guest) (export "keel:tool/guest@{version}" (instance $guest)))"#
        );
        let error = load_error(&wat::parse_str(wat).unwrap());
        assert!(error.starts_with("does not export the keel tool contract: "), "{error}");
        assert!(error.contains("metadata") || error.contains("guest"), "{error}");
    }
}

#[test]
fn a_missing_plugin_path_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.wasm");
    let result = block_on(Host::builder().workspace(dir.path()).plugins(&missing).build());
    let error = result.err().unwrap().to_string();
    assert!(error.starts_with(&format!("failed to read {}: ", missing.display())), "{error}");
}

#[test]
fn a_component_importing_what_the_host_does_not_provide_is_refused_naming_the_import() {
    let wat = r#"(component
        (import "acme:weird/thing" (instance (export "poke" (func))))
        (instance $guest)
        (export "keel:tool/guest@0.4.0" (instance $guest)))"#;
    assert_eq!(
        load_error(&wat::parse_str(wat).unwrap()),
        "cannot be linked: component imports instance `acme:weird/thing`, but a matching implementation \
         was not found in the linker: instance export `poke` has the wrong type: function implementation \
         is missing"
    );
}
