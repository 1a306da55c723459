//! Upkeep of the compile cache: what it holds, pruning what no plugin seen
//! lately points to, and its size cap.
//!
//! The cache (see `engine`) holds three kinds of entry, each one file:
//! compiled code (`<content key>-<engine>.cwasm`), index entries
//! (`index/`, each naming the content key of the bytes a plugin file held,
//! and the file; its modification time is when a start last found the file
//! so, to within `SEEN_GRANULE`) and what plugins answered at load
//! (`answers/<content key>-…`). Everything here groups them by content key.
//!
//! A prune may run while other keel processes use the cache. It removes
//! each entry with one `unlink`, which is atomic: a start that opened or
//! mapped the file before keeps it whole until it closes it, and one that
//! comes after finds nothing, which for every kind of entry is a miss that
//! falls back to reading, compiling or asking the plugin. Entries are only
//! ever written whole, under a temporary name renamed over theirs, so a
//! prune never sees half of one either. No entry depends on another being
//! present: any subset of a content key's entries left behind is a valid
//! cache.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};
use crate::load::engine::parse_content_key;

/// The subdirectory of the index, as `engine` names it.
const INDEX_DIR: &str = "index";
/// The subdirectory of the load-time answers, as `engine` names it.
const ANSWERS_DIR: &str = "answers";
/// How old a temporary file left by a crashed write must be to be removed:
/// one younger may be a write under way.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// What the cache holds for the bytes of one component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheEntry {
    /// The content key: the BLAKE3 hash of the component's bytes, in hex.
    pub content_key: String,
    /// The plugin files the index knows to hold these bytes.
    pub plugins: Vec<PathBuf>,
    /// When a start last found one of those files, or else when the
    /// newest entry of these bytes was written.
    pub last_seen: SystemTime,
    /// Bytes of compiled code.
    pub code_bytes: u64,
    /// Bytes of index entries and kept answers.
    pub other_bytes: u64,
    /// The files, for removing them.
    files: Vec<PathBuf>,
}

impl CacheEntry {
    /// Every byte the entry takes.
    pub fn bytes(&self) -> u64 {
        self.code_bytes + self.other_bytes
    }

    /// Whether it holds keel's own warm-up tool, which no plugin file
    /// holds: the one entry a start writes of no plugin.
    pub fn is_keels_own(&self) -> bool {
        self.content_key == super::canary::content_key()
    }
}

/// What [`list`] finds: the entries, least recently seen first, and the
/// files that belong to none (leftovers of an older layout or a crash).
#[derive(Debug, Default)]
pub struct Listing {
    /// The entries, least recently seen first.
    pub entries: Vec<CacheEntry>,
    /// Files of no entry, with their sizes and modification times.
    pub strays: Vec<(PathBuf, u64, SystemTime)>,
}

impl Listing {
    /// Every byte the cache takes.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(CacheEntry::bytes).sum::<u64>()
            + self.strays.iter().map(|(_, bytes, _)| bytes).sum::<u64>()
    }
}

/// What a prune removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Files removed.
    pub files: usize,
    /// Bytes they took.
    pub bytes: u64,
}

/// The entries of the compile cache in `dir`. A directory that does not
/// exist is an empty cache.
pub fn list(dir: &Path) -> Result<Listing> {
    let mut by_key: BTreeMap<String, CacheEntry> = BTreeMap::new();
    let mut strays = Vec::new();
    for (path, bytes, modified) in files_in(dir)? {
        let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        match name.strip_suffix(".cwasm").and_then(|stem| stem.get(..64)).filter(|key| is_key(key)) {
            Some(key) => {
                let entry = entry_of(&mut by_key, key);
                entry.code_bytes += bytes;
                entry.last_seen = entry.last_seen.max(modified);
                entry.files.push(path);
            }
            None => strays.push((path, bytes, modified)),
        }
    }
    for (path, bytes, modified) in files_in(&dir.join(ANSWERS_DIR))? {
        let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        match name.get(..64).filter(|key| is_key(key) && name.as_bytes().get(64) == Some(&b'-')) {
            Some(key) => {
                let entry = entry_of(&mut by_key, key);
                entry.other_bytes += bytes;
                entry.last_seen = entry.last_seen.max(modified);
                entry.files.push(path);
            }
            None => strays.push((path, bytes, modified)),
        }
    }
    for (path, bytes, modified) in files_in(&dir.join(INDEX_DIR))? {
        let held = std::fs::read(&path).unwrap_or_default();
        match parse_content_key(&held) {
            Some(key) => {
                let plugin =
                    held.get(65..).map(|rest| PathBuf::from(String::from_utf8_lossy(rest).into_owned()));
                let entry = entry_of(&mut by_key, key);
                entry.other_bytes += bytes;
                entry.last_seen = entry.last_seen.max(modified);
                entry.plugins.extend(plugin.filter(|plugin| !plugin.as_os_str().is_empty()));
                entry.files.push(path);
            }
            None => strays.push((path, bytes, modified)),
        }
    }
    let mut entries: Vec<CacheEntry> = by_key.into_values().collect();
    for entry in &mut entries {
        entry.plugins.sort();
        entry.plugins.dedup();
    }
    entries.sort_by(|a, b| a.last_seen.cmp(&b.last_seen).then_with(|| a.content_key.cmp(&b.content_key)));
    Ok(Listing { entries, strays })
}

/// Remove every entry of the cache in `dir` that no plugin file seen within
/// `max_age` points to, and was not written within it either; and the
/// files of no entry older than that (or than an hour, for a temporary
/// file a write may still be filling).
pub fn prune(dir: &Path, max_age: Duration) -> Result<Pruned> {
    let cutoff = SystemTime::now().checked_sub(max_age).unwrap_or(SystemTime::UNIX_EPOCH);
    let listing = list(dir)?;
    let mut pruned = Pruned::default();
    for entry in listing.entries.iter().filter(|entry| entry.last_seen < cutoff) {
        remove_all(&entry.files, &mut pruned);
    }
    remove_strays(&listing.strays, cutoff, &mut pruned);
    Ok(pruned)
}

/// Bring the cache in `dir` down to at most `max_bytes`, removing whole
/// entries, least recently seen first (files of no entry before them).
pub fn enforce_cap(dir: &Path, max_bytes: u64) -> Result<Pruned> {
    let listing = list(dir)?;
    let mut total = listing.bytes();
    let mut pruned = Pruned::default();
    if total <= max_bytes {
        return Ok(pruned);
    }
    let cutoff = SystemTime::now();
    remove_strays(&listing.strays, cutoff, &mut pruned);
    total = total.saturating_sub(pruned.bytes);
    for entry in &listing.entries {
        if total <= max_bytes {
            break;
        }
        let before = pruned.bytes;
        remove_all(&entry.files, &mut pruned);
        total = total.saturating_sub(pruned.bytes - before);
    }
    Ok(pruned)
}

fn remove_strays(strays: &[(PathBuf, u64, SystemTime)], cutoff: SystemTime, pruned: &mut Pruned) {
    let temp_cutoff = SystemTime::now().checked_sub(STALE_TEMP).unwrap_or(SystemTime::UNIX_EPOCH);
    for (path, bytes, modified) in strays {
        let is_temp = path.file_name().is_some_and(|name| name.to_string_lossy().starts_with('.'));
        if *modified < cutoff && (!is_temp || *modified < temp_cutoff) && remove(path) {
            pruned.files += 1;
            pruned.bytes += bytes;
        }
    }
}

fn remove_all(files: &[PathBuf], pruned: &mut Pruned) {
    for path in files {
        let bytes = std::fs::metadata(path).map_or(0, |stat| stat.len());
        if remove(path) {
            pruned.files += 1;
            pruned.bytes += bytes;
        }
    }
}

/// Remove one entry: a single `unlink`, atomic for every reader (see the
/// module docs). One already gone was removed by someone else.
fn remove(path: &Path) -> bool {
    match std::fs::remove_file(path) {
        Ok(()) => true,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => false,
        Err(error) => {
            tracing::warn!(path = %path.display(), "failed to prune the compile cache: {error}");
            false
        }
    }
}

/// The regular files directly in `dir`, with size and modification time.
fn files_in(dir: &Path) -> Result<Vec<(PathBuf, u64, SystemTime)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(Error::io("read", dir, error)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|error| Error::io("read", dir, error))?;
        // An entry removed meanwhile (another prune) is simply not listed.
        let Ok(stat) = entry.metadata() else { continue };
        if stat.is_file() {
            files.push((entry.path(), stat.len(), stat.modified().unwrap_or(SystemTime::UNIX_EPOCH)));
        }
    }
    Ok(files)
}

/// The entry of `key` in `by_key`, made empty when there is none.
fn entry_of<'a>(by_key: &'a mut BTreeMap<String, CacheEntry>, key: &str) -> &'a mut CacheEntry {
    by_key.entry(key.to_owned()).or_insert_with(|| CacheEntry {
        content_key: key.to_owned(),
        plugins: Vec::new(),
        last_seen: SystemTime::UNIX_EPOCH,
        code_bytes: 0,
        other_bytes: 0,
        files: Vec::new(),
    })
}

fn is_key(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prune_leaves_the_temporary_file_of_a_write_in_progress_which_then_lands_whole() {
        let dir = tempfile::tempdir().unwrap();
        let entry = dir.path().join(format!("{}.cwasm", "a".repeat(64)));
        let staged = crate::fs::Staged::new(&entry, b"compiled code", false).unwrap();
        let pruned = prune(dir.path(), Duration::ZERO).unwrap();
        assert_eq!((pruned.files, pruned.bytes), (0, 0));
        assert_eq!(std::fs::read(staged.temp_path()).unwrap(), b"compiled code");
        staged.commit().unwrap();
        let listing = list(dir.path()).unwrap();
        assert_eq!(listing.entries.iter().map(|entry| entry.code_bytes).collect::<Vec<_>>(), [13]);
        assert!(listing.strays.is_empty());
    }
}
