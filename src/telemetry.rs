//! Logging: text for people, JSON for log pipelines; the level from `RUST_LOG` (default info).

use std::io::IsTerminal;

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Text => registry
            .with(
                fmt::layer()
                    .with_ansi(colour(
                        std::io::stderr().is_terminal(),
                        std::env::var_os("NO_COLOR"),
                    ))
                    .with_writer(std::io::stderr),
            )
            .init(),
        LogFormat::Json => registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .init(),
    }
}

/// Text logs are coloured only on a terminal, and never with `NO_COLOR` set (no-color.org): a
/// file or a pipe gets plain text.
pub fn colour(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::colour;

    #[test]
    fn text_logs_are_plain_unless_stderr_is_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(!colour(false, None), "a file or a pipe");
        assert!(!colour(true, Some("1".into())), "NO_COLOR");
        assert!(
            colour(true, Some("".into())),
            "an empty NO_COLOR does not count"
        );
    }
}
