//! Property tests standing in for fuzzing: arbitrary text through the batch
//! reader, arbitrary JSON through the schema compiler, arbitrary bytes
//! through component loading. The host must answer each with a value or an
//! error, never a panic.
//!
//! Each property runs a fixed, small number of cases so that the test
//! command stays fast; `KEEL_FUZZ_CASES=N` runs N cases of each instead:
//!
//! ```sh
//! KEEL_FUZZ_CASES=100000 cargo test -p keel-tests --test all fuzz
//! ```

use std::sync::{Arc, OnceLock};

use keel_host::batch::{parse_batch, parse_batch_with_limit};
use keel_host::limits::Limits;
use keel_host::load::PluginTool;
use keel_host::load::Runtime;
use keel_host::pool::InputSchema;
use proptest::prelude::*;
use serde_json::{Map, Value};

use crate::{block_on, guest};

fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("KEEL_FUZZ_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(default);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

/// Any JSON value, a few levels deep, biased towards the keys and values a
/// batch or a schema uses so that the interesting paths are reached.
fn json_value() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("type".to_string()),
        Just("id".to_string()),
        Just("name".to_string()),
        Just("input".to_string()),
        Just("role".to_string()),
        Just("content".to_string()),
        Just("properties".to_string()),
        Just("$ref".to_string()),
        Just("items".to_string()),
        Just("pattern".to_string()),
        "[a-z$]{1,6}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop_oneof![
            Just("tool_use".to_string()),
            Just("assistant".to_string()),
            Just("object".to_string()),
            Just("#/properties/a".to_string()),
            Just("[".to_string()),
            ".{0,8}",
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn the_batch_reader_never_panics_on_any_text(text in ".{0,200}") {
        let _ = parse_batch(&text, "fuzz.json");
    }

    #[test]
    fn the_batch_reader_never_panics_on_any_json(value in json_value(), max_input in 0usize..64) {
        let text = value.to_string();
        if let Ok(uses) = parse_batch_with_limit(&text, "fuzz.json", max_input) {
            let mut ids: Vec<&str> = uses.iter().map(|tool_use| tool_use.id.as_str()).collect();
            ids.sort();
            ids.dedup();
            prop_assert_eq!(ids.len(), uses.len(), "ids are unique");
        }
    }
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn the_schema_compiler_never_panics(schema in json_value(), input in json_value()) {
        if let Ok(schema) = InputSchema::compile(&schema) {
            let _ = schema.check(&input);
        }
    }
}

fn runtime() -> &'static Arc<Runtime> {
    static RUNTIME: OnceLock<Arc<Runtime>> = OnceLock::new();
    RUNTIME.get_or_init(|| Arc::new(Runtime::new(&Limits::default(), None).unwrap()))
}

fn load(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fuzz.wasm");
    std::fs::write(&path, bytes).unwrap();
    let _ = block_on(PluginTool::load(runtime(), &path, dir.path(), &Limits::default()));
}

/// A real component, small enough to mutate quickly.
fn seed() -> &'static [u8] {
    static SEED: OnceLock<Vec<u8>> = OnceLock::new();
    SEED.get_or_init(|| std::fs::read(guest("keel_guest_trap_load")).unwrap())
}

proptest! {
    #![proptest_config(cases(24))]

    #[test]
    fn loading_arbitrary_bytes_never_panics(tail in prop::collection::vec(any::<u8>(), 0..256), component in any::<bool>()) {
        // Past the header check, so the component parser sees the bytes.
        let version: &[u8] = if component { &[0x0d, 0x00, 0x01, 0x00] } else { &[0x01, 0x00, 0x00, 0x00] };
        let bytes: Vec<u8> = b"\0asm".iter().chain(version).chain(&tail).copied().collect();
        load(&bytes);
    }

    #[test]
    fn loading_a_mutated_component_never_panics(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = seed().to_vec();
        for (at, byte) in flips {
            let at = at.index(bytes.len());
            bytes[at] = byte;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        load(&bytes);
    }
}
