//! The floor every `keel bench` figure is compared with: a bare
//! pre-instantiated component on keel's own engine settings, called in a
//! fresh store with nothing of keel around it. Not part of the API an
//! embedder uses; the benchmark needs wasmtime, and wasmtime stays in this
//! room.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::Store;

use super::bindings::{ContentBlock, GuestPre};
use super::engine::{RACY_WINDOW, Runtime};
use super::grants::PluginGrant;
use super::sandbox::{Mounts, SandboxState};
use crate::error::{Error, Result};
use crate::limits::Limits;

/// How recently a plugin file may have changed for the compile cache's index
/// to skip it: a warm start's files are older than this.
pub const CACHE_RACY_WINDOW: Duration = RACY_WINDOW;

/// A component ready to instantiate, with no limits but the engine's.
pub struct Floor {
    pre: GuestPre<SandboxState>,
    mounts: Option<Arc<Mounts>>,
    _runtime: Runtime,
}

impl Floor {
    /// The component at `path` on keel's default engine: fuel and epoch
    /// interruption on, as every keel call has them.
    pub fn new(path: &Path) -> Result<Self> {
        Floor::on(Runtime::new(&Limits::default(), None)?, path, None)
    }

    /// The component at `path` on an engine with fuel and epoch
    /// interruption off, with `workspace` mounted read-only: what metering
    /// costs shows apart from the rest of the path.
    pub fn unmetered(path: &Path, workspace: &Path) -> Result<Self> {
        let mounts = Mounts::open(&PluginGrant::workspace_only(workspace))
            .map_err(|error| Error::io("open", workspace, error))?;
        Floor::on(Runtime::unmetered(&Limits::default())?, path, Some(Arc::new(mounts)))
    }

    fn on(runtime: Runtime, path: &Path, mounts: Option<Arc<Mounts>>) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|error| Error::io("read", path, error))?;
        let compiled = runtime.compile(path, &bytes)?;
        let pre = super::plugin::link(&runtime, path, &compiled.component)?;
        Ok(Floor { pre, mounts, _runtime: runtime })
    }

    /// A fresh store, instantiate, one `call` of `input`: nothing else, and
    /// through the same bindings as a keel call, which look up only the
    /// export they call. The tool's own error is `Err`.
    pub async fn call(&self, input: &str) -> std::result::Result<String, String> {
        let state = match &self.mounts {
            Some(mounts) => SandboxState::bare_in(mounts.clone()),
            None => SandboxState::bare(),
        };
        let mut store = Store::new(self.pre.engine(), state);
        // An engine without fuel refuses any: that is what it is for.
        let _ = store.set_fuel(u64::MAX);
        store.set_epoch_deadline(u64::MAX / 2);
        let tool = self.pre.instantiate_async(&mut store).await.expect("the floor instantiates");
        let output = tool.call(&mut store, input, r#"{"cwd":"/workspace"}"#).await;
        let output = output.expect("the floor's call does not trap")?;
        let text = output.content.into_iter().find_map(|block| match block {
            ContentBlock::Text(text) => Some(text),
            ContentBlock::Image(_) => None,
        });
        Ok(text.unwrap_or_default())
    }
}

/// The network policy's whole judgement of one request to `addr` under
/// `grant`, as every guest request meets it before anything is sent: its
/// method, its URL and Host header against the grant's rules, and the
/// address its name resolved to. What the policy alone costs per request.
pub fn network_check<B>(
    grant: &crate::load::network::NetworkGrant,
    request: &http::Request<B>,
    addr: std::net::IpAddr,
) -> std::result::Result<(), String> {
    let (target, _rule) = super::egress::check(grant, request)?;
    grant.allows_address(&target, addr)
}
