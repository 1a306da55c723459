//! `keel bench`: keel's speed and memory figures, each beside its baseline.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context as _, Result};
use clap::Args;
use keel_cli::bench::{self, BenchOptions, Figure};

/// Arguments of `keel bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Few iterations: checks the suite runs, figures are noisy.
    #[arg(long)]
    quick: bool,
    /// Print one JSON object per figure and line.
    #[arg(long)]
    json: bool,
    /// The directory holding `keel_tool_echo.wasm` and `keel_tool_hash.wasm`.
    /// Default: the tools bundled with this build.
    #[arg(long, value_name = "DIR")]
    tools: Option<PathBuf>,
    /// Only the figures whose name starts with this, such as `throughput`.
    #[arg(long, value_name = "NAME")]
    only: Option<String>,
    /// Serve the baseline of the MCP figures on stdio instead: a native echo
    /// tool behind rmcp (`bench::mcp::NATIVE_ECHO_ARGS` spawns it).
    #[arg(long, hide = true)]
    serve_native_echo: bool,
    /// Start a pool of the plugins in PLUGINS with the compile cache in
    /// CACHE, print the milliseconds since the process started, and exit:
    /// one start of the start-up figure (`bench::START_POOL_ARGS`).
    #[arg(long, hide = true, num_args = 2, value_names = ["PLUGINS", "CACHE"])]
    start_pool: Option<Vec<PathBuf>>,
}

/// Measure every figure and print it as it is measured. `started` is when
/// the process started.
pub fn run(args: &BenchArgs, started: Instant) -> Result<()> {
    if args.serve_native_echo {
        return Ok(bench::mcp::serve_native_echo()?);
    }
    if let Some([plugins, cache]) = args.start_pool.as_deref() {
        let (ms, _host, _runtime) = bench::start_pool(plugins, cache, started)?;
        println!("{ms}");
        // What comes after the start is not measured, and need not be done.
        std::process::exit(0);
    }
    // A captured backtrace per wasmtime error would be measured too.
    // SAFETY: nothing else runs yet: the benchmarks start their threads below.
    unsafe { std::env::remove_var("RUST_BACKTRACE") };
    let tools = match &args.tools {
        Some(dir) => dir.clone(),
        None => super::run::bundled_tools()?,
    };
    let keel = std::env::current_exe().context("failed to find the keel binary")?;
    let options = BenchOptions { quick: args.quick, tools, keel };
    if let Some(only) = &args.only
        && !bench::FIGURES.iter().any(|name| name.starts_with(only.as_str()))
    {
        anyhow::bail!("no figure is named {only}; the figures: {}", bench::FIGURES.join(", "));
    }
    if !args.json {
        println!("{:<58} {:>12} {:>12}  {:<8} {:>7}  target", "figure", "keel", "baseline", "unit", "ratio");
    }
    let mut stdout = std::io::stdout();
    bench::all(&options, args.only.as_deref(), |figure| {
        let line = if args.json {
            serde_json::to_string(&figure).expect("figures serialize")
        } else {
            table_row(&figure)
        };
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    })?;
    Ok(())
}

fn table_row(figure: &Figure) -> String {
    let target = match (&figure.target, figure.met) {
        (Some(target), Some(true)) => format!("{target} (met)"),
        (Some(target), Some(false)) => format!("{target} (NOT met)"),
        _ => String::new(),
    };
    format!(
        "{:<58} {:>12.1} {:>12.1}  {:<8} {:>7.2}  {target}",
        figure.name, figure.keel, figure.baseline, figure.unit, figure.ratio
    )
}
