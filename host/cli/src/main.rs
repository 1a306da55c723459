//! `keel`: run sandboxed agent tools from the command line.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};

/// `print!` for what a command prints on standard output, returning a
/// failed write as a [`commands::StdoutError`] where `print!` panics: a
/// reader that went away (`keel run … | head`) ends the command, and
/// `main` ends the process quietly.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*).map_err(crate::commands::StdoutError)
    }};
}

/// [`out!`] with a newline, as `println!`.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err(crate::commands::StdoutError)
    }};
}

mod commands;
mod interrupt;
mod progress;
mod prompter;
mod telemetry;

/// Sandboxes are made on one worker thread and often dropped on another:
/// glibc malloc takes the first thread's arena lock for such a free, so two
/// workers contend on it; mimalloc frees across threads without a lock.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A WebAssembly plugin host for third-party agent tools.
#[derive(Parser)]
#[command(name = "keel", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure keel's per-call cost, throughput and memory against baselines.
    Bench(commands::bench::BenchArgs),
    /// Run a batch of tool calls and print the tool_result message.
    Run(commands::run::RunArgs),
    /// Run golden batch fixtures and compare their output byte for byte.
    Test(commands::test::TestArgs),
    /// Print the tool definitions exactly as an agent sends them to a model.
    List(commands::list::ListArgs),
    /// Serve the tools over the Model Context Protocol, on stdio or streamable HTTP.
    Serve(commands::serve::ServeArgs),
    /// Show one plugin as keel sees it: metadata, schema, answers, grants.
    Inspect(commands::inspect::InspectArgs),
    /// Create a tool crate that builds, tests and runs out of the box.
    New(commands::new::NewArgs),
    /// Pin the plugins a run would load in keel.lock, beside keel.toml.
    Lock(commands::lock::LockArgs),
    /// Push a built tool to an OCI registry as a WebAssembly artifact.
    Publish(commands::publish::PublishArgs),
    /// List the compile cache's entries and sizes, or prune it.
    Cache(commands::cache::CacheArgs),
}

fn main() -> ExitCode {
    let started = Instant::now();
    // The allocator maps its arenas for transparent huge pages and gives
    // freed memory back to the kernel after a few idle milliseconds; each
    // 2 MiB page touched again after that is zeroed whole, in the call that
    // touches it. With 4 KiB pages a call's allocations fault in only what
    // they use (HTTP calls/s with one client, README Performance). Children
    // inherit the flag; `keel bench --mcp-server` clears it for the server
    // it compares, which runs as it would anywhere else.
    #[cfg(target_os = "linux")]
    {
        // A kernel without the flag runs as before.
        let _ = rustix::thread::disable_transparent_huge_pages(true);
    }
    // A trap or a limit in a plugin is a wasmtime error, made on the call's
    // path; where `RUST_BACKTRACE` is set, each would capture a host
    // backtrace nobody reads. Library backtraces stay off unless asked for
    // by name; a panic still prints its own.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: no other thread has started yet.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
    let cli = Cli::parse();
    let telemetry = telemetry::init();
    let result = match cli.command {
        Command::Bench(args) => commands::bench::run(&args, started),
        Command::Run(args) => commands::run::run(&args),
        Command::Test(args) => commands::test::run(&args),
        Command::List(args) => commands::list::run(&args),
        Command::Serve(args) => commands::serve::run(&args),
        Command::Inspect(args) => commands::inspect::run(&args),
        Command::New(args) => commands::new::run(&args),
        Command::Lock(args) => commands::lock::run(&args),
        Command::Publish(args) => commands::publish::run(&args),
        Command::Cache(args) => commands::cache::run(&args),
    };
    // Before the process exits, so no span of the command is lost.
    telemetry.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Nobody is left to read the rest, nor an error: the status is the
        // one a shell gives a command that SIGPIPE ended (128 + 13).
        Err(error) if stdout_gone(&error) => ExitCode::from(141),
        // A stop signal: stderr says what it stopped (`keel: interrupted
        // while starting`), and the status is the one a shell gives a
        // command that signal ended.
        Err(ref error) if let Some(stopped) = interrupt::stopped(error) => {
            let _ = writeln!(std::io::stderr().lock(), "keel: {stopped}");
            ExitCode::from(stopped.signal.status())
        }
        Err(error) => {
            // Unlike `eprintln!`, no panic when stderr is gone: the command
            // failed, and its status says so all the same. An error may
            // quote the batch (an id): its lines keep their breaks, and
            // every other control character is escaped.
            let text = format!("{error:#}");
            let lines: Vec<_> = text.split('\n').map(commands::printable).collect();
            let _ = writeln!(std::io::stderr().lock(), "error: {}", lines.join("\n"));
            ExitCode::FAILURE
        }
    }
}

/// Whether `error` is a write to a standard output whose reader went away.
fn stdout_gone(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<commands::StdoutError>()
            .is_some_and(|error| error.0.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
