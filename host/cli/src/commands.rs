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

/// A write to standard output that failed: see `out!` in `main.rs`.
#[derive(Debug)]
pub struct StdoutError(pub std::io::Error);

impl std::fmt::Display for StdoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "failed to write to standard output: {}", self.0)
    }
}

impl std::error::Error for StdoutError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// `count` of `noun`, for a person: `1 plugin`, `2 plugins`.
pub fn counted(count: usize, noun: &str) -> String {
    format!("{count} {noun}{}", if count == 1 { "" } else { "s" })
}

/// A size for a person: `512 B`, `3.4 KiB`, `1.1 MiB`.
pub fn size(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
    }
}
