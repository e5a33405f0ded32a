//! The work a graph does, for performance reports: the bytes its inputs and outputs occupy (the
//! least memory traffic any implementation needs: each input read once, each output written
//! once) and the floating-point operations of its matrix products.
//!
//! Only matrix products are counted: they are what the matrix units execute, and element-wise
//! work is negligible beside them (or beside the bytes) in every graph of the corpus. A product
//! of an `m×k` and a `k×n` matrix counts `2·m·n·k` operations. A threadblock matmul counts once
//! per block, and once per for-loop iteration when it runs inside the loop; so two candidates
//! of one program can differ where one recomputes what the other shares.

use super::dtype::DType;
use super::kernel::{KernelGraph, KnOpKind};
use super::threadblock::{TbGraph, TbOpKind};

/// Bytes and matrix operations of a graph.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Work {
    /// Bytes of every graph input's logical elements.
    pub input_bytes: u64,
    /// Bytes of every graph output's logical elements.
    pub output_bytes: u64,
    /// Matrix-product operations per operand element type, sorted by type.
    pub matmul_flops: Vec<(DType, f64)>,
}

impl Work {
    /// Input plus output bytes.
    pub fn bytes(&self) -> u64 {
        self.input_bytes + self.output_bytes
    }

    /// All matrix-product operations.
    pub fn flops(&self) -> f64 {
        // A fold from +0.0: an empty `sum` of floats is −0.0.
        self.matmul_flops.iter().fold(0.0, |a, (_, f)| a + f)
    }

    fn add_flops(&mut self, dt: DType, f: f64) {
        match self.matmul_flops.iter_mut().find(|(d, _)| *d == dt) {
            Some((_, x)) => *x += f,
            None => {
                self.matmul_flops.push((dt, f));
                self.matmul_flops.sort_by_key(|(d, _)| *d);
            }
        }
    }
}

fn bytes_of(numel: usize, dt: DType) -> u64 {
    numel as u64 * u64::from(dt.bits()).div_ceil(8)
}

/// 2·m·n·k for an output of `out_numel` elements and inner extent `k`.
fn product_flops(out_numel: usize, k: usize) -> f64 {
    2.0 * out_numel as f64 * k as f64
}

/// The work of a (valid) graph.
pub fn work(g: &KernelGraph) -> Work {
    let mut w = Work::default();
    for (_, t) in g.inputs() {
        let t = &g.tensors[t];
        w.input_bytes += bytes_of(t.shape.numel(), t.dtype);
    }
    for (_, t) in g.outputs() {
        let t = &g.tensors[t];
        w.output_bytes += bytes_of(t.shape.numel(), t.dtype);
    }
    for (_, op) in g.ops.iter() {
        match &op.kind {
            KnOpKind::Matmul => {
                let (Some(&a), Some(&c)) = (op.inputs.first(), op.outputs.first()) else {
                    continue;
                };
                let a = &g.tensors[a];
                let k = a.shape.dims().last().copied().unwrap_or(1);
                w.add_flops(a.dtype, product_flops(g.tensors[c].shape.numel(), k));
            }
            KnOpKind::Customized(tb) => threadblock_flops(tb, &mut w),
            _ => {}
        }
    }
    w
}

fn threadblock_flops(tb: &TbGraph, w: &mut Work) {
    let blocks = tb.num_blocks() as f64;
    for (_, op) in tb.ops.iter() {
        if !matches!(op.kind, TbOpKind::Matmul) {
            continue;
        }
        let (Some(&a), Some(&c)) = (op.inputs.first(), op.outputs.first()) else {
            continue;
        };
        let (a, c) = (&tb.tensors[a], &tb.tensors[c]);
        let k = a.shape.dims().last().copied().unwrap_or(1);
        let iterations = if c.after_accum {
            1.0
        } else {
            tb.forloop_range as f64
        };
        w.add_flops(
            a.dtype,
            product_flops(c.shape.numel(), k) * iterations * blocks,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{AccumKind, GraphBuilder, TbGraphBuilder};

    #[test]
    fn kernel_level_matmul_counts_2mnk_and_io_bytes() {
        let mut g = GraphBuilder::new();
        let a = g.new_input(&[2, 3], DType::F16).unwrap();
        let b = g.new_input(&[3, 4], DType::F16).unwrap();
        let c = g.matmul(a, b).unwrap();
        g.mark_output(c).unwrap();
        let w = work(&g.build().unwrap());
        assert_eq!(w.input_bytes, (6 + 12) * 2);
        assert_eq!(w.output_bytes, 8 * 2);
        assert_eq!(w.bytes(), 52);
        assert_eq!(w.matmul_flops, vec![(DType::F16, 2.0 * 2.0 * 4.0 * 3.0)]);
    }

    #[test]
    fn threadblock_matmul_counts_per_block_and_iteration() {
        // X 8×64 · W 64×32: grid 4 along W's columns, loop of 4 over k (tiles 8×16 · 16×8).
        let mut g = GraphBuilder::new();
        let x = g.new_input(&[8, 64], DType::BF16).unwrap();
        let w = g.new_input(&[64, 32], DType::BF16).unwrap();
        let mut tb = TbGraphBuilder::new([4, 1, 1], [128, 1, 1], 4);
        let tx = tb.new_input(&g, x, [-1, -1, -1], 1).unwrap();
        let tw = tb.new_input(&g, w, [1, -1, -1], 0).unwrap();
        let p = tb.matmul(tx, tw).unwrap();
        let acc = tb.forloop_accum(p, AccumKind::Nored).unwrap();
        tb.new_output(acc, [1, -1, -1]).unwrap();
        let outs = g.customized(tb).unwrap();
        g.mark_output(outs[0]).unwrap();
        let work = work(&g.build().unwrap());
        // Every block and iteration: 2·8·8·16; 4 blocks × 4 iterations = 2·8·32·64 in all.
        assert_eq!(
            work.matmul_flops,
            vec![(DType::BF16, 2.0 * 8.0 * 32.0 * 64.0)]
        );
        assert_eq!(work.bytes(), (8 * 64 + 64 * 32 + 8 * 32) * 2);
    }
}
