//! Device tensors: the strides and placement of every DTensor (caller buffers keep the
//! caller's strides; intermediates get padded strides along their solved innermost dim), the
//! caller's buffers, and the workspace buffers of intermediates with their lifetimes.

use super::memory::Buffer;
use super::ops::dtensor_strides;
use super::plan::{DTensorGeometry, IoPlan, KnUnfused, Placement, WORKSPACE_ALIGN};
use crate::graph::arena::Handle;
use crate::graph::kernel::{KernelGraph, KnOp, KnOpKind};
use crate::graph::shape::Strides;
use crate::layout::solve::LayoutPlan;
use crate::layout::strides::padded_strides;

/// Strides and placement of every DTensor (workspace offsets are filled in after packing).
pub(super) fn dtensor_geometry(g: &KernelGraph, layout: &LayoutPlan) -> Vec<DTensorGeometry> {
    let mut placement: Vec<Option<Placement>> = vec![None; g.tensors.len()];
    let mut user: Vec<Option<Strides>> = vec![None; g.tensors.len()];
    for (i, (h, t)) in g.inputs().into_iter().enumerate() {
        placement[t.index()] = Some(Placement::Input(i));
        if let KnOpKind::Input { strides } = &g.ops[h].kind {
            user[t.index()] = Some(strides.clone());
        }
    }
    for (j, (h, t)) in g.outputs().into_iter().enumerate() {
        if placement[t.index()].is_none() {
            placement[t.index()] = Some(Placement::Output(j));
            if let KnOpKind::Output { strides: Some(s) } = &g.ops[h].kind {
                user[t.index()] = Some(s.clone());
            }
        }
    }
    let base = |t: usize, user: &[Option<Strides>]| -> (Strides, usize) {
        let d = &g.tensors[Handle::from_index(t)];
        match &user[t] {
            Some(s) => (s.clone(), s.span(&d.shape).unwrap_or(0)),
            None => dtensor_strides(&d.shape, layout.dtensors[t], d.dtype),
        }
    };
    // A multi-GPU all-reduce sums its input and output as flat arrays: the output takes the
    // input's strides. An output buffer with other user strides then receives a copy (the
    // output operator copies a tensor that lives elsewhere); the layout solver gives both the
    // same innermost dim (constraint 6 of `layout::solve`).
    let mut same_as: Vec<Option<usize>> = vec![None; g.tensors.len()];
    if g.sharding.num_gpus() > 1 {
        for (_, op) in g.ops.iter() {
            if let KnOpKind::AllReduce { .. } = op.kind {
                let (x, y) = (op.inputs[0].index(), op.outputs[0].index());
                let x_strides = match same_as[x] {
                    Some(src) => base(src, &user).0,
                    None => base(x, &user).0,
                };
                // One layout: equal strides wherever a dim has more than one element.
                let shape = &g.tensors[op.outputs[0]].shape;
                let differs = |s: &Strides| {
                    (0..shape.rank()).any(|d| shape.dim(d) > 1 && s.0[d] != x_strides.0[d])
                };
                if user[y].as_ref().is_some_and(differs) {
                    placement[y] = None;
                    user[y] = None;
                }
                same_as[y] = Some(same_as[x].unwrap_or(x));
            }
        }
    }
    g.tensors
        .iter()
        .map(|(h, _)| {
            let t = h.index();
            let (strides, phys_elems) = base(same_as[t].unwrap_or(t), &user);
            DTensorGeometry {
                innermost: layout.dtensors[t],
                strides,
                phys_elems,
                placement: placement[t].unwrap_or(Placement::Workspace(0)),
            }
        })
        .collect()
}

/// Workspace buffers of the intermediates, live from the op that writes them to the last op
/// that reads them, and the DTensor of each.
pub(super) fn workspace_buffers(
    g: &KernelGraph,
    dt: &[DTensorGeometry],
) -> (Vec<Buffer>, Vec<usize>) {
    let mut def = vec![usize::MAX; g.tensors.len()];
    let mut last = vec![0usize; g.tensors.len()];
    for (h, op) in g.ops.iter() {
        for &t in &op.outputs {
            def[t.index()] = h.index();
            last[t.index()] = h.index();
        }
        for &t in &op.inputs {
            last[t.index()] = last[t.index()].max(h.index());
        }
    }
    let mut bufs = Vec::new();
    let mut tensors = Vec::new();
    for (h, d) in g.tensors.iter() {
        if matches!(dt[h.index()].placement, Placement::Workspace(_))
            && def[h.index()] != usize::MAX
        {
            let bytes = (dt[h.index()].phys_elems * d.dtype.bytes()).div_ceil(WORKSPACE_ALIGN)
                * WORKSPACE_ALIGN;
            bufs.push(Buffer {
                name: format!("%{} {} {}", h.index(), d.shape, d.dtype),
                bytes,
                start: def[h.index()],
                end: last[h.index()] + 1,
                align: WORKSPACE_ALIGN,
            });
            tensors.push(h.index());
        }
    }
    (bufs, tensors)
}

/// The caller's buffers: inputs keep their strides; an output takes the strides the graph
/// gives it, or its tensor's when the tensor lives in it, or padded strides along the tensor's
/// innermost dim when it is a copy of another tensor (a graph input, or another output).
pub(super) fn io_plans(g: &KernelGraph, dt: &[DTensorGeometry]) -> (Vec<IoPlan>, Vec<IoPlan>) {
    let inputs = g
        .inputs()
        .into_iter()
        .map(|(_, t)| {
            let st = dt[t.index()].strides.clone();
            IoPlan {
                tensor: t,
                alloc_elems: st.span(&g.tensors[t].shape).unwrap_or(0),
                strides: st,
            }
        })
        .collect();
    let outputs = g
        .outputs()
        .into_iter()
        .enumerate()
        .map(|(j, (h, t))| {
            let d = &g.tensors[t];
            let geo = &dt[t.index()];
            let (strides, alloc) = match &g.ops[h].kind {
                KnOpKind::Output { strides: Some(s) } => (s.clone(), s.span(&d.shape).unwrap_or(0)),
                _ if geo.placement == Placement::Output(j) => (geo.strides.clone(), geo.phys_elems),
                _ => padded_strides(&d.shape, geo.innermost, None, d.dtype.bytes()),
            };
            IoPlan {
                tensor: t,
                strides,
                alloc_elems: alloc.max(1),
            }
        })
        .collect();
    (inputs, outputs)
}

/// Intermediates in the workspace whose only reader is a kernel-level element-wise operator.
pub(super) fn unfused(g: &KernelGraph, dt: &[DTensorGeometry]) -> Vec<KnUnfused> {
    let mut readers: Vec<Vec<Handle<KnOp>>> = vec![Vec::new(); g.tensors.len()];
    let mut writer: Vec<Option<Handle<KnOp>>> = vec![None; g.tensors.len()];
    for (h, op) in g.ops.iter() {
        for &t in &op.inputs {
            readers[t.index()].push(h);
        }
        for &t in &op.outputs {
            writer[t.index()] = Some(h);
        }
    }
    g.tensors
        .iter()
        .filter_map(|(t, _)| {
            let (Some(producer), [consumer]) = (writer[t.index()], readers[t.index()].as_slice())
            else {
                return None;
            };
            let elementwise = matches!(
                g.ops[*consumer].kind,
                KnOpKind::Unary(_) | KnOpKind::Binary(_)
            );
            (elementwise && matches!(dt[t.index()].placement, Placement::Workspace(_))).then_some(
                KnUnfused {
                    tensor: t,
                    producer,
                    consumer: *consumer,
                },
            )
        })
        .collect()
}
