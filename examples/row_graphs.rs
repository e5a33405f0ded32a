//! Writes the builder-made row blocks (`mucc::graph::workloads::row_graphs`: element-wise
//! operators and RMS norms over a loop of one iteration, the shapes register rows cover) as
//! Mirage JSON, one file per graph, for GPU checks (`mucc run --check`).
//!
//!   cargo run --release --example row_graphs -- OUT_DIR

use std::path::PathBuf;

use mucc::graph::mirage_json::{ExportOptions, graph_to_json};
use mucc::graph::workloads::row_graphs;

fn main() {
    let Some(out) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: row_graphs OUT_DIR");
        std::process::exit(2);
    };
    std::fs::create_dir_all(&out).expect("the output folder");
    let graphs = row_graphs().expect("the row graphs build");
    for (name, g) in &graphs {
        let json = graph_to_json(g, &ExportOptions::default()).expect("export");
        let path = out.join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap() + "\n")
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    println!("{} row graphs written to {}", graphs.len(), out.display());
}
