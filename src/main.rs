//! The `mucc` command line. Exit codes: 0 success, 1 user error (bad input, failed check),
//! 2 internal error (a bug in mucc).

#![allow(clippy::needless_range_loop)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

/// Prints a command-line error. clap quotes the offending argument as given: an argument with a
/// newline or an escape sequence is printed escaped (without colours), so that it cannot forge
/// a line of output.
fn print_clap_error(e: &clap::Error) {
    // Each argument, and the value of each `--option=value`, that would act on a terminal.
    let mut hostile: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .flat_map(|a| {
            let value = a
                .strip_prefix('-')
                .and_then(|o| o.split_once('='))
                .map(|(_, v)| v.to_string());
            std::iter::once(a).chain(value)
        })
        .filter(|a| mucc::graph::error::escape(a) != a.as_str())
        .collect();
    // The longest first, so that an argument is escaped whole before its value alone.
    hostile.sort_by_key(|a| std::cmp::Reverse(a.len()));
    if hostile.is_empty()
        || matches!(
            e.kind(),
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
        )
    {
        let _ = e.print();
        return;
    }
    // With clap's styles, which the plain rendering would strip from the arguments too.
    let mut text = e.render().ansi().to_string();
    for a in &hostile {
        text = text.replace(a.as_str(), &mucc::graph::error::escape(a));
    }
    let text = strip_styles(&text);
    // Whatever clap wrote around the arguments is escaped too, line by line.
    let text: Vec<String> = text
        .lines()
        .map(|l| mucc::graph::error::escape(l).into_owned())
        .collect();
    eprintln!("{}", text.join("\n"));
}

/// `text` without its ANSI style sequences (`ESC [ … final byte`).
fn strip_styles(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for f in chars.by_ref() {
                if ('\u{40}'..='\u{7e}').contains(&f) {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn main() -> ExitCode {
    let args = match cli::Cli::try_parse() {
        Ok(a) => a,
        Err(e) => {
            print_clap_error(&e);
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
