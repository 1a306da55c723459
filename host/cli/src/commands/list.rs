//! `keel list`: the tool pool as a model sees it.

use anyhow::Result;
use clap::{Args, ValueEnum};
use keel_host::pool::definitions::{self, Format};

use super::run::HostArgs;
use crate::interrupt::Signals;

/// Arguments of `keel list`.
#[derive(Args)]
pub struct ListArgs {
    #[command(flatten)]
    host: HostArgs,
    /// The shape of the output.
    #[arg(long, value_enum, default_value_t = ListFormat::Anthropic)]
    format: ListFormat,
}

/// The shapes `keel list` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ListFormat {
    /// The `tools` of an Anthropic Messages request.
    Anthropic,
    /// The `tools` of an OpenAI Chat Completions request (function tools).
    Openai,
    /// Everything keel knows of each tool, deferred ones included.
    Json,
}

/// Build the host from the flags and `keel.toml`, and print its pool: the
/// tool definitions exactly as an agent sends them, in pool order, as one
/// JSON array. Tools left out (disabled, clashing, outside the mode, denied
/// by a rule) are not printed; warnings go to stderr.
pub fn run(args: &ListArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    // A stop signal while the plugins load stops the command there.
    let host = runtime.block_on(async {
        let mut signals = Signals::listen()?;
        let builder = args.host.builder()?;
        signals
            .or(async { Ok(crate::progress::shown(crate::progress::LOADING, builder.build()).await?) })
            .await
    });
    let host = crate::interrupt::end(runtime, host)?;
    let pool = host.pool();
    let text = match args.format {
        ListFormat::Anthropic => {
            serde_json::to_string_pretty(&definitions::definitions(pool, Format::Anthropic))?
        }
        ListFormat::Openai => serde_json::to_string_pretty(&definitions::definitions(pool, Format::OpenAi))?,
        ListFormat::Json => serde_json::to_string_pretty(&definitions::listing(pool))?,
    };
    outln!("{text}")?;
    host.wait_for_cache_upkeep();
    Ok(())
}
