//! One module per subcommand.

pub mod list;
pub mod new;
pub mod bench;
pub mod inspect;
pub mod run;
pub mod serve;
pub mod test;
