//! Writes the builder-made single-kernel attention blocks (`mucc::graph::workloads::attention_blocks`:
//! exp(Q·Kᵀ)·V / Σ exp(Q·Kᵀ) in one customized operator, f16 and bf16, grids of 8–512 blocks)
//! as Mirage JSON, one file per graph: the register-pipe shape with a cluster split, two row
//! tiles per warp and several resident CTAs, which no corpus candidate has.
//!
//!   cargo run --release --example attention_graphs -- OUT_DIR

use std::path::PathBuf;

use mucc::graph::mirage_json::{ExportOptions, graph_to_json};
use mucc::graph::workloads::attention_blocks;

fn main() {
    let Some(out) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: attention_graphs OUT_DIR");
        std::process::exit(2);
    };
    std::fs::create_dir_all(&out).expect("the output folder");
    let graphs = attention_blocks().expect("the attention blocks build");
    for (name, g) in &graphs {
        let json = graph_to_json(g, &ExportOptions::default()).expect("export");
        let path = out.join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap() + "\n")
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    println!(
        "{} attention blocks written to {}",
        graphs.len(),
        out.display()
    );
}
