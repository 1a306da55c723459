//! `wc`: count a text file's lines, words and bytes, as `wc` does.
//!
//! The smallest tool with a structured result: it hands back [`Counts`] as a
//! structured value, declared by its output schema, and no text block, so the
//! model reads the value's JSON text. Read-only and concurrency-safe; its
//! permission subject is the file, named from the workspace root.

use std::io::Read;

use keel_guest::{Context, Error, Output, Plan, Result, Tool, Value, bail};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Input of `wc`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The file to count, relative to the working directory.
    pub file_path: String,
}

/// What `wc` hands back: the structured value its output schema describes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Counts {
    /// The file counted, relative to the workspace root.
    pub path: String,
    /// Newline characters, as `wc -l` counts: a last line without one is not
    /// counted.
    pub lines: u64,
    /// Runs of characters between whitespace (space, tab, newline, carriage
    /// return, vertical tab, form feed), as `wc -w` counts them.
    pub words: u64,
    /// The file's size in bytes.
    pub bytes: u64,
}

/// The `wc` tool.
pub struct Wc;

impl Tool for Wc {
    type Input = Input;
    const NAME: &str = "wc";
    const DESCRIPTION: &str = "Counts the lines, words and bytes of a file, as `wc` does, and \
        returns them as a JSON object.";
    const FIXED_PLAN: Option<Plan> = Some(Plan::SAFE_READ_ONLY);
    const SEARCH_HINT: Option<&str> = Some("count lines words and bytes of a file");

    fn output_schema() -> Option<Value> {
        Some(keel_guest::schema_for::<Counts>())
    }

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
        Ok(())
    }

    fn permission_subject(input: &Input, cx: &Context) -> Option<String> {
        Some(cx.workspace_relative(&input.file_path))
    }

    fn activity_description(input: &Input, _cx: &Context) -> Option<String> {
        Some(format!("Counting {}", input.file_path))
    }

    fn call(input: Input, cx: &Context) -> Result<Output> {
        let name = &input.file_path;
        let path = cx.resolve(name);
        let metadata = std::fs::metadata(&path).map_err(|error| Error::io("cannot read", name, &error))?;
        if metadata.is_dir() {
            bail!("{name} is a directory");
        }
        let file = std::fs::File::open(&path).map_err(|error| Error::io("cannot read", name, &error))?;
        let mut counts = count(file).map_err(|error| Error::io("cannot read", name, &error))?;
        counts.path = cx.workspace_relative(name);
        Output::structured(&counts)
    }
}

/// Count what `reader` holds, a buffer at a time; `path` is left empty.
pub fn count(mut reader: impl Read) -> std::io::Result<Counts> {
    let mut counts = Counts::default();
    let mut in_word = false;
    let mut buffer = vec![0; 64 << 10];
    loop {
        let read = match reader.read(&mut buffer) {
            Ok(0) => return Ok(counts),
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        counts.bytes += read as u64;
        for &byte in &buffer[..read] {
            let space = matches!(byte, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c);
            counts.lines += u64::from(byte == b'\n');
            // A word is counted where it starts, even if a buffer ends in it.
            counts.words += u64::from(!in_word && !space);
            in_word = !space;
        }
    }
}

keel_guest::export!(Wc);

#[cfg(test)]
mod tests {
    use keel_guest::json;

    use super::*;

    fn counts(text: &str) -> (u64, u64, u64) {
        let counts = count(text.as_bytes()).unwrap();
        (counts.lines, counts.words, counts.bytes)
    }

    #[test]
    fn counts_like_wc() {
        assert_eq!(counts(""), (0, 0, 0));
        assert_eq!(counts("one two\nthree\n"), (2, 3, 14));
        assert_eq!(counts("no newline at the end"), (0, 5, 21));
        assert_eq!(counts("  spaced \t out\r\n\n"), (2, 2, 17));
        assert_eq!(counts("héllo wörld\n"), (1, 2, 14), "bytes, not characters");
    }

    #[test]
    fn counts_across_buffers() {
        let text = "word ".repeat(30_000) + "last";
        assert_eq!(counts(&text), (0, 30_001, text.len() as u64));
    }

    #[test]
    fn hands_back_a_structured_value_matching_its_schema() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "a b\nc\n").unwrap();
        let cx = Context::new(json!({ "cwd": dir.path() }));
        let output = Wc::call(Input { file_path: "notes.txt".into() }, &cx).unwrap();
        assert!(output.content.is_empty(), "the host shows the value's JSON text");
        let path = dir.path().join("notes.txt").display().to_string();
        assert_eq!(output.structured, Some(json!({ "path": path, "lines": 2, "words": 3, "bytes": 6 })));

        let schema = Wc::output_schema().unwrap();
        for field in ["path", "lines", "words", "bytes"] {
            assert!(
                schema["properties"][field]["description"].is_string(),
                "{field} is documented: {schema}"
            );
        }
        assert_eq!(schema["required"], json!(["path", "lines", "words", "bytes"]));
    }

    #[test]
    fn a_missing_file_or_a_directory_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let cx = Context::new(json!({ "cwd": dir.path() }));
        let error = Wc::call(Input { file_path: "missing.txt".into() }, &cx).unwrap_err();
        assert!(error.message().starts_with("cannot read missing.txt: "), "{error}");
        let error = Wc::call(Input { file_path: ".".into() }, &cx).unwrap_err();
        assert_eq!(error.message(), ". is a directory");
    }

    #[test]
    fn answers_as_a_read_and_names_the_file_from_the_workspace_root() {
        let secrets = Context::new(json!({ "cwd": "/workspace/secrets" }));
        let input = Input { file_path: "k.txt".into() };
        assert!(Wc::is_read_only(&input, &secrets) && Wc::is_concurrency_safe(&input, &secrets));
        assert_eq!(Wc::permission_subject(&input, &secrets).as_deref(), Some("secrets/k.txt"));
        let outside = Input { file_path: "../../etc/passwd".into() };
        assert_eq!(Wc::permission_subject(&outside, &secrets).as_deref(), Some("/etc/passwd"));
    }
}
