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

/// `text` as a terminal shows it safely: each control character (escape,
/// bell, NUL, a line break…) written as Rust escapes it, `\u{1b}`, `\n`,
/// so that a name or id a model wrote cannot move the cursor, retitle the
/// window or fake a line. Everything else is left as it is.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            shown.extend(c.escape_debug());
        } else {
            shown.push(c);
        }
    }
    shown.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_printed_escaped_and_nothing_else() {
        assert_eq!(printable("t\u{1b}[31m\u{7}\0a\nb\u{9b}"), r"t\u{1b}[31m\u{7}\0a\nb\u{9b}");
        assert_eq!(printable("grep «é» \\ \""), "grep «é» \\ \"");
        assert!(matches!(printable("grep"), std::borrow::Cow::Borrowed("grep")));
    }
}
