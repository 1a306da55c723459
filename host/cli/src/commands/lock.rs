//! `keel lock`: pin the plugins a run would load in `keel.lock`.

use anyhow::Result;
use clap::Args;
use keel_host::load::Lock;

use super::run::HostArgs;
use crate::interrupt::Signals;

/// Arguments of `keel lock`.
#[derive(Args)]
pub struct LockArgs {
    #[command(flatten)]
    host: HostArgs,
}

/// Load every plugin the flags and `keel.toml` name, as `keel run` would
/// (tags of `oci://` artifacts resolved afresh), and write `keel.lock`
/// beside `keel.toml`: each plugin's name, source, component digest and
/// contract version, and the manifest digest a tag resolved to. The
/// `sha256` keys of `keel.toml` still hold: a plugin that breaks one is
/// not locked.
pub fn run(args: &LockArgs) -> Result<()> {
    let resolved = args.host.resolve(true)?;
    let pins = resolved.pins.clone().expect("a run for the lock has pins");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    // A stop signal while the plugins load stops the command before the lock is
    // written.
    let host = runtime.block_on(async {
        let mut builder = args.host.builder_without_plugins().config(args.host.config()?).pins(pins.clone());
        for path in &resolved.paths {
            builder = builder.plugins(path);
        }
        Signals::listen()?
            .or(async { Ok(crate::progress::shown(crate::progress::LOADING, builder.build()).await?) })
            .await
    });
    let host = crate::interrupt::end(runtime, host)?;
    let mut entries = host.lock_entries().to_vec();
    for entry in &mut entries {
        if let Some((_, pulled)) = resolved.pulled.iter().find(|(source, _)| *source == entry.source) {
            entry.resolved = Some(pulled.manifest.clone());
        }
    }
    let lock = Lock::new(entries);
    lock.write(pins.lock_path())?;
    let pinned = super::counted(lock.plugins.len(), "plugin");
    eprintln!("wrote {}: {pinned} pinned", pins.lock_path().display());
    Ok(())
}
