//! What a guest may open: regular files, directories and links, never a
//! named pipe (FIFO), a socket or a device.
//!
//! A granted directory's filesystem calls run on the calling thread (see
//! `Mounts::open` in `sandbox.rs`), the thread that also polls the call's
//! deadline timer. Opening a FIFO waits for a writer, and a device may wait
//! for anything: either would hold that worker thread, and with it the call's
//! deadline, its result, the calls queued behind it on that worker, and the
//! host's stop. Plugins cannot make such files (WASI has no `mkfifo`), so
//! only one already in a granted directory is a hazard; this refuses to open
//! it.
//!
//! `[method]descriptor.open-at` of `wasi:filesystem/types` is shadowed by one
//! that first asks wasmtime-wasi's own `stat-at` what the path names,
//! following a link as the open would, and refuses, as `unsupported` (a
//! guest's `Not supported`), a target that exists and is neither a regular
//! file nor a directory; anything else is wasmtime-wasi's own `open-at`,
//! semantics unchanged. What it costs, per open, on the thread
//! of the open: one copy of the path, and one `statx` for a name directly in
//! the directory, four system calls for a deeper path (about 2 and 4 µs in a
//! debug build, beside an open of about 4 µs).
//!
//! What it leaves: a FIFO put in place between the `stat-at` and the open,
//! renamed over the path or made the target of a link by a plugin (or any
//! other process) with write access to a directory that already holds it,
//! is still opened, and blocks as before. So does a hung network mount,
//! whose `stat-at` blocks as its open would.

use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::WasiView;
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView, WasiFilesystemView as _};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, DescriptorFlags, DescriptorType, ErrorCode, HostDescriptor as _, OpenFlags, PathFlags,
};

/// The interface wasmtime-wasi's `add_to_linker_async` defines, under the
/// version of its own WIT: a guest built against any 0.2 version links to it.
/// Were it renamed, this would define a second interface beside it, and the
/// FIFO test in `tests/all/special_files.rs` would fail.
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// Shadow `open-at` in `linker`, which already holds wasmtime-wasi's
/// filesystem and allows shadowing.
pub(crate) fn add_to_linker<T: WasiView + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    type Params = (Resource<Descriptor>, PathFlags, String, OpenFlags, DescriptorFlags);
    linker.instance(FILESYSTEM_TYPES)?.func_wrap_async(
        "[method]descriptor.open-at",
        |mut store, (descriptor, path_flags, path, open_flags, flags): Params| {
            Box::new(async move {
                let opened =
                    open_at(store.data_mut().filesystem(), descriptor, path_flags, path, open_flags, flags)
                        .await?;
                Ok((opened,))
            })
        },
    )
}

/// wasmtime-wasi's `open-at`, unless the path names a file that opening
/// could block on.
async fn open_at(
    mut view: WasiFilesystemCtxView<'_>,
    descriptor: Resource<Descriptor>,
    path_flags: PathFlags,
    path: String,
    open_flags: OpenFlags,
    flags: DescriptorFlags,
) -> wasmtime::Result<Result<Resource<Descriptor>, ErrorCode>> {
    if let Some(kind) = kind_of(&mut view, &descriptor, path_flags, &path).await.and_then(blocking_kind) {
        tracing::debug!(?path, "refused to open {kind}: opening one may block the host's thread");
        return Ok(Err(ErrorCode::Unsupported));
    }
    match view.open_at(descriptor, path_flags, path, open_flags, flags).await {
        Ok(opened) => Ok(Ok(opened)),
        Err(error) => Ok(Err(types::Host::convert_error_code(&mut view, error)?)),
    }
}

/// The kind of file `path` names under `descriptor`, its last link followed
/// when `path_flags` say so, as wasmtime-wasi's `stat-at` sees it; `None`
/// when it cannot be looked at, which the open then says in its own words.
///
/// The last component is looked at unfollowed first, and only a link again,
/// followed: an unfollowed look at a name directly in the directory is one
/// `statx`, where cap-std opens any other path (`O_PATH`, beneath the
/// directory) to stat it, four system calls.
async fn kind_of(
    view: &mut WasiFilesystemCtxView<'_>,
    descriptor: &Resource<Descriptor>,
    path_flags: PathFlags,
    path: &str,
) -> Option<DescriptorType> {
    // A guest's descriptor argument is a borrow; another handle to the same
    // entry of the table is one too.
    let borrow = || Resource::new_borrow(descriptor.rep());
    let unfollowed = view.stat_at(borrow(), PathFlags::empty(), path.to_owned()).await.ok()?.type_;
    if unfollowed != DescriptorType::SymbolicLink || !path_flags.contains(PathFlags::SYMLINK_FOLLOW) {
        return Some(unfollowed);
    }
    Some(view.stat_at(borrow(), path_flags, path.to_owned()).await.ok()?.type_)
}

/// What a file of `kind` is called when opening it is refused; `None` for
/// the kinds a guest may open. A link is only seen here when it is not
/// followed, and then the open refuses it itself.
fn blocking_kind(kind: DescriptorType) -> Option<&'static str> {
    match kind {
        DescriptorType::RegularFile | DescriptorType::Directory | DescriptorType::SymbolicLink => None,
        DescriptorType::CharacterDevice => Some("a character device"),
        DescriptorType::BlockDevice => Some("a block device"),
        DescriptorType::Fifo => Some("a named pipe"),
        DescriptorType::Socket => Some("a socket"),
        // wasmtime-wasi's `stat-at` calls both of the kinds left on Unix
        // unknown.
        DescriptorType::Unknown => Some("a named pipe or a socket"),
    }
}
