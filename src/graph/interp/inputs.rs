//! Deterministic, seeded input generation.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use super::HostTensor;
use crate::graph::kernel::{KernelGraph, KnOpKind};

/// How to draw the inputs of a graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InputSpec {
    /// Seed; the same seed gives the same inputs on every machine.
    pub seed: u64,
    /// Values are drawn uniformly from [−scale, scale) (integers: rounded, and made
    /// non-negative for unsigned types).
    pub scale: f64,
}

impl Default for InputSpec {
    fn default() -> Self {
        InputSpec {
            seed: 0,
            scale: 1.0,
        }
    }
}

/// Draws one buffer per graph input, laid out with the input's strides. Each value is
/// representable in the input's element type (so a GPU run sees exactly the values the
/// interpreter sees), logical elements are drawn in row-major order (the values do not depend on
/// the layout), and padding elements are NaN (so a kernel that reads padding is caught).
pub fn random_inputs(g: &KernelGraph, spec: InputSpec) -> Vec<HostTensor> {
    let mut out = Vec::new();
    for (i, (_, op)) in g
        .ops
        .iter()
        .filter(|(_, op)| matches!(op.kind, KnOpKind::Input { .. }))
        .enumerate()
    {
        let KnOpKind::Input { strides } = &op.kind else {
            unreachable!()
        };
        let t = &g.tensors[op.outputs[0]];
        let seed = spec.seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // Chunks get their own ChaCha stream, so the values do not depend on the thread count.
        let mut logical = vec![0.0f64; t.shape.numel()];
        logical
            .par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(c, chunk)| {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(c as u64);
                for v in chunk.iter_mut() {
                    let x = (rng.random::<u32>() as f64 * (2.0 / 4294967296.0) - 1.0) * spec.scale;
                    *v = if t.dtype.is_unsigned() {
                        t.dtype.round(x.abs())
                    } else {
                        t.dtype.round(x)
                    };
                }
            });
        let data = if strides.0 == t.shape.row_major_strides().0 {
            logical
        } else {
            let mut data = vec![f64::NAN; strides.span(&t.shape).unwrap_or(0)];
            let dims = t.shape.dims();
            let mut idx = vec![0usize; dims.len()];
            for &v in &logical {
                let off: usize = idx.iter().zip(&strides.0).map(|(i, s)| i * s).sum();
                data[off] = v;
                for d in (0..dims.len()).rev() {
                    idx[d] += 1;
                    if idx[d] < dims[d] {
                        break;
                    }
                    idx[d] = 0;
                }
            }
            data
        };
        out.push(HostTensor {
            shape: t.shape,
            strides: strides.clone(),
            data,
        });
    }
    out
}

/// Elements per independently seeded stream.
const CHUNK: usize = 1 << 16;
