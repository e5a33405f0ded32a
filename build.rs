//! Build script: a fingerprint of the planner, emitter and runtime sources
//! (`MUCC_SOURCE_FINGERPRINT`), so that the tuning cache (`cuda::tune`) keeps results apart per
//! planner and not only per package version: a tuned variant measured with other code is stale.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let mut all = Vec::new();
    for d in ["src", "runtime-headers", "templates"] {
        println!("cargo:rerun-if-changed={d}");
        files(&root.join(d), &mut all);
    }
    all.sort();
    let mut h = DefaultHasher::new();
    for p in &all {
        p.strip_prefix(&root).unwrap_or(p).hash(&mut h);
        std::fs::read(p).unwrap_or_default().hash(&mut h);
    }
    println!(
        "cargo:rustc-env=MUCC_SOURCE_FINGERPRINT={:016x}",
        h.finish()
    );
}
