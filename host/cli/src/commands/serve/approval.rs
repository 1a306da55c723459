//! Approval through the client: a call that needs a person's approval asks
//! the user of the client that made it, by MCP elicitation.
//!
//! The host has one [`Prompter`], this one; it knows which calls came from a
//! client that can ask its user, one that declared the elicitation
//! capability. It asks with the tool, the subject (or, for a tool that
//! gives none, the input) and the reasons; accepting with `approve` runs
//! the call, anything else denies it with the message a batch gives. A
//! client that fails to answer, or answers what cannot be read, denies it
//! too, saying so rather than speaking for its user.
//! - Before 2026-07-28, the server sends the client `elicitation/create`
//!   while the call waits, for at most [`ANSWER_WITHIN`]; then the question
//!   is withdrawn (`notifications/cancelled`) and the call denied. A call
//!   that ends while it waits (cancelled, or the server stopping) withdraws
//!   its question too. A client whose connection closes (the end of stdin,
//!   an HTTP session ended) answers nothing more: its questions are denied
//!   at once. A client that drops the connection of one HTTP request keeps
//!   its session, and could still answer: its question waits out the bound.
//! - From 2026-07-28 the server sends a client no requests. The call is
//!   stopped where it would ask (before it runs), and the answer to
//!   `tools/call` is an input-required result holding the question, with a
//!   `requestState` bound to the tool and its arguments. The client retries
//!   the same call with its user's answer in `inputResponses`, and the call
//!   runs again from the start with that answer.
//!
//! For any other call it cannot ask ([`Prompter::can_ask`]), so the call is
//! refused as in a run with no one to ask, and so is a tool that needs a
//! person.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use keel_host::permissions::{Approval, ApprovalRequest, Prompter};
use rmcp::model::{
    CallToolRequestParams, CancelledNotificationParam, ClientResult, ElicitRequest, ElicitRequestParams,
    ElicitResult, ElicitationAction, ElicitationSchema, InputRequest, InputRequiredResult, ProtocolVersion,
    RequestId, ServerRequest,
};
use rmcp::service::{ElicitationMode, PeerRequestOptions, RequestContext, ServiceError};
use rmcp::{Peer, RoleServer};
use serde::{Deserialize, Serialize};

/// The key of the approval question in an input-required result.
pub const APPROVAL_KEY: &str = "approval";

/// How long a client's user has to answer a question. A yes or no takes a
/// person seconds; a minute leaves time to read the question and look at
/// what it names. Meanwhile the call waits, and a call that changes
/// anything holds back every call after it, of every client: past a minute
/// the question is taken for unanswered (a client that shows no dialog, or
/// lost it), and the calls behind it go on.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// The characters of a call's input a question shows, when its tool gives
/// no subject: enough to tell two calls of one tool apart, while a
/// ten-kilobyte input does not fill the dialog.
const INPUT_SHOWN: usize = 200;

/// The answer asked for: one box to tick.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Confirm {
    /// Run this call.
    approve: bool,
}

rmcp::elicit_safe!(Confirm);

/// How one call's client is asked.
#[derive(Clone)]
enum Asker {
    /// Now, by a request to the client.
    Peer(Peer<RoleServer>),
    /// By the round trips of 2026-07-28.
    Rounds(Arc<Round>),
}

/// One try of a call asked by round trips: the answer the client sent with
/// it, if any, and the question this try stopped at, if it did.
pub struct Round {
    answer: Option<Approval>,
    question: Mutex<Option<ApprovalRequest>>,
    state: String,
}

impl Round {
    /// The input-required result that asks the question this try stopped
    /// at, if it stopped at one.
    pub fn input_required(&self) -> Option<InputRequiredResult> {
        let asked = self.question.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()?;
        let schema = ElicitationSchema::from_type::<Confirm>().expect("the approval schema is a flat object");
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: question(&asked),
            requested_schema: schema,
        };
        let requests = [(APPROVAL_KEY.to_owned(), InputRequest::Elicitation(ElicitRequest::new(params)))];
        Some(InputRequiredResult::new(Some(requests.into_iter().collect()), Some(self.state.clone())))
    }
}

/// The clients that can be asked, by the `tool_use` id of their calls.
#[derive(Clone)]
pub struct ClientPrompter {
    askable: Arc<Mutex<HashMap<String, Asker>>>,
    /// How long a question waits for its answer.
    answer_within: Duration,
}

impl Default for ClientPrompter {
    fn default() -> Self {
        ClientPrompter { askable: Arc::default(), answer_within: ANSWER_WITHIN }
    }
}

/// While alive, the call it was made for may ask its client.
pub struct Registration {
    askable: Arc<Mutex<HashMap<String, Asker>>>,
    id: String,
    round: Option<Arc<Round>>,
}

impl Registration {
    /// The try, for a call asked by round trips.
    pub fn round(&self) -> Option<&Round> {
        self.round.as_deref()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.askable.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&self.id);
    }
}

/// What binds a client's answer to the call it was asked about: a digest of
/// the tool and its arguments.
fn state_of(request: &CallToolRequestParams) -> String {
    use sha2::Digest as _;
    let text = serde_json::to_string(&(&request.name, &request.arguments)).unwrap_or_default();
    sha2::Sha256::digest(text.as_bytes()).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The approval a client's answer to the question gives, as sent in a
/// retried call.
fn approval_of(answer: &serde_json::Value) -> Approval {
    match serde_json::from_value::<ElicitResult>(answer.clone()) {
        Ok(result) => approval_of_result(result),
        Err(error) => unreadable(&format!("it is not an elicitation result: {error}")),
    }
}

/// The approval an elicitation result gives: the user's own answer, or,
/// when it cannot be read, a denial saying so.
fn approval_of_result(result: ElicitResult) -> Approval {
    match result.action {
        ElicitationAction::Accept => match result.content.map(serde_json::from_value::<Confirm>) {
            Some(Ok(Confirm { approve: true })) => Approval::Allow,
            // Left unticked.
            Some(Ok(Confirm { approve: false })) => Approval::Deny(None),
            Some(Err(error)) => unreadable(&error.to_string()),
            None => unreadable("it accepted with no content"),
        },
        ElicitationAction::Cancel => Approval::Deny(Some("the user cancelled the request".into())),
        // Declined, or an answer this version does not know: no.
        _ => Approval::Deny(None),
    }
}

/// The denial for an answer that cannot be read, for `why`.
fn unreadable(why: &str) -> Approval {
    Approval::Deny(Some(format!("the client's answer could not be read: {why}")))
}

impl ClientPrompter {
    /// Let the call `tool_use_id`, made by `request`, ask the client of
    /// `context`, if it can be asked, for as long as the registration lives.
    pub fn register(
        &self,
        tool_use_id: &str,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Option<Registration> {
        let elicits =
            context.client_capabilities().is_some_and(|capabilities| capabilities.elicitation.is_some());
        if !elicits {
            return None;
        }
        let rounds =
            context.protocol_version().is_none_or(|version| version >= ProtocolVersion::V_2026_07_28);
        let (asker, round) = if rounds {
            let state = state_of(request);
            // An answer counts only for the call it was asked about.
            let answer = request
                .input_responses
                .as_ref()
                .and_then(|responses| responses.get(APPROVAL_KEY))
                .filter(|_| request.request_state.as_deref() == Some(state.as_str()))
                .map(approval_of);
            let round = Arc::new(Round { answer, question: Mutex::new(None), state });
            (Asker::Rounds(round.clone()), Some(round))
        } else {
            (Asker::Peer(context.peer.clone()), None)
        };
        self.askable
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(tool_use_id.to_owned(), asker);
        Some(Registration { askable: self.askable.clone(), id: tool_use_id.to_owned(), round })
    }

    fn asker(&self, tool_use_id: &str) -> Option<Asker> {
        self.askable.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(tool_use_id).cloned()
    }
}

/// What the user is shown: the tool, what it would touch (or, for a tool
/// that does not say, its input, as JSON, cut after [`INPUT_SHOWN`]
/// characters), and why it asks. What the model wrote is shown escaped.
pub fn question(request: &ApprovalRequest) -> String {
    let on = match &request.subject {
        Some(subject) => format!(" on {}", escaped(subject)),
        None => {
            let input = request.input.to_string();
            let input = escaped(&input);
            match input.char_indices().nth(INPUT_SHOWN) {
                Some((cut, _)) => format!(" with {}… ({} bytes)", &input[..cut], input.len()),
                None => format!(" with {input}"),
            }
        }
    };
    format!("Allow {}{on}? {}.", request.tool, request.reasons.join("; "))
}

/// `text` with each control character, and each that turns the direction
/// of the text around it, written as Rust escapes it (`\u{202e}`): a name
/// the model chose cannot break the question's lines or show itself
/// reversed.
fn escaped(text: &str) -> std::borrow::Cow<'_, str> {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(hidden) {
        return text.into();
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hidden(c) {
            shown.extend(c.escape_unicode());
        } else {
            shown.push(c);
        }
    }
    shown.into()
}

/// A question sent and not yet answered: withdrawn from the client if the
/// call stops waiting for it (the call cancelled, the server stopping).
struct Pending {
    peer: Peer<RoleServer>,
    id: Option<RequestId>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let (Some(id), Ok(runtime)) = (self.id.take(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        let peer = self.peer.clone();
        runtime.spawn(async move {
            let reason = "the call it asked about ended".to_owned();
            if let Err(error) =
                peer.notify_cancelled(CancelledNotificationParam::new(Some(id), Some(reason))).await
            {
                tracing::debug!("failed to withdraw a question from the client: {error}");
            }
        });
    }
}

impl ClientPrompter {
    /// Ask `request` of the client at `peer`, by `elicitation/create`, for
    /// at most `answer_within`.
    async fn elicit(&self, peer: Peer<RoleServer>, request: &ApprovalRequest) -> Approval {
        if !peer.supported_elicitation_modes().contains(&ElicitationMode::Form) {
            return Approval::Deny(Some(
                "the client cannot ask its user: it does not take form questions".into(),
            ));
        }
        let schema = ElicitationSchema::from_type::<Confirm>().expect("the approval schema is a flat object");
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: question(request),
            requested_schema: schema,
        };
        // On time-out rmcp withdraws the question itself.
        let options = PeerRequestOptions::with_timeout(self.answer_within);
        let sent =
            peer.send_cancellable_request(ServerRequest::ElicitRequest(ElicitRequest::new(params)), options);
        let handle = match sent.await {
            Ok(handle) => handle,
            Err(error) => return failed(request, &error),
        };
        let mut pending = Pending { peer, id: Some(handle.id.clone()) };
        let answer = handle.await_response().await;
        pending.id = None;
        match answer {
            Ok(ClientResult::ElicitResult(result)) => approval_of_result(result),
            Ok(_) => unreadable("it is not an elicitation result"),
            Err(ServiceError::Timeout { timeout }) => {
                tracing::warn!(tool_use_id = %request.tool_use_id, "the client did not answer within {timeout:?}");
                Approval::Deny(Some(format!("the client did not answer within {timeout:?}")))
            }
            Err(error) => failed(request, &error),
        }
    }
}

/// The denial of a call whose client failed to answer, with `error`.
fn failed(request: &ApprovalRequest, error: &ServiceError) -> Approval {
    let why = match error {
        ServiceError::McpError(error) => error.message.to_string(),
        ServiceError::TransportClosed => "its connection closed".to_owned(),
        error => error.to_string(),
    };
    tracing::warn!(tool_use_id = %request.tool_use_id, "the client failed to answer: {why}");
    Approval::Deny(Some(format!("the client failed to answer: {why}")))
}

#[async_trait]
impl Prompter for ClientPrompter {
    async fn ask(&self, request: &ApprovalRequest) -> Approval {
        let peer = match self.asker(&request.tool_use_id) {
            None => return Approval::Deny(Some("the client cannot ask its user".into())),
            Some(Asker::Rounds(round)) => {
                if let Some(answer) = &round.answer {
                    return answer.clone();
                }
                // The call stops here, before it runs; its answer to the
                // client is the question instead.
                *round.question.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Some(request.clone());
                return Approval::Deny(Some("waiting for the user's answer".into()));
            }
            Some(Asker::Peer(peer)) => peer,
        };
        self.elicit(peer, request).await
    }

    fn can_ask(&self, tool_use_id: &str) -> bool {
        self.asker(tool_use_id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{ClientConfig, ElicitationCapability};
    use rmcp::service::RunningService;
    use serde_json::{Value, json};
    use tokio::io::{
        AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf,
    };

    use super::*;

    /// A server that serves nothing: only its peer is used, to ask.
    struct Nothing;

    impl rmcp::ServerHandler for Nothing {}

    /// A prompter whose questions about `call-1` go to a client at the
    /// other end of a pipe, which the test reads and writes line by line.
    struct Asking {
        prompter: ClientPrompter,
        _server: RunningService<RoleServer, Nothing>,
        lines: Lines<BufReader<ReadHalf<DuplexStream>>>,
        client: WriteHalf<DuplexStream>,
    }

    impl Asking {
        /// Questions that wait for `answer_within`, asked of a client of
        /// 2025-06-18 that can ask its user.
        fn new(answer_within: Duration) -> Self {
            let (client, server) = tokio::io::duplex(64 << 10);
            let mut info = ClientConfig::default();
            info.protocol_version = ProtocolVersion::V_2025_06_18;
            info.capabilities.elicitation = Some(ElicitationCapability::new());
            let server = rmcp::service::serve_directly(Nothing, tokio::io::split(server), Some(info));
            let prompter = ClientPrompter { answer_within, ..ClientPrompter::default() };
            let asker = Asker::Peer(server.peer().clone());
            prompter.askable.lock().unwrap().insert("call-1".into(), asker);
            let (read, client) = tokio::io::split(client);
            Asking { prompter, _server: server, lines: BufReader::new(read).lines(), client }
        }

        /// The next message the server sends the client, within 10 s.
        async fn read(&mut self) -> Value {
            let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
                .await
                .expect("the server writes within 10 s")
                .unwrap()
                .expect("the server writes a line");
            serde_json::from_str(&line).unwrap()
        }

        async fn write(&mut self, message: Value) {
            self.client.write_all(format!("{message}\n").as_bytes()).await.unwrap();
        }

        /// Ask about `call-1`, a `write_file` of `a.txt`, on a task of its
        /// own; and the question the client is sent.
        async fn ask(&mut self) -> (tokio::task::JoinHandle<Approval>, Value) {
            let prompter = self.prompter.clone();
            let asking = tokio::spawn(async move { prompter.ask(&write_file("a.txt")).await });
            let asked = self.read().await;
            assert_eq!(asked["method"], "elicitation/create", "{asked}");
            (asking, asked)
        }
    }

    fn write_file(path: &str) -> ApprovalRequest {
        ApprovalRequest {
            tool_use_id: "call-1".into(),
            tool: "write_file".into(),
            input: json!({ "file_path": path, "content": "x" }),
            subject: Some(path.into()),
            reasons: vec!["the rule `write_file` asks for approval".into()],
        }
    }

    fn echo(input: Value) -> ApprovalRequest {
        ApprovalRequest {
            tool: "echo".into(),
            input,
            subject: None,
            reasons: vec!["the rule `echo` asks for approval".into()],
            ..write_file("")
        }
    }

    /// The approval within 10 s.
    async fn answered(asking: tokio::task::JoinHandle<Approval>) -> Approval {
        tokio::time::timeout(Duration::from_secs(10), asking).await.expect("answered within 10 s").unwrap()
    }

    #[tokio::test]
    async fn a_question_not_answered_in_time_is_withdrawn_and_the_call_denied() {
        let mut client = Asking::new(Duration::from_millis(200));
        let (asking, asked) = client.ask().await;
        assert_eq!(
            answered(asking).await,
            Approval::Deny(Some("the client did not answer within 200ms".into()))
        );
        assert_eq!(
            client.read().await,
            json!({ "jsonrpc": "2.0", "method": "notifications/cancelled",
                    "params": { "requestId": asked["id"], "reason": "request timeout" } })
        );
    }

    #[tokio::test]
    async fn a_question_whose_call_ends_is_withdrawn() {
        let mut client = Asking::new(ANSWER_WITHIN);
        let (asking, asked) = client.ask().await;
        // As when the call is cancelled, or the server stops.
        asking.abort();
        assert_eq!(
            client.read().await,
            json!({ "jsonrpc": "2.0", "method": "notifications/cancelled",
                    "params": { "requestId": asked["id"], "reason": "the call it asked about ended" } })
        );
    }

    #[tokio::test]
    async fn a_client_that_fails_to_answer_or_answers_what_cannot_be_read_is_not_taken_for_its_user() {
        let mut client = Asking::new(ANSWER_WITHIN);
        let denied = |why: &str| Approval::Deny(Some(why.into()));
        let cases = [
            (json!({ "result": { "action": "accept", "content": { "approve": true } } }), Approval::Allow),
            (
                json!({ "result": { "action": "accept", "content": { "approve": false } } }),
                Approval::Deny(None),
            ),
            (json!({ "result": { "action": "decline" } }), Approval::Deny(None)),
            (json!({ "result": { "action": "cancel" } }), denied("the user cancelled the request")),
            (
                json!({ "error": { "code": -32603, "message": "the dialog crashed" } }),
                denied("the client failed to answer: the dialog crashed"),
            ),
            (
                json!({ "result": { "action": "accept", "content": { "approve": "true" } } }),
                denied(
                    r#"the client's answer could not be read: invalid type: string "true", expected a boolean"#,
                ),
            ),
            (
                json!({ "result": { "action": "accept" } }),
                denied("the client's answer could not be read: it accepted with no content"),
            ),
            (
                json!({ "result": "yes" }),
                denied("the client's answer could not be read: it is not an elicitation result"),
            ),
        ];
        for (mut answer, approval) in cases {
            let (asking, asked) = client.ask().await;
            answer["jsonrpc"] = json!("2.0");
            answer["id"] = asked["id"].clone();
            client.write(answer.clone()).await;
            assert_eq!(answered(asking).await, approval, "{answer}");
        }
    }

    #[test]
    fn an_answer_sent_with_a_retried_call_that_cannot_be_read_says_so() {
        assert_eq!(
            approval_of(&json!({ "action": "accept", "content": { "approve": "yes" } })),
            Approval::Deny(Some(
                r#"the client's answer could not be read: invalid type: string "yes", expected a boolean"#
                    .into()
            ))
        );
        assert_eq!(
            approval_of(&json!({ "action": "accept", "content": { "approve": false } })),
            Approval::Deny(None)
        );
    }

    #[test]
    fn a_question_names_the_subject_or_else_shows_the_input_escaped_and_cut() {
        assert_eq!(
            question(&write_file("notes/a\nb.md")),
            r"Allow write_file on notes/a\u{a}b.md? the rule `write_file` asks for approval."
        );
        assert_eq!(
            question(&echo(json!({ "text": "A\u{1b}[2J\u{202e}B" }))),
            r#"Allow echo with {"text":"A\u001b[2J\u{202e}B"}? the rule `echo` asks for approval."#
        );
        // 1,011 bytes of JSON: the first 200 characters are shown.
        assert_eq!(
            question(&echo(json!({ "text": "x".repeat(1000) }))),
            format!(
                r#"Allow echo with {{"text":"{}… (1011 bytes)? the rule `echo` asks for approval."#,
                "x".repeat(191)
            )
        );
    }
}
