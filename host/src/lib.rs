//! keel-host: run third-party agent tools as sandboxed WebAssembly components.
//!
//! An agent hands keel the `tool_use` blocks of one model turn; keel runs each
//! tool in a fresh sandbox (wasmtime, WASI p2, a capability-gated workspace,
//! fuel, a deadline, a memory cap) and hands back exactly one `tool_result` per
//! `tool_use`, in order.
//!
//! ```no_run
//! use keel_host::{Host, ToolUse};
//! use serde_json::json;
//!
//! # async fn run() -> keel_host::Result<()> {
//! let host = Host::builder()
//!     .workspace("/path/to/project")
//!     .plugins("/path/to/tools/")
//!     .build()
//!     .await?;
//! let batch = [ToolUse::new("toolu_1", "grep", json!({ "pattern": "fn main" }))];
//! let outcome = host.run_batch(&batch).await;
//! println!("{}", keel_host::batch::user_message(&outcome.results));
//! # Ok(())
//! # }
//! ```
//!
//! The path of a call: [`plugin`] loading → [`pool`] → validation and
//! [`permissions`] ([`runner`]) → a [`sandbox`] with [`limits`] → results
//! ([`batch`]).
#![deny(missing_docs)]

pub mod batch;
pub mod bench;
mod bindings;
pub mod budget;
pub mod builtin;
pub mod config;
pub mod context;
pub mod definitions;
pub mod engine;
pub mod error;
pub mod events;
pub mod fixture;
pub mod grants;
mod host;
pub mod ledger;
pub mod limits;
pub mod partition;
pub mod permissions;
pub mod plugin;
pub mod pool;
pub mod runner;
pub mod sandbox;
pub mod scheduler;
pub mod schema;
pub mod summary;
pub mod tool;

pub use batch::{ToolResult, ToolUse};
pub use bindings::CONTRACT_VERSION;
pub use error::{Error, Result};
pub use events::Event;
pub use host::{BatchRun, Host, HostBuilder, PlannedCall};
pub use limits::Limits;
pub use scheduler::{BatchOutcome, Interrupt};
pub use tool::{Invocation, Tool, ToolSpec};
