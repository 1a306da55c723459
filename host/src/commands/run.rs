//! `keel run`: run a batch of tool calls.

use std::io::Read as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use clap::Args;
use keel_host::batch::{parse_batch, user_message};
use keel_host::config::Config;
use keel_host::{Host, HostBuilder};

/// Arguments of `keel run`.
#[derive(Args)]
pub struct RunArgs {
    /// A `.wasm` tool or a directory of them; repeatable. Default: the
    /// example tools bundled with this build.
    #[arg(long = "plugins", value_name = "PATH")]
    plugins: Vec<PathBuf>,
    /// The directory the tools work in. Default: the current directory.
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Where compiled tools are cached. Default: `$KEEL_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/keel`, else `~/.cache/keel`.
    #[arg(long, value_name = "DIR", conflicts_with = "no_cache")]
    cache_dir: Option<PathBuf>,
    /// The configuration file. Default: `keel.toml` in the current
    /// directory, when there is one.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Compile every tool afresh and cache nothing.
    #[arg(long)]
    no_cache: bool,
    /// A JSON file holding an array of tool_use blocks or an assistant
    /// message; `-` reads standard input.
    #[arg(value_name = "BATCH")]
    batch: String,
}

/// Run the batch and print the user message of tool_result blocks.
pub fn run(args: &RunArgs) -> Result<()> {
    let (text, origin) = read_batch(&args.batch)?;
    let uses = parse_batch(&text, &origin)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let message = runtime.block_on(async {
        let host = host_builder(args)?.build().await?;
        let outcome = host.run_batch(&uses).await;
        anyhow::Ok(user_message(&outcome.results))
    })?;
    println!("{}", serde_json::to_string_pretty(&message)?);
    Ok(())
}

fn read_batch(batch: &str) -> Result<(String, String)> {
    if batch == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("failed to read batch from standard input")?;
        return Ok((text, "<stdin>".into()));
    }
    let text = std::fs::read_to_string(batch).with_context(|| format!("failed to read batch {batch}"))?;
    Ok((text, batch.to_string()))
}

/// A host builder for the common flags: plugins (or the bundled tools),
/// workspace and cache.
pub fn host_builder(args: &RunArgs) -> Result<HostBuilder> {
    let (config, _) = Config::discover(args.config.as_deref(), &std::env::current_dir()?)?;
    let mut builder = Host::builder().config(config);
    if args.plugins.is_empty() {
        builder = builder.plugins(bundled_tools()?);
    }
    for path in &args.plugins {
        builder = builder.plugins(path);
    }
    if let Some(dir) = &args.workspace {
        builder = builder.workspace(dir);
    }
    if args.no_cache {
        builder = builder.cache_dir(None);
    } else if let Some(dir) = &args.cache_dir {
        builder = builder.cache_dir(Some(dir.clone()));
    }
    Ok(builder)
}

/// The example tools built with this binary, wherever the build put them.
fn bundled_tools() -> Result<PathBuf> {
    let Some(dir) = option_env!("KEEL_BUNDLED_TOOLS_DIR") else {
        bail!("this build of keel has no bundled tools; pass --plugins PATH");
    };
    let dir = PathBuf::from(dir);
    if !dir.is_dir() {
        bail!("the bundled tools are missing from {}; rebuild keel, or pass --plugins PATH", dir.display());
    }
    Ok(dir)
}
