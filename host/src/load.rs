//! Loading: the one wasmtime engine and its compile cache, the bindings
//! generated from `wit/`, the sandbox of one call with its grants and limits,
//! and plugins, which put a component behind the host's [`Tool`] trait.
//!
//! wasmtime stays in this room: nothing outside it names a wasmtime type.
//!
//! [`Tool`]: crate::tool::Tool

pub(crate) mod bindings;
pub mod cache;
pub(crate) mod canary;
pub(crate) mod egress;
pub(crate) mod engine;
pub(crate) mod epoch;
#[doc(hidden)]
pub mod floor;
pub(crate) mod grants;
pub mod lock;
pub mod network;
#[cfg(feature = "oci")]
pub mod oci;
pub(crate) mod plugin;
pub(crate) mod sandbox;
pub(crate) mod special_files;

pub use self::engine::{Runtime, default_cache_dir};
pub use self::grants::{Access, DirGrant, Grants, PluginConfig, PluginGrant, PluginsConfig};
pub use self::lock::{Lock, LockedPlugin, Pins};
pub use self::plugin::{LoadReport, PluginTool, plugin_files};
