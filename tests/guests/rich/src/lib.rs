//! `rich`: a test guest whose results are richer than text, the sound ones
//! and the broken ones, so that the host's checks of images and structured
//! values are proven against a real component.
//!
//! Input: `{ "mode": <mode>, "value": <any JSON> }`. The modes:
//!
//! - `image`: a text block `a tiny image`, then a 1×1 PNG ([`PIXEL`]).
//! - `mislabeled`: the same PNG labelled `image/jpeg`.
//! - `unknown-type`: the same PNG labelled `image/bmp`, a type no model reads.
//! - `wide`: a PNG of 9000×1 pixels ([`WIDE`]), wider than a model takes.
//! - `huge`: 6 MiB labelled `image/png`: [`PIXEL`] followed by zeros.
//! - `structured`: `value` as the structured value, with no text block. The
//!   output schema is that of [`Report`], so `{"count": -1}` or
//!   `{"count": "x"}` break it.
//! - `text-and-structured`: a text block `see the value`, and `value` as the
//!   structured value.
//!
//! Concurrency-safe and read-only.

use keel_guest::{Block, Context, Image, Output, Result, Tool, Value, bail};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A 1×1 PNG (one opaque blue pixel), whole and valid.
pub const PIXEL: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52, 0x00,
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4, 0x89, 0x00,
    0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0xda, 0x63, 0x50, 0x68, 0x78, 0xf0, 0x1f, 0x00, 0x04,
    0xc4, 0x02, 0x80, 0xac, 0x13, 0x21, 0x88, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42,
    0x60, 0x82,
];

/// A PNG of 9000×1 pixels, `testdata/wide.png`: small compressed, but wider
/// than a model accepts.
pub const WIDE: &[u8] = include_bytes!("../testdata/wide.png");

/// The size of the `huge` image's bytes: 6 MiB.
pub const HUGE_BYTES: usize = 6 << 20;

/// The modes, in the order the crate docs list them.
pub const MODES: &[&str] =
    &["image", "mislabeled", "unknown-type", "wide", "huge", "structured", "text-and-structured"];

/// Input of `rich`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// What to hand back: one of `image`, `mislabeled`, `unknown-type`,
    /// `wide`, `huge`, `structured` and `text-and-structured`.
    pub mode: String,
    /// The structured value of the modes that hand one back, as given.
    #[serde(default)]
    pub value: Option<Value>,
}

/// The structured output the tool declares.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Report {
    /// A count, never negative.
    pub count: u32,
}

/// The `rich` tool.
pub struct Rich;

impl Tool for Rich {
    type Input = Input;
    const NAME: &str = "rich";
    const DESCRIPTION: &str = "Test guest: hands back images and structured values, sound or broken, \
        as `mode` says.";

    fn output_schema() -> Option<Value> {
        Some(keel_guest::schema_for::<Report>())
    }

    fn is_concurrency_safe(_input: &Input, _cx: &Context) -> bool {
        true
    }

    fn is_read_only(_input: &Input, _cx: &Context) -> bool {
        true
    }

    fn is_destructive(_input: &Input, _cx: &Context) -> bool {
        false
    }

    fn validate_input(input: &Input, _cx: &Context) -> Result<()> {
        if !MODES.contains(&input.mode.as_str()) {
            bail!("unknown mode `{}`: give one of {MODES:?}", input.mode);
        }
        Ok(())
    }

    fn call(input: Input, _cx: &Context) -> Result<Output> {
        let value = input.value.unwrap_or(Value::Null);
        Ok(match input.mode.as_str() {
            "image" => Output::text("a tiny image").with_image(Image::png(PIXEL)),
            "mislabeled" => Output::image(Image::jpeg(PIXEL)),
            "unknown-type" => Output::image(Image::new("image/bmp", PIXEL)),
            "wide" => Output::image(Image::png(WIDE)),
            "huge" => {
                let mut bytes = PIXEL.to_vec();
                bytes.resize(HUGE_BYTES, 0);
                Output::image(Image::png(bytes))
            }
            // Built directly, not with `Output::structured`, so that a value
            // the schema refuses reaches the host as given.
            "structured" => Output { content: vec![], structured: Some(value), context_modifier: None },
            "text-and-structured" => Output {
                content: vec![Block::Text("see the value".into())],
                structured: Some(value),
                context_modifier: None,
            },
            other => bail!("unknown mode `{other}`: give one of {MODES:?}"),
        })
    }
}

keel_guest::export!(Rich);

#[cfg(test)]
mod tests {
    use std::path::Path;

    use image::{ImageFormat, Rgba, RgbaImage};
    use keel_guest::json;

    use super::*;

    fn call(mode: &str, value: &Value) -> Output {
        let input: Input = serde_json::from_value(json!({ "mode": mode, "value": value })).unwrap();
        Rich::validate_input(&input, &Context::workspace_root()).unwrap();
        Rich::call(input, &Context::workspace_root()).unwrap()
    }

    fn image(output: &Output) -> &Image {
        match output.content.last() {
            Some(Block::Image(image)) => image,
            _ => panic!("an image last: {output:?}"),
        }
    }

    #[test]
    fn the_images_are_what_their_modes_say() {
        let output = call("image", &Value::Null);
        assert_eq!(output.text(), "a tiny image");
        assert_eq!(image(&output), &Image::png(PIXEL));
        assert_eq!(image(&call("mislabeled", &Value::Null)).media_type, "image/jpeg");
        assert_eq!(image(&call("unknown-type", &Value::Null)).media_type, "image/bmp");
        assert_eq!(image(&call("wide", &Value::Null)), &Image::png(WIDE));
        let huge = call("huge", &Value::Null);
        let huge = image(&huge);
        assert_eq!((huge.media_type.as_str(), huge.data.len()), ("image/png", HUGE_BYTES));
        assert!(huge.data.starts_with(PIXEL) && huge.data[PIXEL.len()..].iter().all(|&byte| byte == 0));
    }

    #[test]
    fn the_pngs_are_valid_and_of_their_sizes() {
        let pixel = image::load_from_memory_with_format(PIXEL, ImageFormat::Png).unwrap();
        assert_eq!((pixel.width(), pixel.height()), (1, 1));
        let wide = image::load_from_memory_with_format(WIDE, ImageFormat::Png).unwrap();
        assert_eq!((wide.width(), wide.height()), (9000, 1));
        assert!(WIDE.len() < 1_000, "wide.png is {} bytes", WIDE.len());
    }

    /// `testdata/wide.png` is rewritten by this test with `KEEL_BLESS=1`; the
    /// crate embeds it, so run the tests again after.
    #[test]
    fn bless_the_wide_png() {
        if std::env::var_os("KEEL_BLESS").is_some() {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/wide.png");
            let wide = RgbaImage::from_pixel(9000, 1, Rgba([0x20, 0x80, 0xe0, 0xff]));
            wide.save_with_format(path, ImageFormat::Png).unwrap();
        }
    }

    #[test]
    fn structured_values_are_handed_back_as_given() {
        for value in [json!({ "count": 3 }), json!({ "count": -1 }), json!({ "count": "x" })] {
            let output = call("structured", &value);
            assert!(output.content.is_empty());
            assert_eq!(output.structured, Some(value.clone()));
            let output = call("text-and-structured", &value);
            assert_eq!((output.text(), output.structured), ("see the value".to_string(), Some(value)));
        }
    }

    #[test]
    fn the_output_schema_is_the_reports() {
        let schema = Rich::output_schema().unwrap();
        assert_eq!(schema["properties"]["count"]["type"], "integer");
        assert_eq!(schema["properties"]["count"]["minimum"], 0);
        assert_eq!(schema["required"], json!(["count"]));
    }

    #[test]
    fn an_unknown_mode_is_refused() {
        let input = Input { mode: "nope".into(), value: None };
        let error = Rich::validate_input(&input, &Context::workspace_root()).unwrap_err();
        assert!(error.message().starts_with("unknown mode `nope`: give one of "), "{error}");
    }
}
