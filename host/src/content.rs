//! What a result is made of: text and image blocks (README, "Results").
//!
//! A result is [`Content`]: plain text, as almost every tool gives, or a list
//! of [`ContentBlock`]s when a tool returned images. Both serialize as the
//! `content` of an Anthropic `tool_result` block: a string, or an array of
//! `{"type": "text", "text": …}` and `{"type": "image", "source": {"type":
//! "base64", "media_type": …, "data": …}}` blocks. A text-only result stays a
//! string, so its bytes are what they were before images existed.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The media types an image block may have: those the Messages API takes.
pub const IMAGE_MEDIA_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// What a model reads as one result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// Text alone: serialized as a JSON string.
    Text(String),
    /// Blocks in order, images among them: serialized as a JSON array.
    Blocks(Vec<ContentBlock>),
}

/// One block of a result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContentBlock {
    /// Text.
    Text(String),
    /// An image.
    Image(Image),
}

/// An encoded image and its media type.
#[derive(Clone, PartialEq, Eq)]
pub struct Image {
    /// One of [`IMAGE_MEDIA_TYPES`].
    pub media_type: String,
    /// The encoded bytes; shared, since a result is cloned for its events.
    pub data: Arc<[u8]>,
}

/// What the bytes of a checked image hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    /// Width in pixels.
    pub width: u64,
    /// Height in pixels.
    pub height: u64,
}

impl Default for Content {
    fn default() -> Self {
        Content::Text(String::new())
    }
}

impl Content {
    /// The content of `blocks`: plain text when they hold no image (the text
    /// blocks joined by newlines), else the blocks.
    pub fn from_blocks(blocks: Vec<ContentBlock>) -> Self {
        if blocks.iter().any(|block| matches!(block, ContentBlock::Image(_))) {
            return Content::Blocks(blocks);
        }
        let mut texts = blocks.into_iter().map(|block| match block {
            ContentBlock::Text(text) => text,
            ContentBlock::Image(_) => unreachable!("no image was seen"),
        });
        let first = texts.next().unwrap_or_default();
        Content::Text(texts.fold(first, |mut all, text| {
            all.push('\n');
            all.push_str(&text);
            all
        }))
    }

    /// The text a model reads, images left out: the text blocks joined by
    /// newlines.
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Content::Text(text) => Cow::Borrowed(text),
            Content::Blocks(blocks) => Cow::Owned(text_of(blocks)),
        }
    }

    /// The text, when the content is text alone.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Content::Text(text) => Some(text),
            Content::Blocks(_) => None,
        }
    }

    /// The images, in order.
    pub fn images(&self) -> impl Iterator<Item = &Image> {
        let blocks = match self {
            Content::Text(_) => &[][..],
            Content::Blocks(blocks) => blocks.as_slice(),
        };
        blocks.iter().filter_map(|block| match block {
            ContentBlock::Image(image) => Some(image),
            ContentBlock::Text(_) => None,
        })
    }
}

/// The text blocks of `blocks` joined by newlines, images left out: what
/// [`Content::text`] reads of a list of blocks.
pub fn text_of(blocks: &[ContentBlock]) -> String {
    let texts: Vec<&str> = blocks
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) => Some(text.as_str()),
            ContentBlock::Image(_) => None,
        })
        .collect();
    texts.join("\n")
}

impl From<String> for Content {
    fn from(text: String) -> Self {
        Content::Text(text)
    }
}

impl From<&str> for Content {
    fn from(text: &str) -> Self {
        Content::Text(text.to_owned())
    }
}

/// The text, with each image shown as `[image/png image, 68 bytes]`: for
/// people reading a log or an error, not for a model.
impl fmt::Display for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Content::Text(text) => f.write_str(text),
            Content::Blocks(blocks) => {
                for (index, block) in blocks.iter().enumerate() {
                    if index > 0 {
                        f.write_str("\n")?;
                    }
                    match block {
                        ContentBlock::Text(text) => f.write_str(text)?,
                        ContentBlock::Image(image) => {
                            write!(f, "[{} image, {} bytes]", image.media_type, image.data.len())?;
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

impl fmt::Debug for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Image")
            .field("media_type", &self.media_type)
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl Image {
    /// An image of `media_type` holding `data`, not yet checked.
    pub fn new(media_type: impl Into<String>, data: impl Into<Arc<[u8]>>) -> Self {
        Image { media_type: media_type.into(), data: data.into() }
    }

    /// Check that the media type is one a model takes and that the bytes hold
    /// it, and read the image's size from its header. The error says what is
    /// wrong, in words for the tool's author.
    pub fn check(&self) -> Result<ImageInfo, String> {
        let media_type = &self.media_type;
        if !IMAGE_MEDIA_TYPES.contains(&media_type.as_str()) {
            return Err(format!(
                "has media type `{media_type}`; an image must be one of {}",
                IMAGE_MEDIA_TYPES.join(", ")
            ));
        }
        let held = match imagesize::image_type(&self.data) {
            Ok(imagesize::ImageType::Png) => Some("image/png"),
            Ok(imagesize::ImageType::Jpeg) => Some("image/jpeg"),
            Ok(imagesize::ImageType::Gif) => Some("image/gif"),
            Ok(imagesize::ImageType::Webp) => Some("image/webp"),
            _ => None,
        };
        match held {
            Some(held) if held == media_type => {}
            Some(held) => return Err(format!("is labelled `{media_type}` but its bytes are `{held}`")),
            None => {
                return Err(format!(
                    "is labelled `{media_type}` but its bytes are not an image of that type"
                ));
            }
        }
        let size = imagesize::blob_size(&self.data)
            .map_err(|error| format!("is labelled `{media_type}` but its header cannot be read: {error}"))?;
        Ok(ImageInfo { width: size.width as u64, height: size.height as u64 })
    }

    /// The bytes as standard base64, as a `tool_result` or an MCP image
    /// content carries them.
    pub fn base64(&self) -> String {
        BASE64.encode(&self.data)
    }

    /// The file extension for its media type: `png`, `jpg`, `gif` or `webp`.
    pub fn extension(&self) -> &'static str {
        match self.media_type.as_str() {
            "image/jpeg" => "jpg",
            "image/gif" => "gif",
            "image/webp" => "webp",
            _ => "png",
        }
    }
}

impl Serialize for Content {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Content::Text(text) => serializer.serialize_str(text),
            Content::Blocks(blocks) => blocks.serialize(serializer),
        }
    }
}

impl Serialize for ContentBlock {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        match self {
            ContentBlock::Text(text) => {
                map.serialize_entry("type", "text")?;
                map.serialize_entry("text", text)?;
            }
            ContentBlock::Image(image) => {
                map.serialize_entry("type", "image")?;
                map.serialize_entry(
                    "source",
                    &serde_json::json!({
                        "type": "base64",
                        "media_type": image.media_type,
                        "data": image.base64(),
                    }),
                )?;
            }
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Content::from_value(&Value::deserialize(deserializer)?).map_err(de::Error::custom)
    }
}

impl Content {
    /// Read the `content` of a `tool_result` block: a string, or an array of
    /// text and base64 image blocks. The error names the block at fault.
    pub fn from_value(value: &Value) -> Result<Self, String> {
        match value {
            Value::String(text) => Ok(Content::Text(text.clone())),
            Value::Array(blocks) => blocks
                .iter()
                .enumerate()
                .map(|(index, block)| {
                    ContentBlock::from_value(block).map_err(|reason| format!("content[{index}]: {reason}"))
                })
                .collect::<Result<_, _>>()
                .map(Content::Blocks),
            _ => Err("`content` is neither a string nor an array of blocks".into()),
        }
    }
}

impl ContentBlock {
    fn from_value(block: &Value) -> Result<Self, String> {
        let field = |name: &str| block.get(name).and_then(Value::as_str);
        match field("type") {
            Some("text") => field("text")
                .map(|text| ContentBlock::Text(text.to_owned()))
                .ok_or_else(|| "a text block without `text`".to_string()),
            Some("image") => {
                let source = block.get("source").ok_or("an image block without `source`")?;
                let part = |name: &str| source.get(name).and_then(Value::as_str);
                if part("type") != Some("base64") {
                    return Err("an image block whose source is not `base64`".into());
                }
                let media_type = part("media_type").ok_or("an image block without `media_type`")?;
                let data = part("data").ok_or("an image block without `data`")?;
                let data = BASE64.decode(data).map_err(|error| format!("an image block's data: {error}"))?;
                Ok(ContentBlock::Image(Image::new(media_type, data)))
            }
            Some(other) => Err(format!("a block of type `{other}`, not `text` or `image`")),
            None => Err("a block without `type`".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The smallest PNG: one transparent pixel.
    pub(crate) const PIXEL_PNG: &[u8] = &[
        0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52, 0x00,
        0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4, 0x89, 0x00,
        0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x60, 0x00, 0x02, 0x00, 0x00, 0x05, 0x00,
        0x01, 0x7a, 0x5e, 0xab, 0x3f, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
    ];

    #[test]
    fn text_alone_stays_a_string_and_images_make_an_array() {
        let text = Content::from_blocks(vec![ContentBlock::Text("a".into()), ContentBlock::Text("b".into())]);
        assert_eq!(serde_json::to_value(&text).unwrap(), json!("a\nb"));
        assert_eq!(Content::from_blocks(Vec::new()), Content::Text(String::new()));
        let image = Image::new("image/png", PIXEL_PNG.to_vec());
        let blocks = Content::from_blocks(vec![ContentBlock::Text("a".into()), ContentBlock::Image(image)]);
        let value = serde_json::to_value(&blocks).unwrap();
        assert_eq!(value[0], json!({ "type": "text", "text": "a" }));
        assert_eq!(value[1]["source"]["media_type"], "image/png");
        assert_eq!(Content::from_value(&value).unwrap(), blocks, "it reads back as it was written");
        assert_eq!(blocks.text(), "a");
    }

    #[test]
    fn an_image_is_checked_against_its_media_type() {
        assert_eq!(
            Image::new("image/png", PIXEL_PNG.to_vec()).check(),
            Ok(ImageInfo { width: 1, height: 1 })
        );
        assert_eq!(
            Image::new("image/jpeg", PIXEL_PNG.to_vec()).check().unwrap_err(),
            "is labelled `image/jpeg` but its bytes are `image/png`"
        );
        assert!(Image::new("image/bmp", PIXEL_PNG.to_vec()).check().unwrap_err().contains("image/webp"));
        assert!(Image::new("image/gif", b"GIF8".to_vec()).check().is_err());
    }

    #[test]
    fn a_malformed_block_is_named() {
        let error = Content::from_value(&json!([{ "type": "text", "text": "a" }, { "type": "video" }]));
        assert_eq!(error.unwrap_err(), "content[1]: a block of type `video`, not `text` or `image`");
    }
}
