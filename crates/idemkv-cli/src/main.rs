//! `idemkv`: the command-line tool. `idemkv demo` shows the duplicate-delivery race that
//! idemkv closes; the operator subcommands look inside an idemkv file.
//!
//! A crate of its own, so that its dependencies (clap, serde_json, indicatif) stay out of
//! the library.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
