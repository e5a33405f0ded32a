//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod compile_cache;
pub mod plan_check;

use std::path::PathBuf;

/// `../shared/corpus/mirage-benchmarks` relative to the crate.
pub fn corpus_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/corpus/mirage-benchmarks"
    ))
}

/// Every corpus file, sorted by name.
pub fn corpus_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("the corpus is at ../shared/corpus/mirage-benchmarks")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    v
}

/// Compares `actual` with the golden file `golden/<name>` (relative to the crate), or writes it
/// when `MUCC_BLESS=1`.
pub fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/golden")).join(name);
    // Generated C++ keeps to the emitter's line limit (comments and the header included).
    if name.ends_with(".cu")
        && let Some((n, l)) = actual
            .lines()
            .enumerate()
            .find(|(_, l)| l.len() > mucc::emit::cxx::MAX_LINE)
    {
        panic!(
            "{name}: line {} has {} characters (limit {}): {l}",
            n + 1,
            l.len(),
            mucc::emit::cxx::MAX_LINE
        );
    }
    if std::env::var_os("MUCC_BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "golden file {} is missing; run with MUCC_BLESS=1 to create it",
            path.display()
        )
    });
    if expected != actual {
        let first = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the output at line {}:\n  golden: {:?}\n  actual: {:?}\n(re-bless with MUCC_BLESS=1 if the change is intended)",
            path.display(),
            first + 1,
            expected.lines().nth(first),
            actual.lines().nth(first)
        );
    }
}
