//! Reference execution of a customized operator (§4.3 of the format reference): every block
//! independently runs the in-loop operators for each iteration, finalises its accumulators,
//! then runs the after-loop operators once and stores its output tiles.

use rayon::prelude::*;

use super::Rounding;
use super::array::Array;
use crate::graph::arena::Handle;
use crate::graph::ops::{AccumKind, TbReduction};
use crate::graph::shape::Shape;
use crate::graph::threadblock::{STensor, TbGraph, TbOp, TbOpKind};

/// When an operator runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Once, before the loop (loop-invariant).
    Hoisted,
    /// Every iteration.
    Loop,
    /// Once, after the loop.
    After,
}

/// Per-operator plan derived once per customized operator.
struct Plan {
    phase: Vec<Phase>,
}

fn plan(tb: &TbGraph) -> Plan {
    // A tile is loop-invariant if it comes from an input without a for-loop dim, or from a
    // stateless operator whose inputs are all loop-invariant.
    let mut invariant = vec![false; tb.tensors.len()];
    let mut phase = Vec::with_capacity(tb.ops.len());
    for (_, op) in tb.ops.iter() {
        let p = match &op.kind {
            TbOpKind::Input { forloop_dim, .. } => {
                if forloop_dim.is_none() {
                    Phase::Hoisted
                } else {
                    Phase::Loop
                }
            }
            TbOpKind::Output { .. } => Phase::After,
            TbOpKind::Accum(_) => Phase::Loop,
            TbOpKind::Reduction {
                kind: TbReduction::Max,
                ..
            } => {
                if tb.tensors[op.inputs[0]].after_accum {
                    Phase::After
                } else {
                    Phase::Loop
                }
            }
            _ => {
                if op.inputs.iter().any(|&t| tb.tensors[t].after_accum) {
                    Phase::After
                } else if op.inputs.iter().all(|&t| invariant[t.index()]) {
                    Phase::Hoisted
                } else {
                    Phase::Loop
                }
            }
        };
        if p == Phase::Hoisted {
            for &t in &op.outputs {
                invariant[t.index()] = true;
            }
        }
        phase.push(p);
    }
    Plan { phase }
}

/// A block's result: (customized output index, tile origin, tile).
type Stores = Vec<(usize, Vec<usize>, Array)>;

/// Runs a customized operator; `inputs` are its input DTensors as logical arrays, `out_shapes`
/// the shapes of its outputs. Also returns, per STensor, the largest magnitude it took in any
/// block and iteration (NaN ignored), for range checks against its dtype.
/// With [`Rounding::Stored`], every tile written and every accumulator update is rounded to
/// the tile's dtype.
pub fn run(
    tb: &TbGraph,
    inputs: &[&Array],
    out_shapes: &[Shape],
    rounding: Rounding,
) -> (Vec<Array>, Vec<f64>) {
    let plan = plan(tb);
    let [gx, gy, gz] = tb.grid;
    let blocks: Vec<[usize; 3]> = (0..gz)
        .flat_map(|z| (0..gy).flat_map(move |y| (0..gx).map(move |x| [x, y, z])))
        .collect();
    let per_block: Vec<(Stores, Vec<f64>)> = blocks
        .par_iter()
        .map(|&b| Block::new(tb, &plan, inputs, b, rounding).run())
        .collect();
    let mut outs: Vec<Array> = out_shapes
        .iter()
        .map(|&s| Array::full(s, f64::NAN))
        .collect();
    let mut tile_max = vec![0.0f64; tb.tensors.len()];
    for (stores, maxima) in per_block {
        for (j, origin, tile) in stores {
            outs[j].write_slice(&origin, &tile);
        }
        for (m, x) in tile_max.iter_mut().zip(maxima) {
            *m = m.max(x);
        }
    }
    (outs, tile_max)
}

/// Accumulator state.
enum Acc {
    /// Σ so far (shape of the result before finalisation).
    Sum(Array),
    /// Running max.
    Max(Array),
}

struct Block<'a> {
    tb: &'a TbGraph,
    plan: &'a Plan,
    inputs: &'a [&'a Array],
    b: [usize; 3],
    rounding: Rounding,
    values: Vec<Option<Array>>,
    /// Largest magnitude each tile took so far.
    tile_max: Vec<f64>,
    accs: Vec<Option<Acc>>,
    /// Running maxima of `reduction_max` operators.
    running_max: Vec<Option<Array>>,
}

impl<'a> Block<'a> {
    fn new(
        tb: &'a TbGraph,
        plan: &'a Plan,
        inputs: &'a [&'a Array],
        b: [usize; 3],
        rounding: Rounding,
    ) -> Self {
        Block {
            tb,
            plan,
            inputs,
            b,
            rounding,
            values: vec![None; tb.tensors.len()],
            tile_max: vec![0.0; tb.tensors.len()],
            accs: (0..tb.ops.len()).map(|_| None).collect(),
            running_max: vec![None; tb.ops.len()],
        }
    }

    fn val(&self, t: Handle<STensor>) -> &Array {
        self.values[t.index()]
            .as_ref()
            .expect("validated graphs define tiles before use")
    }

    fn set(&mut self, t: Handle<STensor>, mut a: Array) {
        let dtype = self.tb.tensors[t].dtype;
        if self.rounding == Rounding::Stored {
            a.data.iter_mut().for_each(|x| *x = dtype.round(*x));
        }
        if dtype.max_finite().is_some() {
            let m = &mut self.tile_max[t.index()];
            // Infinite reference values are infinite in the compiled code too: no overflow.
            *m = super::array::finite_max_abs(&a.data, *m);
        }
        self.values[t.index()] = Some(a);
    }

    fn run(mut self) -> (Stores, Vec<f64>) {
        let tb = self.tb;
        for (h, op) in tb.ops.iter() {
            if self.plan.phase[h.index()] == Phase::Hoisted {
                self.exec(h, op, 0);
            }
        }
        for i in 0..tb.forloop_range {
            for (h, op) in tb.ops.iter() {
                if self.plan.phase[h.index()] == Phase::Loop {
                    self.exec(h, op, i);
                }
            }
        }
        for (h, op) in tb.ops.iter() {
            if let TbOpKind::Accum(kind) = op.kind {
                self.finalize(h, op, kind);
            }
        }
        let mut stores = Vec::new();
        for (h, op) in tb.ops.iter() {
            if self.plan.phase[h.index()] == Phase::After {
                if let TbOpKind::Output { output, omap } = op.kind {
                    let tile = self.val(op.inputs[0]).clone();
                    let mut origin = vec![0; tile.shape.rank()];
                    for a in 0..3 {
                        if let (true, Some(d)) = (tb.grid[a] > 1, omap.axis(a)) {
                            origin[d] += self.b[a] * tile.shape.dim(d);
                        }
                    }
                    stores.push((output, origin, tile));
                } else {
                    self.exec(h, op, 0);
                }
            }
        }
        (stores, self.tile_max)
    }

    /// Executes one operator in iteration `i`.
    fn exec(&mut self, h: Handle<TbOp>, op: &TbOp, i: usize) {
        let tb = self.tb;
        let out_shape = |k: usize| tb.tensors[op.outputs[k]].shape;
        match &op.kind {
            TbOpKind::Input {
                input,
                imap,
                forloop_dim,
            } => {
                let d = self.inputs[*input];
                let s = out_shape(0);
                let mut origin = vec![0; s.rank()];
                for a in 0..3 {
                    if let (true, Some(dim)) = (tb.grid[a] > 1, imap.axis(a)) {
                        origin[dim] += self.b[a] * (d.shape.dim(dim) / tb.grid[a]);
                    }
                }
                if let Some(f) = forloop_dim {
                    origin[*f] += i * s.dim(*f);
                }
                let tile = d.slice(&origin, s);
                self.set(op.outputs[0], tile);
            }
            TbOpKind::Output { .. } => {}
            TbOpKind::Matmul => {
                let c = Array::matmul(self.val(op.inputs[0]), self.val(op.inputs[1]));
                self.set(op.outputs[0], c);
            }
            TbOpKind::Unary(u) => {
                let y = self.val(op.inputs[0]).map(|x| u.apply(x));
                self.set(op.outputs[0], y);
            }
            TbOpKind::Binary(b) => {
                let y = Array::binary(
                    self.val(op.inputs[0]),
                    self.val(op.inputs[1]),
                    *b,
                    out_shape(0),
                );
                self.set(op.outputs[0], y);
            }
            TbOpKind::RmsNorm => {
                let y = self.val(op.inputs[0]).rms_norm(1);
                self.set(op.outputs[0], y);
            }
            TbOpKind::Concat { dim } => {
                let y = Array::concat(
                    &[self.val(op.inputs[0]), self.val(op.inputs[1])],
                    *dim,
                    out_shape(0),
                );
                self.set(op.outputs[0], y);
            }
            TbOpKind::Reduction { dim, kind } => match kind {
                TbReduction::Sum => {
                    let y = self.val(op.inputs[0]).sum_to(*dim, 1);
                    self.set(op.outputs[0], y);
                }
                TbReduction::ToDimx => {
                    let y = self.val(op.inputs[0]).sum_to(*dim, tb.reduction_dimx);
                    self.set(op.outputs[0], y);
                }
                TbReduction::PlainMax => {
                    let y = self.val(op.inputs[0]).max_over(*dim, 1);
                    self.set(op.outputs[0], y);
                }
                TbReduction::Max => {
                    let m = self.val(op.inputs[0]).max_over(*dim, 1);
                    let old = self.running_max[h.index()]
                        .take()
                        .unwrap_or_else(|| Array::full(m.shape, f64::NEG_INFINITY));
                    let new = Array::from_vec(
                        m.shape,
                        old.data
                            .iter()
                            .zip(&m.data)
                            .map(|(&o, &x)| if x > o || x.is_nan() { x } else { o })
                            .collect(),
                    );
                    // previous − new (≤ 0); equal maxima (even both −∞) give 0, not NaN.
                    let diff = Array::from_vec(
                        m.shape,
                        old.data
                            .iter()
                            .zip(&new.data)
                            .map(|(&o, &n)| if o == n { 0.0 } else { o - n })
                            .collect(),
                    );
                    self.set(op.outputs[0], new.clone());
                    self.set(op.outputs[1], diff);
                    self.running_max[h.index()] = Some(new);
                }
            },
            TbOpKind::Accum(kind) => {
                let x = self.val(op.inputs[0]);
                let last = x.shape.rank() - 1;
                let contribution = match kind {
                    AccumKind::Nored | AccumKind::NoredRescale | AccumKind::Max => x.clone(),
                    AccumKind::RedLdSum | AccumKind::RedLdSumRescale | AccumKind::RedLdMean => {
                        x.sum_to(last, 1)
                    }
                    AccumKind::RedLdRms => x.map(|v| v * v).sum_to(last, 1),
                    AccumKind::RedtoxLdSum => x.sum_to(last, tb.reduction_dimx),
                };
                let r = op.inputs.get(1).map(|&r| self.val(r).clone());
                let slot = &mut self.accs[h.index()];
                match (slot, kind) {
                    (Some(Acc::Max(a)), _) => {
                        for (s, &v) in a.data.iter_mut().zip(&contribution.data) {
                            if v > *s || v.is_nan() {
                                *s = v;
                            }
                        }
                    }
                    (Some(Acc::Sum(a)), AccumKind::NoredRescale | AccumKind::RedLdSumRescale) => {
                        a.rescale_add(r.as_ref().expect("rescale has two inputs"), &contribution);
                    }
                    (Some(Acc::Sum(a)), _) => a.add_assign(&contribution),
                    (slot @ None, AccumKind::Max) => *slot = Some(Acc::Max(contribution)),
                    (slot @ None, _) => *slot = Some(Acc::Sum(contribution)),
                }
                if self.rounding == Rounding::Stored {
                    let dtype = tb.tensors[op.outputs[0]].dtype;
                    if let Some(Acc::Sum(a) | Acc::Max(a)) = &mut self.accs[h.index()] {
                        a.data.iter_mut().for_each(|x| *x = dtype.round(*x));
                    }
                }
            }
        }
    }

    fn finalize(&mut self, h: Handle<TbOp>, op: &TbOp, kind: AccumKind) {
        let tb = self.tb;
        let x_shape = tb.tensors[op.inputs[0]].shape;
        let lf = (x_shape.dim(x_shape.rank() - 1) * tb.forloop_range) as f64;
        let acc = match self.accs[h.index()].take() {
            Some(Acc::Sum(a)) | Some(Acc::Max(a)) => a,
            None => unreachable!("forloop_range >= 1"),
        };
        let out = match kind {
            AccumKind::RedLdMean => acc.map(|v| v / lf),
            AccumKind::RedLdRms => acc.map(|v| (v / lf).sqrt()),
            _ => acc,
        };
        self.set(op.outputs[0], out);
    }
}
