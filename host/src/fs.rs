//! Files written whole or not at all: the atomic-write helper of the compile
//! cache, the lock file, pulled plugins and golden fixtures; where a path's
//! links lead ([`link_target`]); and files read only when they are regular
//! files of a bounded size ([`read_file_at_most`]). Persisted results have
//! their own writes, which never follow a link (`budget/persist.rs`). And the read of a file a user named
//! ([`read_file_at_most`]): a regular file of bounded size, never a pipe or
//! a device.

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

/// Write `contents` to `path` so that readers see the old file, or the whole
/// new one, never a part, and a crash leaves no part under `path`: a hidden
/// temporary file beside it (`.<name>.<random>.tmp`), synced, then renamed
/// over it. The parent directory is created when missing.
pub fn write_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    Staged::new(path, contents, true)?.commit()
}

/// Where `path` leads when it names nothing that exists: the end of its
/// chain of symbolic links (a link to a file not made yet), else `path`.
pub fn link_target(path: &Path) -> io::Result<PathBuf> {
    let mut path = path.to_path_buf();
    // As many links as the kernel follows before it gives up (ELOOP).
    for _ in 0..40 {
        match std::fs::symlink_metadata(&path) {
            Ok(metadata) if metadata.file_type().is_symlink() => {
                let target = std::fs::read_link(&path)?;
                path = match path.parent() {
                    Some(dir) => dir.join(target),
                    None => target,
                };
            }
            Ok(_) => return Ok(path),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(path),
            Err(error) => return Err(error),
        }
    }
    Err(io::Error::other("too many levels of symbolic links"))
}

/// The contents of the file at `path` (its links followed), when it is a
/// regular file of at most `most` bytes. Anything else is refused before a
/// byte is read, saying what it is: a named pipe would block the read until
/// a writer came, and a device such as `/dev/zero` never ends. A file found
/// larger than `most`, or grown past it while read, is refused naming its
/// size.
pub fn read_file_at_most(path: &Path, most: usize) -> io::Result<Vec<u8>> {
    use std::io::Read as _;
    let most_text = crate::limits::human_bytes(most);
    let refuse = |metadata: &std::fs::Metadata| -> io::Result<()> {
        if !metadata.is_file() {
            let what = kind_of(metadata);
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("it is {what}, not a file")));
        }
        if metadata.len() > most as u64 {
            let size = metadata.len();
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("it is {size} bytes, more than the {most_text} read"),
            ));
        }
        Ok(())
    };
    // Checked before the open, which would block on a named pipe; and on
    // the opened file, in case another took its place meanwhile.
    refuse(&std::fs::metadata(path)?)?;
    let file = std::fs::File::open(path)?;
    refuse(&file.metadata()?)?;
    let mut contents = Vec::new();
    file.take(most as u64 + 1).read_to_end(&mut contents)?;
    if contents.len() > most {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("it grew past the {most_text} read while it was read"),
        ));
    }
    Ok(contents)
}

/// What a file that is not a regular file is, as an error names it.
fn kind_of(metadata: &std::fs::Metadata) -> &'static str {
    let kind = metadata.file_type();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if kind.is_fifo() {
            return "a named pipe";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_file() {
        "a file"
    } else {
        "neither a file nor a directory"
    }
}

/// [`write_atomically`] without the sync: running readers still see the old
/// file or the whole new one, but a crash may leave the file empty, partial
/// or missing, so only for files whose readers treat that as absent (the
/// compile cache's index and answers).
pub(crate) fn replace_unsynced(path: &Path, contents: &[u8]) -> io::Result<()> {
    Staged::new(path, contents, false)?.commit()
}

/// Contents written under a temporary name beside their target. Dropped
/// without [`Staged::commit`] (an error, a panic), the temporary file is
/// removed.
pub(crate) struct Staged {
    temp: tempfile::NamedTempFile,
    target: PathBuf,
}

impl Staged {
    /// Write `contents` to a hidden temporary file beside `target`, synced
    /// when `sync` is true; nothing changes under `target` until
    /// [`Staged::commit`].
    pub(crate) fn new(target: &Path, contents: &[u8], sync: bool) -> io::Result<Self> {
        let dir = match target.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        std::fs::create_dir_all(dir)?;
        let name = target.file_name().map_or_else(Default::default, |name| name.to_string_lossy());
        let prefix = format!(".{name}.");
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".tmp");
        // The mode of a file made anew (0o666 less the umask, where a
        // temporary file would be its owner's alone), or of the file it
        // replaces: a lock or a fixture others read stays readable to them.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            builder.permissions(std::fs::Permissions::from_mode(0o666));
        }
        let mut temp = builder.tempfile_in(dir)?;
        #[cfg(unix)]
        if let Ok(replaced) = std::fs::metadata(target)
            && replaced.is_file()
        {
            temp.as_file().set_permissions(replaced.permissions())?;
        }
        temp.write_all(contents)?;
        if sync {
            temp.as_file().sync_all()?;
        }
        Ok(Staged { temp, target: target.to_path_buf() })
    }

    /// Rename the temporary file to its target, replacing any file there. A
    /// rename within one directory is atomic: a reader sees the old file or
    /// the whole new one.
    pub(crate) fn commit(self) -> io::Result<()> {
        self.temp.persist(&self.target).map_err(|error| error.error)?;
        Ok(())
    }

    /// Where the contents wait for [`Staged::commit`].
    #[cfg(test)]
    pub(crate) fn temp_path(&self) -> &Path {
        self.temp.path()
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_file_written_anew_gets_the_mode_of_any_new_file_and_a_replaced_one_keeps_its_own() {
        let dir = tempfile::tempdir().unwrap();
        // As the system makes a new file: 0o666 less the umask.
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "x").unwrap();
        let new = dir.path().join("new");
        write_atomically(&new, b"x").unwrap();
        assert_eq!(mode(&new), mode(&plain));

        let shared = dir.path().join("shared");
        std::fs::write(&shared, "old").unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomically(&shared, b"new").unwrap();
        assert_eq!(mode(&shared), 0o640);
        assert_eq!(std::fs::read_to_string(&shared).unwrap(), "new");
    }
}
