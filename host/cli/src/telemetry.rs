//! Logs to stderr and, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, the library's spans over
//! OTLP/HTTP (README, "Seeing a run").
//!
//! The library makes the spans (a "call" span per planned call, named after
//! its tool, with a child per step); this module only ships them. The
//! exporter runs on a thread of its own behind a batch span processor, so a
//! call never waits on the collector; a collector that is down or slow costs
//! a logged error, never the run. [`Telemetry::shutdown`] sends what is left
//! before the process exits.

use std::io::IsTerminal as _;

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// What must outlive the command: the span exporter, when there is one.
pub struct Telemetry {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Send the spans not yet sent and stop the exporter. Bounded by the
    /// exporter's timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s by default)
    /// and a second for its few quick retries, where the SDK's own
    /// shutdown gives up after 5 s whatever the timeout; said on stderr
    /// when the collector is slow to answer.
    pub fn shutdown(self) {
        #[cfg(feature = "otlp")]
        if let Some(provider) = self.provider {
            let wait = otlp::timeout() + std::time::Duration::from_secs(1);
            let what = format!(
                "sending the last spans to {} (at most {} s)",
                otlp::endpoint(),
                wait.as_secs_f64().ceil()
            );
            if let Err(error) = crate::interrupt::said_if_slow(what, || provider.shutdown_with_timeout(wait))
            {
                tracing::warn!("failed to send the last spans over OTLP: {error}");
            }
        }
    }
}

/// Logs go to stderr, so stdout carries only the command's output. The level
/// comes from `KEEL_LOG` (as in `RUST_LOG`); warnings by default. They are in
/// colour only on a terminal, and not when `NO_COLOR` is set: a log file
/// gets plain text. Spans go over OTLP whatever that level, when an endpoint
/// is set.
pub fn init() -> Telemetry {
    let filter = EnvFilter::try_from_env("KEEL_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    #[cfg(feature = "otlp")]
    {
        let (provider, error) = match otlp::exporter() {
            Ok(provider) => (provider, None),
            Err(error) => (None, Some(error)),
        };
        dispatch(filter, provider.as_ref()).init();
        // Said once logging is up; the command runs without export.
        if let Some(error) = error {
            tracing::warn!("spans are not exported: {error}");
        }
        Telemetry { provider }
    }
    #[cfg(not(feature = "otlp"))]
    {
        dispatch(filter).init();
        Telemetry {}
    }
}

/// Logs through `filter` to stderr, and spans to `provider` when there is
/// one. Without one, no layer stands in for it: tracing takes an absent
/// (`None`) layer to want every span at every level, and every call would
/// then make spans (keel's, wasmtime's, WASI's) that nobody reads.
fn dispatch(
    filter: EnvFilter,
    #[cfg(feature = "otlp")] provider: Option<&opentelemetry_sdk::trace::SdkTracerProvider>,
) -> tracing::Dispatch {
    let colour =
        std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    let verbose = filter.max_level_hint().is_some_and(|level| level >= LevelFilter::DEBUG);
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(|| OneLine(std::io::stderr()))
        .with_ansi(colour)
        .event_format(ClientsDoing { format: tracing_subscriber::fmt::format().with_target(false), verbose });
    let registry = tracing_subscriber::registry().with(logs.with_filter(filter));
    #[cfg(feature = "otlp")]
    if let Some(provider) = provider {
        return tracing::Dispatch::new(registry.with(otlp::layer(provider)));
    }
    tracing::Dispatch::new(registry)
}

/// A log writer that keeps each event to one line: a line break inside an
/// event's text (a request id a client chose may hold one, and rmcp logs ids
/// as they are) is written as `\n` (`\r` as `\r`), so that nothing logged
/// can pass for a line of its own. Each event comes in one write, its own
/// line break last.
struct OneLine<W>(W);

impl<W: std::io::Write> std::io::Write for OneLine<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let (text, end) = match bytes.strip_suffix(b"\n") {
            Some(text) => (text, &b"\n"[..]),
            None => (bytes, &b""[..]),
        };
        if !text.iter().any(|&byte| byte == b'\n' || byte == b'\r') {
            self.0.write_all(bytes)?;
            return Ok(bytes.len());
        }
        let mut line = Vec::with_capacity(bytes.len() + 16);
        for &byte in text {
            match byte {
                b'\n' => line.extend_from_slice(b"\\n"),
                b'\r' => line.extend_from_slice(b"\\r"),
                byte => line.push(byte),
            }
        }
        line.extend_from_slice(end);
        self.0.write_all(&line)?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Leaves out, below DEBUG, what rmcp logs of a client's doing rather than
/// the server's: a warning for each error reply it sends (a method keel does
/// not serve, such as `resources/list`, which clients ask as they connect,
/// or a request it cannot read; the client has the error), and an error for
/// each reply whose HTTP client gave up waiting and closed its connection
/// (the call was interrupted; the metrics count it).
struct ClientsDoing<F> {
    format: F,
    verbose: bool,
}

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for ClientsDoing<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        cx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        if !self.verbose && event.metadata().target() == "rmcp::service" && is_a_clients_doing(event) {
            return Ok(());
        }
        self.format.format_event(cx, writer, event)
    }
}

/// Whether rmcp's `event` tells of a client's doing (see [`ClientsDoing`]).
fn is_a_clients_doing(event: &tracing::Event<'_>) -> bool {
    #[derive(Default)]
    struct Said {
        message: String,
        error: String,
    }
    impl tracing::field::Visit for Said {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            use std::fmt::Write as _;
            let into = match field.name() {
                "message" => &mut self.message,
                "error" => &mut self.error,
                _ => return,
            };
            let _ = write!(into, "{value:?}");
        }
    }
    let mut said = Said::default();
    event.record(&mut said);
    match said.message.as_str() {
        "response error" => true,
        "failed to send pending response during drain" => said.error.contains("channel closed"),
        _ => false,
    }
}

#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{Protocol, WithExportConfig as _};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::filter::{LevelFilter, Targets};

    /// The variables that turn export on, as the OpenTelemetry
    /// specification names them.
    const ENDPOINTS: [&str; 2] = ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"];

    /// The provider whose batch processor sends spans to the configured
    /// endpoint; `None` when no endpoint is set, or `OTEL_SDK_DISABLED` is
    /// `true`.
    pub fn exporter() -> Result<Option<SdkTracerProvider>, String> {
        if !ENDPOINTS.iter().any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()))
            || std::env::var("OTEL_SDK_DISABLED").is_ok_and(|value| value.trim().eq_ignore_ascii_case("true"))
        {
            return Ok(None);
        }
        // An https endpoint needs a TLS provider; the one keel's other
        // clients use. Already installed is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(protocol())
            .build()
            .map_err(|error| format!("failed to build the OTLP exporter: {error}"))?;
        Ok(Some(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource()).build()))
    }

    /// The exporter's timeout: `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` or
    /// `OTEL_EXPORTER_OTLP_TIMEOUT` in milliseconds, 10 s by default, as the
    /// exporter reads them.
    pub fn timeout() -> std::time::Duration {
        ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"]
            .iter()
            .find_map(|name| std::env::var(name).ok()?.trim().parse().ok())
            .map_or(std::time::Duration::from_secs(10), std::time::Duration::from_millis)
    }

    /// Where the spans go, as the variables name it.
    pub fn endpoint() -> String {
        ENDPOINTS
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|value| !value.is_empty()))
            .unwrap_or_default()
    }

    /// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL`:
    /// `http/protobuf` (the default) or `http/json`. keel has no gRPC
    /// exporter: asking for one is said, and protobuf over HTTP used.
    fn protocol() -> Protocol {
        let asked =
            ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"].iter().find_map(|name| {
                std::env::var(name).ok().filter(|value| !value.is_empty()).map(|value| (name, value))
            });
        match asked {
            None => Protocol::HttpBinary,
            Some((_, value)) if value.eq_ignore_ascii_case("http/protobuf") => Protocol::HttpBinary,
            Some((_, value)) if value.eq_ignore_ascii_case("http/json") => Protocol::HttpJson,
            Some((name, value)) => {
                eprintln!("keel: {name}={value} is not supported: spans go as http/protobuf");
                Protocol::HttpBinary
            }
        }
    }

    /// The SDK's resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`),
    /// with `service.name` `keel` unless those name one.
    fn resource() -> Resource {
        let named = std::env::var_os("OTEL_SERVICE_NAME").is_some_and(|value| !value.is_empty())
            || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|attributes| {
                attributes.split(',').any(|pair| pair.trim().starts_with("service.name="))
            });
        let builder = Resource::builder();
        if named { builder.build() } else { builder.with_service_name("keel").build() }
    }

    /// The layer that turns the library's spans into OpenTelemetry spans:
    /// `keel_host` spans at INFO and above, whatever `KEEL_LOG` says, and
    /// nothing else (not the exporter's own HTTP client).
    pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        let tracer = provider.tracer("keel");
        let spans = Targets::new().with_target("keel_host", LevelFilter::INFO);
        tracing_opentelemetry::layer().with_tracer(tracer).with_filter(spans)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn without_an_exporter_no_span_is_made_below_the_log_level() {
        // A subscriber that names no highest level, as `tracing`'s own
        // `NoSubscriber` does, lifts the level every subscriber of the
        // process is asked about to TRACE while it lives: the answer must
        // then come from the logging filter.
        let _unlevelled = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
        let dispatch = dispatch(
            EnvFilter::new("warn"),
            #[cfg(feature = "otlp")]
            None,
        );
        tracing::dispatcher::with_default(&dispatch, || {
            assert!(tracing::info_span!(target: "keel_host::call", "call").is_disabled());
            assert!(tracing::trace_span!(target: "wasmtime_wasi", "read").is_disabled());
            assert!(tracing::enabled!(tracing::Level::WARN));
        });
    }

    #[test]
    fn what_rmcp_logs_of_a_clients_doing_is_left_out_below_debug() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let log = |verbose: bool| {
            let written = Arc::new(Mutex::new(Vec::new()));
            let writer = {
                let written = written.clone();
                move || Written(written.clone())
            };
            let logs = tracing_subscriber::fmt::layer()
                .with_writer(writer)
                .with_ansi(false)
                .event_format(ClientsDoing { format: tracing_subscriber::fmt::format(), verbose })
                .with_filter(EnvFilter::new("warn"));
            let subscriber = tracing_subscriber::registry().with(logs);
            tracing::subscriber::with_default(subscriber, || {
                tracing::warn!(target: "rmcp::service", id = 3, error = ?"method not found", "response error");
                tracing::error!(target: "rmcp::service", error = %"channel closed", "failed to send pending response during drain");
                tracing::error!(target: "rmcp::service", error = %"Broken pipe", "fail to response message");
                tracing::warn!(target: "keel::serve", "response error");
            });
            String::from_utf8(written.lock().unwrap().clone()).unwrap()
        };
        let quiet = log(false);
        assert!(!quiet.contains("method not found") && !quiet.contains("channel closed"), "{quiet}");
        assert!(quiet.contains("fail to response message") && quiet.contains("keel::serve"), "{quiet}");
        let verbose = log(true);
        assert!(verbose.contains("method not found") && verbose.contains("channel closed"), "{verbose}");
    }

    #[test]
    fn a_line_break_in_what_is_logged_cannot_start_a_line_of_its_own() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let written = Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let written = written.clone();
            move || OneLine(Written(written.clone()))
        };
        let logs = tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(false);
        let subscriber = tracing_subscriber::registry().with(logs.with_filter(EnvFilter::new("debug")));
        tracing::subscriber::with_default(subscriber, || {
            let id = "7\n2026-12-07T00:00:00.000000Z ERROR forged\r";
            tracing::debug!(target: "rmcp::service", "received request {id}");
            tracing::warn!("a plain line");
        });
        let log = String::from_utf8(written.lock().unwrap().clone()).unwrap();
        assert_eq!(log.lines().count(), 2, "{log}");
        assert!(log.contains("received request 7\\n2026-12-07T00:00:00.000000Z ERROR forged\\r\n"), "{log}");
        assert!(log.ends_with("a plain line\n"), "{log}");
    }

    /// A log writer into shared bytes.
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Written {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[cfg(feature = "otlp")]
    #[test]
    fn with_an_exporter_keels_spans_are_made_and_no_others() {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let dispatch = dispatch(EnvFilter::new("warn"), Some(&provider));
        tracing::dispatcher::with_default(&dispatch, || {
            assert!(!tracing::info_span!(target: "keel_host::call", "call").is_disabled());
            assert!(tracing::trace_span!(target: "wasmtime_wasi", "read").is_disabled());
        });
    }
}
