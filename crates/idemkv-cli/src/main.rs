//! `idemkv`: the command-line tool. `idemkv demo` shows the duplicate-delivery race that
//! idemkv closes; the operator subcommands look inside an idemkv file.
//!
//! Built only with the default `cli` feature (clap, serde_json, indicatif).

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
