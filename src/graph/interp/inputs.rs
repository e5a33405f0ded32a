//! Deterministic, seeded input generation.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use super::HostTensor;
use crate::graph::dtype::DType;
use crate::graph::kernel::{KernelGraph, KnOpKind};
use crate::graph::shape::{Shape, Strides};

/// How to draw the inputs of a graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InputSpec {
    /// Seed; the same seed gives the same inputs on every machine.
    pub seed: u64,
    /// Values are drawn uniformly from [−scale, scale) (integers: rounded, and made
    /// non-negative for unsigned types).
    pub scale: f64,
}

/// A scale (or any positive number) for a message: as written when short (`0.5`, `70000`),
/// else in exponent form (`1e300`, not 301 digits; `1e-300`, not 300 zeros).
pub fn format_scale(x: f64) -> String {
    let plain = format!("{x}");
    if plain.len() <= 12 {
        plain
    } else {
        format!("{x:e}")
    }
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
        let logical = draw(t.shape, t.dtype, i, spec);
        let data = if strides.0 == t.shape.row_major_strides().0 {
            logical
        } else {
            scatter(t.shape, strides, &logical)
        };
        out.push(HostTensor {
            shape: t.shape,
            strides: strides.clone(),
            data,
        });
    }
    out
}

/// The logical (row-major) values of input `index` with `shape` and `dtype`: uniform in
/// [−scale, scale), representable in `dtype`, seeded by `spec.seed` and the input's index.
pub(super) fn draw(shape: Shape, dtype: DType, index: usize, spec: InputSpec) -> Vec<f64> {
    let seed = spec.seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // Chunks get their own ChaCha stream, so the values do not depend on the thread count.
    let mut logical = vec![0.0f64; shape.numel()];
    logical
        .par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_stream(c as u64);
            for v in chunk.iter_mut() {
                let x = (rng.random::<u32>() as f64 * (2.0 / 4294967296.0) - 1.0) * spec.scale;
                *v = if dtype.is_unsigned() {
                    dtype.round(x.abs())
                } else {
                    dtype.round(x)
                };
            }
        });
    logical
}

/// A buffer laid out with `strides` holding the row-major values `logical` of `shape`; padding
/// elements are NaN.
pub(super) fn scatter(shape: Shape, strides: &Strides, logical: &[f64]) -> Vec<f64> {
    let mut data = vec![f64::NAN; strides.span(&shape).unwrap_or(0)];
    let dims = shape.dims();
    let mut idx = vec![0usize; dims.len()];
    for &v in logical {
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
}

/// Elements per independently seeded stream.
const CHUNK: usize = 1 << 16;
