//! IR → Mirage µGraph JSON.
//!
//! The output follows Mirage's saved format (§2 of the format reference): keys sorted, `dim`
//! padded to four entries, layouts `DmemRowMajor`/`SmemRowMajor`, `smem_offset` 0 (Mirage
//! ignores it on load). Recorded guids are kept; tensors without one get fresh guids above the
//! largest in use. Parameters Mirage does not serialise are written under extra keys that
//! Mirage ignores and mucc reads back: `scalar` (mul_scalar), `min_val`/`max_val` (clamp),
//! `normalized_dims` (kernel rms_norm); and the first operator of every graph names the dtype
//! table under `mucc_dtype_table`, since the codes alone are ambiguous, and the GPU mesh under
//! `mucc_gpu_dim` when it is known. Input and output maps (`input_map` / `output_map`) are
//! written as the graph's [`crate::graph::Sharding`] records them.

use serde_json::{Map, Value, json};

use super::names;
use crate::graph::arena::Handle;
use crate::graph::dtype::{DType, DtypeTable};
use crate::graph::error::{ErrorKind, GraphError};
use crate::graph::kernel::{DTensor, KernelGraph, KnOpKind};
use crate::graph::ops::{TbReduction, UnaryOp};
use crate::graph::shape::{MAX_DIMS, Shape};
use crate::graph::threadblock::{STensor, TbGraph, TbOpKind};

/// The key, written on each graph's first operator, that names the dtype table of the file.
pub const TABLE_KEY: &str = "mucc_dtype_table";

/// The key, written on a graph's first operator when the graph's GPU mesh is known, that records
/// it as an int3 (Mirage keeps `gpu_dim` on the C++ graph object and never serialises it).
pub const GPU_DIM_KEY: &str = "mucc_gpu_dim";

/// How to write a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportOptions {
    /// The `data_type` code table.
    pub dtype_table: DtypeTable,
    /// Write the pre-2025-03 accumulator spellings (`tb_accum_*`).
    pub legacy_names: bool,
}

impl Default for ExportOptions {
    /// Current Mirage: current dtype codes and operator names.
    fn default() -> Self {
        ExportOptions {
            dtype_table: DtypeTable::Current,
            legacy_names: false,
        }
    }
}

fn dims_json(s: &Shape) -> Value {
    let mut d: Vec<i64> = s.dims().iter().map(|&x| x as i64).collect();
    d.resize(MAX_DIMS, 0);
    json!(d)
}

fn int3(v: [i64; 3]) -> Value {
    json!({"x": v[0], "y": v[1], "z": v[2]})
}

fn launch3(v: [usize; 3]) -> Value {
    int3(v.map(|x| x as i64))
}

struct Exporter<'a> {
    opts: ExportOptions,
    g: &'a KernelGraph,
    dguids: Vec<i64>,
}

impl Exporter<'_> {
    fn code(&self, d: DType) -> Result<i64, GraphError> {
        self.opts.dtype_table.encode(d).ok_or_else(|| {
            GraphError::new(ErrorKind::Unsupported(format!(
                "the {} dtype table has no code for {d}",
                self.opts.dtype_table
            )))
        })
    }

    fn dtensor(&self, h: Handle<DTensor>) -> Result<Value, GraphError> {
        let t = &self.g.tensors[h];
        Ok(json!({
            "data_type": self.code(t.dtype)?,
            "dim": dims_json(&t.shape),
            "guid": self.dguids[h.index()],
            "layout": "DmemRowMajor",
            "num_dims": t.shape.rank(),
        }))
    }

    fn stensor(
        &self,
        tb: &TbGraph,
        guids: &[i64],
        h: Handle<STensor>,
    ) -> Result<Value, GraphError> {
        let t = &tb.tensors[h];
        Ok(json!({
            "after_accum": t.after_accum,
            "data_type": self.code(t.dtype)?,
            "dim": dims_json(&t.shape),
            "guid": guids[h.index()],
            "layout": "SmemRowMajor",
            "num_dims": t.shape.rank(),
            "smem_offset": 0,
        }))
    }

    fn unary_keys(m: &mut Map<String, Value>, u: &UnaryOp) {
        match *u {
            UnaryOp::MulScalar(s) => {
                m.insert("scalar".into(), json!(s));
            }
            UnaryOp::Clamp { min, max } => {
                // JSON has no infinities: an unbounded side is written as "inf" / "-inf".
                let bound = |x: f64| {
                    if x == f64::INFINITY {
                        json!("inf")
                    } else if x == f64::NEG_INFINITY {
                        json!("-inf")
                    } else {
                        json!(x)
                    }
                };
                m.insert("min_val".into(), bound(min));
                m.insert("max_val".into(), bound(max));
            }
            _ => {}
        }
    }

    fn bgraph(
        &self,
        tb: &TbGraph,
        kn_ins: &[Handle<DTensor>],
        kn_outs: &[Handle<DTensor>],
    ) -> Result<Value, GraphError> {
        let guids = assign_guids(tb.tensors.iter().map(|(_, t)| t.guid).collect(), 20_000_000);
        let mut ops = Vec::new();
        for (_, op) in tb.ops.iter() {
            let mut m = Map::new();
            m.insert(
                "op_type".into(),
                json!(names::tb_name(&op.kind, self.opts.legacy_names)),
            );
            let ins: Result<Vec<Value>, _> = op
                .inputs
                .iter()
                .map(|&t| self.stensor(tb, &guids, t))
                .collect();
            let outs: Result<Vec<Value>, _> = op
                .outputs
                .iter()
                .map(|&t| self.stensor(tb, &guids, t))
                .collect();
            m.insert("input_tensors".into(), Value::Array(ins?));
            m.insert("output_tensors".into(), Value::Array(outs?));
            match &op.kind {
                TbOpKind::Input {
                    input,
                    imap,
                    forloop_dim,
                } => {
                    m.insert("dtensor".into(), self.dtensor(kn_ins[*input])?);
                    m.insert("input_map".into(), int3(imap.to_mirage()));
                    m.insert(
                        "forloop_dim".into(),
                        json!(forloop_dim.map_or(-1, |f| f as i64)),
                    );
                }
                TbOpKind::Output { output, omap } => {
                    m.insert("dtensor".into(), self.dtensor(kn_outs[*output])?);
                    m.insert("output_map".into(), int3(omap.to_mirage()));
                }
                TbOpKind::Unary(u) => Self::unary_keys(&mut m, u),
                TbOpKind::Concat { dim } => {
                    m.insert("concat_dim".into(), json!(dim));
                }
                TbOpKind::Reduction { dim, kind } => {
                    m.insert("reduce_dim".into(), json!(dim));
                    let size: i64 = match kind {
                        TbReduction::Sum => 1,
                        TbReduction::ToDimx => tb.reduction_dimx as i64,
                        TbReduction::Max => -1,
                        TbReduction::PlainMax => {
                            return Err(GraphError::new(ErrorKind::Unsupported(format!(
                                "threadblock {} is mucc's internal max of a tile, which \
                                 Mirage's format has no operator for",
                                op.kind.name()
                            ))));
                        }
                    };
                    m.insert("reduce_size".into(), json!(size));
                }
                TbOpKind::Matmul | TbOpKind::Binary(_) | TbOpKind::RmsNorm | TbOpKind::Accum(_) => {
                }
            }
            ops.push(Value::Object(m));
        }
        Ok(json!({
            "block_dim": launch3(tb.block),
            "forloop_range": tb.forloop_range,
            "graph_level": "thread_block_graph",
            "grid_dim": launch3(tb.grid),
            "operators": ops,
            "reduction_dimx": tb.reduction_dimx,
            "smem_offset": 0,
        }))
    }

    fn graph(&self) -> Result<Value, GraphError> {
        let mut ops = Vec::new();
        for (h, op) in self.g.ops.iter() {
            let mut m = Map::new();
            if h.index() == 0 {
                // Codes 940/941 mean different types in the mid and current tables; name the
                // table so that the file is never ambiguous (Mirage ignores unknown keys).
                m.insert(TABLE_KEY.into(), json!(self.opts.dtype_table.name()));
                if let Some(mesh) = self.g.sharding.mesh {
                    m.insert(GPU_DIM_KEY.into(), launch3(mesh.0));
                }
            }
            m.insert("op_type".into(), json!(names::kn_name(&op.kind)));
            let ins: Result<Vec<Value>, _> = op.inputs.iter().map(|&t| self.dtensor(t)).collect();
            let outs: Result<Vec<Value>, _> = op.outputs.iter().map(|&t| self.dtensor(t)).collect();
            m.insert("input_tensors".into(), Value::Array(ins?));
            m.insert("output_tensors".into(), Value::Array(outs?));
            match &op.kind {
                KnOpKind::Input { strides } => {
                    let map = self.g.sharding.map(h).to_mirage();
                    m.insert("input_map".into(), int3(map));
                    m.insert("input_strides".into(), json!(strides.0));
                }
                KnOpKind::Output { strides } => {
                    let map = self.g.sharding.map(h).to_mirage();
                    m.insert("output_map".into(), int3(map));
                    let s: Vec<usize> = strides.as_ref().map(|s| s.0.clone()).unwrap_or_default();
                    m.insert("output_strides".into(), json!(s));
                }
                KnOpKind::Unary(u) => Self::unary_keys(&mut m, u),
                KnOpKind::RmsNorm { normalized_dims } => {
                    m.insert("normalized_dims".into(), json!(normalized_dims));
                }
                KnOpKind::Chunk { dim, chunk_size } => {
                    m.insert("chunk_dim".into(), json!(dim));
                    m.insert("chunk_size".into(), json!(chunk_size));
                }
                KnOpKind::AllReduce { inplace } => {
                    m.insert("inplace".into(), json!(inplace));
                }
                KnOpKind::Customized(tb) => {
                    m.insert("bgraph".into(), self.bgraph(tb, &op.inputs, &op.outputs)?);
                }
                KnOpKind::SoftmaxCombine { .. }
                | KnOpKind::RowMax { .. }
                | KnOpKind::ShiftedExp { .. } => {
                    return Err(GraphError::new(ErrorKind::Unsupported(format!(
                        "kernel op {} is mucc's internal {}, which Mirage's format has no \
                         operator for",
                        h.index(),
                        op.kind.name()
                    ))));
                }
                KnOpKind::Matmul
                | KnOpKind::Binary(_)
                | KnOpKind::Reduction { .. }
                | KnOpKind::Concat { .. }
                | KnOpKind::Split { .. } => {}
            }
            ops.push(Value::Object(m));
        }
        Ok(Value::Array(ops))
    }
}

/// Keeps recorded guids and numbers the others from above the largest one (at least `base`).
fn assign_guids(recorded: Vec<Option<i64>>, base: i64) -> Vec<i64> {
    let mut next = recorded
        .iter()
        .flatten()
        .max()
        .map_or(base, |&m| m.max(base - 1) + 1);
    recorded
        .into_iter()
        .map(|g| {
            g.unwrap_or_else(|| {
                next += 1;
                next - 1
            })
        })
        .collect()
}

/// One kernel graph as a Mirage JSON value (an array of operator objects).
pub fn graph_to_json(g: &KernelGraph, opts: &ExportOptions) -> Result<Value, GraphError> {
    let dguids = assign_guids(g.tensors.iter().map(|(_, t)| t.guid).collect(), 10_000_000);
    Exporter {
        opts: *opts,
        g,
        dguids,
    }
    .graph()
}

/// A list of candidate graphs, as Mirage saves them.
pub fn graphs_to_json<'a>(
    graphs: impl IntoIterator<Item = &'a KernelGraph>,
    opts: &ExportOptions,
) -> Result<Value, GraphError> {
    let v: Result<Vec<Value>, GraphError> =
        graphs.into_iter().map(|g| graph_to_json(g, opts)).collect();
    Ok(Value::Array(v?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_assignment() {
        let g = assign_guids(
            vec![Some(10_000_005), None, Some(10_000_001), None],
            10_000_000,
        );
        assert_eq!(g, vec![10_000_005, 10_000_006, 10_000_001, 10_000_007]);
        let g = assign_guids(vec![None, None], 20_000_000);
        assert_eq!(g, vec![20_000_000, 20_000_001]);
    }
}
