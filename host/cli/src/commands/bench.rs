//! `keel bench`: keel's speed and memory figures, each beside its baseline.

use std::path::PathBuf;
use std::time::{Duration, Instant};

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
    /// Compare keel with this stdio MCP server instead, run by `sh -c`
    /// (such as 'npx -y @modelcontextprotocol/server-everything'): the MCP
    /// figures of both, on the same client.
    #[arg(long, value_name = "COMMAND", requires = "tool")]
    mcp_server: Option<String>,
    /// The tool of `--mcp-server` to call.
    #[arg(long, value_name = "NAME", requires = "mcp_server")]
    tool: Option<String>,
    /// The arguments of each call of `--tool`, a JSON object.
    #[arg(long, value_name = "JSON", default_value = "{}", requires = "mcp_server")]
    arguments: String,
    /// Serve the baseline of the MCP figures on stdio instead: a native echo
    /// tool behind rmcp (`bench::mcp::NATIVE_ECHO_ARGS` spawns it).
    #[arg(long, hide = true)]
    serve_native_echo: bool,
    /// The same over streamable HTTP on a loopback port
    /// (`bench::http::NATIVE_ECHO_HTTP_ARGS`).
    #[arg(long, hide = true)]
    serve_native_echo_http: bool,
    /// Start a pool of the plugins in PLUGINS with the compile cache in
    /// CACHE, print the milliseconds since the process started, and exit:
    /// one start of the start-up figure (`bench::START_POOL_ARGS`).
    #[arg(long, hide = true, num_args = 2, value_names = ["PLUGINS", "CACHE"])]
    start_pool: Option<Vec<PathBuf>>,
    /// The same start, then time the first call of `echo` and the later
    /// ones (`bench::FIRST_CALL_ARGS`).
    #[arg(long, hide = true, num_args = 2, value_names = ["PLUGINS", "CACHE"])]
    first_call: Option<Vec<PathBuf>>,
}

/// Measure every figure and print it as it is measured. `started` is when
/// the process started.
pub fn run(args: &BenchArgs, started: Instant) -> Result<()> {
    if args.serve_native_echo {
        return Ok(bench::mcp::serve_native_echo()?);
    }
    if args.serve_native_echo_http {
        return Ok(bench::http::serve_native_echo_http()?);
    }
    if let Some([plugins, cache]) = args.first_call.as_deref() {
        let [first, later, after_idle, warm_up] = bench::first_call_in_process(plugins, cache, started)?;
        outln!("{first} {later} {after_idle} {warm_up}")?;
        std::process::exit(0);
    }
    if let Some([plugins, cache]) = args.start_pool.as_deref() {
        let (ms, _host, _runtime) = bench::start_pool(plugins, cache, started)?;
        outln!("{ms}")?;
        // What comes after the start is not measured, and need not be done.
        std::process::exit(0);
    }
    // A captured backtrace per wasmtime error would be measured too.
    // SAFETY: nothing else runs yet: the benchmarks start their threads below.
    unsafe { std::env::remove_var("RUST_BACKTRACE") };
    let tools = match &args.tools {
        // Absolute: the figures run `keel serve` on it from a directory of
        // their own.
        Some(dir) => {
            std::path::absolute(dir).with_context(|| format!("failed to resolve {}", dir.display()))?
        }
        None => super::run::bundled_tools()?,
    };
    let keel = std::env::current_exe().context("failed to find the keel binary")?;
    let options = BenchOptions { quick: args.quick, tools, keel };
    let compare = match (&args.mcp_server, &args.tool) {
        (Some(command), Some(tool)) => match serde_json::from_str(&args.arguments) {
            Ok(serde_json::Value::Object(arguments)) => Some((command, tool, arguments)),
            _ => anyhow::bail!("--arguments must be a JSON object, not {}", args.arguments),
        },
        _ => None,
    };
    if let Some(only) = &args.only
        && !bench::FIGURES.iter().any(|name| name.starts_with(only.as_str()) || only.starts_with(name))
    {
        anyhow::bail!("no figure is named {only}; the figures: {}", bench::FIGURES.join(", "));
    }
    // The table's head goes out with its first row: a run that fails
    // before any figure prints the error alone.
    let mut head = (!args.json).then(|| {
        format!(
            "{:<NAME_WIDTH$} {:>12} {:>12}  {:<8} {:>7}  target\n",
            "figure", "keel", "baseline", "unit", "ratio"
        )
    });
    // On a terminal, a line on stderr says what is being measured, and for
    // how long; a figure is printed with the line cleared. It is drawn once
    // a second, by a thread of its own that does no more: the figures
    // measured in this process hardly see it, and elsewhere it is not made.
    let spinner = crate::progress::line();
    if !spinner.is_hidden() {
        spinner.enable_steady_tick(Duration::from_secs(1));
    }
    let measuring = |group: &str| {
        spinner.set_message(format!("measuring {group}"));
        spinner.reset_elapsed();
    };
    // A figure nobody can read ends the measuring: its write's error is
    // kept here, and returned as the command's.
    let mut unwritten = None;
    let print = |figure: Figure| {
        let line = if args.json {
            serde_json::to_string(&figure).expect("figures serialize")
        } else {
            head.take().unwrap_or_default() + &table_row(&figure)
        };
        spinner.suspend(|| outln!("{line}")).map_err(|error| {
            let kind = error.0.kind();
            unwritten = Some(error);
            bench::Error::io("write", "standard output", kind.into())
        })
    };
    let measured = match compare {
        Some((command, tool, arguments)) => {
            measuring(&format!("keel serve and `{command}`"));
            bench::mcp::compare(&options, command, tool, &arguments, print)
        }
        None => bench::all(&options, args.only.as_deref(), print, measuring),
    };
    spinner.finish_and_clear();
    match unwritten {
        Some(error) => Err(error.into()),
        None => Ok(measured?),
    }
}

/// The width of the table's first column, the figure's name.
const NAME_WIDTH: usize = 58;

/// A figure as a row of the table. A name wider than its column has a line
/// of its own, and its numbers go on the next, in their columns.
fn table_row(figure: &Figure) -> String {
    let target = match (&figure.target, figure.met) {
        (Some(target), Some(true)) => format!("{target} (met)"),
        (Some(target), Some(false)) => format!("{target} (NOT met)"),
        _ => String::new(),
    };
    let numbers = format!(
        "{:>12.1} {:>12.1}  {:<8} {:>7.2}  {target}",
        figure.keel, figure.baseline, figure.unit, figure.ratio
    );
    if figure.name.chars().count() > NAME_WIDTH {
        format!("{}\n{:NAME_WIDTH$} {numbers}", figure.name, "")
    } else {
        format!("{:<NAME_WIDTH$} {numbers}", figure.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(name: &str) -> Figure {
        let target = Some("ratio <= 1.25".to_string());
        Figure {
            name: name.into(),
            keel: 18.1,
            baseline: 14.4,
            unit: "µs",
            ratio: 1.2569,
            target,
            met: Some(false),
        }
    }

    #[test]
    fn a_row_keeps_its_numbers_in_their_columns_whatever_its_name() {
        let short = table_row(&figure("per_call_overhead (keel / floor)"));
        assert_eq!(
            short,
            "per_call_overhead (keel / floor)                                   18.1         14.4  µs          1.26  \
             ratio <= 1.25 (NOT met)"
        );
        let long =
            table_row(&figure(&format!("mcp_stdio_round_trip_p50 (keel serve echo / {})", "x".repeat(40))));
        let (name, numbers) = long.split_once('\n').expect("a long name has a line of its own");
        assert!(name.starts_with("mcp_stdio_round_trip_p50 (keel serve echo / xxx"), "{long}");
        assert_eq!(numbers, format!("{:NAME_WIDTH$}{}", "", &short[NAME_WIDTH..]));
    }
}
