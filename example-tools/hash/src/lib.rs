//! `hash`: sha256 of a text or a file, optionally iterated — real CPU work.
//! A text may be repeated, so a call can hash many bytes it makes itself.
//!
//! Read-only and concurrency-safe. Hashing a file names the file, from the
//! workspace root, as its permission subject; hashing a text names none. A
//! repeated text of [`PROGRESS_FROM_BYTES`] or more reports its progress in
//! MiB, at most sixteen times over the call.

use keel_guest::{Context, Output, Plan, Progress, Result, Tool, bail};
use schemars::JsonSchema;
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Most rounds one call may ask for: enough for a long CPU-bound call, not
/// enough to be a typo that runs for an hour.
pub const MAX_ROUNDS: u64 = 100_000_000;

/// Most bytes a repeated text may come to, 1 GiB: seconds of work, not hours.
pub const MAX_REPEATED_BYTES: u64 = 1 << 30;

/// The smallest repeated text whose hashing reports progress, 64 MiB: a
/// fraction of a second or more of work.
pub const PROGRESS_FROM_BYTES: u64 = 64 << 20;

/// Input of `hash`: exactly one of `text` and `file_path`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// Text to hash.
    #[serde(default)]
    pub text: Option<String>,
    /// File to hash, relative to the working directory.
    #[serde(default)]
    pub file_path: Option<String>,
    /// How many times to apply sha256, each round hashing the previous digest.
    /// Default: 1.
    #[serde(default)]
    pub rounds: Option<u64>,
    /// Hash `text` repeated this many times, as one stream of bytes, at most
    /// 1 GiB in all. Default: 1.
    #[serde(default)]
    pub repeat: Option<u64>,
}

/// The `hash` tool.
pub struct Hash;

impl Tool for Hash {
    type Input = Input;
    const NAME: &str = "hash";
    const DESCRIPTION: &str = "Computes the sha256 of a text or of a file, in hex; with `repeat`, \
        of the text repeated that many times; with `rounds`, hashes the digest again that many \
        times.";
    const FIXED_PLAN: Option<Plan> = Some(Plan::SAFE_READ_ONLY);
    const SEARCH_HINT: Option<&str> = Some("sha256 digest of text or a file");

    fn activity_description(input: &Input, _cx: &Context) -> Option<String> {
        // Only a repeated text is long enough work to be worth a line.
        let (text, repeat) = (input.text.as_ref()?, input.repeat?);
        let bytes = repeat.saturating_mul(text.len() as u64);
        Some(match bytes {
            bytes if bytes >= 1 << 20 => format!("Hashing {} MiB", bytes >> 20),
            bytes => format!("Hashing {bytes} bytes"),
        })
    }

    fn permission_subject(input: &Input, cx: &Context) -> Option<String> {
        input.file_path.as_ref().map(|path| cx.workspace_relative(path))
    }

    fn validate_input(input: &Input, _cx: &Context) -> Result<()> {
        match (&input.text, &input.file_path) {
            (Some(_), Some(_)) => bail!("give either `text` or `file_path`, not both"),
            (None, None) => bail!("give `text` or `file_path`"),
            _ => {}
        }
        match input.rounds {
            Some(0) => bail!("`rounds` must be at least 1"),
            Some(rounds) if rounds > MAX_ROUNDS => bail!("`rounds` must be at most {MAX_ROUNDS}"),
            _ => {}
        }
        match (input.repeat, &input.text) {
            (None, _) => Ok(()),
            (Some(_), None) => bail!("`repeat` repeats a `text`; give one"),
            (Some(0), _) => bail!("`repeat` must be at least 1"),
            (Some(repeat), Some(text)) if repeat.saturating_mul(text.len() as u64) > MAX_REPEATED_BYTES => {
                bail!("`text` repeated {repeat} times is over {MAX_REPEATED_BYTES} bytes")
            }
            _ => Ok(()),
        }
    }

    fn call(input: Input, cx: &Context) -> Result<Output> {
        let rounds = input.rounds.unwrap_or(1);
        let bytes = match (&input.text, &input.file_path) {
            (Some(text), _) if input.repeat.is_some() => {
                let repeat = input.repeat.unwrap_or(1);
                let total = repeat.saturating_mul(text.len() as u64);
                let digest = if total >= PROGRESS_FROM_BYTES {
                    digest_repeated_reporting(text.as_bytes(), repeat, rounds, |done| {
                        let (done, total) = ((done * text.len() as u64) >> 20, total >> 20);
                        Progress::new(done)
                            .total(total)
                            .message(format!("Hashed {done} of {total} MiB"))
                            .report();
                    })
                } else {
                    digest_repeated(text.as_bytes(), repeat, rounds)
                };
                return Ok(Output::text(hex(&digest)));
            }
            (Some(text), _) => text.clone().into_bytes(),
            (None, Some(path)) => std::fs::read(cx.resolve(path))
                .map_err(|error| keel_guest::Error::io("cannot read", path, &error))?,
            (None, None) => bail!("give `text` or `file_path`"),
        };
        Ok(Output::text(hex(&digest(&bytes, rounds))))
    }
}

/// [`digest`] of `bytes` repeated `repeat` times, without making the copies.
pub fn digest_repeated(bytes: &[u8], repeat: u64, rounds: u64) -> [u8; 32] {
    digest_repeated_reporting(bytes, repeat, rounds, |_| {})
}

/// [`digest_repeated`], calling `done` with the repeats hashed so far after
/// each sixteenth of them (the last one short).
pub fn digest_repeated_reporting(
    bytes: &[u8],
    repeat: u64,
    rounds: u64,
    mut done: impl FnMut(u64),
) -> [u8; 32] {
    let mut hasher = Sha256::new();
    let step = repeat.div_ceil(16).max(1);
    let mut hashed = 0;
    while hashed < repeat {
        let until = (hashed + step).min(repeat);
        for _ in hashed..until {
            hasher.update(bytes);
        }
        hashed = until;
        done(hashed);
    }
    let mut digest: [u8; 32] = hasher.finalize().into();
    for _ in 1..rounds {
        digest = Sha256::digest(digest).into();
    }
    digest
}

/// sha256 of `bytes`, then of each digest again, `rounds` times in all.
pub fn digest(bytes: &[u8], rounds: u64) -> [u8; 32] {
    let mut digest: [u8; 32] = Sha256::digest(bytes).into();
    for _ in 1..rounds {
        digest = Sha256::digest(digest).into();
    }
    digest
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

keel_guest::export!(Hash);

#[cfg(test)]
mod tests {
    use keel_guest::json;

    use super::*;

    fn text(text: &str, rounds: Option<u64>) -> Input {
        Input { text: Some(text.into()), file_path: None, rounds, repeat: None }
    }

    #[test]
    fn hashes_text_like_sha256sum() {
        let out = Hash::call(text("abc", None), &Context::workspace_root()).unwrap();
        assert_eq!(out.text(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn rounds_hash_the_digest_again() {
        let twice = Hash::call(text("abc", Some(2)), &Context::workspace_root()).unwrap().text();
        assert_eq!(twice, hex(&Sha256::digest(digest(b"abc", 1))));
    }

    #[test]
    fn hashes_a_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "abc").unwrap();
        let cx = Context::new(json!({ "cwd": dir.path() }));
        let input = Input { text: None, file_path: Some("f".into()), rounds: None, repeat: None };
        assert_eq!(Hash::call(input, &cx).unwrap().text(), hex(&digest(b"abc", 1)));
    }

    #[test]
    fn wants_exactly_one_source_and_sane_rounds() {
        let cx = Context::workspace_root();
        let both = Input { text: Some("a".into()), file_path: Some("b".into()), rounds: None, repeat: None };
        assert_eq!(
            Hash::validate_input(&both, &cx).unwrap_err().message(),
            "give either `text` or `file_path`, not both"
        );
        let none = Input { text: None, file_path: None, rounds: None, repeat: None };
        assert_eq!(Hash::validate_input(&none, &cx).unwrap_err().message(), "give `text` or `file_path`");
        assert_eq!(
            Hash::validate_input(&text("a", Some(0)), &cx).unwrap_err().message(),
            "`rounds` must be at least 1"
        );
    }

    #[test]
    fn a_repeated_text_hashes_as_its_copies_would() {
        let cx = Context::workspace_root();
        let input = Input { repeat: Some(3), ..text("abc", Some(2)) };
        assert_eq!(Hash::call(input, &cx).unwrap().text(), hex(&digest(b"abcabcabc", 2)));
        let no_text = Input { text: None, file_path: Some("f".into()), rounds: None, repeat: Some(2) };
        assert_eq!(
            Hash::validate_input(&no_text, &cx).unwrap_err().message(),
            "`repeat` repeats a `text`; give one"
        );
        let huge = Input { repeat: Some(1 << 30), ..text("ab", None) };
        assert_eq!(
            Hash::validate_input(&huge, &cx).unwrap_err().message(),
            "`text` repeated 1073741824 times is over 1073741824 bytes"
        );
    }

    #[test]
    fn names_the_file_from_the_workspace_root_after_a_cd() {
        let secrets = Context::new(json!({ "cwd": "/workspace/secrets" }));
        let file =
            |path: &str| Input { text: None, file_path: Some(path.into()), rounds: None, repeat: None };
        assert_eq!(Hash::permission_subject(&file("k.txt"), &secrets).as_deref(), Some("secrets/k.txt"));
        assert_eq!(Hash::permission_subject(&file("../a/./b"), &secrets).as_deref(), Some("a/b"));
        assert_eq!(Hash::permission_subject(&text("k.txt", None), &secrets), None);
    }

    #[test]
    fn a_long_repeat_reports_sixteen_times_and_hashes_the_same() {
        let mut reports = Vec::new();
        let digest = digest_repeated_reporting(b"ab", 100, 1, |done| reports.push(done));
        assert_eq!(digest, digest_repeated(b"ab", 100, 1));
        assert_eq!(digest, super::digest(&b"ab".repeat(100), 1));
        assert_eq!(reports.len(), 15, "{reports:?}");
        assert_eq!(reports.first(), Some(&7));
        assert_eq!(reports.last(), Some(&100));
        assert!(reports.windows(2).all(|pair| pair[0] < pair[1]));
    }
}
