//! Approval through the client: a call that needs a person's approval asks
//! the user of the client that made it, by MCP elicitation.
//!
//! The host has one [`Prompter`], this one; it knows which calls came from a
//! client that can ask its user (one that declared the elicitation
//! capability, on a protocol that lets the server send it a request: those
//! before 2026-07-28). For those it sends `elicitation/create` with the tool,
//! the subject and the reasons; accepting with `approve` runs the call,
//! anything else denies it with the message a batch gives. For any other
//! call it cannot ask ([`Prompter::can_ask`]), so the call is refused as in a
//! run with no one to ask, and so is a tool that needs a person.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use keel_host::permissions::{Approval, ApprovalRequest, Prompter};
use rmcp::model::ProtocolVersion;
use rmcp::service::{ElicitationError, RequestContext};
use rmcp::{Peer, RoleServer};
use serde::Deserialize;

/// The answer asked for: one box to tick.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct Confirm {
    /// Run this call.
    approve: bool,
}

rmcp::elicit_safe!(Confirm);

/// The clients that can be asked, by the `tool_use` id of their calls.
#[derive(Clone, Default)]
pub struct ClientPrompter {
    askable: Arc<Mutex<HashMap<String, Peer<RoleServer>>>>,
}

/// While alive, the call it was made for may ask its client.
pub struct Registration {
    askable: Arc<Mutex<HashMap<String, Peer<RoleServer>>>>,
    id: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.askable.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&self.id);
    }
}

impl ClientPrompter {
    /// Let the call `tool_use_id` ask the client of `context`, if it can be
    /// asked, for as long as the registration lives.
    pub fn register(&self, tool_use_id: &str, context: &RequestContext<RoleServer>) -> Option<Registration> {
        let elicits = context.peer.peer_info().is_some_and(|info| info.capabilities.elicitation.is_some());
        // From 2026-07-28 a server sends the client no requests.
        let legacy =
            context.protocol_version().is_some_and(|version| version < ProtocolVersion::V_2026_07_28);
        if !(elicits && legacy) {
            return None;
        }
        self.askable
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(tool_use_id.to_owned(), context.peer.clone());
        Some(Registration { askable: self.askable.clone(), id: tool_use_id.to_owned() })
    }

    fn peer(&self, tool_use_id: &str) -> Option<Peer<RoleServer>> {
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
        let Some(peer) = self.peer(&request.tool_use_id) else {
            return Approval::Deny(Some("the client cannot ask its user".into()));
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
        self.peer(tool_use_id).is_some()
    }
}
