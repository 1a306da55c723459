//! Pinned plugins: `keel.lock`, and the `sha256` key of a `[plugins.X]`
//! section.
//!
//! A lock records, for every plugin a run loads, its name, where it came
//! from (a file, relative to the lock's directory when it is inside it, or
//! an `oci://` reference), the sha256 digest of its component and its
//! contract version:
//!
//! ```toml
//! version = 1
//!
//! [[plugin]]
//! name = "grep"
//! source = "tools/grep.wasm"
//! sha256 = "4f1c…"
//! contract = "0.3.0"
//! ```
//!
//! [`Pins`] holds what a run checks against: the lock (when there is one)
//! and the `sha256` keys of the configuration. The engine hands it the
//! digest of every component it compiles or loads from its cache, before
//! any of the component's code runs, so a file whose bytes differ from the
//! pin of its source is refused before it is asked anything; once a plugin
//! has told its name, the pins of that name are checked too. With
//! `locked`, a plugin the lock does not name, and a lock entry whose plugin
//! the run does not load, are refused as well.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::load::grants::PluginsConfig;

/// The lock's file name, beside `keel.toml`.
pub const LOCK_FILE_NAME: &str = "keel.lock";

/// The format version a lock is written in.
const LOCK_VERSION: u32 = 1;

/// The contents of `keel.lock`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    /// The format version: 1.
    pub version: u32,
    /// One entry per plugin, sorted by name.
    #[serde(default, rename = "plugin")]
    pub plugins: Vec<LockedPlugin>,
}

/// One plugin as a lock pins it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedPlugin {
    /// The tool's name.
    pub name: String,
    /// Where it came from: a file (relative to the lock's directory when
    /// inside it), or the `oci://` reference it was pulled by.
    pub source: String,
    /// The manifest digest an `oci://` reference by tag resolved to
    /// (`sha256:…`): a locked run pulls this digest, not the tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<String>,
    /// The sha256 digest of the component's bytes, in lowercase hex.
    pub sha256: String,
    /// The contract version the component was built against, for a reader
    /// of the lock. It is not checked: the version is read from the
    /// component, whose bytes `sha256` pins, so it cannot change while the
    /// pin holds.
    pub contract: String,
}

impl Lock {
    /// A lock of `plugins`, sorted by name.
    pub fn new(mut plugins: Vec<LockedPlugin>) -> Self {
        plugins.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.source.cmp(&b.source)));
        Lock { version: LOCK_VERSION, plugins }
    }

    /// Parse a lock's text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Self> {
        let invalid = |reason: String| Error::Lock { path: origin.to_path_buf(), reason };
        let lock: Lock = crate::config::read_toml(text).map_err(invalid)?;
        if lock.version != LOCK_VERSION {
            return Err(invalid(format!(
                "version {} is not {LOCK_VERSION}, the one this keel reads",
                lock.version
            )));
        }
        for plugin in &lock.plugins {
            if !is_sha256_hex(&plugin.sha256) {
                return Err(invalid(format!(
                    "the sha256 of {} is not 64 lowercase hex digits: {:?}",
                    plugin.name, plugin.sha256
                )));
            }
            if let Some(resolved) = &plugin.resolved
                && !resolved.strip_prefix("sha256:").is_some_and(is_sha256_hex)
            {
                return Err(invalid(format!(
                    "the resolved digest of {} is not sha256: and 64 lowercase hex digits: {resolved:?}",
                    plugin.name
                )));
            }
        }
        // Two entries of one name or one source would leave the pin that
        // holds to whichever is found first.
        let mut names = HashMap::new();
        let mut sources = HashMap::new();
        for (index, plugin) in lock.plugins.iter().enumerate() {
            let twice = if let Some(first) = names.insert(plugin.name.as_str(), index) {
                Some((format!("the tool {}", plugin.name), first))
            } else {
                sources
                    .insert(plugin.source.as_str(), index)
                    .map(|first| (format!("the source {}", plugin.source), first))
            };
            if let Some((what, first)) = twice {
                return Err(invalid(format!(
                    "{what} is pinned twice, by {}; a plugin has one entry (`keel lock` writes the lock afresh)",
                    entries_at(text, lock.plugins.len(), first, index)
                )));
            }
        }
        Ok(lock)
    }

    /// The lock at `path`, or `None` when there is no such file.
    pub fn load(path: &Path) -> Result<Option<Self>> {
        match std::fs::read_to_string(path) {
            Ok(text) => Lock::parse(&text, path).map(Some),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(Error::io("read", path, error)),
        }
    }

    /// The lock as the text of its file.
    pub fn to_text(&self) -> String {
        let body = toml::to_string(self).expect("a lock serializes");
        format!("# Written by `keel lock`: the plugins this project runs, pinned by digest.\n{body}")
    }

    /// Write the lock to `path`, atomically: a reader sees the old lock or
    /// the whole new one.
    pub fn write(&self, path: &Path) -> Result<()> {
        crate::fs::write_atomically(path, self.to_text().as_bytes())
            .map_err(|error| Error::io("write", path, error))
    }

    /// The entry named `name`.
    pub fn entry(&self, name: &str) -> Option<&LockedPlugin> {
        self.plugins.iter().find(|plugin| plugin.name == name)
    }
}

/// The entries `first` and `second` (from 0) of a lock of `count` entries
/// whose text is `text`, named by the line of their `[[plugin]]` header when
/// every entry has one, else by their place.
fn entries_at(text: &str, count: usize, first: usize, second: usize) -> String {
    let headers: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, line)| line.split_whitespace().collect::<String>().starts_with("[[plugin]]"))
        .map(|(at, _)| at + 1)
        .collect();
    if headers.len() == count {
        format!("the [[plugin]] entries at lines {} and {}", headers[first], headers[second])
    } else {
        format!("its entries {} and {}", first + 1, second + 1)
    }
}

/// Whether `text` is a sha256 digest in lowercase hex.
pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

/// The sha256 digest of `bytes`, in lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(bytes);
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// What a run's plugins are checked against; see the module docs.
#[derive(Debug)]
pub struct Pins {
    /// Where the lock is, or would be written.
    lock_path: PathBuf,
    /// The lock's directory, canonical: local sources are relative to it.
    lock_dir: Option<PathBuf>,
    lock: Option<Lock>,
    locked: bool,
    /// `[plugins.X] sha256`, by tool name.
    by_name: BTreeMap<String, String>,
    /// Sources that are not the file itself (an `oci://` reference), by
    /// the file the component was put in.
    sources: HashMap<PathBuf, String>,
    /// The digest of each file's component as the engine last loaded it.
    seen: Mutex<HashMap<PathBuf, String>>,
}

impl Pins {
    /// The pins of the lock at `lock_path` (none when there is no lock, or
    /// `lock` is `None`) and of the `sha256` keys of `plugins`; `locked`
    /// also refuses plugins the lock does not name and entries no plugin
    /// answers. A `sha256` key in a pattern section, or one that is not a
    /// digest, is an error naming the section.
    pub fn new(
        lock_path: PathBuf,
        lock: Option<Lock>,
        locked: bool,
        plugins: &PluginsConfig,
    ) -> Result<Self> {
        if locked && lock.is_none() {
            return Err(Error::NoLock { lock: lock_path });
        }
        let mut by_name = BTreeMap::new();
        for (pattern, section) in plugins {
            let Some(sha256) = &section.sha256 else { continue };
            let invalid = |reason: &str| Error::Grant { pattern: pattern.clone(), reason: reason.into() };
            if pattern.contains('*') {
                return Err(invalid("a sha256 pin names one tool, not a pattern"));
            }
            if !is_sha256_hex(sha256) {
                return Err(invalid("sha256 must be 64 lowercase hex digits"));
            }
            by_name.insert(pattern.clone(), sha256.clone());
        }
        let lock_dir =
            lock_path.parent().map(|dir| if dir.as_os_str().is_empty() { Path::new(".") } else { dir });
        let lock_dir = lock_dir.and_then(|dir| dir.canonicalize().ok());
        Ok(Pins {
            lock_path,
            lock_dir,
            lock,
            locked,
            by_name,
            sources: HashMap::new(),
            seen: Mutex::default(),
        })
    }

    /// Name the source of the component in `file` (an `oci://` reference),
    /// which a lock records instead of the file.
    pub fn with_source(mut self, file: PathBuf, source: String) -> Self {
        self.sources.insert(file, source);
        self
    }

    /// The lock the pins were made with, if any.
    pub fn lock(&self) -> Option<&Lock> {
        self.lock.as_ref()
    }

    /// Where the lock is, or would be written.
    pub fn lock_path(&self) -> &Path {
        &self.lock_path
    }

    /// The source a lock records for the component in `file`.
    pub fn source_of(&self, file: &Path) -> String {
        if let Some(source) = self.sources.get(file) {
            return source.clone();
        }
        let canonical = file.canonicalize().unwrap_or_else(|_| file.to_path_buf());
        let relative = self.lock_dir.as_deref().and_then(|dir| canonical.strip_prefix(dir).ok());
        relative.unwrap_or(&canonical).to_string_lossy().into_owned()
    }

    /// The engine's check of the component of `file`, whose bytes have
    /// `sha256`: refused when the lock pins its source to other bytes.
    /// Called before any of its code runs.
    pub(crate) fn vet_file(&self, file: &Path, sha256: &str) -> Result<()> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(file.to_path_buf(), sha256.to_owned());
        let Some(lock) = &self.lock else { return Ok(()) };
        let source = self.source_of(file);
        match lock.plugins.iter().find(|plugin| plugin.source == source) {
            Some(pinned) if pinned.sha256 != sha256 => Err(self.mismatch(file, &pinned.sha256, sha256)),
            _ => Ok(()),
        }
    }

    /// The digest of `file`'s component as the engine last loaded it.
    pub fn digest_of(&self, file: &Path) -> Option<String> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner).get(file).cloned()
    }

    /// Check the plugin `name`, loaded from `file`, against the pins of its
    /// name; with `locked`, refuse it when the lock does not name it.
    pub fn check_plugin(&self, name: &str, file: &Path) -> Result<()> {
        let Some(sha256) = self.digest_of(file) else {
            return Err(Error::Pin { path: self.named(file), reason: "its digest is not known".into() });
        };
        if let Some(pinned) = self.by_name.get(name)
            && *pinned != sha256
        {
            return Err(Error::Pin {
                path: self.named(file),
                reason: format!(
                    "[plugins.{name}] pins sha256 {pinned}, but the file's component has sha256 {sha256}"
                ),
            });
        }
        match self.lock.as_ref().and_then(|lock| lock.entry(name)) {
            Some(pinned) if pinned.sha256 != sha256 => Err(self.mismatch(file, &pinned.sha256, &sha256)),
            None if self.locked => Err(Error::Pin {
                path: self.named(file),
                reason: format!(
                    "{} does not name its tool {name} (--locked); run `keel lock` to pin it",
                    self.lock_path.display()
                ),
            }),
            _ => Ok(()),
        }
    }

    /// With `locked`: fail naming the first lock entry none of `names`
    /// answers.
    pub fn check_complete<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Result<()> {
        let Some(lock) = self.lock.as_ref().filter(|_| self.locked) else { return Ok(()) };
        let names: Vec<&str> = names.into_iter().collect();
        match lock.plugins.iter().find(|plugin| !names.contains(&plugin.name.as_str())) {
            Some(missing) => Err(Error::Unanswered {
                lock: self.lock_path.clone(),
                name: missing.name.clone(),
                source_of: missing.source.clone(),
            }),
            None => Ok(()),
        }
    }

    /// What a lock records of the plugin `name` of `contract`, loaded from
    /// `file`; `None` when its digest is not known.
    pub fn entry_for(&self, name: &str, file: &Path, contract: &str) -> Option<LockedPlugin> {
        Some(LockedPlugin {
            name: name.to_owned(),
            source: self.source_of(file),
            resolved: None,
            sha256: self.digest_of(file)?,
            contract: contract.to_owned(),
        })
    }

    /// `file` as an error names it: by the `oci://` reference it was pulled
    /// by, not the place in the store that keeps it.
    pub(crate) fn named(&self, file: &Path) -> PathBuf {
        self.sources.get(file).map_or_else(|| file.to_path_buf(), PathBuf::from)
    }

    fn mismatch(&self, file: &Path, pinned: &str, actual: &str) -> Error {
        Error::Pin {
            path: self.named(file),
            reason: format!(
                "{} pins sha256 {pinned}, but the file's component has sha256 {actual}",
                self.lock_path.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, sha: char) -> LockedPlugin {
        LockedPlugin {
            name: name.into(),
            source: format!("{name}.wasm"),
            resolved: None,
            sha256: sha.to_string().repeat(64),
            contract: "0.3.0".into(),
        }
    }

    #[test]
    fn a_lock_reads_back_what_it_wrote_sorted_by_name() {
        let lock = Lock::new(vec![entry("b", 'b'), entry("a", 'a')]);
        let read = Lock::parse(&lock.to_text(), Path::new("keel.lock")).unwrap();
        assert_eq!(read.plugins.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(read, lock);
    }

    #[test]
    fn a_lock_with_a_digest_that_is_not_one_is_refused() {
        let text = "version = 1\n[[plugin]]\nname = \"a\"\nsource = \"a.wasm\"\nsha256 = \"xyz\"\ncontract = \"0.3.0\"\n";
        let error = Lock::parse(text, Path::new("keel.lock")).unwrap_err().to_string();
        assert_eq!(error, "invalid lock keel.lock: the sha256 of a is not 64 lowercase hex digits: \"xyz\"");
        let hex = "a".repeat(64);
        for resolved in ["sha256:../../etc", "md5:abc", &hex] {
            let text = format!(
                "version = 1\n[[plugin]]\nname = \"a\"\nsource = \"oci://r/a:1\"\nresolved = {resolved:?}\n\
                 sha256 = \"{hex}\"\ncontract = \"0.3.0\"\n"
            );
            let error = Lock::parse(&text, Path::new("keel.lock")).unwrap_err().to_string();
            assert_eq!(
                error,
                format!(
                    "invalid lock keel.lock: the resolved digest of a is not sha256: and 64 lowercase hex \
                     digits: {resolved:?}"
                )
            );
        }
        let error = Lock::parse("version = 1\ngarbage\n", Path::new("keel.lock")).unwrap_err().to_string();
        assert_eq!(error, "invalid lock keel.lock: key with no value, expected `=` (line 2, column 8)");
    }

    #[test]
    fn a_plugin_pinned_twice_is_refused_naming_both_entries() {
        let plugin = |name: &str, source: &str, sha: char| {
            format!(
                "[[plugin]]\nname = \"{name}\"\nsource = \"{source}\"\nsha256 = \"{}\"\ncontract = \"0.4.0\"\n",
                sha.to_string().repeat(64)
            )
        };
        let refusal = |entries: &[String]| {
            let text = format!("version = 1\n\n{}", entries.join("\n"));
            Lock::parse(&text, Path::new("/p/keel.lock")).unwrap_err().to_string()
        };
        let (a, b, c) = (
            plugin("grep", "grep.wasm", 'a'),
            plugin("wc", "wc.wasm", 'b'),
            plugin("grep", "grep.wasm", 'c'),
        );
        let expected = "invalid lock /p/keel.lock: the tool grep is pinned twice, by the [[plugin]] entries at lines \
                        3 and 15; a plugin has one entry (`keel lock` writes the lock afresh)";
        assert_eq!(refusal(&[a.clone(), b.clone(), c]), expected);
        // Whatever the order of the two digests.
        let c = plugin("grep", "grep.wasm", 'c');
        assert_eq!(refusal(&[c, b.clone(), a.clone()]), expected);
        assert_eq!(
            refusal(&[a.clone(), plugin("grep2", "grep.wasm", 'c')]),
            "invalid lock /p/keel.lock: the source grep.wasm is pinned twice, by the [[plugin]] entries at \
             lines 3 and 9; a plugin has one entry (`keel lock` writes the lock afresh)"
        );
        let inline = format!(
            "version = 1\nplugin = [\n  {{ name = \"a\", source = \"a.wasm\", sha256 = \"{0}\", contract = \"0.4.0\" }},\n  \
             {{ name = \"a\", source = \"b.wasm\", sha256 = \"{0}\", contract = \"0.4.0\" }},\n]\n",
            "a".repeat(64)
        );
        assert_eq!(
            Lock::parse(&inline, Path::new("keel.lock")).unwrap_err().to_string(),
            "invalid lock keel.lock: the tool a is pinned twice, by its entries 1 and 2; a plugin has one entry \
             (`keel lock` writes the lock afresh)"
        );
        assert_eq!(
            Lock::parse(&format!("version = 1\n{a}\n{b}"), Path::new("keel.lock")).unwrap().plugins.len(),
            2
        );
    }

    #[test]
    fn a_sha256_key_in_a_pattern_section_is_refused() {
        let config: PluginsConfig =
            toml::from_str(&format!("[\"acme_*\"]\nsha256 = \"{}\"\n", "a".repeat(64))).unwrap();
        let error = Pins::new("keel.lock".into(), None, false, &config).unwrap_err().to_string();
        assert_eq!(error, "invalid grant [plugins.\"acme_*\"]: a sha256 pin names one tool, not a pattern");
    }
}
