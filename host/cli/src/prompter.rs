//! The terminal prompter: `keel run` asks its user at the keyboard.

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use async_trait::async_trait;
use keel_host::permissions::{Approval, ApprovalRequest, Prompter};

/// Asks on the terminal: the question on stderr, `y` or `yes` on stdin
/// allows, anything else refuses. Questions of concurrent calls wait their
/// turn.
#[derive(Debug, Default)]
pub struct TerminalPrompter {
    turn: tokio::sync::Mutex<()>,
}

impl TerminalPrompter {
    /// A prompter when both stdin and stderr are terminals, else `None`: a
    /// run with no one at the keyboard denies what needs approval.
    pub fn if_interactive() -> Option<Self> {
        (std::io::stdin().is_terminal() && std::io::stderr().is_terminal()).then(TerminalPrompter::default)
    }
}

#[async_trait]
impl Prompter for TerminalPrompter {
    async fn ask(&self, request: &ApprovalRequest) -> Approval {
        let _turn = self.turn.lock().await;
        let on = request
            .subject
            .as_ref()
            .map_or_else(|| format!(" with {}", request.input), |s| format!(" on {s}"));
        let question = format!("\nAllow {}{on}? ({}) [y/N] ", request.tool, request.reasons.join("; "));
        // If the batch is interrupted meanwhile, the read goes on until the
        // next line is typed; the answer is then dropped.
        let answer = tokio::task::spawn_blocking(move || {
            let mut stderr = std::io::stderr().lock();
            stderr.write_all(question.as_bytes()).and_then(|()| stderr.flush()).ok()?;
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).ok()?;
            Some(line)
        })
        .await;
        match answer {
            Ok(Some(line)) if matches!(line.trim().to_lowercase().as_str(), "y" | "yes") => Approval::Allow,
            _ => Approval::Deny(None),
        }
    }
}
