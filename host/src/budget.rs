//! Result budgets (README, "Result budgets"): no single result, and no message of
//! results, grows past what a model's context can afford.
//!
//! | tier | limit | past it |
//! |---|---|---|
//! | per tool | `min(max-result-size, 50,000)` chars | the result is persisted and previewed |
//! | per result, absolute | 400,000 bytes | the same, for any tool whose own max is larger |
//! | per message | 200,000 chars over all results of one message | the largest results are persisted until it fits |
//!
//! **Units.** A *char* is a Unicode scalar value (`str::chars`), what the
//! per-tool and per-message limits count. The absolute cap, that of the
//! runtime keel follows, is 100,000 tokens at a conservative 4 bytes each,
//! and stays in bytes: it is checked on the UTF-8 length, beside the char
//! limit. A char is 1 to 4
//! bytes, so a result within the default 50,000 chars is at most 200,000
//! bytes and the byte cap never fires; it bites when a tool's threshold is
//! raised by config past 100,000 chars, and for an untrusted plugin that
//! claims to bound itself. A threshold above 400,000 chars is clamped to
//! 400,000, which the byte cap then tightens further for multi-byte text.
//!
//! **What counts.** A result counts its text, each image by what it costs
//! a model ([`image_chars`]), and its structured value by the chars and bytes
//! of its JSON text, unless the text is that JSON (a value given no text is
//! shown as it, and counted once). A persisted result keeps a structured
//! value of at most [`KEPT_STRUCTURED_BYTES`]; a larger one is left out and
//! the result becomes an error (see [`KEPT_STRUCTURED_BYTES`] for why).
//!
//! **Order.** As each call finishes, [`Budget::per_tool`] applies the first
//! two tiers to its result. When every result of the message is in,
//! [`Budget::per_message`] applies the third, consulting and extending the
//! [`Ledger`] of earlier decisions.
//!
//! ```no_run
//! use keel_host::budget::{Budget, BudgetConfig};
//! use keel_host::budget::ledger::Ledger;
//! # async fn run(spec: &keel_host::ToolSpec, result: keel_host::ToolResult) {
//! let budget = Budget::new(&BudgetConfig::default(), "/path/to/session");
//! let threshold = budget.threshold(spec);
//! let mut results = vec![budget.per_tool(result, threshold).await];
//! let mut ledger = Ledger::new();
//! budget.per_message(&mut results, &[threshold], &mut ledger).await;
//! # }
//! ```
//!
//! The path shown to the model is relative to the session directory
//! (`tool-results/<tool_use_id>.txt`), so the same batch always yields the
//! same bytes; [`Budget::shown_root`] prefixes it when the model needs a path
//! it can open.

pub mod ledger;
mod persist;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt as _;
use serde::{Deserialize, Serialize};

pub use self::persist::{
    Counted, PERSIST_FAILED_PREFIX, PERSISTED_OUTPUT_CLOSING_TAG, PERSISTED_OUTPUT_TAG, PREVIEW_SIZE_BYTES,
    ResultStore, SessionDir, TOOL_RESULTS_SUBDIR, file_name, is_replacement, persist_failed, persisted_block,
    persisted_block_counted, preview,
};
use self::persist::{StructuredPlace, structured_file_name, structured_left_out};
use crate::batch::ToolResult;
use crate::budget::ledger::{Decision, Ledger};
use crate::content::{Content, ContentBlock, Image, ImageInfo};
pub use crate::contract::DEFAULT_MAX_RESULT_SIZE_CHARS;
use crate::tool::{ResultSize, ToolSpec};

/// Tokens one result may cost at most, whatever the tool declares.
pub const MAX_TOOL_RESULT_TOKENS: u64 = 100_000;

/// A conservative bytes-per-token estimate: real text averages more bytes per
/// token, so a cap derived from it errs towards persisting.
pub const BYTES_PER_TOKEN: u64 = 4;

/// The absolute cap of one result, in bytes of UTF-8:
/// [`MAX_TOOL_RESULT_TOKENS`] × [`BYTES_PER_TOKEN`].
pub const MAX_TOOL_RESULT_BYTES: u64 = MAX_TOOL_RESULT_TOKENS * BYTES_PER_TOKEN;

/// Chars all results of one message may hold together. Without it, ten
/// parallel calls just under the per-tool cap would put 10 × 40K = 400K chars
/// into one message.
pub const MAX_TOOL_RESULTS_PER_MESSAGE_CHARS: u64 = 200_000;

/// The most bytes an image may hold and still reach a message: the Messages
/// API refuses a larger one (5 MB).
pub const MAX_IMAGE_BYTES: u64 = 5 * 1024 * 1024;

/// The most pixels an image may measure on either side and still reach a
/// message: the Messages API refuses a larger one.
pub const MAX_IMAGE_SIDE_PX: u64 = 8_000;

/// Pixels per token of an image, as the Messages API counts an image's cost
/// (`width × height / 750`).
pub const IMAGE_PIXELS_PER_TOKEN: u64 = 750;

/// The most bytes of JSON a structured value may hold and stay beside the
/// preview of a persisted result: as many as the preview itself.
///
/// A result of a tool that declares an output schema carries a structured
/// value (MCP's `structuredContent`), and an MCP client holds a successful
/// result without one to be broken (the spec says such a tool MUST return
/// one; the Python SDK raises). The value counts in the budgets as the text
/// does, so when it is what made a result too large it cannot be kept whole,
/// and a persisted result keeps it only when it is this small: then only the
/// text (or the images) was too large, and the result stays a success with
/// its value. A larger value is written to a file like the text, left out,
/// and the result becomes an error saying so and where it went: an error
/// result needs no structured value, and what reaches the model stays
/// bounded by the preview and this.
pub const KEPT_STRUCTURED_BYTES: usize = PREVIEW_SIZE_BYTES;

/// Why an image persisted by the per-message tier was left out.
const OVER_BUDGET: &str = "the result is over its budget";

/// How many results the per-message tier writes at once. Each write is
/// synced, and syncs side by side share the disk's flushes.
const PARALLEL_WRITES: usize = 8;

/// What an image of `info`'s size counts for in the budgets, in chars: the
/// tokens a model spends on it, at [`BYTES_PER_TOKEN`] chars each, as text is
/// counted. An image is budgeted by what it costs the model's context, not by
/// its bytes: a 100 KB screenshot costs about as much as 5,000 chars of text.
pub fn image_chars(info: ImageInfo) -> u64 {
    info.width.saturating_mul(info.height).div_ceil(IMAGE_PIXELS_PER_TOKEN).saturating_mul(BYTES_PER_TOKEN)
}

/// Why an image never reaches a message, if it would not: the Messages API
/// refuses it, or its header cannot be read.
fn refused(image: &Image) -> Option<String> {
    match image.check() {
        Err(reason) => Some(format!("the image {reason}")),
        Ok(info)
            if image.data.len() as u64 > MAX_IMAGE_BYTES
                || info.width.max(info.height) > MAX_IMAGE_SIDE_PX =>
        {
            Some(format!(
                "it measures {}×{} px, and a model takes at most {MAX_IMAGE_SIDE_PX} px a side and \
                 {MAX_IMAGE_BYTES} bytes",
                info.width, info.height
            ))
        }
        Ok(_) => None,
    }
}

/// What `content` counts for in the budgets, in chars: its text, and each
/// image by [`image_chars`].
pub fn content_chars(content: &Content) -> u64 {
    match content {
        Content::Text(text) => text.chars().count() as u64,
        Content::Blocks(blocks) => blocks
            .iter()
            .map(|block| match block {
                ContentBlock::Text(text) => text.chars().count() as u64,
                ContentBlock::Image(image) => image.check().map_or(0, image_chars),
            })
            .sum(),
    }
}

/// What one result counts for in the budgets.
struct Measured {
    /// Its text and images as [`content_chars`] counts them, and the chars
    /// of `apart`.
    chars: u64,
    /// The UTF-8 bytes of its text and of `apart`.
    bytes: u64,
    /// The JSON text of its structured value, when that counts apart from
    /// the text: there is a value and the text is not its JSON (a value the
    /// tool gave no text for is shown as its JSON, counted once).
    apart: Option<String>,
    /// Its images.
    images: usize,
}

impl Measured {
    fn of(result: &ToolResult) -> Self {
        let text = result.content.text();
        let apart = result.structured.as_ref().map(json).filter(|json| *json != text);
        let extra = |measure: fn(&str) -> u64| apart.as_deref().map_or(0, measure);
        Measured {
            chars: content_chars(&result.content).saturating_add(extra(|json| json.chars().count() as u64)),
            bytes: (text.len() as u64).saturating_add(extra(|json| json.len() as u64)),
            images: result.content.images().count(),
            apart,
        }
    }

    /// The header's account of what counted, when the text is not all of it.
    fn counted(&self) -> Option<Counted> {
        (self.images > 0 || self.apart.is_some()).then_some(Counted {
            chars: self.chars,
            images: self.images,
            structured: self.apart.is_some(),
        })
    }
}

/// A structured value's JSON text, as the model reads a value given no text.
fn json(value: &serde_json::Value) -> String {
    serde_json::to_string(value).expect("a JSON value serializes")
}

/// What a persisted result keeps of `structured`: the value when its JSON is
/// at most [`KEPT_STRUCTURED_BYTES`], else nothing.
fn kept(structured: Option<serde_json::Value>) -> Option<serde_json::Value> {
    structured.filter(|value| json(value).len() <= KEPT_STRUCTURED_BYTES)
}

/// Whether `content` is a replacement the budgets made (see [`is_replacement`]).
fn is_replaced(content: &Content, is_error: bool) -> bool {
    content.as_text().is_some_and(|text| is_replacement(text, is_error))
}

/// `[budget]` of `keel.toml`: overrides of the per-message limit and of
/// per-tool thresholds.
///
/// ```toml
/// [budget]
/// per_message_chars = 150_000   # default 200,000
///
/// [budget.tools]                # persist past this many chars
/// grep = 20_000
/// ```
///
/// Values are read as numbers of any kind, and only finite positive ones take
/// effect (a fraction is rounded down); `0`, negatives, `nan` and `inf` are
/// ignored with a warning, keeping the default.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, expecting = "the `[budget]` table")]
pub struct BudgetConfig {
    /// Chars all results of one message may hold together.
    pub per_message_chars: Option<f64>,
    /// Per-tool persistence thresholds in chars, by tool name; they replace
    /// `min(max-result-size, 50,000)` and are clamped to the absolute cap. A
    /// trusted self-bounded tool keeps its exemption.
    #[serde(default)]
    pub tools: BTreeMap<String, f64>,
}

/// When a tool's result is persisted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Threshold {
    /// Persisted when longer than this many chars, or than
    /// [`MAX_TOOL_RESULT_BYTES`] bytes; replaceable by the per-message tier.
    Chars(u64),
    /// Never persisted and never replaced: a trusted tool that bounds its own
    /// output. Persisting it would have the model read the file back through
    /// the same tool, a loop.
    SelfBounded,
}

impl Default for Threshold {
    /// [`DEFAULT_MAX_RESULT_SIZE_CHARS`]; also what a result without a tool
    /// (an unknown name) gets.
    fn default() -> Self {
        Threshold::Chars(DEFAULT_MAX_RESULT_SIZE_CHARS)
    }
}

impl Threshold {
    /// Whether `content` is past this threshold.
    pub fn exceeded_by(self, content: &str) -> bool {
        match self {
            Threshold::SelfBounded => false,
            Threshold::Chars(chars) => {
                content.len() as u64 > MAX_TOOL_RESULT_BYTES || content.chars().count() as u64 > chars
            }
        }
    }

    /// Whether `content` is past this threshold: its text by its bytes and
    /// chars as [`Threshold::exceeded_by`], with each image counted in by
    /// [`image_chars`].
    pub fn exceeded_by_content(self, content: &Content) -> bool {
        match (self, content) {
            (_, Content::Text(text)) => self.exceeded_by(text),
            (Threshold::SelfBounded, Content::Blocks(_)) => false,
            (Threshold::Chars(chars), Content::Blocks(_)) => {
                content.text().len() as u64 > MAX_TOOL_RESULT_BYTES || content_chars(content) > chars
            }
        }
    }

    /// Whether `result` is past this threshold: its content as
    /// [`Threshold::exceeded_by_content`], with its structured value's JSON
    /// text counted in, chars and bytes, unless the text is that JSON.
    pub fn exceeded_by_result(self, result: &ToolResult) -> bool {
        self.exceeded(&Measured::of(result))
    }

    fn exceeded(self, measured: &Measured) -> bool {
        match self {
            Threshold::SelfBounded => false,
            Threshold::Chars(chars) => measured.bytes > MAX_TOOL_RESULT_BYTES || measured.chars > chars,
        }
    }

    /// Whether the per-message tier may replace the result.
    pub fn replaceable(self) -> bool {
        self != Threshold::SelfBounded
    }
}

/// The budgets of one session: the resolved limits and where persisted
/// results go. Cheap to clone; clones share the store.
#[derive(Clone)]
pub struct Budget {
    per_message_chars: u64,
    tool_chars: BTreeMap<String, u64>,
    store: Arc<dyn ResultStore>,
    shown_root: String,
    warnings: Vec<String>,
    /// Results persisted so far, shared by the clones.
    persisted: Arc<AtomicU64>,
}

impl Budget {
    /// The budgets `config` sets, persisting into
    /// `session_dir/tool-results/` with atomic writes ([`SessionDir`]).
    ///
    /// Overrides that do not take effect are logged as warnings and kept in
    /// [`Budget::warnings`].
    pub fn new(config: &BudgetConfig, session_dir: impl Into<PathBuf>) -> Self {
        Budget::with_store(config, Arc::new(SessionDir::new(session_dir)))
    }

    /// The budgets `config` sets, persisting through `store`.
    pub fn with_store(config: &BudgetConfig, store: Arc<dyn ResultStore>) -> Self {
        let mut warnings = Vec::new();
        let mut accept = |key: String, value: f64| {
            let taken = effective(value);
            if taken.is_none() {
                warnings.push(format!(
                    "ignoring `{key} = {}` in the config: only a finite positive number takes effect",
                    toml_number(value)
                ));
            }
            taken
        };
        let per_message_chars = config
            .per_message_chars
            .and_then(|value| accept("[budget] per_message_chars".into(), value))
            .unwrap_or(MAX_TOOL_RESULTS_PER_MESSAGE_CHARS);
        let tool_chars = config
            .tools
            .iter()
            .filter_map(|(name, &value)| {
                let chars = accept(format!("[budget.tools] {name}"), value)?;
                Some((name.clone(), chars.min(MAX_TOOL_RESULT_BYTES)))
            })
            .collect();
        for warning in &warnings {
            tracing::warn!("{warning}");
        }
        Budget {
            per_message_chars,
            tool_chars,
            store,
            shown_root: String::new(),
            warnings,
            persisted: Arc::default(),
        }
    }

    /// Show persisted paths under `root` (for example the session directory's
    /// absolute path, so the model can open the file) instead of relative to
    /// the session directory. Default: relative, `tool-results/<id>.txt`.
    pub fn shown_root(mut self, root: impl Into<String>) -> Self {
        self.shown_root = root.into();
        self
    }

    /// Results persisted so far, by either tier, through this budget and its
    /// clones: a result whose content, or one of whose images, was written
    /// to a file (or failed to be, the result becoming an error).
    pub fn results_persisted(&self) -> u64 {
        self.persisted.load(Ordering::Relaxed)
    }

    /// Config overrides that were ignored, one sentence each.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The per-message limit in effect, in chars.
    pub fn per_message_chars(&self) -> u64 {
        self.per_message_chars
    }

    /// When results of the tool `spec` describes are persisted.
    ///
    /// A self-bounded tool stays exempt only when [`ToolSpec::trusted`] (a
    /// built-in, or a plugin the config trusts); an untrusted one is clamped
    /// to the absolute cap, then treated like any tool. Otherwise the
    /// config's threshold for the tool's name applies, else
    /// `min(max-result-size, 50,000)`.
    pub fn threshold(&self, spec: &ToolSpec) -> Threshold {
        let declared = match spec.max_result_size {
            ResultSize::SelfBounded if spec.trusted => return Threshold::SelfBounded,
            ResultSize::SelfBounded => MAX_TOOL_RESULT_BYTES,
            ResultSize::Chars(chars) => chars.min(MAX_TOOL_RESULT_BYTES),
        };
        match self.tool_chars.get(&spec.name) {
            Some(&chars) => Threshold::Chars(chars),
            None => Threshold::Chars(declared.min(DEFAULT_MAX_RESULT_SIZE_CHARS)),
        }
    }

    /// What a loaded set of tools should be warned about, once, at load: an
    /// untrusted plugin whose self-bound is not honoured, and
    /// `[budget.tools]` entries that name no tool or a tool exempt from
    /// persisting.
    pub fn check_tools<'a>(&self, tools: impl IntoIterator<Item = &'a ToolSpec>) -> Vec<String> {
        let mut warnings = Vec::new();
        let mut named = std::collections::BTreeSet::new();
        for spec in tools {
            named.insert(spec.name.as_str());
            let threshold = self.threshold(spec);
            match (spec.max_result_size, threshold) {
                (ResultSize::SelfBounded, Threshold::Chars(chars)) => warnings.push(format!(
                    "plugin tool `{}` says it bounds its own output, but the config does not trust it: \
                     its results are persisted past {chars} chars",
                    spec.name
                )),
                (_, Threshold::SelfBounded) if self.tool_chars.contains_key(&spec.name) => {
                    warnings.push(format!(
                        "ignoring `[budget.tools] {}` in the config: the tool bounds its own output and \
                         is never persisted",
                        spec.name
                    ));
                }
                _ => {}
            }
        }
        for name in self.tool_chars.keys().filter(|name| !named.contains(name.as_str())) {
            warnings.push(format!("ignoring `[budget.tools] {name}` in the config: no tool has that name"));
        }
        warnings
    }

    /// The first two tiers, for one result as its call finishes: past
    /// `threshold`, the content is persisted and the result becomes a
    /// `<persisted-output>` block (see [`persisted_block`]). When persisting
    /// fails, the result becomes an error holding the reason and the preview
    /// (see [`persist_failed`]). A result that already is a replacement is
    /// left as it is.
    ///
    /// Before either, an image a model would refuse (over
    /// [`MAX_IMAGE_BYTES`], or over [`MAX_IMAGE_SIDE_PX`] on a side) is
    /// persisted as `tool-results/<id>-image-<n>.<ext>` and replaced by a
    /// text block naming the file, whatever the threshold. Past the
    /// threshold, a result with images is persisted whole: its text as a
    /// text result is, each image to a file of its own, and it becomes text.
    ///
    /// A structured value counts by its JSON text, unless the text is that
    /// JSON (see [`Threshold::exceeded_by_result`]). A persisted result keeps
    /// it when it is at most [`KEPT_STRUCTURED_BYTES`] of JSON; a larger one
    /// is left out and the result becomes an error naming where it went.
    pub async fn per_tool(&self, result: ToolResult, threshold: Threshold) -> ToolResult {
        let (result, refused) = self.refuse_images(result).await;
        let measured = Measured::of(&result);
        if !threshold.exceeded(&measured) || is_replaced(&result.content, result.is_error) {
            if refused {
                self.persisted.fetch_add(1, Ordering::Relaxed);
            }
            return result;
        }
        // Boxed, as in `refuse_images` and `per_message`: inline, the future
        // of a file write would swell that of every call, persisted or not.
        Box::pin(self.persist_result(result, measured)).await
    }

    /// Persist `result` whole, measured as `measured`: its content as
    /// [`Budget::persist_content`] does, and its structured value kept, or
    /// left out (written to a file when it is not the text) with the result
    /// an error, as [`KEPT_STRUCTURED_BYTES`] says.
    async fn persist_result(&self, mut result: ToolResult, measured: Measured) -> ToolResult {
        let content = std::mem::take(&mut result.content);
        let id = result.tool_use_id.clone();
        (result.content, result.is_error) =
            self.persist_content(&id, content, result.is_error, measured.counted()).await;
        let Some(value) = result.structured.take() else { return result };
        let apart = measured.apart.is_some();
        let json = measured.apart.unwrap_or_else(|| json(&value));
        if json.len() <= KEPT_STRUCTURED_BYTES {
            result.structured = Some(value);
            return result;
        }
        drop(value);
        let note = if apart {
            let file = structured_file_name(&id);
            let shown = persist::shown_path(&self.shown_root, &file);
            let bytes = json.len();
            let store = self.store.clone();
            let written = tokio::task::spawn_blocking(move || store.write(&file, json.as_bytes()))
                .await
                .unwrap_or_else(|_| Err(std::io::Error::other("the writer panicked")));
            match written {
                Ok(()) => structured_left_out(bytes, StructuredPlace::Saved(&shown)),
                Err(error) => {
                    tracing::warn!("failed to persist the structured value of {id} to {shown}: {error}");
                    structured_left_out(bytes, StructuredPlace::Failed(&shown, &error))
                }
            }
        } else {
            structured_left_out(json.len(), StructuredPlace::Text)
        };
        let mut blocks = match std::mem::take(&mut result.content) {
            Content::Text(text) if text.is_empty() => Vec::new(),
            Content::Text(text) => vec![ContentBlock::Text(text)],
            Content::Blocks(blocks) => blocks,
        };
        blocks.push(ContentBlock::Text(note));
        result.content = Content::from_blocks(blocks);
        result.is_error = true;
        result
    }

    /// Persist and replace every image of `result` a model would refuse;
    /// and whether there was one.
    async fn refuse_images(&self, mut result: ToolResult) -> (ToolResult, bool) {
        let Content::Blocks(blocks) = &mut result.content else { return (result, false) };
        let (mut number, mut refused_any) = (0, false);
        for block in blocks.iter_mut() {
            let ContentBlock::Image(image) = block else { continue };
            number += 1;
            if let Some(why) = refused(image) {
                refused_any = true;
                let (note, failed) =
                    Box::pin(self.persist_image(&result.tool_use_id, number, image, &why)).await;
                result.is_error |= failed;
                *block = ContentBlock::Text(note);
            }
        }
        let blocks = std::mem::take(blocks);
        result.content = Content::from_blocks(blocks);
        (result, refused_any)
    }

    /// How many chars the replacement [`Budget::persist_result`] makes of
    /// `result` (measured as `measured`) counts for, its files written.
    fn replacement_chars(&self, result: &ToolResult, measured: &Measured) -> u64 {
        let structured = match (&result.structured, &measured.apart) {
            (None, _) => 0,
            (Some(_), Some(json)) if json.len() <= KEPT_STRUCTURED_BYTES => json.chars().count() as u64,
            (Some(_), Some(json)) => {
                let shown = persist::shown_path(&self.shown_root, &structured_file_name(&result.tool_use_id));
                // And the line break that joins it to the blocks before.
                structured_left_out(json.len(), StructuredPlace::Saved(&shown)).chars().count() as u64 + 1
            }
            (Some(value), None) => {
                let json = json(value);
                if json.len() <= KEPT_STRUCTURED_BYTES {
                    json.chars().count() as u64
                } else {
                    structured_left_out(json.len(), StructuredPlace::Text).chars().count() as u64 + 1
                }
            }
        };
        self.content_replacement_chars(&result.tool_use_id, &result.content, measured.counted())
            .saturating_add(structured)
    }

    /// How many chars the replacement [`Budget::persist_content`] makes of
    /// `content` counts for, its files written.
    fn content_replacement_chars(
        &self,
        tool_use_id: &str,
        content: &Content,
        counted: Option<Counted>,
    ) -> u64 {
        let text_chars = |text: &str| {
            let shown = persist::shown_path(&self.shown_root, &file_name(tool_use_id));
            persist::persisted_block_counted(text, counted, &shown).chars().count() as u64
        };
        let blocks = match content {
            // The block holds a text that fits its preview whole, and more;
            // unless a structured value counted apart goes with it.
            Content::Text(text) if text.len() <= persist::PREVIEW_SIZE_BYTES && counted.is_none() => {
                return u64::MAX;
            }
            Content::Text(text) => return text_chars(text),
            Content::Blocks(blocks) => blocks,
        };
        let text = crate::content::text_of(blocks);
        let images = blocks.iter().filter_map(|block| match block {
            ContentBlock::Image(image) => Some(image),
            ContentBlock::Text(_) => None,
        });
        let notes = (1..).zip(images).map(|(number, image)| {
            let file = persist::image_file_name(tool_use_id, number, image.extension());
            let shown = persist::shown_path(&self.shown_root, &file);
            persist::persisted_image_block(image, OVER_BUDGET, &shown).chars().count() as u64
        });
        let text = if text.is_empty() { 0 } else { text_chars(&text) };
        notes.fold(text, u64::saturating_add)
    }

    /// Persist `content` whole: what the model reads instead (text), and
    /// whether it is an error. `counted` is what the result counted for
    /// besides the text, given in the block's header.
    async fn persist_content(
        &self,
        tool_use_id: &str,
        content: Content,
        is_error: bool,
        counted: Option<Counted>,
    ) -> (Content, bool) {
        self.persisted.fetch_add(1, Ordering::Relaxed);
        let blocks = match content {
            Content::Text(text) => {
                let (text, is_error) = self.persist(tool_use_id, text, is_error, counted).await;
                return (Content::Text(text), is_error);
            }
            Content::Blocks(blocks) => blocks,
        };
        let text = crate::content::text_of(&blocks);
        let mut shown = Vec::new();
        let mut is_error = is_error;
        if !text.is_empty() {
            let (block, failed) = self.persist(tool_use_id, text, is_error, counted).await;
            is_error = failed;
            shown.push(ContentBlock::Text(block));
        }
        let images = blocks.into_iter().filter_map(|block| match block {
            ContentBlock::Image(image) => Some(image),
            ContentBlock::Text(_) => None,
        });
        for (number, image) in (1..).zip(images) {
            let (note, failed) = self.persist_image(tool_use_id, number, &image, OVER_BUDGET).await;
            is_error |= failed;
            shown.push(ContentBlock::Text(note));
        }
        (Content::from_blocks(shown), is_error)
    }

    /// Persist image `number` of a result: the text block naming its file,
    /// and whether persisting failed.
    async fn persist_image(
        &self,
        tool_use_id: &str,
        number: usize,
        image: &Image,
        why: &str,
    ) -> (String, bool) {
        let file = persist::image_file_name(tool_use_id, number, image.extension());
        let shown = persist::shown_path(&self.shown_root, &file);
        let (store, bytes) = (self.store.clone(), image.data.clone());
        let written = tokio::task::spawn_blocking(move || store.write(&file, &bytes))
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("the writer panicked")));
        match written {
            Ok(()) => (persist::persisted_image_block(image, why, &shown), false),
            Err(error) => {
                tracing::warn!("failed to persist image {number} of {tool_use_id} to {shown}: {error}");
                (persist::image_persist_failed(image, why, &shown, &error), true)
            }
        }
    }

    /// The third tier, for the results of one message once all are in.
    /// `thresholds[i]` is the threshold of the tool of `results[i]`
    /// ([`Threshold::default`] for a result with no tool).
    ///
    /// First every result the `ledger` has a decision for gets it again: a
    /// replaced one the recorded bytes (nothing is written again), a kept one
    /// stays whole. Then, while the message is over
    /// [`Budget::per_message_chars`], the largest undecided result that is
    /// replaceable (not [`Threshold::SelfBounded`], not already a
    /// replacement) is persisted; ties go to the earlier result. A result
    /// whose replacement would be no shorter than it (a text that fits the
    /// preview whole, say) is kept: persisting it would only make the
    /// message longer. Every result is then recorded in the ledger, replaced
    /// or kept. A message whose remaining results are all decided, exempt or
    /// too short to shorten may stay over the limit: a decision is never
    /// revisited.
    ///
    /// # Panics
    ///
    /// When `results` and `thresholds` differ in length.
    pub async fn per_message(
        &self,
        results: &mut [ToolResult],
        thresholds: &[Threshold],
        ledger: &mut Ledger,
    ) {
        assert_eq!(results.len(), thresholds.len(), "one threshold per result");
        let mut undecided = Vec::new();
        for (index, result) in results.iter_mut().enumerate() {
            match ledger.get(&result.tool_use_id) {
                Some(Decision::Replaced { content, is_error }) => {
                    result.content = Content::Text(content.clone());
                    result.is_error = *is_error;
                    result.structured = kept(result.structured.take());
                }
                Some(Decision::Kept) => {}
                None => undecided.push(index),
            }
        }
        let mut measured: Vec<Option<Measured>> = results.iter().map(|_| None).collect();
        for &index in &undecided {
            measured[index] = Some(Measured::of(&results[index]));
        }
        let mut sizes: Vec<u64> = results
            .iter()
            .zip(&measured)
            .map(|(result, measured)| match measured {
                Some(measured) => measured.chars,
                None => Measured::of(result).chars,
            })
            .collect();
        let mut total: u64 = sizes.iter().sum();
        let mut candidates: Vec<usize> = undecided
            .iter()
            .copied()
            .filter(|&index| {
                thresholds[index].replaceable()
                    && !is_replaced(&results[index].content, results[index].is_error)
            })
            .collect();
        candidates.sort_by_key(|&index| (std::cmp::Reverse(sizes[index]), index));
        let mut next = 0;
        while total > self.per_message_chars && next < candidates.len() {
            // The results to persist are chosen as if every write succeeds
            // (a replacement's size is known before it is written), then
            // written side by side. A write that fails leaves a replacement
            // of another size, so the choice goes on from the actual total.
            let mut projected = total;
            let mut chosen = Vec::new();
            while projected > self.per_message_chars && next < candidates.len() {
                let index = candidates[next];
                next += 1;
                let result = &results[index];
                let measure = measured[index].as_ref().expect("an undecided result is measured");
                // What a replacement would not shorten stays: persisting it
                // cannot bring the message nearer its limit.
                let replacement = self.replacement_chars(result, measure);
                if replacement < sizes[index] {
                    projected = projected - sizes[index] + replacement;
                    chosen.push(index);
                }
            }
            let writes = chosen.into_iter().map(|index| {
                let result = std::mem::replace(&mut results[index], ToolResult::ok("", ""));
                let measure = measured[index].take().expect("an undecided result is measured");
                async move { (index, self.persist_result(result, measure).await) }
            });
            let written: Vec<_> =
                futures::stream::iter(writes).buffer_unordered(PARALLEL_WRITES).collect().await;
            for (index, replaced) in written {
                let size = Measured::of(&replaced).chars;
                results[index] = replaced;
                total = total - sizes[index] + size;
                sizes[index] = size;
            }
        }
        for index in undecided {
            let result = &results[index];
            let decision = match &result.content {
                Content::Text(text) if is_replacement(text, result.is_error) => {
                    Decision::Replaced { content: text.clone(), is_error: result.is_error }
                }
                _ => Decision::Kept,
            };
            ledger.record(&result.tool_use_id, decision);
        }
    }

    /// Persist `content`, returning what the model reads instead and whether
    /// it is an error. The write runs on the blocking pool: it syncs to disk.
    async fn persist(
        &self,
        tool_use_id: &str,
        content: String,
        is_error: bool,
        counted: Option<Counted>,
    ) -> (String, bool) {
        let file = file_name(tool_use_id);
        let shown = persist::shown_path(&self.shown_root, &file);
        let content = Arc::new(content);
        let (store, bytes) = (self.store.clone(), content.clone());
        let written = tokio::task::spawn_blocking(move || store.write(&file, bytes.as_bytes()))
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("the writer panicked")));
        match written {
            Ok(()) => (persisted_block_counted(&content, counted, &shown), is_error),
            Err(error) => {
                tracing::warn!("failed to persist the result of {tool_use_id} to {shown}: {error}");
                (persist_failed(&content, &shown, &error), true)
            }
        }
    }
}

/// The value an override takes, if it takes effect.
fn effective(value: f64) -> Option<u64> {
    // `as` saturates, so a huge finite value is simply "no limit to speak of".
    (value.is_finite() && value > 0.0).then(|| value.floor() as u64)
}

/// `value` as it is spelled in TOML.
fn toml_number(value: f64) -> String {
    match value {
        v if v.is_nan() => "nan".into(),
        v if v == f64::INFINITY => "inf".into(),
        v if v == f64::NEG_INFINITY => "-inf".into(),
        v => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io;
    use std::path::Path;
    use std::sync::Mutex;

    use super::*;
    use crate::config::Config;

    /// A store in memory that can be told to fail with an OS error.
    #[derive(Default)]
    struct Memory {
        files: Mutex<BTreeMap<String, Vec<u8>>>,
        fail_with: Option<i32>,
    }

    impl ResultStore for Memory {
        fn write(&self, file_name: &str, contents: &[u8]) -> io::Result<()> {
            if let Some(code) = self.fail_with {
                return Err(io::Error::from_raw_os_error(code));
            }
            self.files.lock().unwrap().insert(file_name.to_owned(), contents.to_vec());
            Ok(())
        }
    }

    impl Memory {
        fn names(&self) -> Vec<String> {
            self.files.lock().unwrap().keys().cloned().collect()
        }
    }

    fn in_memory(config: &BudgetConfig) -> (Budget, Arc<Memory>) {
        let store = Arc::new(Memory::default());
        (Budget::with_store(config, store.clone()), store)
    }

    /// `n` chars of ASCII lines of 100 chars each.
    fn text(n: usize) -> String {
        let line = format!("{}\n", "x".repeat(99));
        line.repeat(n / 100 + 1)[..n].to_owned()
    }

    /// The real `Read` built-in's spec.
    fn read() -> ToolSpec {
        let dir = tempfile::tempdir().unwrap();
        let dir = cap_std::fs::Dir::open_ambient_dir(dir.path(), cap_std::ambient_authority()).unwrap();
        crate::tool::Tool::spec(&crate::pool::builtin::Read::new(dir)).clone()
    }

    fn plugin(name: &str, size: ResultSize, trusted: bool) -> ToolSpec {
        let mut spec = read();
        spec.name = name.into();
        spec.max_result_size = size;
        spec.origin =
            crate::tool::ToolOrigin::Plugin { path: format!("{name}.wasm").into(), contract: "0.3.0" };
        spec.trusted = trusted;
        spec
    }

    fn config(text: &str) -> BudgetConfig {
        Config::parse(text, Path::new("keel.toml")).unwrap().budget
    }

    #[test]
    fn thresholds_follow_the_declared_size_the_default_cap_and_trust() {
        let (budget, _) = in_memory(&BudgetConfig::default());
        let threshold = |size, trusted| budget.threshold(&plugin("a", size, trusted));
        assert_eq!(threshold(ResultSize::Chars(10), false), Threshold::Chars(10));
        assert_eq!(threshold(ResultSize::Chars(50_000), false), Threshold::Chars(50_000));
        assert_eq!(threshold(ResultSize::Chars(50_001), false), Threshold::Chars(50_000));
        assert_eq!(threshold(ResultSize::Chars(50_001), true), Threshold::Chars(50_000));
        assert_eq!(threshold(ResultSize::Chars(u64::MAX), false), Threshold::Chars(50_000));
        assert_eq!(threshold(ResultSize::SelfBounded, false), Threshold::Chars(50_000));
        assert_eq!(threshold(ResultSize::SelfBounded, true), Threshold::SelfBounded);
        assert_eq!(budget.threshold(&read()), Threshold::SelfBounded);
    }

    #[test]
    fn a_tool_override_replaces_the_threshold_up_to_the_absolute_cap() {
        let (budget, _) =
            in_memory(&config("[budget.tools]\ngrep = 120\nbig = 1e9\nRead = 5\nraw = 100_000.9\n"));
        assert_eq!(
            budget.threshold(&plugin("grep", ResultSize::Chars(50_000), false)),
            Threshold::Chars(120)
        );
        assert_eq!(budget.threshold(&plugin("big", ResultSize::Chars(10), false)), Threshold::Chars(400_000));
        assert_eq!(
            budget.threshold(&plugin("raw", ResultSize::SelfBounded, false)),
            Threshold::Chars(100_000)
        );
        assert_eq!(budget.threshold(&read()), Threshold::SelfBounded, "config cannot force a loop");
        assert!(budget.warnings().is_empty(), "{:?}", budget.warnings());
    }

    #[test]
    fn only_finite_positive_overrides_take_effect() {
        let (budget, _) = in_memory(&config(
            "[budget]\nper_message_chars = nan\n[budget.tools]\na = 0\nb = -1\nc = inf\nd = -inf\ne = 0.0\n\
             f = 1.5\ng = nan\nh = -0.5\n",
        ));
        assert_eq!(budget.per_message_chars(), 200_000);
        assert_eq!(
            budget.warnings(),
            [
                "ignoring `[budget] per_message_chars = nan` in the config: only a finite positive number takes effect",
                "ignoring `[budget.tools] a = 0` in the config: only a finite positive number takes effect",
                "ignoring `[budget.tools] b = -1` in the config: only a finite positive number takes effect",
                "ignoring `[budget.tools] c = inf` in the config: only a finite positive number takes effect",
                "ignoring `[budget.tools] d = -inf` in the config: only a finite positive number takes effect",
                "ignoring `[budget.tools] e = 0` in the config: only a finite positive number takes effect",
                "ignoring `[budget.tools] g = nan` in the config: only a finite positive number takes effect",
                "ignoring `[budget.tools] h = -0.5` in the config: only a finite positive number takes effect",
            ]
        );
        for name in ["a", "b", "c", "d", "e", "g", "h"] {
            assert_eq!(
                budget.threshold(&plugin(name, ResultSize::Chars(70), false)),
                Threshold::Chars(70),
                "{name}"
            );
        }
        assert_eq!(budget.threshold(&plugin("f", ResultSize::Chars(70), false)), Threshold::Chars(1));
        for value in ["0", "-5", "inf", "-inf", "nan"] {
            let (budget, _) = in_memory(&config(&format!("[budget]\nper_message_chars = {value}\n")));
            assert_eq!(budget.per_message_chars(), 200_000, "{value}");
            assert_eq!(budget.warnings().len(), 1, "{value}");
        }
        let (budget, _) = in_memory(&config("[budget]\nper_message_chars = 150_000\n"));
        assert_eq!(budget.per_message_chars(), 150_000);
    }

    #[test]
    fn an_override_of_the_wrong_type_or_key_is_a_config_error() {
        let error = |text: &str| Config::parse(text, Path::new("keel.toml")).unwrap_err().to_string();
        assert!(error("[budget]\nper_message_chars = \"big\"\n").contains("invalid type: string"));
        assert!(error("[budget]\nper_message = 5\n").contains("unknown field `per_message`"));
    }

    #[test]
    fn tools_are_checked_against_trust_and_the_overrides() {
        let (budget, _) = in_memory(&config("[budget.tools]\nRead = 10\nghost = 10\ngrep = 10\n"));
        let read = read();
        let grep = plugin("grep", ResultSize::Chars(50_000), false);
        let lazy = plugin("lazy", ResultSize::SelfBounded, false);
        let trusted = plugin("cat", ResultSize::SelfBounded, true);
        let tools = [&read, &grep, &lazy, &trusted];
        assert_eq!(
            budget.check_tools(tools),
            [
                "ignoring `[budget.tools] Read` in the config: the tool bounds its own output and is never \
                 persisted",
                "plugin tool `lazy` says it bounds its own output, but the config does not trust it: its \
                 results are persisted past 50000 chars",
                "ignoring `[budget.tools] ghost` in the config: no tool has that name",
            ]
        );
    }

    #[test]
    fn the_byte_cap_holds_when_the_char_threshold_does_not() {
        let wide = Threshold::Chars(400_000);
        assert!(!wide.exceeded_by(&"🦀".repeat(100_000)), "exactly 400,000 bytes");
        assert!(wide.exceeded_by(&format!("{}a", "🦀".repeat(100_000))), "400,001 bytes, 100,001 chars");
        assert!(!Threshold::Chars(50_000).exceeded_by(&"€".repeat(50_000)), "150,000 bytes, 50,000 chars");
        assert!(Threshold::Chars(50_000).exceeded_by(&"€".repeat(50_001)));
        assert!(!Threshold::SelfBounded.exceeded_by(&"x".repeat(1_000_000)));
    }

    #[tokio::test]
    async fn per_tool_keeps_a_result_at_its_limit_and_persists_one_over() {
        let (budget, store) = in_memory(&BudgetConfig::default());
        let at = ToolResult::ok("at", text(50_000));
        assert_eq!(budget.per_tool(at.clone(), Threshold::default()).await, at);
        assert!(store.names().is_empty());

        let over = text(50_001);
        let result = budget.per_tool(ToolResult::ok("toolu_over", over.clone()), Threshold::default()).await;
        let expected = format!(
            "<persisted-output>\nOutput too large (50001 chars, 50001 bytes). Full output saved to: \
             tool-results/toolu_over.txt\n\nPreview (first 1999 bytes):\n{}\n...\n</persisted-output>",
            &over[..1_999]
        );
        assert_eq!(result, ToolResult::ok("toolu_over", expected));
        assert_eq!(store.files.lock().unwrap()["toolu_over.txt"], over.as_bytes());
    }

    #[tokio::test]
    async fn per_tool_persists_an_error_result_as_an_error() {
        let (budget, _) = in_memory(&BudgetConfig::default());
        let result = budget.per_tool(ToolResult::error("e", text(11)), Threshold::Chars(10)).await;
        assert!(result.is_error);
        assert!(
            result.content.text().starts_with("<persisted-output>\nOutput too large (11 chars"),
            "{}",
            result.content
        );
    }

    #[tokio::test]
    async fn per_tool_never_persists_a_self_bounded_result_or_a_replacement() {
        let (budget, store) = in_memory(&BudgetConfig::default());
        let huge = ToolResult::ok("r", text(3_000_000));
        assert_eq!(budget.per_tool(huge.clone(), Threshold::SelfBounded).await, huge);
        let block = ToolResult::ok("b", persisted_block(&text(5_000), "tool-results/b.txt"));
        assert_eq!(budget.per_tool(block.clone(), Threshold::Chars(10)).await, block);
        assert!(store.names().is_empty());
    }

    #[tokio::test]
    async fn shown_root_prefixes_the_path() {
        let (budget, _) = in_memory(&BudgetConfig::default());
        let budget = budget.shown_root("/home/me/.keel/s1");
        let result = budget.per_tool(ToolResult::ok("a", text(11)), Threshold::Chars(10)).await;
        assert!(
            result.content.text().contains("Full output saved to: /home/me/.keel/s1/tool-results/a.txt\n"),
            "{}",
            result.content
        );
    }

    #[tokio::test]
    async fn a_full_disk_gives_a_clear_error_result_not_a_lost_one() {
        let store = Arc::new(Memory { fail_with: Some(28), ..Memory::default() });
        let budget = Budget::with_store(&BudgetConfig::default(), store);
        let content = format!("first line\n{}", text(60_000));
        let result = budget.per_tool(ToolResult::ok("toolu_1", content), Threshold::default()).await;
        assert_eq!(
            result,
            ToolResult::error(
                "toolu_1",
                "Failed to save the full output (60011 chars, 60011 bytes) to tool-results/toolu_1.txt: No \
                 space left on device (os error 28). Only this preview is left; run the tool again with a \
                 narrower input.\n\nPreview (first 1910 bytes):\n"
                    .to_owned()
                    + &format!("first line\n{}", text(60_000))[..1_910]
                    + "\n..."
            )
        );
    }

    #[tokio::test]
    async fn a_panicking_writer_is_a_failure_too() {
        struct Panics;
        impl ResultStore for Panics {
            fn write(&self, _: &str, _: &[u8]) -> io::Result<()> {
                panic!("writer bug")
            }
        }
        let budget = Budget::with_store(&BudgetConfig::default(), Arc::new(Panics));
        let result = budget.per_tool(ToolResult::ok("p", text(11)), Threshold::Chars(10)).await;
        assert!(result.is_error);
        assert!(
            result.content.text().starts_with(
                "Failed to save the full output (11 chars, 11 bytes) to tool-results/p.txt: the writer panicked."
            ),
            "{}",
            result.content
        );
    }

    #[tokio::test]
    async fn a_real_session_dir_that_cannot_be_written_gives_an_error_result() {
        let session = tempfile::tempdir().unwrap();
        std::fs::write(session.path().join("tool-results"), "in the way").unwrap();
        let budget = Budget::new(&BudgetConfig::default(), session.path());
        let result = budget.per_tool(ToolResult::ok("a", text(11)), Threshold::Chars(10)).await;
        assert!(result.is_error);
        assert!(
            result
                .content
                .text()
                .starts_with("Failed to save the full output (11 chars, 11 bytes) to tool-results/a.txt: "),
            "{}",
            result.content
        );
    }

    fn results(sizes: &[usize]) -> Vec<ToolResult> {
        sizes.iter().enumerate().map(|(i, &n)| ToolResult::ok(format!("r{i}"), text(n))).collect()
    }

    fn replaced_ids(results: &[ToolResult]) -> Vec<&str> {
        results
            .iter()
            .filter(|r| is_replaced(&r.content, r.is_error))
            .map(|r| r.tool_use_id.as_str())
            .collect()
    }

    fn total(results: &[ToolResult]) -> usize {
        results.iter().map(|r| content_chars(&r.content)).sum::<u64>() as usize
    }

    #[tokio::test]
    async fn a_message_exactly_at_the_limit_is_kept_whole() {
        let (budget, store) = in_memory(&BudgetConfig::default());
        let mut message = results(&[40_000; 5]);
        let before = message.clone();
        let mut ledger = Ledger::new();
        budget.per_message(&mut message, &[Threshold::default(); 5], &mut ledger).await;
        assert_eq!(message, before);
        assert!(store.names().is_empty());
        assert_eq!(ledger.iter().filter(|(_, d)| **d == Decision::Kept).count(), 5);
    }

    #[tokio::test]
    async fn a_message_one_over_loses_its_largest_result() {
        let (budget, store) = in_memory(&BudgetConfig::default());
        let mut message = results(&[40_000, 40_000, 40_001, 40_000, 40_000]);
        let before = message.clone();
        let mut ledger = Ledger::new();
        budget.per_message(&mut message, &[Threshold::default(); 5], &mut ledger).await;
        assert_eq!(replaced_ids(&message), ["r2"]);
        assert_eq!(
            message[2].content,
            Content::Text(persisted_block(&before[2].content.text(), "tool-results/r2.txt"))
        );
        assert_eq!(store.names(), ["r2.txt"]);
        assert_eq!(
            ledger.get("r2"),
            Some(&Decision::Replaced { content: message[2].content.text().into_owned(), is_error: false })
        );
        assert_eq!(ledger.get("r0"), Some(&Decision::Kept));
    }

    /// A store that counts how many writes are under way at once; its first
    /// write waits (up to two seconds) for a second to begin.
    #[derive(Default)]
    struct Overlapping {
        inside: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
        waited: std::sync::atomic::AtomicBool,
    }

    impl ResultStore for Overlapping {
        fn write(&self, _: &str, _: &[u8]) -> io::Result<()> {
            let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            if !self.waited.swap(true, Ordering::SeqCst) {
                for _ in 0..200 {
                    if self.most.load(Ordering::SeqCst) > 1 {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            self.inside.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_message_writes_the_results_it_persists_side_by_side() {
        let store = Arc::new(Overlapping::default());
        let budget = Budget::with_store(&BudgetConfig::default(), store.clone());
        let mut message = results(&[100_000; 10]);
        budget.per_message(&mut message, &[Threshold::default(); 10], &mut Ledger::new()).await;
        // Nine replacements bring 1,000,000 chars under 200,000; eight do not.
        assert_eq!(replaced_ids(&message), ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8"]);
        assert!(store.most.load(Ordering::SeqCst) > 1, "the writes ran one after another");
    }

    #[tokio::test]
    async fn a_message_whose_writes_fail_keeps_every_result_and_its_order() {
        let store = Arc::new(Memory { fail_with: Some(28), ..Memory::default() });
        let budget = Budget::with_store(&BudgetConfig::default(), store);
        let mut message = results(&[100_000; 10]);
        let mut ledger = Ledger::new();
        budget.per_message(&mut message, &[Threshold::default(); 10], &mut ledger).await;
        let ids: Vec<_> = message.iter().map(|r| r.tool_use_id.as_str()).collect();
        assert_eq!(ids, ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9"]);
        assert_eq!(replaced_ids(&message), ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8"]);
        for result in &message[..9] {
            assert!(result.is_error);
            assert!(result.content.text().starts_with(PERSIST_FAILED_PREFIX), "{}", result.content);
        }
        assert!(total(&message) <= 200_000, "{}", total(&message));
        assert_eq!(ledger.iter().count(), 10);
    }

    #[tokio::test]
    async fn ties_go_to_the_earlier_result_until_the_message_fits() {
        let (budget, _) = in_memory(&BudgetConfig::default());
        let mut message = results(&[40_000; 10]);
        let mut ledger = Ledger::new();
        budget.per_message(&mut message, &[Threshold::default(); 10], &mut ledger).await;
        // Each replacement saves 40,000 minus its block's length (about
        // 2,100): five leave 210K, the sixth brings the message under.
        assert_eq!(replaced_ids(&message), ["r0", "r1", "r2", "r3", "r4", "r5"]);
        assert!(total(&message) <= 200_000 && total(&message) > 160_000, "{}", total(&message));
        assert_eq!(ledger.len(), 10);
    }

    #[tokio::test]
    async fn largest_first_skipping_self_bounded_results() {
        let (budget, _) = in_memory(&BudgetConfig::default());
        let mut message = results(&[100_000, 10_000, 80_000, 30_000, 60_000]);
        let thresholds = [
            Threshold::SelfBounded,
            Threshold::default(),
            Threshold::default(),
            Threshold::Chars(500),
            Threshold::default(),
        ];
        let mut ledger = Ledger::new();
        budget.per_message(&mut message, &thresholds, &mut ledger).await;
        // 280K: the self-bounded 100K stays; 80K then 60K go.
        assert_eq!(replaced_ids(&message), ["r2", "r4"]);
        assert_eq!(message[0].content.text().len(), 100_000);
    }

    #[tokio::test]
    async fn results_a_replacement_would_not_shorten_are_kept() {
        let (budget, store) = in_memory(&BudgetConfig::default());
        // 20,000 short results: each fits its preview whole, so its
        // replacement would be longer than it.
        let mut message = results(&[20; 20_000]);
        let before = message.clone();
        let mut ledger = Ledger::new();
        budget.per_message(&mut message, &vec![Threshold::default(); 20_000], &mut ledger).await;
        assert_eq!(message, before);
        assert!(store.names().is_empty());
        assert_eq!(ledger.iter().filter(|(_, d)| **d == Decision::Kept).count(), 20_000);

        // Of 150 results of 2,000 chars, one of 3,000 and one of 700 chars
        // of three bytes each (2,100 bytes: its preview and the block's
        // words are longer than it), only the 3,000 shortens.
        let mut message = results(&[2_000; 151]);
        message[150].content = Content::Text(text(3_000));
        message.push(ToolResult::ok("wide", "語".repeat(700)));
        budget.per_message(&mut message, &vec![Threshold::default(); 152], &mut Ledger::new()).await;
        assert_eq!(replaced_ids(&message), ["r150"]);
        assert_eq!(store.names(), ["r150.txt"]);
    }

    /// The header of a PNG of `width` × `height` px, all a budget reads.
    fn png(width: u32, height: u32) -> Image {
        let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        bytes.extend(width.to_be_bytes());
        bytes.extend(height.to_be_bytes());
        bytes.extend([8, 6, 0, 0, 0, 0, 0, 0, 0]);
        Image::new("image/png", bytes)
    }

    #[tokio::test]
    async fn a_short_text_with_a_large_image_is_persisted_and_a_tiny_image_is_kept() {
        let (budget, store) = in_memory(&BudgetConfig::default());
        let with = |id: &str, image: Image| {
            let blocks = vec![ContentBlock::Text("a screenshot:".into()), ContentBlock::Image(image)];
            ToolResult { content: Content::Blocks(blocks), ..ToolResult::ok(id, "") }
        };
        // 2,000 × 2,000 px count as 21,336 chars; 1 × 1 px as 4, less than
        // the note that would name its file.
        // The message stays over once the large one is persisted.
        let mut message = results(&[199_990]);
        message.push(with("large", png(2_000, 2_000)));
        message.push(with("tiny", png(1, 1)));
        budget
            .per_message(
                &mut message,
                &[Threshold::SelfBounded, Threshold::default(), Threshold::default()],
                &mut Ledger::new(),
            )
            .await;
        assert_eq!(replaced_ids(&message), ["large"]);
        assert_eq!(store.names(), ["large-image-1.png", "large.txt"]);
        assert!(matches!(&message[2].content, Content::Blocks(blocks) if blocks.len() == 2));
    }

    #[tokio::test]
    async fn a_message_of_exempt_results_may_stay_over() {
        let (budget, store) = in_memory(&BudgetConfig::default());
        let mut message = results(&[150_000, 150_000]);
        let before = message.clone();
        let mut ledger = Ledger::new();
        budget.per_message(&mut message, &[Threshold::SelfBounded; 2], &mut ledger).await;
        assert_eq!(message, before);
        assert!(store.names().is_empty());
    }

    #[tokio::test]
    async fn messages_are_judged_independently() {
        let (budget, _) = in_memory(&BudgetConfig::default());
        let mut ledger = Ledger::new();
        let mut first = results(&[150_000]);
        budget.per_message(&mut first, &[Threshold::SelfBounded], &mut ledger).await;
        let mut second: Vec<ToolResult> =
            (0..3).map(|i| ToolResult::ok(format!("s{i}"), text(50_000))).collect();
        let before = second.clone();
        budget.per_message(&mut second, &[Threshold::default(); 3], &mut ledger).await;
        assert_eq!(second, before, "the first message's 150K does not count against the second");
    }

    #[tokio::test]
    async fn the_per_message_limit_can_be_lowered() {
        let (budget, _) = in_memory(&config("[budget]\nper_message_chars = 50_000\n"));
        let mut message = results(&[30_000, 30_000]);
        budget.per_message(&mut message, &[Threshold::default(); 2], &mut Ledger::new()).await;
        assert_eq!(replaced_ids(&message), ["r0"]);
    }

    #[tokio::test]
    async fn recorded_decisions_are_applied_again_without_writing() {
        let (budget, store) = in_memory(&BudgetConfig::default());
        let mut ledger = Ledger::new();
        ledger.record("r0", Decision::Kept);
        ledger.record("r1", Decision::Replaced { content: "earlier bytes".into(), is_error: true });
        // r0 is the largest, and was kept: it stays whole, and r2 goes.
        let mut message = results(&[190_000, 50_000, 20_000]);
        budget.per_message(&mut message, &[Threshold::default(); 3], &mut ledger).await;
        assert_eq!(message[0].content.text().len(), 190_000);
        assert_eq!(message[1], ToolResult::error("r1", "earlier bytes"));
        assert_eq!(replaced_ids(&message), ["r2"]);
        assert_eq!(store.names(), ["r2.txt"]);
    }

    #[tokio::test]
    async fn a_failed_persist_still_shrinks_the_message_and_is_recorded() {
        let store = Arc::new(Memory { fail_with: Some(28), ..Memory::default() });
        let budget = Budget::with_store(&BudgetConfig::default(), store);
        let mut message = results(&[150_000, 60_000]);
        let mut ledger = Ledger::new();
        budget.per_message(&mut message, &[Threshold::SelfBounded, Threshold::default()], &mut ledger).await;
        assert!(message[1].is_error);
        assert!(message[1].content.text().starts_with("Failed to save the full output (60000 chars"));
        assert_eq!(
            ledger.get("r1"),
            Some(&Decision::Replaced { content: message[1].content.text().into_owned(), is_error: true })
        );
        assert!(total(&message) <= 200_000);
    }

    /// A result of a tool with an output schema: `text` (the value's JSON
    /// when `None`, as the host shows a value given no text) and `value`.
    fn structured(id: &str, text: Option<&str>, value: serde_json::Value) -> ToolResult {
        let text = text.map_or_else(|| json(&value), str::to_owned);
        ToolResult { structured: Some(value), ..ToolResult::ok(id, text) }
    }

    #[tokio::test]
    async fn a_persisted_result_keeps_a_structured_value_small_enough_and_stays_a_success() {
        let (budget, store) = in_memory(&BudgetConfig::default());
        let value = serde_json::json!({ "lines": 10, "words": 20, "bytes": 120 });
        let result = budget.per_tool(structured("wc", None, value.clone()), Threshold::Chars(10)).await;
        assert!(!result.is_error);
        assert_eq!(result.structured, Some(value.clone()), "an MCP client needs it for a success");
        assert_eq!(result.content, Content::Text(persisted_block(&json(&value), "tool-results/wc.txt")));
        assert_eq!(store.names(), ["wc.txt"]);

        // Only the text was too large: the value stays beside its preview.
        let result = budget
            .per_tool(structured("long", Some(&text(60_000)), value.clone()), Threshold::default())
            .await;
        assert!(!result.is_error);
        assert_eq!(result.structured, Some(value));
        assert!(
            result.content.text().starts_with(
                "<persisted-output>\nOutput too large (60035 chars counted with its structured value; the \
                 text alone is 60000 chars, 60000 bytes). Full output saved to: tool-results/long.txt\n"
            ),
            "{}",
            result.content
        );
    }

    #[tokio::test]
    async fn a_structured_value_too_large_to_keep_makes_the_persisted_result_an_error() {
        let (budget, store) = in_memory(&BudgetConfig::default());
        let value = serde_json::json!({ "count": 1, "pad": "x".repeat(100_000) });
        let result = budget.per_tool(structured("rich", None, value.clone()), Threshold::default()).await;
        assert!(result.is_error, "a success without its structured value breaks an MCP client");
        assert_eq!(result.structured, None);
        assert_eq!(
            result.content,
            Content::Text(
                persisted_block(&json(&value), "tool-results/rich.txt")
                    + "\n<persisted-output>\nStructured value left out (100020 bytes of JSON): a persisted \
                       result keeps one of at most 2000 bytes, so this result is an error. It is the output \
                       above, as JSON.\n</persisted-output>"
            )
        );
        assert!(is_replaced(&result.content, result.is_error));
        assert_eq!(store.names(), ["rich.txt"], "the text is the value's JSON: one file holds both");
    }

    #[tokio::test]
    async fn a_structured_value_beside_a_short_text_counts_in_the_per_tool_tier() {
        let (budget, store) = in_memory(&BudgetConfig::default());
        let value = serde_json::json!({ "count": 1, "pad": "y".repeat(1_000_000) });
        let result = budget
            .per_tool(structured("r1", Some("13 chars here"), value.clone()), Threshold::default())
            .await;
        assert!(result.is_error);
        assert_eq!(result.structured, None);
        assert_eq!(
            result.content.text(),
            "<persisted-output>\nOutput too large (1000033 chars counted with its structured value; the text \
             alone is 13 chars, 13 bytes). Full output saved to: tool-results/r1.txt\n\nPreview (first 13 \
             bytes):\n13 chars here\n</persisted-output>\n<persisted-output>\nStructured value left out \
             (1000020 bytes of JSON): a persisted result keeps one of at most 2000 bytes, so this result is \
             an error. Saved to: tool-results/r1-structured.json\n</persisted-output>"
        );
        assert_eq!(store.names(), ["r1-structured.json", "r1.txt"]);
        assert_eq!(store.files.lock().unwrap()["r1-structured.json"], json(&value).into_bytes());

        // The byte cap counts the value's bytes too: 150,000 chars of three
        // bytes each are within 300,000 chars but over 400,000 bytes.
        let wide = structured("w", Some("short"), serde_json::json!({ "s": "語".repeat(150_000) }));
        assert!(!Threshold::Chars(300_000).exceeded_by_content(&wide.content));
        assert!(Threshold::Chars(300_000).exceeded_by_result(&wide));
        assert!(!Threshold::SelfBounded.exceeded_by_result(&wide));
    }

    #[tokio::test]
    async fn a_structured_value_that_cannot_be_saved_is_still_left_out() {
        let store = Arc::new(Memory { fail_with: Some(28), ..Memory::default() });
        let budget = Budget::with_store(&BudgetConfig::default(), store);
        let value = serde_json::json!({ "pad": "z".repeat(60_000) });
        let result = budget.per_tool(structured("f", Some("text"), value), Threshold::default()).await;
        assert!(result.is_error);
        assert_eq!(result.structured, None);
        assert!(
            result.content.text().ends_with(
                "Failed to save it to tool-results/f-structured.json: No space left on device (os error \
                 28).\n</persisted-output>"
            ),
            "{}",
            result.content
        );
        assert!(is_replaced(&result.content, result.is_error));
    }

    #[tokio::test]
    async fn a_structured_value_beside_a_short_text_counts_in_the_per_message_tier() {
        let (budget, store) = in_memory(&BudgetConfig::default());
        let small = serde_json::json!({ "count": 3 });
        let mut message: Vec<ToolResult> = (0..3)
            .map(|i| {
                structured(&format!("s{i}"), Some("short"), serde_json::json!({ "pad": "p".repeat(80_000) }))
            })
            .collect();
        message.push(structured("kept", Some(&text(3_000)), small.clone()));
        let mut ledger = Ledger::new();
        budget
            .per_message(
                &mut message,
                &[Threshold::SelfBounded, Threshold::default(), Threshold::default(), Threshold::default()],
                &mut ledger,
            )
            .await;
        // 3 × 80,015 chars: one replacement brings the message under.
        assert_eq!(replaced_ids(&message), ["s1"]);
        assert!(message[1].is_error);
        assert_eq!(message[1].structured, None);
        assert_eq!(store.names(), ["s1-structured.json", "s1.txt"]);
        assert!(message[2].structured.is_some(), "a result kept keeps its value");
        let sent = message[1].content.text().into_owned();
        assert_eq!(ledger.get("s1"), Some(&Decision::Replaced { content: sent.clone(), is_error: true }));

        // Sent again, the recorded replacement drops the large value and
        // keeps a small one, as the first decision did.
        let mut again = vec![
            structured("s1", Some("short"), serde_json::json!({ "pad": "p".repeat(80_000) })),
            structured("r", Some("short"), small.clone()),
        ];
        let mut ledger = Ledger::new();
        ledger.record("s1", Decision::Replaced { content: sent.clone(), is_error: true });
        ledger.record(
            "r",
            Decision::Replaced {
                content: "<persisted-output>\nx\n</persisted-output>".into(),
                is_error: false,
            },
        );
        budget.per_message(&mut again, &[Threshold::default(); 2], &mut ledger).await;
        assert_eq!((again[0].content.text().into_owned(), again[0].structured.clone()), (sent, None));
        assert_eq!(again[1].structured, Some(small));
    }

    #[tokio::test]
    async fn a_persisted_image_result_says_the_size_that_counted() {
        let (budget, _) = in_memory(&BudgetConfig::default());
        let blocks = vec![ContentBlock::Text("a screenshot:".into()), ContentBlock::Image(png(2_000, 2_000))];
        let result = ToolResult { content: Content::Blocks(blocks), ..ToolResult::ok("large", "") };
        let mut message = vec![result.clone(), ToolResult::ok("big", text(190_000))];
        budget
            .per_message(&mut message, &[Threshold::default(), Threshold::SelfBounded], &mut Ledger::new())
            .await;
        // 13 chars and the image's 21,336.
        assert!(
            message[0].content.text().starts_with(
                "<persisted-output>\nOutput too large (21349 chars counted with its image; the text alone is \
                 13 chars, 13 bytes). Full output saved to: tool-results/large.txt\n"
            ),
            "{}",
            message[0].content
        );
        let result = budget.per_tool(result, Threshold::Chars(100)).await;
        assert_eq!(result.content, message[0].content, "both tiers say the same");
    }

    #[test]
    #[should_panic(expected = "one threshold per result")]
    fn per_message_wants_one_threshold_per_result() {
        let (budget, _) = in_memory(&BudgetConfig::default());
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(budget.per_message(&mut results(&[1]), &[], &mut Ledger::new()));
    }
}
