//! Writes random valid µGraphs (`mucc::graph::random`) as Mirage JSON candidate lists, for
//! `mucc run --all --check` on a GPU machine (scripts/gpu-test.sh, step `generated`).
//!
//!   cargo run --release --example gen_graphs -- OUT_DIR COUNT [FIRST_SEED] [PER_FILE]
//!
//! Graph i of the run has seed FIRST_SEED + i; files `gen_<first seed of the file>.json` hold
//! PER_FILE graphs each (default 100), so a failure names its seed: file seed + graph index.

use std::path::PathBuf;

use mucc::graph::mirage_json::{ExportOptions, graphs_to_json};
use mucc::graph::random::{GenConfig, graph};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: gen_graphs OUT_DIR COUNT [FIRST_SEED] [PER_FILE]");
        std::process::exit(2);
    }
    let out = PathBuf::from(&args[1]);
    let count: u64 = args[2].parse().expect("COUNT is a number");
    let first: u64 = args
        .get(3)
        .map_or(0, |s| s.parse().expect("FIRST_SEED is a number"));
    let per: u64 = args
        .get(4)
        .map_or(100, |s| s.parse().expect("PER_FILE is a number"));
    std::fs::create_dir_all(&out).expect("the output folder");
    let cfg = GenConfig::default();
    let mut start = first;
    while start < first + count {
        let end = (start + per).min(first + count);
        let graphs: Vec<_> = (start..end).map(|s| graph(s, &cfg)).collect();
        let json = graphs_to_json(graphs.iter(), &ExportOptions::default()).expect("export");
        let path = out.join(format!("gen_{start:06}.json"));
        std::fs::write(&path, serde_json::to_string(&json).expect("JSON") + "\n").expect("write");
        start = end;
    }
    eprintln!(
        "wrote {count} graphs (seeds {first}..{}) to {}",
        first + count,
        out.display()
    );
}
