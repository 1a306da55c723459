//! One module per subcommand.

pub mod list;
pub mod run;
pub mod test;
