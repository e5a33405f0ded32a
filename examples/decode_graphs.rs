//! Writes the builder-made decode graphs (`mucc::graph::workloads::decode_graphs`: (silu(X) ⊙ Y)
//! · W, M ∈ {1, 8}, bf16 and fp16, Qwen2.5 sizes, grids of 32–86 blocks) as Mirage JSON, one
//! file per graph, for `scripts/gpu-test.sh` (step `decode`) and `scripts/gpu/decode_vs_torch.py`.
//!
//!   cargo run --release --example decode_graphs -- OUT_DIR

use std::path::PathBuf;

use mucc::graph::mirage_json::{ExportOptions, graph_to_json};
use mucc::graph::workloads::decode_graphs;

fn main() {
    let Some(out) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: decode_graphs OUT_DIR");
        std::process::exit(2);
    };
    std::fs::create_dir_all(&out).expect("the output folder");
    let graphs = decode_graphs().expect("the decode graphs build");
    for (name, g) in &graphs {
        let json = graph_to_json(g, &ExportOptions::default()).expect("export");
        let path = out.join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap() + "\n")
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    println!(
        "{} decode graphs written to {}",
        graphs.len(),
        out.display()
    );
}
