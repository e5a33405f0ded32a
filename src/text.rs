//! User-provided text (file names, strings read from files, command-line values) made fit for
//! messages: escaped so that it cannot act on a terminal, and clipped so that a huge string
//! does not come back whole.

use std::borrow::Cow;
use std::path::Path;

/// `s` shortened for an error message: at most 64 characters, with the total length noted when
/// cut (a 50 MB string from a file must not come back as 100 MB of stderr), and escaped as
/// [`escape`] does.
pub fn clip(s: &str) -> String {
    const KEEP: usize = 64;
    match s.char_indices().nth(KEEP) {
        None => escape(s).into_owned(),
        Some((cut, _)) => format!("{}… ({} bytes in all)", escape(&s[..cut]), s.len()),
    }
}

/// Whether `c` would act on a terminal instead of showing: a C0 or C1 control character, DEL,
/// or a bidirectional formatting character (which reorders the text around it).
fn acts_on_terminal(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` for a message: text from a file or a file name (user-provided) with every character that
/// would act on a terminal written out — `\n`, `\r`, `\t`, `\x1b` style for C0 controls and
/// DEL, `\u{9b}` style for C1 controls and bidirectional overrides — so that it can neither forge
/// a line of mucc's output (an `error:` line) nor send escape sequences. Other text, backslashes
/// included, is unchanged.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(acts_on_terminal) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 && acts_on_terminal(c) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if acts_on_terminal(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A path for a message: [`Path::display`] (invalid UTF-8 shown as U+FFFD), escaped as
/// [`escape`] does.
pub fn escape_path(p: &Path) -> String {
    let shown = p.display().to_string();
    match escape(&shown) {
        Cow::Borrowed(_) => shown,
        Cow::Owned(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_that_acts_on_a_terminal_is_written_out() {
        assert!(matches!(escape("gated_mlp.json"), Cow::Borrowed(_)));
        assert_eq!(escape("a\\b µ"), "a\\b µ");
        assert_eq!(
            escape("x\nerror: y\r\t\u{1b}[2J\u{7f}\u{9b}\u{202e}"),
            "x\\nerror: y\\r\\t\\x1b[2J\\x7f\\u{9b}\\u{202e}"
        );
        assert_eq!(escape_path(Path::new("/tmp/a\nb.json")), "/tmp/a\\nb.json");
        // clip escapes what it keeps and counts the original bytes.
        let long = format!("\n{}", "x".repeat(100));
        let c = clip(&long);
        assert!(
            c.starts_with("\\nxxx") && c.ends_with("(101 bytes in all)"),
            "{c}"
        );
        assert_eq!(
            escape_path(Path::new("a\u{1b}]0;title\u{7}.json")),
            "a\\x1b]0;title\\x07.json"
        );
    }
}
