//! Fuzz target for the Mirage µGraph JSON loader.
//!
//! For any UTF-8 input: import it (must not panic), validate every graph (must not panic), and
//! for every valid graph
//!   - export it with `graph_to_json` (current names and dtype codes), serialise, re-import with
//!     the current dtype table, and require the re-imported graph to equal the original;
//!   - re-import the same text with dtype-table detection: if that produces no warning, it must
//!     also give back the original graph (no silent misreading);
//!   - re-validate the re-imported graph (must pass);
//!   - run the CPU interpreter when the graph is small (it must not panic; errors are fine).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mucc::graph::interp::{evaluate, random_inputs};
use mucc::graph::mirage_json::graph_to_json;
use mucc::graph::{DtypeTable, KernelGraph, KnOpKind};
use mucc::{ImportOptions, parse_str};

/// Bounds for running the interpreter.
const MAX_ELEMENTS: usize = 100_000;
const MAX_BLOCK_ITERS: usize = 10_000;
const MAX_WORK: usize = 20_000_000;

/// Whether `g` is cheap enough to interpret (all arithmetic saturating).
fn small_enough(g: &KernelGraph) -> bool {
    let mut elements = 0usize;
    for (_, t) in g.tensors.iter() {
        elements = elements.saturating_add(t.shape.numel());
    }
    if elements >= MAX_ELEMENTS {
        return false;
    }
    let mut block_iters = 0usize;
    let mut work = 0usize;
    for (_, op) in g.ops.iter() {
        match &op.kind {
            KnOpKind::Input { strides } => {
                // Padded input buffers are allocated at their full span.
                let t = &g.tensors[op.outputs[0]];
                match strides.span(&t.shape) {
                    Some(s) if s < MAX_ELEMENTS * 10 => {}
                    Some(_) => return false,
                    None => {} // validation must have rejected this; let the interpreter show it
                }
            }
            KnOpKind::Matmul => {
                let out: usize = op.outputs.iter().map(|&t| g.tensors[t].shape.numel()).sum();
                let k = op
                    .inputs
                    .first()
                    .and_then(|&t| g.tensors[t].shape.dims().last().copied())
                    .unwrap_or(1);
                work = work.saturating_add(out.saturating_mul(k));
            }
            KnOpKind::Customized(tb) => {
                let bi = tb
                    .grid
                    .iter()
                    .fold(1usize, |a, &x| a.saturating_mul(x))
                    .saturating_mul(tb.forloop_range.max(1));
                block_iters = block_iters.saturating_add(bi);
                let mut per_iter = 0usize;
                for (_, top) in tb.ops.iter() {
                    for &t in top.inputs.iter().chain(&top.outputs) {
                        per_iter = per_iter.saturating_add(tb.tensors[t].shape.numel());
                    }
                    if matches!(top.kind, mucc::graph::TbOpKind::Matmul) {
                        let out: usize = top
                            .outputs
                            .iter()
                            .map(|&t| tb.tensors[t].shape.numel())
                            .fold(0usize, |a, x| a.saturating_add(x));
                        let k = top
                            .inputs
                            .first()
                            .and_then(|&t| tb.tensors[t].shape.dims().last().copied())
                            .unwrap_or(1);
                        per_iter = per_iter.saturating_add(out.saturating_mul(k));
                    }
                }
                work = work.saturating_add(bi.saturating_mul(per_iter));
            }
            _ => {}
        }
    }
    block_iters < MAX_BLOCK_ITERS && work < MAX_WORK
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(file) = parse_str(text, None, &ImportOptions::default()) else {
        return;
    };
    for lg in &file.graphs {
        if lg.validate().is_err() {
            continue;
        }
        let g = &lg.graph;

        // Export → serialise → re-import with the table the exporter writes.
        let json = graph_to_json(g, &Default::default())
            .unwrap_or_else(|e| panic!("export of a valid graph failed: {e}"));
        let text2 = serde_json::to_string(&json).expect("serialising a serde_json::Value");
        let current = ImportOptions {
            dtype_table: Some(DtypeTable::Current),
            ..Default::default()
        };
        let back = parse_str(&text2, None, &current)
            .unwrap_or_else(|e| panic!("re-import of an exported valid graph failed: {e}\n{text2}"));
        assert_eq!(back.graphs.len(), 1, "exported one graph, re-imported {}", back.graphs.len());
        let g2 = &back.graphs[0];
        assert!(
            g2.graph == *g,
            "round trip changed the graph\noriginal: {g:#?}\nre-imported: {:#?}\njson: {text2}",
            g2.graph
        );
        if let Err(e) = g2.validate() {
            panic!("re-imported graph fails validation: {e}\njson: {text2}");
        }

        // Re-import with detection: a silent (warning-free) detection must not misread.
        if let Ok(det) = parse_str(&text2, None, &ImportOptions::default()) {
            if det.warnings.is_empty() && det.graphs.len() == 1 {
                assert!(
                    det.graphs[0].graph == *g,
                    "dtype detection ({}: {}) silently misread an exported graph\njson: {text2}",
                    det.dtype_table,
                    det.dtype_table_reason
                );
            }
        }

        // CPU interpreter on small graphs: must not panic (errors are acceptable).
        if small_enough(g) {
            let inputs = random_inputs(g, Default::default());
            let _ = evaluate(g, &inputs);
        }
    }
});
