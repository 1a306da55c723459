//! `thumbnail`: show the model an image file of the workspace, scaled down.
//!
//! Reads a PNG, JPEG, GIF (its first frame) or WebP file, scales it to fit
//! `max_side` pixels keeping its aspect ratio (never up), and hands it back as
//! a PNG image block after a line of text naming the file, its size and
//! format, and the size shown. Read-only and concurrency-safe; its permission
//! subject is the file, named from the workspace root.

use std::io::Cursor;

use image::imageops::FilterType;
use image::{DynamicImage, ImageFormat, ImageReader, Limits};
use keel_guest::{Context, Error, Image, Output, Plan, Result, Tool, bail};
use schemars::JsonSchema;
use serde::Deserialize;

/// The longest side a thumbnail gets when the input names none.
pub const DEFAULT_MAX_SIDE: u32 = 512;

/// The smallest `max_side` an input may ask for.
pub const MIN_MAX_SIDE: u32 = 16;

/// The largest `max_side` an input may ask for.
pub const MAX_MAX_SIDE: u32 = 2048;

/// The most pixels an image may have to be scaled: 4 bytes each once
/// decoded, 128 MiB, half of a sandbox's default memory.
pub const MAX_PIXELS: u64 = 32 << 20;

/// Input of `thumbnail`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The image file (PNG, JPEG, GIF or WebP), relative to the working
    /// directory.
    pub file_path: String,
    /// The longest side of the thumbnail, in pixels. An image already that
    /// small is shown at its own size.
    #[serde(default = "default_max_side")]
    #[schemars(range(min = 16, max = 2048))]
    pub max_side: u32,
}

fn default_max_side() -> u32 {
    DEFAULT_MAX_SIDE
}

/// The `thumbnail` tool.
pub struct Thumbnail;

impl Tool for Thumbnail {
    type Input = Input;
    const NAME: &str = "thumbnail";
    const DESCRIPTION: &str = "Shows an image file of the workspace (PNG, JPEG, GIF or WebP), scaled \
        down to fit `max_side` pixels (default 512) keeping its aspect ratio, with a line giving \
        its size and format.";
    const FIXED_PLAN: Option<Plan> = Some(Plan::SAFE_READ_ONLY);
    const SEARCH_HINT: Option<&str> = Some("view an image file as a thumbnail");

    fn is_destructive(_input: &Input, _cx: &Context) -> bool {
        false
    }

    fn is_search_or_read(_input: &Input, _cx: &Context) -> bool {
        true
    }

    fn validate_input(input: &Input, _cx: &Context) -> Result<()> {
        if input.file_path.trim().is_empty() {
            bail!("`file_path` must not be empty");
        }
        if !(MIN_MAX_SIDE..=MAX_MAX_SIDE).contains(&input.max_side) {
            bail!("`max_side` must be from {MIN_MAX_SIDE} to {MAX_MAX_SIDE}, got {}", input.max_side);
        }
        Ok(())
    }

    fn permission_subject(input: &Input, cx: &Context) -> Option<String> {
        Some(cx.workspace_relative(&input.file_path))
    }

    fn activity_description(input: &Input, _cx: &Context) -> Option<String> {
        Some(format!("Scaling {}", input.file_path))
    }

    fn call(input: Input, cx: &Context) -> Result<Output> {
        let name = &input.file_path;
        let bytes =
            std::fs::read(cx.resolve(name)).map_err(|error| Error::io("cannot read", name, &error))?;
        let thumbnail = thumbnail(name, &bytes, input.max_side)?;
        let (width, height) = thumbnail.original;
        let (shown_width, shown_height) = thumbnail.shown;
        let format = format_name(thumbnail.format);
        Ok(Output::text(format!("{name}: {width}×{height} {format}, shown at {shown_width}×{shown_height}"))
            .with_image(Image::png(thumbnail.png)))
    }
}

/// An image scaled down and encoded as PNG.
#[derive(Debug)]
pub struct Scaled {
    /// The format the image was read in.
    pub format: ImageFormat,
    /// Its width and height.
    pub original: (u32, u32),
    /// The thumbnail's width and height.
    pub shown: (u32, u32),
    /// The thumbnail, encoded as PNG.
    pub png: Vec<u8>,
}

/// Decode `bytes` (the file `name`) and scale the image to fit `max_side`.
pub fn thumbnail(name: &str, bytes: &[u8], max_side: u32) -> Result<Scaled> {
    let format = match image::guess_format(bytes) {
        Ok(format @ (ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::Gif | ImageFormat::WebP)) => format,
        _ => bail!("{name} is not a PNG, JPEG, GIF or WebP image"),
    };
    let undecodable = |error: image::ImageError| {
        Error::msg(format!("cannot decode {name} as {}: {error}", format_name(format)))
    };
    let reader = || ImageReader::with_format(Cursor::new(bytes), format);
    let (width, height) = reader().into_dimensions().map_err(undecodable)?;
    if u64::from(width) * u64::from(height) > MAX_PIXELS {
        bail!(
            "{name} is {width}×{height} pixels, more than the {} megapixels a thumbnail is made from",
            MAX_PIXELS >> 20
        );
    }
    let mut reader = reader();
    let mut limits = Limits::default();
    limits.max_alloc = Some(MAX_PIXELS * 4 + (16 << 20));
    reader.limits(limits);
    let image = reader.decode().map_err(undecodable)?;

    let shown = fit((width, height), max_side);
    let image = if shown == (width, height) {
        image
    } else {
        image.resize_exact(shown.0, shown.1, FilterType::Triangle)
    };
    // Eight bits a channel is all a model sees, and keeps the PNG small.
    let image = if image.color().has_alpha() {
        DynamicImage::ImageRgba8(image.to_rgba8())
    } else {
        DynamicImage::ImageRgb8(image.to_rgb8())
    };
    let mut png = Vec::new();
    image
        .write_to(&mut Cursor::new(&mut png), ImageFormat::Png)
        .map_err(|error| Error::msg(format!("cannot encode the thumbnail of {name}: {error}")))?;
    Ok(Scaled { format, original: (width, height), shown, png })
}

/// The size of an image of `size` scaled to fit a square of `max_side`,
/// keeping its aspect ratio (rounded to the nearest pixel, at least one), and
/// never larger than it was.
pub fn fit((width, height): (u32, u32), max_side: u32) -> (u32, u32) {
    let longest = width.max(height);
    if longest <= max_side {
        return (width, height);
    }
    let scale = |side: u32| {
        let scaled = (u64::from(side) * u64::from(max_side) + u64::from(longest) / 2) / u64::from(longest);
        u32::try_from(scaled).expect("no larger than max_side").max(1)
    };
    (scale(width), scale(height))
}

/// The name of a supported format as people write it.
fn format_name(format: ImageFormat) -> &'static str {
    match format {
        ImageFormat::Png => "PNG",
        ImageFormat::Jpeg => "JPEG",
        ImageFormat::Gif => "GIF",
        ImageFormat::WebP => "WebP",
        _ => "image",
    }
}

keel_guest::export!(Thumbnail);

#[cfg(test)]
mod tests {
    use std::path::Path;

    use image::{Rgb, RgbImage, Rgba, RgbaImage};
    use keel_guest::{Block, json};

    use super::*;

    /// The sample image committed at `testdata/sample.png`: a 640×400
    /// gradient, red across and green down.
    fn sample() -> RgbImage {
        RgbImage::from_fn(640, 400, |x, y| Rgb([(x * 255 / 639) as u8, (y * 255 / 399) as u8, 128]))
    }

    fn input(file_path: &str, max_side: u32) -> Input {
        Input { file_path: file_path.into(), max_side }
    }

    fn save(dir: &Path, name: &str, image: &DynamicImage, format: ImageFormat) {
        image.save_with_format(dir.join(name), format).unwrap();
    }

    /// Run the tool on `name` in `dir`: its text and its image, decoded.
    fn run(dir: &Path, name: &str, max_side: u32) -> (String, DynamicImage) {
        let cx = Context::new(json!({ "cwd": dir }));
        let output = Thumbnail::call(input(name, max_side), &cx).unwrap();
        let [Block::Text(text), Block::Image(image)] = output.content.as_slice() else {
            panic!("a text then an image: {output:?}")
        };
        assert_eq!(image.media_type, "image/png");
        let decoded = image::load_from_memory_with_format(&image.data, ImageFormat::Png).unwrap();
        (text.clone(), decoded)
    }

    #[test]
    fn scales_a_jpeg_down_keeping_its_aspect_ratio() {
        let dir = tempfile::tempdir().unwrap();
        let photo = DynamicImage::ImageRgb8(RgbImage::from_fn(1920, 1080, |x, y| Rgb([x as u8, y as u8, 7])));
        save(dir.path(), "photo.jpg", &photo, ImageFormat::Jpeg);
        let (text, shown) = run(dir.path(), "photo.jpg", DEFAULT_MAX_SIDE);
        assert_eq!(text, "photo.jpg: 1920×1080 JPEG, shown at 512×288");
        assert_eq!((shown.width(), shown.height()), (512, 288));
    }

    #[test]
    fn never_scales_up_and_keeps_transparency() {
        let dir = tempfile::tempdir().unwrap();
        let icon = DynamicImage::ImageRgba8(RgbaImage::from_pixel(100, 50, Rgba([1, 2, 3, 4])));
        save(dir.path(), "icon.png", &icon, ImageFormat::Png);
        let (text, shown) = run(dir.path(), "icon.png", 2048);
        assert_eq!(text, "icon.png: 100×50 PNG, shown at 100×50");
        assert_eq!(shown.to_rgba8().get_pixel(0, 0), &Rgba([1, 2, 3, 4]));
    }

    #[test]
    fn reads_gif_and_webp_too() {
        let dir = tempfile::tempdir().unwrap();
        let tall = DynamicImage::ImageRgba8(RgbaImage::from_pixel(30, 300, Rgba([9, 9, 9, 255])));
        save(dir.path(), "tall.gif", &tall, ImageFormat::Gif);
        save(dir.path(), "tall.webp", &tall, ImageFormat::WebP);
        let (text, shown) = run(dir.path(), "tall.gif", 100);
        assert_eq!(text, "tall.gif: 30×300 GIF, shown at 10×100");
        assert_eq!((shown.width(), shown.height()), (10, 100));
        let (text, _) = run(dir.path(), "tall.webp", 100);
        assert_eq!(text, "tall.webp: 30×300 WebP, shown at 10×100");
    }

    #[test]
    fn resolves_the_file_against_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("pics")).unwrap();
        save(dir.path(), "pics/sample.png", &DynamicImage::ImageRgb8(sample()), ImageFormat::Png);
        let (text, _) = run(&dir.path().join("pics"), "./sample.png", 320);
        assert_eq!(text, "./sample.png: 640×400 PNG, shown at 320×200");
    }

    #[test]
    fn a_file_that_is_not_a_supported_image_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not an image").unwrap();
        let mut bytes = Vec::new();
        // A BMP, by its signature: a real image format, but not one of the four.
        bytes.extend_from_slice(b"BM");
        bytes.extend_from_slice(&[0; 64]);
        std::fs::write(dir.path().join("old.bmp"), bytes).unwrap();
        let cx = Context::new(json!({ "cwd": dir.path() }));
        for name in ["notes.txt", "old.bmp"] {
            let error = Thumbnail::call(input(name, 512), &cx).unwrap_err();
            assert_eq!(error.message(), format!("{name} is not a PNG, JPEG, GIF or WebP image"));
        }
        std::fs::write(dir.path().join("broken.png"), b"\x89PNG\r\n\x1a\ngarbage").unwrap();
        let error = Thumbnail::call(input("broken.png", 512), &cx).unwrap_err();
        assert!(error.message().starts_with("cannot decode broken.png as PNG: "), "{error}");
        let error = Thumbnail::call(input("missing.png", 512), &cx).unwrap_err();
        assert!(error.message().starts_with("cannot read missing.png: "), "{error}");
    }

    #[test]
    fn fit_keeps_the_aspect_ratio_and_never_upscales() {
        assert_eq!(fit((1920, 1080), 512), (512, 288));
        assert_eq!(fit((1080, 1920), 512), (288, 512));
        assert_eq!(fit((640, 400), 512), (512, 320));
        assert_eq!(fit((512, 512), 512), (512, 512));
        assert_eq!(fit((10, 10), 512), (10, 10));
        assert_eq!(fit((9000, 1), 16), (16, 1), "a side never rounds to zero");
    }

    #[test]
    fn answers_as_a_read() {
        let cx = Context::workspace_root();
        let input = input("a.png", 512);
        assert!(Thumbnail::is_read_only(&input, &cx));
        assert!(Thumbnail::is_concurrency_safe(&input, &cx));
        assert!(!Thumbnail::is_destructive(&input, &cx));
        assert_eq!(Thumbnail::activity_description(&input, &cx).as_deref(), Some("Scaling a.png"));
    }

    #[test]
    fn names_the_file_from_the_workspace_root_after_a_cd() {
        let secrets = Context::new(json!({ "cwd": "/workspace/secrets" }));
        assert_eq!(
            Thumbnail::permission_subject(&input("k.png", 512), &secrets).as_deref(),
            Some("secrets/k.png")
        );
        assert_eq!(
            Thumbnail::permission_subject(&input("../a.png", 512), &secrets).as_deref(),
            Some("a.png")
        );
    }

    #[test]
    fn max_side_defaults_to_512_and_is_bounded() {
        let parsed: Input = serde_json::from_str(r#"{"file_path": "a.png"}"#).unwrap();
        assert_eq!(parsed.max_side, DEFAULT_MAX_SIDE);
        let cx = Context::workspace_root();
        assert_eq!(Thumbnail::validate_input(&input("a.png", 16), &cx), Ok(()));
        assert_eq!(
            Thumbnail::validate_input(&input("a.png", 15), &cx).unwrap_err().message(),
            "`max_side` must be from 16 to 2048, got 15"
        );
        assert!(Thumbnail::validate_input(&input("a.png", 2049), &cx).is_err());
        let schema = keel_guest::schema_for::<Input>();
        let max_side = &schema["properties"]["max_side"];
        assert_eq!(
            (&max_side["minimum"], &max_side["maximum"], &max_side["default"]),
            (&json!(16), &json!(2048), &json!(512))
        );
    }

    /// `testdata/sample.png`, for golden fixtures, is [`sample`]: rewrite it
    /// with `KEEL_BLESS=1` after changing the gradient.
    #[test]
    fn the_committed_sample_is_the_gradient() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/sample.png");
        if std::env::var_os("KEEL_BLESS").is_some() {
            sample().save_with_format(&path, ImageFormat::Png).unwrap();
        }
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() < 60_000, "the sample is {} bytes", bytes.len());
        let committed = image::load_from_memory_with_format(&bytes, ImageFormat::Png).unwrap();
        assert_eq!(committed.to_rgb8(), sample());
    }
}
