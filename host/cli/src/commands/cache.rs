//! `keel cache`: what the compile cache holds, and pruning it.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use keel_host::load::cache;
use keel_host::load::default_cache_dir;

use crate::commands::size;

/// Arguments of `keel cache`.
#[derive(Args)]
pub struct CacheArgs {
    /// The compile cache. Default: `$KEEL_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/keel`, else `~/.cache/keel`.
    #[arg(long, value_name = "DIR", global = true)]
    cache_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<CacheCommand>,
}

#[derive(Subcommand)]
enum CacheCommand {
    /// Remove what no plugin file seen in the last N days points to.
    Prune {
        /// How many days a plugin file may go unseen and keep its entries.
        #[arg(long, default_value_t = 30)]
        days: u64,
    },
}

/// List the entries (least recently seen first) with their sizes, or prune.
pub fn run(args: &CacheArgs) -> Result<()> {
    let Some(dir) = args.cache_dir.clone().or_else(default_cache_dir) else {
        bail!("no compile cache: set KEEL_CACHE_DIR or pass --cache-dir");
    };
    // Said of the cache, not of the first file read inside it.
    if dir.exists() && !dir.is_dir() {
        bail!("the compile cache {} is not a directory", dir.display());
    }
    match args.command {
        Some(CacheCommand::Prune { days }) => {
            let pruned = cache::prune(&dir, Duration::from_secs(days.saturating_mul(86_400)))?;
            outln!("removed {} files, {} from {}", pruned.files, size(pruned.bytes), dir.display())?;
        }
        None => {
            let listing = cache::list(&dir)?;
            let now = SystemTime::now();
            for entry in &listing.entries {
                let age = now.duration_since(entry.last_seen).unwrap_or_default();
                let plugins: Vec<String> =
                    entry.plugins.iter().map(|path| path.display().to_string()).collect();
                let plugins = if entry.is_keels_own() {
                    "(keel's own warm-up tool)".into()
                } else if plugins.is_empty() {
                    "(no plugin file indexed)".into()
                } else {
                    plugins.join(", ")
                };
                outln!(
                    "{}  {:>10}  seen {:>8} ago  {plugins}",
                    &entry.content_key[..16],
                    size(entry.bytes()),
                    ago(age)
                )?;
            }
            if !listing.strays.is_empty() {
                let bytes: u64 = listing.strays.iter().map(|(_, bytes, _)| bytes).sum();
                outln!("{} files of no entry, {}", listing.strays.len(), size(bytes))?;
            }
            outln!("{} entries, {} in {}", listing.entries.len(), size(listing.bytes()), dir.display())?;
        }
    }
    Ok(())
}

fn ago(age: Duration) -> String {
    let secs = age.as_secs();
    match secs {
        0..3600 => format!("{}m", secs / 60),
        3600..86_400 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}
