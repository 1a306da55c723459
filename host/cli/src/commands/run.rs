//! `keel run`: run a batch of tool calls.
//!
//! Beside the message on stdout it can write what the run did: `--trace`
//! for Perfetto ([`trace`]), `--timeline` as one HTML page ([`timeline`]);
//! and it ends with a line on stderr, or a table with `--stats` ([`stats`]).

pub mod record;
mod stats;
mod timeline;
pub mod trace;

use std::collections::HashMap;
use std::io::{IsTerminal as _, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use self::record::Recording;
use super::printable;
use crate::interrupt::{Signals, Stopped};
use crate::prompter::TerminalPrompter;
use anyhow::{Context as _, Result, bail};
use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use keel_host::Limits;
use keel_host::batch::{openai_messages, parse_batch_bytes, user_message};
use keel_host::config::Config;
use keel_host::load::lock::LOCK_FILE_NAME;
use keel_host::load::oci::{self, Pulled, Registries};
use keel_host::load::{Lock, Pins, Runtime, default_cache_dir};
use keel_host::permissions::KeelFile;
use keel_host::{BatchRun, Event, Host, HostBuilder};

/// Arguments of `keel run`.
#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    host: HostArgs,
    /// Print the run's events as JSON lines on stdout instead of the final
    /// message.
    #[arg(long)]
    events: bool,
    /// The shape of the printed results: the Anthropic user message of
    /// `tool_result` blocks, or the OpenAI Chat Completions `tool` messages
    /// (text only: an image is named in a line of text).
    #[arg(long, value_enum, default_value_t = ResultFormat::Anthropic, conflicts_with = "events")]
    format: ResultFormat,
    /// Also write the run to this file in the Chrome trace-event format,
    /// which Perfetto (ui.perfetto.dev) and chrome://tracing open.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Also write the run to this file as a self-contained HTML timeline.
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// End with a table of every call's figures on stderr instead of the
    /// one-line summary.
    #[arg(long)]
    stats: bool,
    /// A JSON file holding an array of tool_use blocks or an assistant
    /// message; `-` reads standard input.
    #[arg(value_name = "BATCH")]
    batch: String,
}

/// The shapes `keel run` prints its results in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ResultFormat {
    /// An Anthropic Messages user message of `tool_result` blocks.
    Anthropic,
    /// OpenAI Chat Completions `tool` messages, one per result.
    Openai,
}

/// The flags every command that builds a host shares.
#[derive(Args, Clone)]
pub struct HostArgs {
    /// A `.wasm` tool, a directory of them, or an OCI artifact
    /// (`oci://REGISTRY/REPO:TAG` or `…@sha256:DIGEST`); repeatable.
    /// Default: the example tools bundled with this build.
    #[arg(long = "plugins", value_name = "PATH")]
    pub plugins: Vec<PathBuf>,
    /// Refuse any plugin `keel.lock` does not name, and any entry of it
    /// whose plugin this run does not load.
    #[arg(long)]
    pub locked: bool,
    /// The directory the tools work in. Default: the current directory.
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// The configuration file. Default: `keel.toml` in the current
    /// directory, when there is one.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Where compiled tools are cached. Default: `$KEEL_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/keel`, else `~/.cache/keel`.
    #[arg(long, value_name = "DIR", conflicts_with = "no_cache")]
    pub cache_dir: Option<PathBuf>,
    /// Compile every tool afresh and cache nothing.
    #[arg(long)]
    pub no_cache: bool,
    /// The plugin files and pins, found once.
    #[arg(skip)]
    resolved: std::sync::OnceLock<Arc<Resolved>>,
    /// With `--no-cache`, where pulled artifacts are kept: removed when the
    /// last copy of the flags is dropped, as the command ends.
    #[arg(skip)]
    pulled_dir: std::sync::OnceLock<Arc<tempfile::TempDir>>,
}

/// The `--plugins` of a run made files, and what they are checked against.
pub struct Resolved {
    /// The plugin paths: those given, with each `oci://` artifact pulled.
    pub paths: Vec<PathBuf>,
    /// The pins, when there are any to check (a lock, `--locked`, a
    /// `sha256` key) or the run is for `keel lock`.
    pub pins: Option<Arc<Pins>>,
    /// The artifacts pulled: each reference with what it gave.
    pub pulled: Vec<(String, Pulled)>,
}

/// Run the batch; print the user message of tool_result blocks, or the
/// events as JSON lines with `--events`. Ctrl-C or `SIGTERM` interrupts the
/// batch: calls not started are not started, `cancel` calls stop, `block`
/// calls finish. Then write the trace and the timeline asked for, and say
/// on stderr how the batch went; an interrupted run then fails with
/// [`Stopped`], so that its exit status says so.
pub fn run(args: &RunArgs) -> Result<()> {
    let (config, config_path) = args.host.config_and_path()?;
    let (bytes, origin) = read_batch(&args.batch)?;
    let uses = parse_batch_bytes(&bytes, &origin, config.limits.apply(Limits::default()).input)?;
    // A file that cannot be written is found before the batch runs, and so
    // is a report that would replace what the run reads, or the other report.
    let inputs = || {
        let mut inputs = args.host.inputs(config_path.as_deref())?;
        if args.batch != "-" {
            inputs.push((PathBuf::from(&args.batch), "the batch"));
        }
        Ok(inputs)
    };
    let reports = [("--trace", "trace", &args.trace), ("--timeline", "timeline", &args.timeline)];
    let [trace_target, timeline_target]: [Option<trace::Target>; 2] = trace::check_reports(&reports, inputs)?
        .try_into()
        .unwrap_or_else(|_| unreachable!("a target or none per report"));
    let mut recording = Recording::of_batch(uses.iter().map(|call| (call.id.as_str(), call.name.as_str())));
    // What the tools reported is drawn only by the reports.
    if trace_target.is_none() && timeline_target.is_none() {
        recording = recording.without_reports();
    }
    let runtime = keel_cli::call_runtime().build()?;
    let outcome = runtime.block_on(async {
        // A stop signal while the plugins load stops the run before any
        // call; once the batch began, it interrupts the batch.
        let mut signals = Signals::listen()?;
        let host = signals
            .or(async {
                let mut builder = args.host.builder_without_config()?.config(config);
                // With someone at the keyboard a call that needs approval is
                // asked about; without, it is denied saying so.
                if let Some(prompter) = TerminalPrompter::if_interactive() {
                    builder = builder.prompter(std::sync::Arc::new(prompter));
                }
                Ok(crate::progress::shown(crate::progress::LOADING, builder.build()).await?)
            })
            .await?;
        let started = Instant::now();
        let mut run = host.start_batch(uses, keel_host::context::initial());
        let interrupter = run.interrupter();
        let stopped_by = tokio::spawn(async move {
            let signal = signals.received().await;
            interrupter.interrupt();
            signal
        });
        let results = if args.events {
            if let Err(error) = print_events(&mut run, &mut recording).await {
                // Nobody reads the rest: the calls still running are
                // interrupted and end before the runtime does.
                run.interrupter().interrupt();
                run.finish().await;
                return Err(error);
            }
            run.finish().await.results
        } else {
            let display = std::io::stderr().is_terminal().then(LiveProgress::new);
            while let Some(event) = run.next_event().await {
                recording.record(&event);
                if let Some(display) = &display {
                    display.show(&event);
                }
            }
            let outcome = run.finish().await;
            let message = match args.format {
                ResultFormat::Anthropic => user_message(&outcome.results),
                ResultFormat::Openai => serde_json::Value::from(openai_messages(&outcome.results)),
            };
            outln!("{}", serde_json::to_string_pretty(&message)?)?;
            outcome.results
        };
        let wall = started.elapsed();
        // A signal that comes once the batch ended interrupted nothing: it
        // ends keel at once, the reports unwritten.
        crate::interrupt::exit_on_signal(|signal| {
            (format!("keel: {}", Stopped { signal, while_starting: false }), signal.status())
        })?;
        let stopped_by = if stopped_by.is_finished() {
            stopped_by.await.ok()
        } else {
            stopped_by.abort();
            None
        };
        host.wait_for_cache_upkeep();
        anyhow::Ok((results, wall, stopped_by))
    });
    let (results, wall, stopped_by) =
        crate::interrupt::end_with(runtime, outcome, |(_, _, stopped_by)| stopped_by.is_some())?;
    let errors = results.iter().filter(|result| result.is_error).count();
    let wall_us = u64::try_from(wall.as_micros()).unwrap_or(u64::MAX);
    let summary = stats::summary(&recording, results.len(), errors, wall_us);
    // Each report is tried whatever became of the other, and one that
    // cannot be written is said after the summary.
    let mut failed = Vec::new();
    if let Some(target) = &trace_target
        && let Err(error) = target.write(&trace::trace(&recording, "keel run"))
    {
        failed.push(error);
    }
    if let Some(target) = &timeline_target {
        let title = format!("keel run {}", args.batch);
        if let Err(error) = target.write(timeline::page(&recording, &title, &summary).as_bytes()) {
            failed.push(error);
        }
    }
    if args.stats {
        eprint!("{}", stats::table(&recording));
    }
    eprintln!("{}", printable(&summary));
    let last = failed.pop();
    for error in failed.iter().chain(stopped_by.is_some().then_some(()).and(last.as_ref())) {
        eprintln!("error: {}", printable(&format!("{error:#}")));
    }
    match (stopped_by, last) {
        (Some(signal), _) => Err(Stopped { signal, while_starting: false }.into()),
        (None, Some(error)) => Err(error),
        (None, None) => Ok(()),
    }
}

async fn print_events(run: &mut BatchRun, recording: &mut Recording) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    while let Some(event) = run.next_event().await {
        recording.record(&event);
        serde_json::to_writer(&mut stdout, &event)
            .map_err(std::io::Error::from)
            .and_then(|()| stdout.write_all(b"\n"))
            .and_then(|()| stdout.flush())
            .map_err(super::StdoutError)?;
    }
    Ok(())
}

/// One line per running call on stderr: a spinner with the tool's name and
/// what it is doing (its activity), and its latest progress: a bar when a
/// report carries a count and a total, else the report's message. What a
/// model or a tool wrote is shown with its control characters escaped
/// ([`printable`]).
struct LiveProgress {
    bars: MultiProgress,
    running: std::sync::Mutex<HashMap<String, (ProgressBar, Option<String>)>>,
    spinner: ProgressStyle,
    bar: ProgressStyle,
}

impl LiveProgress {
    fn new() -> Self {
        let spinner = ProgressStyle::with_template("{spinner} {prefix:.bold} {msg} ({elapsed})")
            .expect("the template is valid");
        let bar =
            ProgressStyle::with_template("{spinner} {prefix:.bold} [{bar:24}] {pos}/{len} {msg} ({elapsed})")
                .expect("the template is valid")
                .progress_chars("=> ");
        LiveProgress { bars: MultiProgress::new(), running: Default::default(), spinner, bar }
    }

    fn show(&self, event: &Event) {
        let mut running = self.running.lock().expect("the display is not poisoned");
        match event {
            Event::CallStarted { tool_use_id, tool, activity } => {
                let bar = self.bars.add(ProgressBar::new_spinner().with_style(self.spinner.clone()));
                bar.set_prefix(printable(tool).into_owned());
                bar.set_message(printable(activity.as_deref().unwrap_or_default()).into_owned());
                bar.enable_steady_tick(Duration::from_millis(100));
                running.insert(tool_use_id.clone(), (bar, activity.clone()));
            }
            Event::Progress { tool_use_id, data } => {
                if let Some((bar, activity)) = running.get(tool_use_id) {
                    let shown = Shown::of(activity.as_deref(), data);
                    if let Some((position, length)) = shown.count {
                        bar.set_style(self.bar.clone());
                        bar.set_length(length);
                        bar.set_position(position);
                    }
                    bar.set_message(printable(&shown.message).into_owned());
                }
            }
            Event::NetworkRefused { tool_use_id, method, url, reason } => {
                if let Some((bar, _)) = running.get(tool_use_id) {
                    bar.println(printable(&format!("refused {method} {url}: {reason}")));
                }
            }
            Event::CallFinished { tool_use_id, is_error, .. } => {
                if let Some((bar, _)) = running.remove(tool_use_id) {
                    // A failed call's bar stays where it stopped.
                    if *is_error {
                        bar.abandon_with_message("failed");
                    } else {
                        bar.finish_with_message("done");
                    }
                }
            }
            _ => {}
        }
    }
}

/// How far shown raw JSON goes before it is cut.
const SHOWN_JSON_CHARS: usize = 60;

/// What a running call's line shows for one progress report.
#[derive(Debug, PartialEq)]
struct Shown {
    /// The count so far and the total, for a bar.
    count: Option<(u64, u64)>,
    /// The text beside it.
    message: String,
}

impl Shown {
    /// The line for `data`, reported by a call doing `activity`: MCP's
    /// shape (`{"progress": n, "total": m, "message": …}`) makes a bar with
    /// its message; a report with only a `message`, or a string, shows that;
    /// any other is not words for a person, so the activity alone stays, and
    /// only a call with no activity shows the report's JSON text, shortened.
    /// The activity stays in front.
    fn of(activity: Option<&str>, data: &serde_json::Value) -> Self {
        let number = |key: &str| data.get(key).and_then(serde_json::Value::as_f64);
        let count = number("progress").zip(number("total")).map(|(done, total)| (done as u64, total as u64));
        let said = match (data.get("message").and_then(serde_json::Value::as_str), data) {
            (Some(message), _) => Some(message.to_string()),
            (None, serde_json::Value::String(text)) => Some(text.clone()),
            (None, _) if count.is_some() || number("progress").is_some() => None,
            (None, _) if activity.is_some() => None,
            (None, other) => Some(record::shorten(&other.to_string(), SHOWN_JSON_CHARS)),
        };
        let message =
            [activity.map(str::to_string), said].into_iter().flatten().collect::<Vec<_>>().join(" · ");
        Shown { count, message }
    }
}

fn read_batch(batch: &str) -> Result<(Vec<u8>, String)> {
    if batch == "-" {
        let mut bytes = Vec::new();
        std::io::stdin().read_to_end(&mut bytes).context("failed to read batch from standard input")?;
        return Ok((bytes, "<stdin>".into()));
    }
    let bytes = std::fs::read(batch).with_context(|| format!("failed to read batch {batch}"))?;
    Ok((bytes, batch.to_string()))
}

impl HostArgs {
    /// A host builder for these flags: config, plugins (or the bundled
    /// tools), workspace and cache.
    pub fn builder(&self) -> Result<HostBuilder> {
        Ok(self.builder_without_config()?.config(self.config()?))
    }

    /// The configuration: `--config PATH`, else `keel.toml` in the current
    /// directory, else the defaults.
    pub fn config(&self) -> Result<Config> {
        Ok(self.config_and_path()?.0)
    }

    /// [`HostArgs::config`], with the path of the file it was read from,
    /// if any.
    pub fn config_and_path(&self) -> Result<(Config, Option<PathBuf>)> {
        Ok(Config::discover(self.config.as_deref(), &std::env::current_dir()?)?)
    }

    /// The files a command of these flags reads, each with what it is: the
    /// configuration at `config`, `keel.lock`, and every plugin file given
    /// as a path or found in a folder given (the bundled tools' without
    /// `--plugins`). A folder that cannot be listed adds none: loading it
    /// fails naming it.
    pub fn inputs(&self, config: Option<&Path>) -> Result<Vec<(PathBuf, &'static str)>> {
        let mut inputs: Vec<(PathBuf, &'static str)> =
            config.map(|path| (path.to_path_buf(), "the configuration")).into_iter().collect();
        inputs.push((self.lock_path()?, "the lock file"));
        let given = if self.plugins.is_empty() {
            bundled_tools().into_iter().collect()
        } else {
            self.plugins.clone()
        };
        for path in given.iter().filter(|path| !oci::is_reference(&path.to_string_lossy())) {
            inputs.push((path.clone(), "a plugin"));
            if path.is_dir() {
                let files = keel_host::load::plugin_files(path).unwrap_or_default();
                inputs.extend(files.into_iter().map(|file| (file, "a plugin")));
            }
        }
        Ok(inputs)
    }

    /// A host builder for these flags, leaving the configuration to the
    /// caller.
    pub fn builder_without_config(&self) -> Result<HostBuilder> {
        let resolved = self.resolved()?;
        let mut builder = self.builder_without_plugins();
        for path in &resolved.paths {
            builder = builder.plugins(path);
        }
        if let Some(pins) = &resolved.pins {
            builder = builder.pins(pins.clone());
        }
        Ok(builder)
    }

    /// Where the plugins are: the `--plugins` paths, each `oci://` artifact
    /// pulled, else the bundled tools. A path that does not exist is an
    /// error naming it.
    pub fn plugin_paths(&self) -> Result<Vec<PathBuf>> {
        Ok(self.resolved()?.paths.clone())
    }

    /// The engine for plugins loaded ahead of a host (`keel serve`'s): the
    /// compile cache at `cache` and the pins.
    pub fn runtime(&self, limits: &Limits, cache: Option<&Path>) -> Result<Runtime> {
        let runtime = Runtime::new(limits, cache.map(Path::to_path_buf))?;
        Ok(match &self.resolved()?.pins {
            Some(pins) => runtime.with_pins(pins.clone()),
            None => runtime,
        })
    }

    /// The plugin files and pins, found on first use.
    pub fn resolved(&self) -> Result<Arc<Resolved>> {
        if let Some(resolved) = self.resolved.get() {
            return Ok(resolved.clone());
        }
        let resolved = Arc::new(self.resolve(false)?);
        Ok(self.resolved.get_or_init(|| resolved).clone())
    }

    /// Where `keel.lock` is: beside `keel.toml` (`--config PATH`, else the
    /// current directory's).
    pub fn lock_path(&self) -> Result<PathBuf> {
        let dir = match self.config.as_deref().and_then(Path::parent) {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => std::env::current_dir()?,
        };
        Ok(dir.join(LOCK_FILE_NAME))
    }

    /// Find the plugin files and pins. `for_lock` is `keel lock`'s: tags
    /// are resolved afresh, the lock there is not read, and the pins record
    /// every plugin's digest.
    pub fn resolve(&self, for_lock: bool) -> Result<Resolved> {
        let config = self.config()?;
        let lock_path = self.lock_path()?;
        let lock = if for_lock { None } else { Lock::load(&lock_path)? };
        let mut paths = Vec::new();
        let mut pulled = Vec::new();
        let sources: Vec<String> = if self.plugins.is_empty() {
            vec![bundled_tools()?.to_string_lossy().into_owned()]
        } else {
            self.plugins.iter().map(|path| path.to_string_lossy().into_owned()).collect()
        };
        for source in sources {
            if oci::is_reference(&source) {
                let pinned = lock.as_ref().and_then(|lock| {
                    lock.plugins
                        .iter()
                        .find(|entry| entry.source == source)
                        .and_then(|entry| entry.resolved.clone())
                });
                let resolve = match (&pinned, for_lock) {
                    (Some(digest), _) => oci::Resolve::Pinned(digest),
                    (None, true) => oci::Resolve::Fresh,
                    (None, false) => oci::Resolve::Cached,
                };
                let artifact = self.pull(&config, &source, resolve)?;
                paths.push(artifact.file.clone());
                pulled.push((source, artifact));
                continue;
            }
            let path = PathBuf::from(&source);
            if !path.exists() {
                bail!(
                    "no plugin at {}; pass a tool's .wasm component or a directory of them \
                     (cargo puts them in target/wasm32-wasip2/release/)",
                    path.display()
                );
            }
            paths.push(path);
        }
        let pinned_by_config = config.plugins.values().any(|section| section.sha256.is_some());
        let pins = if for_lock || lock.is_some() || self.locked || pinned_by_config {
            let mut pins = Pins::new(lock_path, lock, self.locked, &config.plugins)?;
            for (source, artifact) in &pulled {
                pins = pins.with_source(artifact.file.clone(), source.clone());
            }
            Some(Arc::new(pins))
        } else {
            None
        };
        Ok(Resolved { paths, pins, pulled })
    }

    /// Pull `reference` into the OCI store beside the compile cache, on a
    /// thread of its own so that it works inside a runtime or outside one.
    fn pull(&self, config: &Config, reference: &str, resolve: oci::Resolve<'_>) -> Result<Pulled> {
        let registries = Registries::new(&self.oci_dir()?, &config.registries.insecure);
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                    let pull = async { anyhow::Ok(registries.pull(reference, resolve).await?) };
                    // A stop signal stops a pull as it stops the rest of a
                    // start.
                    let pulled = runtime.block_on(async {
                        Signals::listen()?
                            .or(crate::progress::shown(format!("pulling {reference}"), pull))
                            .await
                    });
                    crate::interrupt::end(runtime, pulled)
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Where pulled artifacts are kept: the compile cache's directory, or
    /// with `--no-cache` a temporary one of this process.
    pub fn oci_dir(&self) -> Result<PathBuf> {
        if self.no_cache {
            if let Some(dir) = self.pulled_dir.get() {
                return Ok(dir.path().to_path_buf());
            }
            let dir = Arc::new(tempfile::Builder::new().prefix("keel-oci-").tempdir()?);
            return Ok(self.pulled_dir.get_or_init(|| dir).path().to_path_buf());
        }
        match self.cache_dir.clone().or_else(default_cache_dir) {
            Some(dir) => Ok(dir),
            None => bail!("no place to keep pulled plugins: set KEEL_CACHE_DIR or pass --cache-dir"),
        }
    }

    /// [`HostArgs::builder_without_config`] with no plugins: workspace and
    /// cache only, and keel's own files to guard from the tools: the
    /// configuration (`--config`, else `keel.toml` here, even missing), the
    /// lock beside it, and the plugin paths given (else the bundled tools).
    pub fn builder_without_plugins(&self) -> HostBuilder {
        let mut builder = Host::builder();
        if let Some(dir) = &self.workspace {
            builder = builder.workspace(dir);
        }
        let config = self.config.clone().unwrap_or_else(|| PathBuf::from(keel_host::config::FILE_NAME));
        builder = builder.keel_file(KeelFile::Config, config);
        if let Ok(lock) = self.lock_path() {
            builder = builder.keel_file(KeelFile::Lock, lock);
        }
        let plugins = if self.plugins.is_empty() {
            bundled_tools().into_iter().collect()
        } else {
            self.plugins.clone()
        };
        for path in plugins.into_iter().filter(|path| !oci::is_reference(&path.to_string_lossy())) {
            builder = builder.keel_file(KeelFile::Plugins, path);
        }
        if self.no_cache {
            builder = builder.cache_dir(None);
        } else if let Some(dir) = &self.cache_dir {
            builder = builder.cache_dir(Some(dir.clone()));
        }
        builder
    }
}

/// The example tools built with this binary, wherever the build put them.
pub fn bundled_tools() -> Result<PathBuf> {
    let Some(dir) = option_env!("KEEL_BUNDLED_TOOLS_DIR") else {
        bail!("this build of keel has no bundled tools; pass --plugins PATH");
    };
    let dir = PathBuf::from(dir);
    if !dir.is_dir() {
        bail!("the bundled tools are missing from {}; rebuild keel, or pass --plugins PATH", dir.display());
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_mcp_report_makes_a_bar_beside_the_activity() {
        let shown = Shown::of(Some("Copying"), &json!({ "progress": 3, "total": 8, "message": "a.txt" }));
        assert_eq!(shown, Shown { count: Some((3, 8)), message: "Copying · a.txt".into() });
        let shown = Shown::of(None, &json!({ "progress": 3, "total": 8 }));
        assert_eq!(shown, Shown { count: Some((3, 8)), message: String::new() });
    }

    #[test]
    fn a_report_without_a_count_shows_its_message_else_the_activity_else_its_json_shortened() {
        assert_eq!(Shown::of(None, &json!({ "message": "indexing" })).message, "indexing");
        assert_eq!(Shown::of(Some("Sleeping 4000 ms"), &json!("half")).message, "Sleeping 4000 ms · half");
        assert_eq!(Shown::of(None, &json!({ "step": 2, "steps": 8 })).message, r#"{"step":2,"steps":8}"#);
        let sleeping = Shown::of(Some("Sleeping 4000 ms"), &json!({ "step": 2, "steps": 8 }));
        assert_eq!(sleeping, Shown { count: None, message: "Sleeping 4000 ms".into() });
        let long = json!({ "files": "x".repeat(100) });
        let shown = Shown::of(None, &long).message;
        assert_eq!(shown.chars().count(), SHOWN_JSON_CHARS + 1);
        assert!(shown.ends_with('…'));
    }
}
