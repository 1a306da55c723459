//! The run: a batch planned, cut into runs that may go in parallel and calls
//! that must go alone, and run under the concurrency cap; one call's steps
//! from its plan to its result; the interrupt; and the shared context the
//! calls see (README, "How a batch runs").

pub(crate) mod call;
pub mod context;
pub(crate) mod interrupt;
pub(crate) mod partition;
pub(crate) mod scheduler;
pub(crate) mod stream;
