//! `test_image_content`: one PNG image block, as the conformance suite's
//! `tools-call-image` scenario asks.

use keel_guest::Image;
use keel_guest::{Context, Output, Result, Tool};
use schemars::JsonSchema;
use serde::Deserialize;

/// No input.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Input {}

/// A 1×1 red PNG.
const PIXEL: [u8; 70] = [
    137, 80, 78, 71, 13, 10, 26, 10, 0, 0, 0, 13, 73, 72, 68, 82, 0, 0, 0, 1, 0, 0, 0, 1, 8, 6, 0, 0, 0, 31,
    21, 196, 137, 0, 0, 0, 13, 73, 68, 65, 84, 120, 156, 99, 248, 207, 192, 240, 31, 0, 5, 0, 1, 255, 137,
    153, 61, 29, 0, 0, 0, 0, 73, 69, 78, 68, 174, 66, 96, 130,
];

/// The tool.
pub struct ImageContent;

impl Tool for ImageContent {
    type Input = Input;
    const NAME: &str = "test_image_content";
    const DESCRIPTION: &str = "Returns an image.";

    fn call(_input: Input, _cx: &Context) -> Result<Output> {
        Ok(Output::image(Image::png(PIXEL.to_vec())))
    }
}

keel_guest::export!(ImageContent);
