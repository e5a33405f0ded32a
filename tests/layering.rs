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

/// The first `mucc::NAME` in `code` whose NAME is not one of this crate's modules (a Rust
/// path such as `mucc::buildscript` in an error message is not the runtime's).
fn runtime_name(code: &str) -> Option<String> {
    const CRATE_MODULES: [&str; 11] = [
        "text",
        "target",
        "outputs",
        "graph",
        "layout",
        "sched",
        "explain",
        "emit",
        "transpile",
        "cuda",
        "buildscript",
    ];
    code.match_indices("mucc::").find_map(|(i, _)| {
        let rest = &code[i + "mucc::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        (!CRATE_MODULES.contains(&name.as_str())).then(|| format!("mucc::{name}"))
    })
}

/// The spellings of the generated C++ are in `emit` only (`emit::cxx` holds the table): no
/// string anywhere else in `src/` names the runtime (`"mucc::…`), a CUDA, cuBLAS, NCCL or
/// tensor-map enumerator, or a CUDA C++ type or qualifier. The stages before `emit` decide and
/// `emit` prints; `explain`, `cuda` and the rest print the plan's own names. The plan file's
/// serde names of cuBLAS's types (`#[serde(rename = "CUDA_R_16F")]` in `sched::gemm`, values
/// of `.plan.json`) are its data format and exempt.
#[test]
fn cxx_spellings_are_in_emit_only() {
    const SPELLINGS: [&str; 13] = [
        "CUDA_R_",
        "CUBLAS_OP_",
        "CUBLAS_COMPUTE_",
        "CUBLAS_GEMM_",
        "CU_TENSOR_MAP_",
        "ncclInt",
        "ncclUint",
        "ncclFloat",
        "ncclBfloat",
        "__half",
        "__nv_bfloat16",
        "__global__",
        "cuuint",
    ];
    let (src, files) = sources("");
    let mut bad = Vec::new();
    let mut files_seen = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        if rel.starts_with("emit") {
            continue;
        }
        files_seen += 1;
        for (n, code) in code_lines(f) {
            if !code.contains('"') || code.contains("#[serde(rename") {
                continue;
            }
            if let Some(w) = SPELLINGS.iter().find(|w| code.contains(*w)) {
                bad.push(format!("{}:{n}: {w} in {}", rel.display(), code.trim()));
            } else if let Some(name) = runtime_name(&code) {
                bad.push(format!("{}:{n}: {name} in {}", rel.display(), code.trim()));
            }
        }
    }
    assert!(files_seen > 40, "only {files_seen} files read");
    assert!(
        bad.is_empty(),
        "C++ spelled outside emit:\n{}",
        bad.join("\n")
    );
}
