//! The `tracing` spans of a batch, as any subscriber gets them: one span per
//! call, named after its tool (`otel.name`) and carrying its `tool_use_id`,
//! with a child span per step. A test binary of its own, so that its global
//! subscriber sees every span of the run, whichever thread makes it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use keel_host::{Host, ToolUse};
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::{Layer, Registry};

/// One span as it was made: its name, its fields and its parent.
#[derive(Clone, Debug)]
struct Made {
    name: &'static str,
    fields: HashMap<String, String>,
    parent: Option<u64>,
}

#[derive(Clone, Default)]
struct Spans(Arc<Mutex<HashMap<u64, Made>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S> Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(&self, attributes: &Attributes<'_>, id: &Id, cx: Context<'_, S>) {
        let mut fields = HashMap::new();
        attributes.record(&mut Fields(&mut fields));
        let parent = cx.span(id).and_then(|span| span.parent()).map(|parent| parent.id().into_u64());
        let made = Made { name: attributes.metadata().name(), fields, parent };
        self.0.lock().unwrap_or_else(PoisonError::into_inner).insert(id.into_u64(), made);
    }
}

fn main() {
    let spans = Spans::default();
    tracing::subscriber::set_global_default(Registry::default().with(spans.clone()))
        .expect("no other subscriber in this test binary");

    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("notes.txt"), "keel\n").unwrap();
    let guests = Path::new(env!("KEEL_TEST_GUESTS_DIR"));
    let builder = Host::builder()
        .workspace(workspace.path())
        .plugins(guests.join("keel_tool_hash.wasm"))
        .plugins(guests.join("keel_tool_write_file.wasm"))
        .cache_dir(Some(Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache")));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let host = runtime.block_on(builder.build()).unwrap();
    let uses = vec![
        ToolUse::new("h1", "hash", json!({ "text": "a" })),
        ToolUse::new("h2", "hash", json!({ "text": "b" })),
        ToolUse::new("w", "write_file", json!({ "file_path": "out.txt", "content": "x" })),
        ToolUse::new("r", "Read", json!({ "file_path": "notes.txt" })),
    ];
    let outcome = runtime.block_on(host.run_batch(&uses));
    assert!(outcome.results.iter().all(|result| !result.is_error), "{:?}", outcome.results);

    let spans = spans.0.lock().unwrap().clone();
    for (id, tool) in [("h1", "hash"), ("h2", "hash"), ("w", "write_file"), ("r", "Read")] {
        let (call_id, call) = spans
            .iter()
            .find(|(_, made)| {
                made.name == "call" && made.fields.get("tool_use_id").map(String::as_str) == Some(id)
            })
            .unwrap_or_else(|| panic!("no span for call {id} among {spans:#?}"));
        assert_eq!(call.fields.get("otel.name").map(String::as_str), Some(tool), "{call:?}");
        assert_eq!(call.fields.get("tool").map(String::as_str), Some(tool), "{call:?}");
        let children: Vec<&str> =
            spans.values().filter(|made| made.parent == Some(*call_id)).map(|made| made.name).collect();
        for step in ["questions", "permission", "tool_call", "budget"] {
            assert!(children.contains(&step), "call {id} has no {step} span: {children:?}");
        }
        if tool != "Read" {
            // A plugin's sandbox set-up is a span inside the step that
            // needed it.
            let steps: Vec<u64> = spans
                .iter()
                .filter(|(_, made)| made.parent == Some(*call_id))
                .map(|(step_id, _)| *step_id)
                .collect();
            assert!(
                spans
                    .values()
                    .any(|made| made.name == "setup" && made.parent.is_some_and(|p| steps.contains(&p))),
                "call {id} has no setup span inside a step"
            );
        }
    }
    println!("spans: every call has its span and a child per step");
}
