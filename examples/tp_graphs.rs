//! Writes the builder-made tensor-parallel graphs (`mucc::graph::workloads::tp_graphs`: gated
//! MLP and attention block at Qwen2.5-7B sizes, M ∈ {1, 8}, bf16 and fp16, on N GPUs, each from
//! kernel-level operators (`tpN_mlp_*`, `tpN_attention_*`) and from fused customized operators
//! (`tpN_fmlp_*`, `tpN_fattn_*`)) as Mirage JSON with their GPU count (`mucc_gpu_dim`), one file
//! per graph, for `scripts/gpu-test.sh` (step `multi`); with more than one GPU also the same
//! graphs unsharded (`tp1_*`, one GPU), the baseline of the speed-up.
//!
//!   cargo run --release --example tp_graphs -- OUT_DIR [GPUS]    (GPUS: 2 by default)

use std::path::PathBuf;

use mucc::graph::mirage_json::{ExportOptions, graph_to_json};
use mucc::graph::workloads::tp_graphs;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(out) = args.next().map(PathBuf::from) else {
        eprintln!("usage: tp_graphs OUT_DIR [GPUS]");
        std::process::exit(2);
    };
    let gpus = match args.next().map(|s| s.parse::<usize>()) {
        None => 2,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => {
            eprintln!("GPUS must be a positive integer");
            std::process::exit(2);
        }
    };
    std::fs::create_dir_all(&out).expect("the output folder");
    let mut graphs = tp_graphs(gpus).expect("the tensor-parallel graphs build");
    if gpus > 1 {
        graphs.extend(tp_graphs(1).expect("the unsharded graphs build"));
    }
    for (name, g) in &graphs {
        let json = graph_to_json(g, &ExportOptions::default()).expect("export");
        let path = out.join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap() + "\n")
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    println!(
        "{} tensor-parallel graphs (on {gpus} GPUs, and unsharded) written to {}",
        graphs.len(),
        out.display()
    );
}
