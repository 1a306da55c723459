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

/// A size for a person: `512 B`, `3.4 KiB`, `1.1 MiB`.
pub fn size(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
    }
}
