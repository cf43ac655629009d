//! The `idemkv` command line: argument parsing, dispatch to one module per subcommand, and
//! the mapping of failures to one-line messages and exit codes.
//!
//! Adding a subcommand: a module `src/cli/<name>.rs` with a `clap::Args` struct and a
//! `run(&Args) -> Result<(), CliError>`, a variant in [`Command`], and a line in [`dispatch`].

mod demo;
pub(crate) mod error;
pub(crate) mod output;

use clap::{Parser, Subcommand};
use error::{CliError, EXIT_ERROR, EXIT_OK};
use std::process::ExitCode;

/// idemkv: an embedded idempotency engine. This tool demonstrates the race it closes.
#[derive(Debug, Parser)]
#[command(name = "idemkv", version, about, long_about = None, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Reproduce the duplicate-delivery race: naive check-then-act vs idemkv, side by side
    ///
    /// Consumer threads receive bursty concurrent duplicates (redeliveries while the first copy
    /// still works, rebalances, retry storms) and charge a card once per message. The same
    /// seeded plan runs through a naive handler (check a processed-set, work, then record it)
    /// and through the same handler guarded by idemkv's Engine::run on a temporary redb file.
    /// The naive handler double-charges; idemkv must not.
    ///
    /// Exit codes: 0 ok, 1 idemkv let a side effect run twice, 2 usage or I/O error.
    Demo(demo::DemoArgs),
}

fn dispatch(cli: &Cli) -> Result<(), CliError> {
    match &cli.command {
        Command::Demo(args) => demo::run(args),
    }
}

/// Parses the arguments, runs the subcommand, and turns the result into an exit code.
pub(crate) fn main() -> ExitCode {
    // A bug must still end in one line and a meaningful code, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("idemkv: internal error: {}{at}", one_line(&what));
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_error(e),
    };
    match std::panic::catch_unwind(|| dispatch(&cli)) {
        Ok(Ok(())) => ExitCode::from(EXIT_OK),
        Ok(Err(e)) => {
            eprintln!("idemkv: error: {e}");
            e.exit_code()
        }
        Err(_) => ExitCode::from(EXIT_ERROR),
    }
}

/// `--help` and `--version` print in full; a usage error is one line, then a pointer to help.
fn clap_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                ExitCode::from(EXIT_ERROR)
            } else {
                ExitCode::from(EXIT_OK)
            }
        }
        _ => {
            let rendered = e.render().to_string();
            eprintln!(
                "idemkv: error: {}",
                usage_error_line(&rendered, subcommand_used().as_deref())
            );
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Condenses clap's multi-line usage error to one line: the error, the possible values or a
/// tip if clap gave one, and where to find help for the (sub)command that was used.
fn usage_error_line(rendered: &str, subcommand: Option<&str>) -> String {
    let lines: Vec<&str> = rendered.lines().map(str::trim).collect();
    let first = lines
        .iter()
        .find(|l| !l.is_empty())
        .copied()
        .unwrap_or("invalid arguments");
    let mut out = first.trim_start_matches("error: ").to_string();
    for extra in lines.iter().skip(1) {
        if extra.starts_with("[possible values:") || extra.starts_with("tip:") {
            out.push_str(&format!(" {extra}"));
        }
    }
    // "Usage: idemkv demo [OPTIONS]" -> "idemkv demo".
    let command = lines
        .iter()
        .find_map(|l| l.strip_prefix("Usage: "))
        .map(|u| {
            u.split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<', '-']))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| match subcommand {
            Some(sub) => format!("idemkv {sub}"),
            None => "idemkv".into(),
        });
    format!("{out}; see '{command} --help'")
}

/// The subcommand named on the command line, if any (for pointing at its help).
fn subcommand_used() -> Option<String> {
    use clap::CommandFactory;
    let first = std::env::args().skip(1).find(|a| !a.starts_with('-'))?;
    Cli::command()
        .get_subcommands()
        .any(|c| c.get_name() == first)
        .then_some(first)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn usage_errors_are_one_line_and_point_to_the_right_help() {
        let e = Cli::try_parse_from(["idemkv", "demo", "--pattern", "foo"]).unwrap_err();
        let line = usage_error_line(&e.render().to_string(), Some("demo"));
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("possible values"), "{line}");
        assert!(line.ends_with("see 'idemkv demo --help'"), "{line}");
        let e = Cli::try_parse_from(["idemkv", "demo", "--bogus"]).unwrap_err();
        let line = usage_error_line(&e.render().to_string(), None);
        assert!(line.ends_with("see 'idemkv demo --help'"), "{line}");
        let e = Cli::try_parse_from(["idemkv", "demox"]).unwrap_err();
        let line = usage_error_line(&e.render().to_string(), None);
        assert!(line.ends_with("see 'idemkv --help'"), "{line}");
    }
}
