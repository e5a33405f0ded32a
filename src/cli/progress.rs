//! The progress bar of the commands that work through several graphs (or variants): `eval`,
//! `run`, `bench` and `tune`.
//!
//! One rule for all of them: a bar is drawn on stderr only when there is more than one item and
//! stderr is a terminal. Otherwise it is hidden — its methods do nothing — so logs, pipes and
//! tests see exactly the output they saw before bars existed.
//!
//! While a bar exists, print through [`ProgressBar::suspend`] (it clears the bar, runs the
//! closure, and draws the bar again), never straight to stdout or stderr, or the bar's line and
//! the printed line end up mixed. `ProgressBar::println` is no substitute: on a hidden bar it
//! prints nothing.

use std::borrow::Cow;
use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};

/// A bar of `len` items named `unit` ("graphs", "variants"), or a hidden one when `len` ≤ 1 or
/// stderr is not a terminal. It shows `message` after the counts until `set_message` changes it
/// (to name the graph being worked on; keep messages short, the bar takes the rest of the
/// line), redraws itself every 200 ms (so the elapsed time moves during long steps such as
/// compiling), and clears itself when dropped unfinished (an early error).
pub fn bar(len: u64, unit: &str, message: impl Into<Cow<'static, str>>) -> ProgressBar {
    if len <= 1 || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    // `wide_bar` takes what the terminal's width leaves, so the line does not wrap.
    let template =
        format!("{{wide_bar}} {{pos}}/{{len}} {unit}, {{elapsed}} elapsed, ~{{eta}} left  {{msg}}");
    let style =
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar());
    let b = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
        .with_style(style)
        .with_message(message)
        .with_finish(ProgressFinish::AndClear);
    b.enable_steady_tick(Duration::from_millis(200));
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_item_never_gets_a_bar() {
        assert!(bar(0, "graphs", "").is_hidden());
        assert!(bar(1, "graphs", "").is_hidden());
    }

    #[test]
    fn several_items_get_a_bar_only_on_a_terminal() {
        let b = bar(5, "graphs", "graph 0");
        assert_eq!(b.is_hidden(), !std::io::stderr().is_terminal());
        assert_eq!(b.length(), if b.is_hidden() { None } else { Some(5) });
        b.finish_and_clear();
    }

    #[test]
    fn suspend_runs_its_closure_on_a_hidden_bar() {
        // Output goes through `suspend`; it must run even when no bar is drawn.
        let b = bar(1, "graphs", "");
        assert_eq!(b.suspend(|| 41 + 1), 42);
    }
}
