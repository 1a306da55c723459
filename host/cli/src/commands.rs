//! One module per subcommand.

pub mod bench;
pub mod inspect;
pub mod list;
pub mod new;
pub mod run;
pub mod serve;
pub mod test;
