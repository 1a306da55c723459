//! Results richer than text (README, "Results"): image blocks and structured
//! values from a real guest, through the checks, the budgets and the ledger.

use keel_host::batch::user_message;
use keel_host::budget::ledger::{Decision, Ledger};
use keel_host::budget::{Budget, BudgetConfig, Threshold};
use keel_host::{Content, ContentBlock, Image, ToolResult, ToolUse};
use serde_json::{Value, json};

use crate::{block_on, host_of};

/// The 1×1 PNG the `rich` guest returns.
fn pixel_png() -> Vec<u8> {
    png_header(1, 1)
}

/// The first bytes of a PNG of `width` × `height`: signature and header
/// chunk, which is all an image's type and size are read from.
fn png_header(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = vec![0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n', 0, 0, 0, 13];
    bytes.extend_from_slice(b"IHDR");
    bytes.extend_from_slice(&width.to_be_bytes());
    bytes.extend_from_slice(&height.to_be_bytes());
    bytes.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
    bytes
}

fn rich(id: &str, mode: &str, value: &Value) -> ToolUse {
    ToolUse::new(id, "rich", json!({ "mode": mode, "value": value }))
}

/// Run `uses` with the `rich` guest, persisting under `session`.
fn run(session: &std::path::Path, uses: &[ToolUse]) -> Vec<ToolResult> {
    let workspace = tempfile::tempdir().unwrap();
    let builder = host_of(workspace.path(), &["keel_guest_rich"]).session_dir(session);
    let host = block_on(builder.build()).unwrap();
    block_on(host.run_batch(uses)).results
}

#[test]
fn an_image_reaches_the_message_as_a_base64_image_block() {
    let session = tempfile::tempdir().unwrap();
    let results = run(session.path(), &[rich("t1", "image", &Value::Null)]);
    let result = &results[0];
    assert!(!result.is_error, "{result:?}");
    let Content::Blocks(blocks) = &result.content else { panic!("an image makes blocks: {result:?}") };
    assert_eq!(blocks[0], ContentBlock::Text("a tiny image".into()));
    let ContentBlock::Image(image) = &blocks[1] else { panic!("the image follows the text") };
    assert_eq!(image.media_type, "image/png");
    let message = user_message(&results);
    let source = &message["content"][0]["content"][1];
    assert_eq!(source["type"], "image");
    assert_eq!(source["source"]["type"], "base64");
    assert_eq!(source["source"]["media_type"], "image/png");
    assert_eq!(source["source"]["data"], image.base64());
}

#[test]
fn an_image_whose_bytes_are_not_its_media_type_fails_the_call() {
    let session = tempfile::tempdir().unwrap();
    let results = run(
        session.path(),
        &[rich("a", "mislabeled", &Value::Null), rich("b", "unknown-type", &Value::Null)],
    );
    assert_eq!(
        results[0],
        ToolResult::error(
            "a",
            "rich failed: the tool broke the keel contract: its image 1 is labelled `image/jpeg` but its \
             bytes are `image/png`"
        )
    );
    assert!(results[1].is_error);
    let text = results[1].content.text();
    assert!(text.contains("has media type `image/bmp`") && text.contains("image/webp"), "{text}");
}

#[test]
fn an_image_a_model_would_refuse_is_persisted_and_named() {
    let session = tempfile::tempdir().unwrap();
    let results =
        run(session.path(), &[rich("wide", "wide", &Value::Null), rich("huge", "huge", &Value::Null)]);
    for result in &results {
        let id = &result.tool_use_id;
        assert!(!result.is_error, "{result:?}");
        let text = result.content.as_text().unwrap_or_else(|| panic!("only text is left: {result:?}"));
        let file = format!("tool-results/{id}-image-1.png");
        assert!(text.starts_with("<persisted-output>\nImage left out (image/png, "), "{text}");
        // The session directory's path comes first, so the model can open it.
        let shown = session.path().join(&file).display().to_string();
        assert!(text.ends_with(&format!("Saved to: {shown}\n</persisted-output>")), "{text}");
        let saved = std::fs::read(session.path().join(&file)).unwrap();
        assert!(saved.starts_with(&pixel_png()[..8]), "the image's own bytes are kept");
    }
    assert!(results[0].content.text().contains("it measures 9000×1 px"), "{:?}", results[0]);
    let huge = std::fs::metadata(session.path().join("tool-results/huge-image-1.png")).unwrap().len();
    assert_eq!(huge, 6 << 20);
}

#[test]
fn a_structured_value_is_checked_and_shown_as_text_when_the_tool_gave_none() {
    let session = tempfile::tempdir().unwrap();
    let results = run(
        session.path(),
        &[
            rich("ok", "structured", &json!({ "count": 3 })),
            rich("both", "text-and-structured", &json!({ "count": 4 })),
            rich("negative", "structured", &json!({ "count": -1 })),
            rich("wrong", "structured", &json!({ "count": "x" })),
        ],
    );
    assert_eq!(results[0].content, Content::Text(r#"{"count":3}"#.into()));
    assert_eq!(results[0].structured, Some(json!({ "count": 3 })));
    assert_eq!(results[1].content, Content::Text("see the value".into()));
    assert_eq!(results[1].structured, Some(json!({ "count": 4 })));
    for (result, rule) in [(&results[2], "(rule: minimum)"), (&results[3], "(rule: type)")] {
        let text = result.content.text();
        assert!(result.is_error, "{result:?}");
        assert!(
            text.starts_with(
                "rich failed: the tool broke the keel contract: its structured value does not match its \
                 output schema: /count: "
            ) && text.ends_with(rule),
            "{text}"
        );
    }
}

#[test]
fn an_image_counts_by_its_size_and_a_replacement_is_reproduced_from_the_transcript() {
    let session = tempfile::tempdir().unwrap();
    let config = BudgetConfig { per_message_chars: Some(6_000.0), ..BudgetConfig::default() };
    let budget = Budget::new(&config, session.path());
    // 1,000 × 1,000 px: 1,334 tokens, counted as 5,336 chars.
    let photo = Image::new("image/png", png_header(1_000, 1_000));
    let with_photo = ToolResult::ok(
        "photo",
        Content::Blocks(vec![ContentBlock::Text("a photo".into()), ContentBlock::Image(photo)]),
    );
    let text = ToolResult::ok("text", "x".repeat(1_000));
    assert!(!Threshold::Chars(5_343).exceeded_by_content(&with_photo.content));
    assert!(Threshold::Chars(5_342).exceeded_by_content(&with_photo.content));

    let mut ledger = Ledger::new();
    let mut message = vec![with_photo.clone(), text.clone()];
    let thresholds = [Threshold::Chars(50_000); 2];
    block_on(budget.per_message(&mut message, &thresholds, &mut ledger));
    let replaced = message[0].content.as_text().expect("the image result became text").to_owned();
    assert!(
        replaced.starts_with(
            "<persisted-output>\nOutput too large (5343 chars counted with its image; the text alone is 7 \
             chars, 7 bytes)"
        ),
        "{replaced}"
    );
    assert!(replaced.contains("Saved to: tool-results/photo-image-1.png\n</persisted-output>"), "{replaced}");
    assert_eq!(message[1], text, "the smaller result is kept");
    assert_eq!(
        std::fs::read(session.path().join("tool-results/photo-image-1.png")).unwrap(),
        png_header(1_000, 1_000)
    );
    assert_eq!(ledger.get("photo"), Some(&Decision::Replaced { content: replaced, is_error: false }));

    // Rebuilt from the message as sent, the ledger gives the same bytes
    // again, for the results whole or as sent.
    let rebuilt = Ledger::reconstruct([&user_message(&message)]).unwrap();
    assert_eq!(rebuilt, ledger);
    for results in [vec![with_photo, text], message.clone()] {
        let mut again = results;
        block_on(budget.per_message(&mut again, &thresholds, &mut rebuilt.clone()));
        assert_eq!(
            serde_json::to_string(&user_message(&again)).unwrap(),
            serde_json::to_string(&user_message(&message)).unwrap()
        );
    }
}

#[test]
fn a_message_keeping_an_image_is_reproduced_too() {
    let session = tempfile::tempdir().unwrap();
    let budget = Budget::new(&BudgetConfig::default(), session.path());
    let small = Image::new("image/png", png_header(10, 10));
    let result = ToolResult::ok("small", Content::Blocks(vec![ContentBlock::Image(small)]));
    let mut ledger = Ledger::new();
    let mut message = vec![result.clone()];
    block_on(budget.per_message(&mut message, &[Threshold::default()], &mut ledger));
    assert_eq!(message[0], result);
    assert_eq!(ledger.get("small"), Some(&Decision::Kept));
    let sent = user_message(&message);
    assert_eq!(Ledger::reconstruct([&sent]).unwrap(), ledger);
    let read_back = Content::from_value(&sent["content"][0]["content"]).unwrap();
    assert_eq!(read_back, result.content, "the image block reads back as it was sent");
}

/// A native tool whose one call returns `value` as a structured value, with
/// no text, under `spec`.
struct Structured(keel_host::ToolSpec, Value);

#[async_trait::async_trait]
impl keel_host::Tool for Structured {
    fn spec(&self) -> &keel_host::ToolSpec {
        &self.0
    }

    async fn invoke(
        &self,
        input: Value,
        _context: std::sync::Arc<Value>,
    ) -> Result<Box<dyn keel_host::Invocation>, keel_host::tool::CallError> {
        Ok(Box::new(StructuredCall(input, self.1.clone())))
    }
}

struct StructuredCall(Value, Value);

#[async_trait::async_trait]
impl keel_host::Invocation for StructuredCall {
    fn input(&self) -> &Value {
        &self.0
    }

    fn set_input(&mut self, input: Value) {
        self.0 = input;
    }

    /// Its answers are the defaults, whatever the context.
    fn set_context(&mut self, _context: std::sync::Arc<Value>) {}

    async fn call(
        self: Box<Self>,
        _cx: keel_host::tool::CallContext,
    ) -> Result<keel_host::tool::CallOutput, keel_host::tool::CallError> {
        Ok(keel_host::tool::CallOutput {
            content: Vec::new(),
            structured: Some(self.1),
            context_modifier: None,
        })
    }
}

fn structured_host(output_schema: Option<Value>) -> keel_host::Result<keel_host::Host> {
    let workspace = tempfile::tempdir().unwrap();
    let spec = keel_host::ToolSpec {
        output_schema,
        ..keel_host::ToolSpec::native("report", "Reports a count.", json!({ "type": "object" }))
    };
    let tool = std::sync::Arc::new(Structured(spec, json!({ "count": 1 })));
    block_on(keel_host::Host::builder().workspace(workspace.path()).builtins(false).tool(tool).build())
}

#[test]
fn a_structured_value_from_a_tool_without_an_output_schema_fails_the_call() {
    let host = structured_host(None).unwrap();
    let results = block_on(host.run_batch(&[ToolUse::new("t1", "report", json!({}))])).results;
    assert_eq!(
        results[0],
        ToolResult::error(
            "t1",
            "report failed: the tool broke the keel contract: it returned a structured value but declares no \
             output schema"
        )
    );
}

#[test]
fn an_output_schema_that_is_not_an_object_schema_is_refused_when_the_tool_joins() {
    let error = structured_host(Some(json!({ "type": "string" }))).err().expect("refused");
    assert_eq!(
        error.to_string(),
        "failed to set up the WebAssembly engine: built-in `report` has an invalid output schema: the output \
         schema does not describe an object"
    );
}

#[test]
fn a_structured_value_counts_in_the_budgets_and_a_persisted_result_keeps_it_or_fails() {
    let session = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let config =
        keel_host::config::Config::parse("[budget.tools]\nrich = 100\n", "keel.toml".as_ref()).unwrap();
    let builder = host_of(workspace.path(), &["keel_guest_rich"]).session_dir(session.path()).config(config);
    let host = block_on(builder.build()).unwrap();
    let small = json!({ "count": 1, "pad": "s".repeat(200) });
    let large = json!({ "count": 1, "pad": "y".repeat(1_000_000) });
    let uses = [
        rich("small", "structured", &small),
        rich("large", "structured", &large),
        rich("beside", "text-and-structured", &large),
    ];
    let results = block_on(host.run_batch(&uses)).results;
    // Its JSON is past the threshold, and small enough to stay beside the
    // preview: the result is persisted and stays a success with its value.
    assert!(!results[0].is_error, "{:?}", results[0]);
    assert_eq!(results[0].structured, Some(small));
    assert!(results[0].content.text().starts_with("<persisted-output>\n"), "{}", results[0].content);
    // Too large to keep, alone or beside a short text: an error, no value.
    for result in &results[1..] {
        assert!(result.is_error, "{result:?}");
        assert_eq!(result.structured, None);
        assert!(result.content.text().len() < 5_000, "{}", result.content);
        assert!(result.content.text().contains("Structured value left out (1000020 bytes of JSON)"));
    }
    let saved = std::fs::read(session.path().join("tool-results/beside-structured.json")).unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&saved).unwrap(), large);
}
