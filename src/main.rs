//! The `mucc` command line. Exit codes: 0 success, 1 user error (bad input, failed check),
//! 2 internal error (a bug in mucc).

#![allow(clippy::needless_range_loop)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = match cli::Cli::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(1),
            };
        }
    };
    // A panic is a bug in mucc: report it as an internal error (exit 2), never as a user error.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("mucc: internal error: {info}");
        eprintln!("This is a bug in mucc; please report it with the input that triggered it.");
    }));
    match std::panic::catch_unwind(|| cli::run(args)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(cli::Failure::User(msg))) => {
            eprintln!("error: {msg}");
            ExitCode::from(1)
        }
        Ok(Err(cli::Failure::Quiet)) => ExitCode::from(1),
        Ok(Err(cli::Failure::BrokenPipe)) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(2),
    }
}
