//! The stages import one way (`ARCHITECTURE.md`): graph ← layout ← sched ← explain, emit ←
//! transpile ← cuda ← buildscript; `text` imports nothing of mucc, `target` and `outputs` only
//! `text`; `explain` and `emit` do not import each other. Every `crate::<module>` path in `src/` (outside comments),
//! grouped ones (`crate::{a, b::c}`) included, is checked against this order; and the two
//! emitters (`emit::kernel_level`, `emit::threadblock`) do not name each other.

use std::path::{Path, PathBuf};

/// The rank of a top-level module: a module may name only modules of a lower rank (or
/// itself). `explain` and `emit` share a rank, so neither may name the other.
fn rank(module: &str) -> Option<u32> {
    Some(match module {
        "text" => 0,
        "target" | "outputs" => 1,
        "graph" => 2,
        "layout" => 3,
        "sched" => 4,
        "explain" | "emit" => 5,
        "transpile" => 6,
        "cuda" => 7,
        "buildscript" => 8,
        _ => return None,
    })
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The Rust files under `src/<sub>` (`sub` empty: all of `src/`), and that folder.
fn sources(sub: &str) -> (PathBuf, Vec<PathBuf>) {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src")).join(sub);
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    (dir, files)
}

/// (line number from 1, the line's code before any `//` comment) of every line of `f`.
fn code_lines(f: &Path) -> Vec<(usize, String)> {
    std::fs::read_to_string(f)
        .unwrap()
        .lines()
        .enumerate()
        .map(|(n, l)| (n + 1, l.split("//").next().unwrap().to_string()))
        .collect()
}

#[test]
fn stages_import_one_way() {
    let (src, files) = sources("");
    let mut bad = Vec::new();
    let mut checked = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = top.trim_end_matches(".rs");
        // The binary (cli, main) and the crate root may name every stage.
        let Some(own) = rank(top) else { continue };
        for (n, code) in code_lines(f) {
            for name in crate_paths(&code) {
                let Some(r) = rank(&name) else { continue };
                checked += 1;
                if name != top && r >= own {
                    bad.push(format!("{}:{n}: {top} names crate::{name}", rel.display()));
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} crate:: paths found");
    assert!(
        bad.is_empty(),
        "imports against the stage order:\n{}",
        bad.join("\n")
    );
}

/// The top-level module of every `crate::` path on a line of code: `crate::name`, and each
/// first segment of a group `crate::{a, b::c, d::{e}}`.
fn crate_paths(code: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Split the group at its top-level commas.
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        names.push(ident(&group[start..j]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.push(ident(&group[start..j]));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            names.push(ident(rest));
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

#[test]
fn grouped_paths_are_seen() {
    assert_eq!(crate_paths("use crate::graph::Shape;"), ["graph"]);
    assert_eq!(
        crate_paths("use crate::{graph::{Shape, DType}, sched::plan, cuda};"),
        ["graph", "sched", "cuda"]
    );
}

/// The names by which a file of one emitter could reach the other: its module path from
/// `crate::`, a relative `super::` path (`super::super::` contains it), or any path through it.
fn emitter_names(other: &str) -> Vec<String> {
    vec![
        format!("emit::{other}"),
        format!("super::{other}"),
        format!("{other}::"),
    ]
}

#[test]
fn emitters_do_not_name_each_other() {
    let (emit, files) = sources("emit");
    let mut bad = Vec::new();
    let mut seen = [0, 0];
    for f in &files {
        let rel = f.strip_prefix(&emit).unwrap().to_string_lossy().to_string();
        let (side, other) = if rel.starts_with("kernel_level") {
            (0, "threadblock")
        } else if rel.starts_with("threadblock") {
            (1, "kernel_level")
        } else {
            continue;
        };
        seen[side] += 1;
        for (n, code) in code_lines(f) {
            if emitter_names(other)
                .iter()
                .any(|p| code.contains(p.as_str()))
            {
                bad.push(format!("emit/{rel}:{n}: names {other}"));
            }
        }
    }
    assert!(
        seen[0] >= 1 && seen[1] >= 2,
        "emitter files not found: {seen:?}"
    );
    assert!(
        bad.is_empty(),
        "the emitters name each other:\n{}",
        bad.join("\n")
    );
}

/// The runtime's C++ names (`mucc::…` in a string) are spelled in `emit` only: the planning
/// stages before it (graph, layout, sched, explain, target) decide, `emit` prints. (The
/// tensor-map and cuBLAS enum names of the launch plan's JSON are part of its format, in
/// `sched`, and are not runtime names.)
#[test]
fn runtime_names_are_spelled_in_emit_only() {
    let mut bad = Vec::new();
    let mut files_seen = 0;
    for sub in ["graph", "layout", "sched", "explain.rs", "target.rs"] {
        let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src")).join(sub);
        let files = if path.is_dir() {
            sources(sub).1
        } else {
            vec![path]
        };
        for f in files {
            files_seen += 1;
            for (n, code) in code_lines(&f) {
                if code.contains("\"mucc::") {
                    bad.push(format!("{}:{n}: {}", f.display(), code.trim()));
                }
            }
        }
    }
    assert!(files_seen > 20, "only {files_seen} files read");
    assert!(
        bad.is_empty(),
        "runtime names spelled outside emit:\n{}",
        bad.join("\n")
    );
}
