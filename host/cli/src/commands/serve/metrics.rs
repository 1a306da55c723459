//! `GET /metrics`: what a server is doing, in the Prometheus text format
//! (OpenMetrics 1.0), for a scraper to watch (README, "Over HTTP").
//!
//! A call is counted from the events the library sends it (the lean sink,
//! [`keel_host::EventSink::lean`]): `call_started` moves it from waiting to
//! in flight, `call_finished` ends it with its figures (outcome, steps,
//! fuel). A call refused at planning has no `call_finished`: it is counted
//! from its result when [`CallMeter::finish`] is called, and a call whose
//! request went away before that when its meter is dropped, so the gauges
//! come back to zero however a call ends.
//!
//! Counting is atomics and a read lock on a label map that holds the entry
//! already after a tool's first call; a scrape encodes under the same read
//! locks and never waits on a call.
//!
//! On the `--http` listener `/metrics` is behind the bearer token like
//! `/mcp`; `--metrics-addr` serves it alone, without a token, on a loopback
//! address of its own (`http.rs`, `serve_metrics`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use anyhow::Result;
use clap::Args;
use keel_host::events::CallFigures;
use keel_host::{Event, ToolResult};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::Shelf;

/// The path metrics are served on.
pub const METRICS_PATH: &str = "/metrics";

/// The content type of what [`Endpoint::render`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The label of a call to a name the pool does not know: a name a client
/// made up is not a label of its own, or a client could grow the metrics
/// without bound. No tool is named so: a plugin's name is letters, digits,
/// `_` and `-` (`load/plugin.rs` checks it), and so is every built-in's.
const UNKNOWN_TOOL: &str = "(unknown)";

/// The upper bounds of the duration histogram's buckets, in seconds: 1 ms to
/// about 65 s, doubling. A native call is a millisecond or less, a plugin
/// call tens of milliseconds, a call that waits on the network seconds; the
/// last bucket before `+Inf` is past the default 30 s deadline, so only a
/// long wait for a call's turn lands in `+Inf`.
fn duration_buckets() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 17))
}

/// The flag of a listener of its own for `/metrics`.
#[derive(Args, Clone, Debug)]
pub struct MetricsArgs {
    /// Serve `/metrics` alone, without a bearer token, on this loopback
    /// address (such as `127.0.0.1:9464`), instead of on the `--http`
    /// listener behind its token. On stdio, the only way to serve them.
    #[arg(long, value_name = "ADDR", value_parser = loopback_addr)]
    pub metrics_addr: Option<SocketAddr>,
}

/// `--metrics-addr`: an address, and a loopback one, since what it serves
/// asks no token.
fn loopback_addr(text: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr =
        text.parse().map_err(|_| format!("{text} is not an address such as 127.0.0.1:9464"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{addr} is not a loopback address: metrics served there would ask no token; \
             give a loopback address such as 127.0.0.1:{port}, or leave --metrics-addr out \
             to serve /metrics on the --http listener behind its token",
            port = addr.port()
        ));
    }
    Ok(addr)
}

/// A tool's name as a label value, shared by every label set of its call.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct ToolName(Arc<str>);

impl EncodeLabelValue for ToolName {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, &self.0)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: ToolName,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: ToolName,
    outcome: &'static str,
}

/// Every metric of one server, for its whole life, reloads included.
pub struct Metrics {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    durations: Family<ToolLabels, Histogram>,
    fuel: Family<ToolLabels, Counter>,
    refused: Family<ToolLabels, Counter>,
    waiting: Gauge,
    in_flight: Gauge,
    plugins: Gauge,
    reloads: Counter,
    load_failures: Counter,
    persisted: Counter,
    /// Results persisted by the hosts a reload replaced, once their last
    /// call was done.
    persisted_before: AtomicU64,
    /// Held by a scrape while it brings `persisted` up to date, so two at
    /// once do not both add the same results. No call takes it.
    scraping: std::sync::Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// The metrics, registered under the `keel_` prefix, all at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("keel");
        let calls = Family::<CallLabels, Counter>::default();
        registry.register("calls", "Calls answered, by tool and outcome", calls.clone());
        let durations =
            Family::<ToolLabels, Histogram>::new_with_constructor(duration_buckets as fn() -> Histogram);
        registry.register(
            "call_duration_seconds",
            "Time from a call's first step to its last (planning to result budgets, a wait for its turn \
             included), by tool; calls refused at planning are not in it",
            durations.clone(),
        );
        let fuel = Family::<ToolLabels, Counter>::default();
        registry.register("fuel_burned", "WebAssembly fuel burned by calls, by tool", fuel.clone());
        let refused = Family::<ToolLabels, Counter>::default();
        registry.register(
            "network_refused",
            "Outbound requests refused before any byte was sent, by tool",
            refused.clone(),
        );
        let waiting = Gauge::default();
        registry.register("calls_waiting", "Calls arrived and not yet started", waiting.clone());
        let in_flight = Gauge::default();
        registry.register("calls_in_flight", "Calls started and not yet finished", in_flight.clone());
        let plugins = Gauge::default();
        registry.register("plugins_loaded", "Plugins served now", plugins.clone());
        let reloads = Counter::default();
        registry.register(
            "plugin_reloads",
            "Times a changed set of plugins was put in place",
            reloads.clone(),
        );
        let load_failures = Counter::default();
        registry.register(
            "plugin_load_failures",
            "Plugin files that failed to load while serving, and reloaded pools that could not be built",
            load_failures.clone(),
        );
        let persisted = Counter::default();
        registry.register("results_persisted", "Results the budgets persisted to files", persisted.clone());
        Metrics {
            registry,
            calls,
            durations,
            fuel,
            refused,
            waiting,
            in_flight,
            plugins,
            reloads,
            load_failures,
            persisted,
            persisted_before: AtomicU64::new(0),
            scraping: std::sync::Mutex::new(()),
        }
    }

    /// A call arrived for `tool`, the real name of the tool it calls (`None`:
    /// no tool of the pool): it waits until the library starts it.
    pub fn arrive(self: &Arc<Self>, tool: Option<&str>) -> CallMeter {
        self.waiting.inc();
        CallMeter {
            metrics: self.clone(),
            tool: ToolName(Arc::from(tool.unwrap_or(UNKNOWN_TOOL))),
            state: AtomicU8::new(WAITING),
        }
    }

    /// `count` plugins are served now.
    pub fn plugins_loaded(&self, count: usize) {
        self.plugins.set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// A changed set of plugins was put in place.
    pub fn reloaded(&self) {
        self.reloads.inc();
    }

    /// A plugin file failed to load, or a reloaded pool could not be built.
    pub fn load_failed(&self) {
        self.load_failures.inc();
    }

    /// A host a reload replaced is gone, having persisted `results` in all.
    pub fn retire(&self, results: u64) {
        self.persisted_before.fetch_add(results, Ordering::Relaxed);
    }

    fn count(&self, tool: &ToolName, outcome: &'static str) {
        self.calls.get_or_create(&CallLabels { tool: tool.clone(), outcome }).inc();
    }
}

/// A call's course as its meter has seen it.
const WAITING: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;

/// One call, from its arrival to its count.
pub struct CallMeter {
    metrics: Arc<Metrics>,
    tool: ToolName,
    state: AtomicU8,
}

impl CallMeter {
    /// Take what `event` tells of the call.
    pub fn see(&self, event: &Event) {
        match event {
            Event::CallStarted { .. }
                if self
                    .state
                    .compare_exchange(WAITING, RUNNING, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok() =>
            {
                self.metrics.waiting.dec();
                self.metrics.in_flight.inc();
            }
            Event::CallFinished { is_error, figures, .. } if self.leave() => {
                self.finished(*is_error, figures.as_deref());
            }
            Event::NetworkRefused { .. } => {
                self.metrics.refused.get_or_create(&ToolLabels { tool: self.tool.clone() }).inc();
            }
            _ => {}
        }
    }

    /// The call's result is in. A call the library did not finish (refused
    /// at planning, or interrupted before it was planned) is counted here:
    /// as `interrupted` if its request was cancelled, else as `invalid`.
    pub fn finish(&self, result: &ToolResult, cancelled: bool) {
        if self.leave() {
            let outcome = match (cancelled, result.is_error) {
                (true, _) => "interrupted",
                (false, true) => "invalid",
                (false, false) => "ok",
            };
            self.metrics.count(&self.tool, outcome);
        }
    }

    /// Leave the gauge the call is counted in; whether it was not done yet.
    fn leave(&self) -> bool {
        match self.state.swap(DONE, Ordering::Relaxed) {
            WAITING => self.metrics.waiting.dec(),
            RUNNING => self.metrics.in_flight.dec(),
            _ => return false,
        };
        true
    }

    fn finished(&self, is_error: bool, figures: Option<&CallFigures>) {
        let Some(figures) = figures else {
            self.metrics.count(&self.tool, if is_error { "error" } else { "ok" });
            return;
        };
        self.metrics.count(&self.tool, figures.outcome.as_str());
        let labels = ToolLabels { tool: self.tool.clone() };
        let micros = figures.end_us().saturating_sub(figures.start_us());
        // Microseconds as f64 are exact far beyond any call's length.
        #[expect(clippy::cast_precision_loss, reason = "exact below 2^53 µs, some 285 years")]
        self.metrics.durations.get_or_create(&labels).observe(micros as f64 / 1e6);
        if let Some(fuel) = figures.fuel {
            self.metrics.fuel.get_or_create(&labels).inc_by(fuel);
        }
    }
}

impl Drop for CallMeter {
    /// A call whose request went away before its result (the client gone,
    /// the request cancelled) is counted as interrupted.
    fn drop(&mut self) {
        if self.leave() {
            self.metrics.count(&self.tool, "interrupted");
        }
    }
}

/// The metrics and the pool they read results persisted from at scrape
/// time: what `/metrics` answers with.
#[derive(Clone)]
pub struct Endpoint {
    metrics: Arc<Metrics>,
    live: Shelf,
}

impl Endpoint {
    /// `metrics`, with results persisted read from the pool `live` holds.
    pub fn new(metrics: Arc<Metrics>, live: Shelf) -> Self {
        Endpoint { metrics, live }
    }

    /// Every metric, in the text format.
    pub fn render(&self) -> String {
        // The hosts a reload replaced, plus the one served now; a host
        // still finishing calls after a reload is counted once it is gone,
        // and the counter never goes back meanwhile.
        let scraping = self.metrics.scraping.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = self.metrics.persisted_before.load(Ordering::Relaxed)
            + self.live.current()._host.results_persisted();
        let shown = self.metrics.persisted.get();
        if now > shown {
            self.metrics.persisted.inc_by(now - shown);
        }
        drop(scraping);
        let mut text = String::with_capacity(4096);
        prometheus_client::encoding::text::encode(&mut text, &self.metrics.registry)
            .expect("writing to a String does not fail");
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metrics_address_must_be_loopback() {
        assert_eq!(loopback_addr("127.0.0.1:9464"), Ok("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(loopback_addr("[::1]:9464"), Ok("[::1]:9464".parse().unwrap()));
        let refused = loopback_addr("0.0.0.0:9464").unwrap_err();
        assert!(refused.starts_with("0.0.0.0:9464 is not a loopback address"), "{refused}");
        assert_eq!(loopback_addr("nine").unwrap_err(), "nine is not an address such as 127.0.0.1:9464");
    }

    #[test]
    fn a_call_refused_at_planning_leaves_no_gauge_up() {
        let metrics = Arc::new(Metrics::new());
        let meter = metrics.arrive(None);
        assert_eq!(metrics.waiting.get(), 1);
        meter.finish(&ToolResult::error("t1", "no such tool"), false);
        assert_eq!(metrics.waiting.get(), 0);
        drop(meter);
        let invalid = CallLabels { tool: ToolName(UNKNOWN_TOOL.into()), outcome: "invalid" };
        assert_eq!(metrics.calls.get_or_create(&invalid).get(), 1, "counted once, not again when dropped");
    }

    #[test]
    fn a_call_dropped_while_running_is_counted_interrupted() {
        let metrics = Arc::new(Metrics::new());
        let meter = metrics.arrive(Some("echo"));
        meter.see(&Event::CallStarted { tool_use_id: "t1".into(), tool: "echo".into(), activity: None });
        assert_eq!((metrics.waiting.get(), metrics.in_flight.get()), (0, 1));
        drop(meter);
        assert_eq!(metrics.in_flight.get(), 0);
        let interrupted = CallLabels { tool: ToolName("echo".into()), outcome: "interrupted" };
        assert_eq!(metrics.calls.get_or_create(&interrupted).get(), 1);
    }
}
