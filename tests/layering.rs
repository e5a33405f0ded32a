//! The stages import one way (`ARCHITECTURE.md`): graph ← layout ← sched ← explain, emit ←
//! transpile ← cuda ← buildscript; `target` and `outputs` import nothing of mucc; `explain` and
//! `emit` do not import each other. Every `crate::<module>` path in `src/` (outside comments)
//! is checked against this order.

use std::path::{Path, PathBuf};

/// The rank of a top-level module: a module may name only modules of a lower rank (or
/// itself). `explain` and `emit` share a rank, so neither may name the other.
fn rank(module: &str) -> Option<u32> {
    Some(match module {
        "target" | "outputs" => 0,
        "graph" => 1,
        "layout" => 2,
        "sched" => 3,
        "explain" | "emit" => 4,
        "transpile" => 5,
        "cuda" => 6,
        "buildscript" => 7,
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

#[test]
fn stages_import_one_way() {
    let src = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let mut files = Vec::new();
    rust_files(&src, &mut files);
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
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap();
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let Some(r) = rank(&name) else { continue };
                checked += 1;
                if name != top && r >= own {
                    bad.push(format!(
                        "{}:{}: {top} names crate::{name}",
                        rel.display(),
                        n + 1
                    ));
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
