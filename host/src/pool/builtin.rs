//! Native tools built into keel. They sit behind the same [`Tool`] trait as
//! plugins and are held to the same grants: file access goes through cap-std
//! directories, never through path strings joined onto `std::fs`.
//!
//! [`Tool`]: crate::tool::Tool

mod read;
mod tool_search;

pub use read::Read;
pub use tool_search::{TOOL_SEARCH, ToolSearch};
