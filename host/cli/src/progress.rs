//! A line on stderr for work a person waits on, such as loading plugins
//! whose code is not compiled yet: drawn only on a terminal, and only once
//! the work has taken longer than a moment, so that a warm start shows
//! nothing.

use std::borrow::Cow;
use std::future::Future;
use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// What a command says while its plugins load (the host's build), when
/// that takes a while.
pub const LOADING: &str = "loading plugins (compiling those new to the cache)";

/// How long work runs before its line is drawn.
const QUIET_FOR: Duration = Duration::from_millis(250);

/// Await `work`; once it has taken longer than [`QUIET_FOR`], say `what`
/// on stderr with the time it has taken so far, when stderr is a terminal.
/// The line is cleared when the work ends.
pub async fn shown<T>(what: impl Into<Cow<'static, str>>, work: impl Future<Output = T>) -> T {
    if !std::io::stderr().is_terminal() {
        return work.await;
    }
    tokio::pin!(work);
    let started = tokio::time::Instant::now();
    tokio::select! {
        done = &mut work => return done,
        () = tokio::time::sleep_until(started + QUIET_FOR) => {}
    }
    let line = line().with_elapsed(started.elapsed()).with_message(what);
    line.enable_steady_tick(Duration::from_millis(100));
    let done = work.await;
    line.finish_and_clear();
    done
}

/// The line itself, not drawn yet: a spinner, its message, and the time
/// since it was made (or last reset); hidden when stderr is not a terminal.
pub fn line() -> ProgressBar {
    ProgressBar::new_spinner()
        .with_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("a valid template"))
}
