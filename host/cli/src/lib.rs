//! What the `keel` binary shares with the golden tests: the fixture runner
//! ([`fixture`], behind `keel test`), the benchmark figures ([`bench`](mod@bench),
//! behind `keel bench`), and the runtime the commands that run calls share
//! with the figures ([`call_runtime`]). The commands themselves live in the
//! binary.
#![deny(missing_docs)]

pub mod bench;
pub mod fixture;

/// The multi-thread runtime of the commands that run calls (`keel serve`,
/// `keel run`) and of the figures that measure them: each worker maps its
/// stack ahead of its first call as it first goes idle
/// ([`keel_host::prefault_thread_stack`]), and tears the sandbox of the last
/// call it answered down as it goes idle, after the reply has gone out
/// ([`keel_host::tear_down_when_idle`]), or as it stops. Blocking threads
/// never park, and run no call.
pub fn call_runtime() -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .enable_all()
        .on_thread_park(|| {
            keel_host::prefault_thread_stack();
            keel_host::tear_down_when_idle();
        })
        .on_thread_stop(keel_host::tear_down_when_idle);
    builder
}
