//! What a running call reports, sent on to its client in order: progress
//! as `notifications/progress`, log lines as `notifications/message`.
//!
//! A forwarder's task starts with the first report. Most calls report
//! nothing, and every client that asks for progress gives each request a
//! token (rmcp's client always does), so a task spawned for every call would
//! be one more thread woken per call, for nothing.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use keel_host::tool::LogLevel;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What a forwarder's task does with the reports it is sent.
type Drain<T> =
    Box<dyn FnOnce(mpsc::UnboundedReceiver<T>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Reports of type `T`, sent on in order by a task started with the first.
pub struct Forwarder<T> {
    state: Mutex<State<T>>,
}

enum State<T> {
    /// Nothing reported yet: the task is not started.
    Idle(Drain<T>),
    /// Started: reports go to its queue.
    Running(mpsc::UnboundedSender<T>, tokio::task::JoinHandle<()>),
    /// Finished, or its task could not be started.
    Done,
}

impl<T: Send + 'static> Forwarder<T> {
    fn new(drain: Drain<T>) -> Self {
        Forwarder { state: Mutex::new(State::Idle(drain)) }
    }

    /// Queue `report`, starting the task if this is the first. Called from
    /// inside the runtime (a tool's host call), so the task can be spawned.
    pub fn send(&self, report: T) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if matches!(*state, State::Idle(_)) {
            let State::Idle(drain) = std::mem::replace(&mut *state, State::Done) else {
                unreachable!("the state was just seen idle")
            };
            let (sender, reports) = mpsc::unbounded_channel();
            *state = State::Running(sender, tokio::spawn(drain(reports)));
        }
        if let State::Running(sender, _) = &*state {
            // The task ends only once the sender is dropped, below.
            let _ = sender.send(report);
        }
    }

    /// Send on what is still queued, then stop: the call's result goes out
    /// after its last report. Once the server is `stopping`, what is queued
    /// is dropped instead: a stopped session sends no more notifications,
    /// and a report waiting for one would hold back the call's reply until
    /// the session gave up on it.
    pub async fn finish(&self, stopping: &CancellationToken) {
        let state = std::mem::replace(
            &mut *self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
            State::Done,
        );
        if let State::Running(sender, mut task) = state {
            drop(sender);
            tokio::select! {
                biased;
                _ = &mut task => {}
                () = stopping.cancelled() => task.abort(),
            }
        }
    }
}

/// A call's progress reports as `notifications/progress` for `token`. A
/// report in MCP's own shape (`{"progress": n, "total": m, "message": …}`,
/// what the SDK's `Progress` sends) goes on as those fields; any other is
/// numbered 1, 2, 3, … with its JSON text as the message.
pub fn progress(peer: Peer<RoleServer>, token: ProgressToken) -> Forwarder<Value> {
    Forwarder::new(Box::new(move |mut reports| {
        Box::pin(async move {
            let mut count = 0u32;
            while let Some(data) = reports.recv().await {
                count += 1;
                let notification = notification(token.clone(), count, data);
                if let Err(error) = peer.notify_progress(notification).await {
                    tracing::debug!("failed to send a progress notification: {error}");
                }
            }
        })
    }))
}

/// The notification for the `count`th report of a call, `data`.
fn notification(token: ProgressToken, count: u32, data: Value) -> ProgressNotificationParam {
    if let Some(progress) = data.get("progress").and_then(Value::as_f64) {
        let mut notification = ProgressNotificationParam::new(token, progress);
        if let Some(total) = data.get("total").and_then(Value::as_f64) {
            notification = notification.with_total(total);
        }
        if let Some(message) = data.get("message").and_then(Value::as_str) {
            notification = notification.with_message(message);
        }
        return notification;
    }
    let message = match data {
        Value::String(text) => text,
        other => other.to_string(),
    };
    ProgressNotificationParam::new(token, f64::from(count)).with_message(message)
}

/// A call's log lines, each with its level.
pub type LogLines = Forwarder<(LogLevel, String)>;

/// A call's log lines as `notifications/message`, the tool's name as the
/// logger.
#[allow(deprecated, reason = "logging is deprecated from 2026-07-28 on; older clients still use it")]
pub fn log(peer: Peer<RoleServer>, tool: String) -> LogLines {
    use rmcp::model::{LoggingLevel as Mcp, LoggingMessageNotificationParam};
    Forwarder::new(Box::new(move |mut lines| {
        Box::pin(async move {
            while let Some((level, message)) = lines.recv().await {
                let level = match level {
                    LogLevel::Trace | LogLevel::Debug => Mcp::Debug,
                    LogLevel::Info => Mcp::Info,
                    LogLevel::Warn => Mcp::Warning,
                    LogLevel::Error => Mcp::Error,
                };
                let notification =
                    LoggingMessageNotificationParam::new(level, Value::String(message)).with_logger(&tool);
                if let Err(error) = peer.notify_logging_message(notification).await {
                    tracing::debug!("failed to send a log message: {error}");
                }
            }
        })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_mcp_shaped_report_goes_on_as_its_own_fields() {
        let token = ProgressToken(rmcp::model::NumberOrString::Number(7));
        let sent = notification(token.clone(), 1, json!({ "progress": 3, "total": 8, "message": "3 of 8" }));
        assert_eq!((sent.progress, sent.total, sent.message.as_deref()), (3.0, Some(8.0), Some("3 of 8")));
        let sent = notification(token, 2, json!({ "step": 1, "steps": 2 }));
        assert_eq!((sent.progress, sent.total), (2.0, None));
        assert_eq!(sent.message.as_deref(), Some(r#"{"step":1,"steps":2}"#));
    }
}
