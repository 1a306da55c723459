//! One module per subcommand.

pub mod bench;
pub mod cache;
pub mod inspect;
pub mod list;
pub mod lock;
pub mod new;
pub mod publish;
pub mod run;
pub mod serve;
pub mod test;
