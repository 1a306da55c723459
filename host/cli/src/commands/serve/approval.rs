//! Approval through the client: a call that needs a person's approval asks
//! the user of the client that made it, by MCP elicitation.
//!
//! The host has one [`Prompter`], this one; it knows which calls came from a
//! client that can ask its user, one that declared the elicitation
//! capability. It asks with the tool, the subject and the reasons;
//! accepting with `approve` runs the call, anything else denies it with the
//! message a batch gives.
//! - Before 2026-07-28, the server sends the client `elicitation/create`
//!   while the call waits.
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

use async_trait::async_trait;
use keel_host::permissions::{Approval, ApprovalRequest, Prompter};
use rmcp::model::{
    CallToolRequestParams, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationSchema, InputRequest, InputRequiredResult, ProtocolVersion,
};
use rmcp::service::{ElicitationError, RequestContext};
use rmcp::{Peer, RoleServer};
use serde::{Deserialize, Serialize};

/// The key of the approval question in an input-required result.
pub const APPROVAL_KEY: &str = "approval";

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
#[derive(Clone, Default)]
pub struct ClientPrompter {
    askable: Arc<Mutex<HashMap<String, Asker>>>,
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

/// The approval a client's answer to the question gives.
fn approval_of(answer: &serde_json::Value) -> Approval {
    match serde_json::from_value::<ElicitResult>(answer.clone()) {
        Ok(result) => match result.action {
            ElicitationAction::Accept => match result.content.map(serde_json::from_value::<Confirm>) {
                Some(Ok(Confirm { approve: true })) => Approval::Allow,
                _ => Approval::Deny(None),
            },
            ElicitationAction::Cancel => Approval::Deny(Some("the user cancelled the request".into())),
            // Declined, or an answer this version does not know: no.
            _ => Approval::Deny(None),
        },
        Err(error) => {
            Approval::Deny(Some(format!("the client's answer is not an elicitation result: {error}")))
        }
    }
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

/// What the user is shown: the tool, what it would touch, and why it asks.
pub fn question(request: &ApprovalRequest) -> String {
    let subject = match &request.subject {
        Some(subject) => format!(" on {subject}"),
        None => String::new(),
    };
    format!("Allow {}{subject}? {}.", request.tool, request.reasons.join("; "))
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
        match peer.elicit::<Confirm>(question(request)).await {
            Ok(Some(Confirm { approve: true })) => Approval::Allow,
            Ok(_) | Err(ElicitationError::UserDeclined) => Approval::Deny(None),
            Err(ElicitationError::UserCancelled) => {
                Approval::Deny(Some("the user cancelled the request".into()))
            }
            Err(error) => {
                tracing::warn!(tool_use_id = %request.tool_use_id, "asking the client failed: {error}");
                Approval::Deny(Some(format!("the client could not ask its user: {error}")))
            }
        }
    }

    fn can_ask(&self, tool_use_id: &str) -> bool {
        self.asker(tool_use_id).is_some()
    }
}
