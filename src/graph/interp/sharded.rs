//! Multi-GPU evaluation (the semantics of [`crate::graph::sharding`]): the kernel graph runs
//! once per rank of its GPU mesh, each rank on its shard of every partitioned input and on the
//! whole of every replicated one; `kn_allreduce_op` replaces the tensor on every rank by the
//! element-wise sum over the ranks (in rank order); each graph output is assembled by its
//! output map. Ranks advance in lockstep, operator by operator, so that an all-reduce sees every
//! rank's input.
//!
//! The GPU checker uses the pieces: [`random_global_inputs`] → [`shard_inputs`] (the per-rank
//! buffers, laid out with each input's strides, to upload to each GPU) → [`evaluate_ranks`]
//! (per-rank reference outputs, to compare with each GPU's) → [`gather_outputs`].
//! [`evaluate_sharded`] does all of it on global arrays.

use super::inputs::{draw, scatter};
use super::{
    Array, Given, HostTensor, InputSpec, RangeExcess, RankState, Rounding, Walk, check_inputs,
};
use crate::graph::arena::Handle;
use crate::graph::error::{ErrorKind, GraphError};
use crate::graph::kernel::{DTensor, KernelGraph, KnOp, KnOpKind};
use crate::graph::shape::Shape;
use crate::graph::sharding::{self, GpuMesh};

/// A multi-GPU graph evaluated on every rank of its mesh.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardedRun {
    /// The mesh (one GPU if the graph's is unknown).
    pub mesh: GpuMesh,
    /// `per_rank[r][j]`: graph output `j` as rank `r` computes it (the per-GPU shape).
    pub per_rank: Vec<Vec<Array>>,
    /// Graph output `j` assembled by its output map (the global shape).
    pub gathered: Vec<Array>,
    /// Tensors whose values exceed their element type's range on some rank (each place once,
    /// with its largest magnitude over the ranks).
    pub excess: Vec<RangeExcess>,
}

fn invalid(msg: String) -> GraphError {
    GraphError::new(ErrorKind::Invalid(msg))
}

/// The global shape of each graph input (the per-GPU shape scaled by its input map).
pub fn global_input_shapes(g: &KernelGraph) -> Vec<Shape> {
    global_shapes(g, g.inputs())
}

/// The global shape of each graph output (the per-GPU shape scaled by its output map).
pub fn global_output_shapes(g: &KernelGraph) -> Vec<Shape> {
    global_shapes(g, g.outputs())
}

/// The global shapes of the tensors of input or output operators (operator, tensor).
fn global_shapes(g: &KernelGraph, ends: Vec<(Handle<KnOp>, Handle<DTensor>)>) -> Vec<Shape> {
    let mesh = g.sharding.mesh_or_single();
    ends.into_iter()
        .map(|(h, t)| {
            let local = g.tensors[t].shape;
            sharding::global_shape(&local, g.sharding.map(h), mesh).unwrap_or(local)
        })
        .collect()
}

/// Draws the global (whole, row-major) value of every graph input, as
/// [`super::random_inputs`] draws the values of a one-GPU graph (on one GPU the two agree).
pub fn random_global_inputs(g: &KernelGraph, spec: InputSpec) -> Vec<Array> {
    global_input_shapes(g)
        .into_iter()
        .zip(g.inputs())
        .enumerate()
        .map(|(i, (shape, (_, t)))| {
            Array::from_vec(shape, draw(shape, g.tensors[t].dtype, i, spec))
        })
        .collect()
}

/// Cuts the global inputs into every rank's buffers: `result[r][i]` is rank `r`'s input `i`
/// (its shard, or the whole tensor if replicated), laid out with the input's strides (padding
/// NaN), ready for the rank's GPU or for [`evaluate_ranks`].
pub fn shard_inputs(g: &KernelGraph, global: &[Array]) -> Result<Vec<Vec<HostTensor>>, GraphError> {
    let mesh = g.sharding.mesh_or_single();
    let inputs = g.inputs();
    if global.len() != inputs.len() {
        return Err(invalid(format!(
            "the graph has {} inputs but {} were given",
            inputs.len(),
            global.len()
        )));
    }
    for (i, (given, want)) in global.iter().zip(global_input_shapes(g)).enumerate() {
        if given.shape != want {
            return Err(invalid(format!(
                "global input {i} has shape {}, the graph expects {want} (per GPU {}, on the GPU mesh {mesh})",
                given.shape, g.tensors[inputs[i].1].shape
            )));
        }
    }
    let mut ranks = Vec::with_capacity(mesh.num_gpus());
    for r in 0..mesh.num_gpus() {
        let c = mesh.coords(r);
        let mut bufs = Vec::with_capacity(inputs.len());
        for (&(h, t), whole) in inputs.iter().zip(global) {
            let local = g.tensors[t].shape;
            let origin = sharding::shard_origin(&local, g.sharding.map(h), mesh, c);
            let piece = if local == whole.shape {
                whole.data.clone()
            } else {
                whole.slice(&origin, local).data
            };
            let strides = match &g.ops[h].kind {
                KnOpKind::Input { strides } => strides.clone(),
                _ => local.row_major_strides(),
            };
            let data = if strides == local.row_major_strides() {
                piece
            } else {
                scatter(local, &strides, &piece)
            };
            bufs.push(HostTensor {
                shape: local,
                strides,
                data,
            });
        }
        ranks.push(bufs);
    }
    Ok(ranks)
}

/// Evaluates `g` (which must have passed [`crate::graph::validate()`]) on every rank of its
/// mesh: `inputs[r]` are rank `r`'s buffers (see [`shard_inputs`]). Returns each rank's graph
/// outputs (per-GPU shapes), and the tensors that exceed their type's range.
pub fn evaluate_ranks(
    g: &KernelGraph,
    inputs: Vec<Vec<HostTensor>>,
    rounding: Rounding,
) -> Result<(Vec<Vec<Array>>, Vec<RangeExcess>), GraphError> {
    let mesh = g.sharding.mesh_or_single();
    if inputs.len() != mesh.num_gpus() {
        return Err(invalid(format!(
            "the graph runs on {} GPUs (mesh {mesh}) but inputs for {} were given",
            mesh.num_gpus(),
            inputs.len()
        )));
    }
    for (r, rank) in inputs.iter().enumerate() {
        check_inputs(g, rank).map_err(|e| invalid(format!("rank {r}: {}", e.kind)))?;
    }
    let walk = Walk::new(g, rounding);
    let mut ranks: Vec<RankState> = inputs
        .into_iter()
        .map(|i| RankState::new(g, i.into_iter().map(Given::Host).collect()))
        .collect();
    let mut excess = Vec::new();
    for (h, op) in g.ops.iter() {
        if matches!(op.kind, KnOpKind::AllReduce { .. }) && ranks.len() > 1 {
            let x = op.inputs[0];
            let mut sum = (*ranks[0].val(x)).clone();
            for rank in &ranks[1..] {
                sum.add_assign(&rank.val(x));
            }
            let sum = walk.store(op.outputs[0], sum, &mut excess);
            for rank in &mut ranks {
                rank.values[op.outputs[0].index()] = Some(sum.clone());
                walk.free(h, op, rank);
            }
        } else {
            for rank in &mut ranks {
                walk.step(h, op, rank, &mut excess);
            }
        }
    }
    // One entry per place, with the largest magnitude seen on any rank.
    let mut merged: Vec<RangeExcess> = Vec::new();
    for e in excess {
        match merged.iter_mut().find(|m| m.place == e.place) {
            Some(m) => m.max_abs = m.max_abs.max(e.max_abs),
            None => merged.push(e),
        }
    }
    Ok((ranks.into_iter().map(|r| r.outputs).collect(), merged))
}

/// Assembles every graph output from the ranks' outputs (`per_rank[r][j]`) by its output map:
/// side by side along the dims the map names, and from the first rank along each mesh axis
/// the map leaves unmapped (there, every rank holds a copy).
pub fn gather_outputs(g: &KernelGraph, per_rank: &[Vec<Array>]) -> Result<Vec<Array>, GraphError> {
    let mesh = g.sharding.mesh_or_single();
    let outputs = g.outputs();
    if per_rank.len() != mesh.num_gpus() {
        return Err(invalid(format!(
            "the graph runs on {} GPUs (mesh {mesh}) but outputs of {} were given",
            mesh.num_gpus(),
            per_rank.len()
        )));
    }
    let mut gathered = Vec::with_capacity(outputs.len());
    for (j, &(h, t)) in outputs.iter().enumerate() {
        let local = g.tensors[t].shape;
        let map = g.sharding.map(h);
        let global = sharding::global_shape(&local, map, mesh)
            .ok_or_else(|| invalid(format!("output {j}: the global shape overflows")))?;
        let mut out = Array::full(global, f64::NAN);
        for (r, outs) in per_rank.iter().enumerate() {
            let part = outs.get(j).ok_or_else(|| {
                invalid(format!(
                    "rank {r} gave {} outputs, the graph has {}",
                    outs.len(),
                    outputs.len()
                ))
            })?;
            if part.shape != local {
                return Err(invalid(format!(
                    "rank {r}: output {j} has shape {}, the graph computes {local}",
                    part.shape
                )));
            }
            let c = mesh.coords(r);
            if sharding::is_first_replica(map, mesh, c) {
                out.write_slice(&sharding::shard_origin(&local, map, mesh, c), part);
            }
        }
        gathered.push(out);
    }
    Ok(gathered)
}

/// Evaluates a (multi-GPU) graph on global inputs, one whole row-major array per graph input:
/// shards them, runs every rank, and gathers the outputs. On one GPU this is [`super::evaluate`].
pub fn evaluate_sharded(
    g: &KernelGraph,
    global: &[Array],
    rounding: Rounding,
) -> Result<ShardedRun, GraphError> {
    let mesh = g.sharding.mesh_or_single();
    let inputs = shard_inputs(g, global)?;
    let (per_rank, excess) = evaluate_ranks(g, inputs, rounding)?;
    let gathered = gather_outputs(g, &per_rank)?;
    Ok(ShardedRun {
        mesh,
        per_rank,
        gathered,
        excess,
    })
}
