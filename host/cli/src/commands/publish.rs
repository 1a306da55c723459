//! `keel publish`: push a built tool to an OCI registry.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use clap::Args;
use keel_host::config::Config;
use keel_host::load::oci::{self, Registries};
use keel_host::load::{PluginTool, Runtime, default_cache_dir};
use keel_host::{Limits, Tool as _};

/// Arguments of `keel publish`.
#[derive(Args)]
pub struct PublishArgs {
    /// Where to push: `oci://REGISTRY/REPO:TAG`.
    #[arg(value_name = "REFERENCE")]
    reference: String,
    /// The tool's `.wasm` component.
    #[arg(value_name = "COMPONENT")]
    component: PathBuf,
    /// The configuration file, for `[registries]`. Default: `keel.toml` in
    /// the current directory, when there is one.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
}

/// Check that keel loads the component, then push it as a WebAssembly OCI
/// artifact (the layout `wkg` and wassette read) and print the manifest's
/// digest: `oci://…@sha256:…` pulls exactly this.
pub fn run(args: &PublishArgs) -> Result<()> {
    if !oci::is_reference(&args.reference) {
        bail!("{} is not a registry reference; it starts with oci://", args.reference);
    }
    let (config, _) = Config::discover(args.config.as_deref(), &std::env::current_dir()?)?;
    let bytes = std::fs::read(&args.component)
        .with_context(|| format!("failed to read {}", args.component.display()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut signals = {
        let _entered = runtime.enter();
        crate::interrupt::Signals::listen()?
    };
    // A stop signal while the component loads or is pushed ends the command;
    // a registry keeps no upload that was not finished.
    let digest = runtime.block_on(signals.or(async {
        // Only a component keel loads is published.
        let limits = Limits::default();
        let engine = Arc::new(Runtime::new(&limits, None)?);
        let workspace = std::env::current_dir()?;
        let load = PluginTool::load(&engine, &args.component, &workspace, &limits);
        let plugin = crate::progress::shown("loading the component (compiling it)", load).await?;
        let cache = default_cache_dir().unwrap_or_else(std::env::temp_dir);
        let registries = Registries::new(&cache, &config.registries.insecure);
        let push = registries.push(&args.reference, bytes);
        let digest = crate::progress::shown(format!("pushing to {}", args.reference), push).await?;
        eprintln!("published {} ({})", plugin.spec().name, args.component.display());
        anyhow::Ok(digest)
    }));
    let digest = crate::interrupt::end(runtime, digest)?;
    let base = args.reference.rsplit_once(':').map_or(args.reference.as_str(), |(base, tag)| {
        if tag.contains('/') { args.reference.as_str() } else { base }
    });
    outln!("{base}@{digest}")?;
    Ok(())
}
