//! A stable, readable text form of a kernel graph (used by `mucc inspect` and tests).
//!
//! DTensors are `%N` and STensors `sN` (arena indices); shapes are printed after `->`.

use std::fmt::Write;

use super::kernel::{KernelGraph, KnOpKind};
use super::threadblock::{TbGraph, TbOpKind};

fn join<T>(items: impl IntoIterator<Item = T>, f: impl Fn(T) -> String) -> String {
    items.into_iter().map(f).collect::<Vec<_>>().join(", ")
}

/// The text form of `g`.
pub fn dump(g: &KernelGraph) -> String {
    let mut s = String::new();
    let dts = join(g.dtypes(), |d| d.to_string());
    let _ = writeln!(
        s,
        "{} inputs, {} outputs, {} kernels, dtypes {dts}",
        g.inputs().len(),
        g.outputs().len(),
        g.num_kernels()
    );
    if let Some(mesh) = g.sharding.mesh {
        let _ = writeln!(s, "gpu mesh {mesh}");
    }
    for (h, op) in g.ops.iter() {
        // Multi-GPU partition of an input or output, printed only when there is one.
        let map = g.sharding.maps.get(&h).map_or(String::new(), |m| {
            let key = if matches!(op.kind, KnOpKind::Input { .. }) {
                "input_map"
            } else {
                "output_map"
            };
            format!(" {key} {m}")
        });
        let ins = join(&op.inputs, |t| format!("%{}", t.index()));
        let outs = join(&op.outputs, |t| format!("%{}", t.index()));
        let shapes = join(&op.outputs, |t| {
            let d = &g.tensors[*t];
            format!("{} {}", d.shape, d.dtype)
        });
        match &op.kind {
            KnOpKind::Input { strides } => {
                let _ = writeln!(s, "{outs} = input -> {shapes} strides {strides}{map}");
            }
            KnOpKind::Output { strides } => {
                let st = strides
                    .as_ref()
                    .map_or("chosen by mucc".to_string(), |s| s.to_string());
                let _ = writeln!(s, "output {ins} strides {st}{map}");
            }
            KnOpKind::Customized(tb) => {
                let _ = writeln!(
                    s,
                    "{outs} = customized({ins}) grid ({}, {}, {}) block ({}, {}, {}) forloop {} dimx {} -> {shapes}",
                    tb.grid[0],
                    tb.grid[1],
                    tb.grid[2],
                    tb.block[0],
                    tb.block[1],
                    tb.block[2],
                    tb.forloop_range,
                    tb.reduction_dimx
                );
                dump_tb(&mut s, tb, &op.inputs, &op.outputs);
            }
            other => {
                let name = match other {
                    KnOpKind::Unary(u) => u.to_string(),
                    KnOpKind::RmsNorm { normalized_dims } => {
                        format!("rms_norm[{normalized_dims} dims]")
                    }
                    k => k.name(),
                };
                let _ = writeln!(s, "{outs} = {name}({ins}) -> {shapes}");
            }
        }
    }
    s
}

fn dump_tb(
    s: &mut String,
    tb: &TbGraph,
    kn_ins: &[super::Handle<super::DTensor>],
    kn_outs: &[super::Handle<super::DTensor>],
) {
    for (_, op) in tb.ops.iter() {
        let ins = join(&op.inputs, |t| format!("s{}", t.index()));
        let outs = join(&op.outputs, |t| format!("s{}", t.index()));
        let shapes = join(&op.outputs, |t| {
            let st = &tb.tensors[*t];
            format!(
                "{}{}",
                st.shape,
                if st.after_accum { " after-loop" } else { "" }
            )
        });
        let line = match &op.kind {
            TbOpKind::Input {
                input,
                imap,
                forloop_dim,
            } => format!(
                "{outs} = input %{} imap {imap} forloop_dim {} -> {shapes}",
                kn_ins.get(*input).map_or(usize::MAX, |t| t.index()),
                forloop_dim.map_or(-1, |f| f as i64)
            ),
            TbOpKind::Output { output, omap } => format!(
                "output {ins} -> %{} omap {omap}",
                kn_outs.get(*output).map_or(usize::MAX, |t| t.index())
            ),
            TbOpKind::Unary(u) => format!("{outs} = {u}({ins}) -> {shapes}"),
            other => format!("{outs} = {}({ins}) -> {shapes}", other.name()),
        };
        let _ = writeln!(s, "    {line}");
    }
}

/// One line: input and output shapes and types, then the kernels (customized operators with
/// their grid, loop and operator count), and the GPU count of a multi-GPU graph.
pub fn summary(g: &KernelGraph) -> String {
    let shapes = |ts: Vec<crate::graph::Handle<crate::graph::DTensor>>| {
        ts.iter()
            .map(|&t| {
                let d = &g.tensors[t];
                format!("{} {}", d.shape, d.dtype)
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ins = shapes(g.inputs().into_iter().map(|(_, t)| t).collect());
    let outs = shapes(g.outputs().into_iter().map(|(_, t)| t).collect());
    let kernels: Vec<String> = g
        .ops
        .iter()
        .filter_map(|(_, op)| match &op.kind {
            KnOpKind::Input { .. } | KnOpKind::Output { .. } => None,
            KnOpKind::Customized(tb) => Some(format!(
                "customized[grid ({}, {}, {}), forloop {}, {} ops]",
                tb.grid[0],
                tb.grid[1],
                tb.grid[2],
                tb.forloop_range,
                tb.ops.len()
            )),
            k => Some(k.name()),
        })
        .collect();
    let gpus = g.sharding.num_gpus();
    format!(
        "inputs {ins}; outputs {outs}; {} kernel{}: {}{}",
        kernels.len(),
        if kernels.len() == 1 { "" } else { "s" },
        kernels.join(", "),
        if gpus > 1 {
            format!("; on {gpus} GPUs (shapes per GPU)")
        } else {
            String::new()
        }
    )
}
