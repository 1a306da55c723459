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
//! The path of a call, room by room (see `ARCHITECTURE.md`): [`load`]ing
//! (engine, compile cache, sandbox, grants) → the [`pool`] (schemas,
//! definitions, built-ins) → [`permissions`] → the run (partition,
//! scheduler, one call, interrupt) → [`budget`]s (persisted results, the
//! [`ledger`](budget::ledger)) → [`events`].
#![deny(missing_docs)]

pub mod batch;
pub mod budget;
pub mod config;
pub mod content;
pub mod contract;
pub mod error;
pub mod events;
pub mod fs;
mod host;
pub mod limits;
pub mod load;
pub mod permissions;
pub mod pool;
mod run;
pub mod tool;

pub use batch::{ToolResult, ToolUse};
pub use content::{Content, ContentBlock, Image};
pub use contract::CONTRACT_VERSION;
pub use error::{Error, Result};
pub use events::Event;
pub use host::{
    BatchRun, Environment, Host, HostBuilder, STACK_PREFAULT, load_plugins, lock_entries,
    prefault_thread_stack,
};
pub use limits::Limits;
pub use load::sandbox::{defer_teardown_on_this_thread, tear_down_when_idle};
pub use run::context;
pub use run::interrupt::Interrupt;
pub use run::scheduler::BatchOutcome;
pub use run::stream::{Arrival, CallStream, EventSink};
pub use tool::{Invocation, Tool, ToolSpec};
