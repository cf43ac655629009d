//! The tool's errors and exit codes: every failure is one line on stderr and a code that
//! says what kind of failure it was.

use std::fmt;
use std::process::ExitCode;

/// Everything went as it should.
pub(crate) const EXIT_OK: u8 = 0;
/// The command ran and its answer is "no": idemkv broke its contract (the demo saw a side
/// effect run twice), `verify` found damage, `get` found no record, `release` found no claim
/// to release, `import` refused some records.
pub(crate) const EXIT_VIOLATION: u8 = 1;
/// Bad usage, or an I/O or engine error that stopped the command.
pub(crate) const EXIT_ERROR: u8 = 2;

/// A failure that ends the command.
#[derive(Debug)]
pub(crate) struct CliError {
    code: u8,
    message: String,
}

impl CliError {
    /// Bad arguments.
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        CliError {
            code: EXIT_ERROR,
            message: message.into(),
        }
    }

    /// An I/O or engine failure; `context` says what was being done.
    pub(crate) fn io(context: impl fmt::Display, err: impl fmt::Display) -> Self {
        CliError {
            code: EXIT_ERROR,
            message: format!("{context}: {err}"),
        }
    }

    /// idemkv broke its contract.
    pub(crate) fn violation(message: impl Into<String>) -> Self {
        CliError {
            code: EXIT_VIOLATION,
            message: message.into(),
        }
    }

    /// The command ran and its answer is "no" (exit 1), with the reason.
    pub(crate) fn negative(message: impl Into<String>) -> Self {
        CliError {
            code: EXIT_VIOLATION,
            message: message.into(),
        }
    }

    /// Exit with `code` and print nothing more: the command's output already said why.
    pub(crate) fn silent(code: u8) -> Self {
        CliError {
            code,
            message: String::new(),
        }
    }

    /// Whether there is a message to print.
    pub(crate) fn is_silent(&self) -> bool {
        self.message.is_empty()
    }

    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code)
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One line, whatever the underlying error printed.
        let one_line = self
            .message
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        f.write_str(&one_line)
    }
}

impl std::error::Error for CliError {}

/// Writing the report to stdout failed. A closed pipe (`idemkv demo | head`) is not an error
/// worth reporting; anything else is.
pub(crate) fn write_failed(err: std::io::Error) -> Option<CliError> {
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        None
    } else {
        Some(CliError::io("writing to stdout", err))
    }
}
