//! Random valid µGraphs for differential testing: every graph this module makes validates, and
//! its reference values stay finite and well inside its dtype's range on inputs in [−1, 1), so
//! that the GPU's results can be compared with the interpreter's.
//!
//! A graph is drawn from a seed ([`graph`]): a dtype (f16, bf16, f32, f64), optionally a few
//! kernel-level operators before and after, and usually one customized operator with a random
//! grid (1–3 axes), block (whole warps or not), for-loop (1–8 iterations), inputs with random
//! grid maps and for-loop dims and odd tile extents (some of them, with kernel-level operators
//! allowed, the product of a kernel-level matmul that the planner may fuse into the customized
//! operator), and a random program over every
//! threadblock operator (unary and binary element-wise operators, matmuls, reductions of all
//! three kinds, rms_norm, concat) feeding every accumulator kind, then after-loop operators and
//! outputs. Proposals the builder rejects are skipped, so every operator in the result is one
//! the builder accepted; the finished graph goes through full validation.
//!
//! Values stay bounded: each tile carries an upper bound of its magnitude and whether it is
//! positive; `sqrt`, `log`, `div`'s divisor and `pow`'s base take only positive tiles bounded
//! away from 0, `exp` only small arguments, and an operator whose bound would pass a limit is
//! not proposed. Binary operators combine tiles of different origins (no `x − x` cancelling to
//! rounding noise).

use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::arena::Handle;
use super::builder::{GraphBuilder, TbGraphBuilder};
use super::dtype::DType;
use super::kernel::{DTensor, KernelGraph};
use super::ops::{AccumKind, BinaryOp, DimMap, UnaryOp};
use super::threadblock::STensor;

/// What [`graph`] may use.
#[derive(Clone, Debug)]
pub struct GenConfig {
    /// Element types to draw from.
    pub dtypes: Vec<DType>,
    /// Most threadblock operators proposed in the loop body.
    pub max_body_ops: usize,
    /// Whether kernel-level operators may surround the customized one.
    pub kernel_level: bool,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            dtypes: vec![DType::F16, DType::BF16, DType::F32, DType::F64],
            max_body_ops: 8,
            kernel_level: true,
        }
    }
}

/// The largest magnitude a generated tile may reach.
const BOUND: f64 = 1e3;

/// A tile of the program being built: its handle, shape facts, magnitude bound, sign and
/// origin (a bit per graph input it depends on).
#[derive(Clone, Copy, Debug)]
struct Tile {
    t: Handle<STensor>,
    bound: f64,
    /// Every value is at least `low` (> 0), when known.
    low: Option<f64>,
    origin: u64,
    /// A whole row may be exactly 0 (after relu): rms_norm of it divides 0 by 0.
    zero_rows: bool,
}

fn pick<'a, T>(rng: &mut impl Rng, v: &'a [T]) -> &'a T {
    &v[rng.random_range(0..v.len())]
}

/// A random valid graph for `seed`.
pub fn graph(seed: u64, cfg: &GenConfig) -> KernelGraph {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Which inputs are matmul products, and their k, come from a stream of their own, so that
    // the main stream draws what it drew before products existed.
    let mut side = ChaCha8Rng::seed_from_u64(seed ^ 0x6d61_746d_756c);
    for _ in 0..64 {
        if let Some(g) = attempt(&mut rng, &mut side, cfg) {
            return g;
        }
    }
    // Always reachable: a plain kernel-level graph.
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[3, 5], DType::F32).expect("a small input");
    let y = g.exp(x).expect("exp of an input");
    g.mark_output(y).expect("an output");
    g.build().expect("a valid graph")
}

fn attempt(rng: &mut ChaCha8Rng, side: &mut ChaCha8Rng, cfg: &GenConfig) -> Option<KernelGraph> {
    let dtype = *pick(rng, &cfg.dtypes);
    let mut g = GraphBuilder::new();
    if cfg.kernel_level && rng.random_bool(0.2) {
        kernel_only(rng, &mut g, dtype)?;
    } else {
        customized(rng, side, &mut g, dtype, cfg)?;
    }
    g.build().ok()
}

/// A few kernel-level operators on fresh inputs.
fn kernel_only(rng: &mut ChaCha8Rng, g: &mut GraphBuilder, dtype: DType) -> Option<()> {
    let (m, k, n) = (
        rng.random_range(1..40),
        rng.random_range(1..70),
        rng.random_range(1..40),
    );
    let a = g.new_input(&[m, k], dtype).ok()?;
    let b = g.new_input(&[k, n], dtype).ok()?;
    let mut t = match rng.random_range(0..4) {
        0 => g.matmul(a, b).ok()?,
        1 => g.rms_norm(a, 1).ok()?,
        2 => {
            let s = g.exp(a).ok()?;
            g.reduction(s, 1).ok()?
        }
        _ => {
            let c = g.new_input(&[m, k], dtype).ok()?;
            let s = g.add(a, c).ok()?;
            g.concat(&[s, a], 1).ok()?
        }
    };
    if rng.random_bool(0.5) {
        t = g.silu(t).ok()?;
    }
    g.mark_output(t).ok()
}

/// Grid, block and loop of a customized operator.
fn launch_shape(rng: &mut ChaCha8Rng) -> ([usize; 3], [usize; 3], usize) {
    let grid = [
        *pick(rng, &[1, 1, 2, 3, 4]),
        *pick(rng, &[1, 1, 1, 2]),
        *pick(rng, &[1, 1, 1, 2]),
    ];
    let block = [*pick(rng, &[32, 64, 96, 100, 128, 128, 256]), 1, 1];
    let f = *pick(rng, &[1, 1, 2, 3, 4, 8]);
    (grid, block, f)
}

/// An input DTensor whose tiles are `tile` (rank 2 or 3) for this launch: grid axes split
/// random distinct dims, the loop walks a random dim (or none).
fn input(
    rng: &mut ChaCha8Rng,
    g: &mut GraphBuilder,
    tb: &mut TbGraphBuilder,
    tile: &[usize],
    dtype: DType,
    in_loop: bool,
) -> Option<Handle<STensor>> {
    let (dims, map, fd) = partition(rng, tb, tile, in_loop);
    let x: Handle<DTensor> = g.new_input(&dims, dtype).ok()?;
    tb.new_input(g, x, DimMap::from(map), fd).ok()
}

/// Like [`input`], but the DTensor is a kernel-level matmul of two fresh inputs over an inner
/// extent `k` (the planner may fuse it into the customized operator that reads it); returns the
/// tile and its magnitude bound (inputs are drawn in [−1, 1]).
fn product_input(
    rng: &mut ChaCha8Rng,
    g: &mut GraphBuilder,
    tb: &mut TbGraphBuilder,
    tile: &[usize],
    k: usize,
    dtype: DType,
    in_loop: bool,
) -> Option<(Handle<STensor>, f64)> {
    let (dims, map, fd) = partition(rng, tb, tile, in_loop);
    let r = dims.len();
    let (mut a, mut b) = (dims.clone(), dims);
    a[r - 1] = k;
    b[r - 2] = k;
    let a = g.new_input(&a, dtype).ok()?;
    let b = g.new_input(&b, dtype).ok()?;
    let s = g.matmul(a, b).ok()?;
    let t = tb.new_input(g, s, DimMap::from(map), fd).ok()?;
    Some((t, (k as f64).min(BOUND)))
}

/// The global dims of an input whose tiles are `tile`, its grid map and loop dim.
fn partition(
    rng: &mut ChaCha8Rng,
    tb: &TbGraphBuilder,
    tile: &[usize],
    in_loop: bool,
) -> (Vec<usize>, [i32; 3], i32) {
    let (grid, f) = (tb.grid(), tb.graph().forloop_range);
    let mut dims = tile.to_vec();
    let mut map = [-1i32; 3];
    let mut used = Vec::new();
    for a in 0..3 {
        if grid[a] > 1 {
            let free: Vec<usize> = (0..dims.len()).filter(|d| !used.contains(d)).collect();
            // A replicated input (no dim for this axis) is allowed too.
            if free.is_empty() || rng.random_bool(0.25) {
                continue;
            }
            let d = *pick(rng, &free);
            used.push(d);
            map[a] = d as i32;
            dims[d] *= grid[a];
        }
    }
    let fd = if in_loop && f > 1 {
        let d = rng.random_range(0..dims.len());
        dims[d] *= f;
        d as i32
    } else if in_loop {
        rng.random_range(0..dims.len()) as i32
    } else {
        -1
    };
    (dims, map, fd)
}

struct Program {
    tiles: Vec<Tile>,
    inputs: u32,
}

impl Program {
    fn fresh(&mut self, t: Handle<STensor>) -> Tile {
        let tile = Tile {
            t,
            bound: 1.0,
            low: None,
            origin: 1u64 << (self.inputs % 64),
            zero_rows: false,
        };
        self.inputs += 1;
        self.tiles.push(tile);
        tile
    }
}

/// A unary operator applicable to `x` with the resulting bound and lower bound.
fn unary(rng: &mut ChaCha8Rng, x: &Tile) -> Option<(UnaryOp, f64, Option<f64>)> {
    let b = x.bound;
    let choice = rng.random_range(0..10);
    Some(match choice {
        0 if b <= 3.0 => (UnaryOp::Exp, b.exp(), Some((-b).exp())),
        1 => (UnaryOp::Square, b * b, None),
        2 => match x.low {
            Some(l) => (UnaryOp::Sqrt, b.sqrt(), Some(l.sqrt())),
            None => return None,
        },
        3 => (UnaryOp::Silu, b, None),
        4 => (UnaryOp::Sigmoid, 1.0, Some(1.0 / (1.0 + b.exp()))),
        5 => (UnaryOp::Gelu, b, None),
        6 => (UnaryOp::Relu, b, None),
        7 => match x.low {
            Some(l) if l > 1e-3 => (UnaryOp::Log, b.ln().abs().max(l.ln().abs()), None),
            _ => return None,
        },
        8 => {
            let lo = rng.random_range(-2.0..0.0f64);
            let hi = if rng.random_bool(0.2) {
                f64::INFINITY
            } else {
                rng.random_range(0.0..2.0f64)
            };
            (
                UnaryOp::Clamp { min: lo, max: hi },
                b.min(lo.abs().max(hi.abs())),
                None,
            )
        }
        _ => {
            let s = rng.random_range(-2.0..2.0f64);
            (
                UnaryOp::MulScalar(s),
                b * s.abs(),
                x.low.filter(|_| s > 0.0).map(|l| l * s),
            )
        }
    })
}

/// The body of a customized operator, its accumulators, after-loop operators and outputs.
fn customized(
    rng: &mut ChaCha8Rng,
    side: &mut ChaCha8Rng,
    g: &mut GraphBuilder,
    dtype: DType,
    cfg: &GenConfig,
) -> Option<()> {
    let (grid, block, f) = launch_shape(rng);
    let dimx = *pick(rng, &[1, 2, 4]);
    let mut tb = TbGraphBuilder::new(grid, block, f).with_reduction_dimx(dimx);
    let mut p = Program {
        tiles: Vec::new(),
        inputs: 0,
    };
    // Tile extents: small, odd often, multiples of dimx where a to-dimx reduction may follow.
    let ext = |rng: &mut ChaCha8Rng| *pick(rng, &[1, 2, 3, 4, 5, 7, 8, 13, 16, 24, 32, 64]);
    let (r, c) = (ext(rng), ext(rng) * dimx);
    let rank3 = rng.random_bool(0.2);
    let shape = |r: usize, c: usize| if rank3 { vec![1, r, c] } else { vec![r, c] };
    let n_in = rng.random_range(1..4);
    for i in 0..n_in {
        let in_loop = i == 0 || rng.random_bool(0.7);
        if cfg.kernel_level && side.random_bool(0.15) {
            let k = *pick(side, &[1, 2, 3, 8, 16, 32]);
            let (t, bound) = product_input(rng, g, &mut tb, &shape(r, c), k, dtype, in_loop)?;
            p.fresh(t);
            if let Some(last) = p.tiles.last_mut() {
                last.bound = bound;
            }
        } else {
            let t = input(rng, g, &mut tb, &shape(r, c), dtype, in_loop)?;
            p.fresh(t);
        }
    }
    // Matmul operands: A [r, k] and B [k, c].
    if rng.random_bool(0.5) {
        let k = ext(rng);
        let a = input(rng, g, &mut tb, &shape(r, k), dtype, true);
        let b = input(rng, g, &mut tb, &shape(k, c), dtype, true);
        if let (Some(a), Some(b)) = (a, b) {
            let ta = p.fresh(a);
            let tbb = p.fresh(b);
            if let Ok(m) = tb.matmul(a, b) {
                p.tiles.push(Tile {
                    t: m,
                    bound: (k as f64).min(BOUND),
                    low: None,
                    origin: ta.origin | tbb.origin,
                    zero_rows: false,
                });
            }
        }
    }
    body(rng, &mut tb, &mut p, cfg.max_body_ops, dimx);
    let after = accumulators(rng, &mut tb, &p, f)?;
    outputs(rng, &mut tb, after)?;
    // Shared memory: every tile at 8 bytes an element, with room for pipeline stages, within
    // what sm_80 has (so that every generated graph plans for both targets).
    let bytes: usize = tb
        .graph()
        .tensors
        .iter()
        .map(|(_, s)| s.shape.numel() * 8)
        .sum();
    if bytes > 80 * 1024 {
        return None;
    }
    let outs = g.customized(tb).ok()?;
    for o in outs {
        let o = if cfg.kernel_level && rng.random_bool(0.15) {
            g.mul_scalar(o, 0.5).ok()?
        } else {
            o
        };
        g.mark_output(o).ok()?;
    }
    Some(())
}

/// Random in-loop operators over the program's tiles.
fn body(
    rng: &mut ChaCha8Rng,
    tb: &mut TbGraphBuilder,
    p: &mut Program,
    max_ops: usize,
    dimx: usize,
) {
    for _ in 0..rng.random_range(0..=max_ops) {
        let x = *pick(rng, &p.tiles);
        let made = match rng.random_range(0..7) {
            0 | 1 => unary(rng, &x).and_then(|(op, bound, low)| {
                tb.unary(op, x.t).ok().map(|t| Tile {
                    t,
                    bound,
                    low,
                    origin: x.origin,
                    zero_rows: matches!(op, UnaryOp::Relu) || x.zero_rows,
                })
            }),
            2 | 3 => {
                let y = *pick(rng, &p.tiles);
                if x.origin & y.origin != 0 {
                    None
                } else {
                    let pow_ok = x.low.is_some_and(|l| l > 0.05) && y.bound <= 2.0;
                    let choice = if pow_ok && rng.random_bool(0.3) {
                        4
                    } else {
                        rng.random_range(0..5)
                    };
                    let (op, bound, low) = match choice {
                        0 => (BinaryOp::Add, x.bound + y.bound, None),
                        1 => (BinaryOp::Sub, x.bound + y.bound, None),
                        2 => (
                            BinaryOp::Mul,
                            x.bound * y.bound,
                            x.low.zip(y.low).map(|(a, b)| a * b),
                        ),
                        3 => match y.low {
                            Some(l) if l > 0.05 => (BinaryOp::Div, x.bound / l, None),
                            _ => (BinaryOp::Add, x.bound + y.bound, None),
                        },
                        _ => match x.low {
                            Some(l) if l > 0.05 && y.bound <= 2.0 => (
                                BinaryOp::Pow,
                                x.bound.max(1.0).powf(y.bound).max(l.powf(-y.bound)),
                                Some(
                                    l.min(1.0).powf(y.bound)
                                        * (1.0 / x.bound.max(1.0)).powf(y.bound),
                                ),
                            ),
                            _ => (BinaryOp::Mul, x.bound * y.bound, None),
                        },
                    };
                    tb.binary(op, x.t, y.t).ok().map(|t| Tile {
                        t,
                        bound,
                        low,
                        origin: x.origin | y.origin,
                        zero_rows: x.zero_rows || y.zero_rows,
                    })
                }
            }
            4 => {
                // A sum over one of the last two dims, or a strided sum down to dimx.
                let Some(s) = tb.tile_shape(x.t) else {
                    continue;
                };
                let last = s.rank() - 1;
                let dim = last - rng.random_range(0..2usize).min(last);
                let to_dimx = rng.random_bool(0.3) && s.dim(last).is_multiple_of(dimx);
                let (r, len) = if to_dimx {
                    (tb.reduction_to_dimx(x.t, last), s.dim(last) / dimx)
                } else {
                    (tb.reduction(x.t, dim), s.dim(dim))
                };
                r.ok().map(|t| Tile {
                    t,
                    bound: x.bound * len as f64,
                    low: x.low.map(|l| l * len as f64),
                    origin: x.origin,
                    zero_rows: x.zero_rows,
                })
            }
            // |x / rms(x)| ≤ √len; a row of zeros would give 0/0, and rows of one or two
            // elements are nearly sign functions, whose rounding in 16-bit tiles (a sum that
            // underflows to 0) the f64 reference does not see.
            5 if x.zero_rows => None,
            5 => {
                let len = tb.tile_shape(x.t).map_or(1, |s| s.dim(s.rank() - 1));
                if len < 4 {
                    continue;
                }
                tb.rms_norm(x.t).ok().map(|t| Tile {
                    t,
                    bound: (len as f64).sqrt(),
                    low: None,
                    origin: x.origin,
                    zero_rows: false,
                })
            }
            _ => {
                let y = *pick(rng, &p.tiles);
                let d = last_dim(tb, x.t);
                tb.concat(x.t, y.t, d).ok().map(|t| Tile {
                    t,
                    bound: x.bound.max(y.bound),
                    low: x.low.zip(y.low).map(|(a, b)| a.min(b)),
                    origin: x.origin | y.origin,
                    zero_rows: x.zero_rows || y.zero_rows,
                })
            }
        };
        if let Some(t) = made.filter(|t| t.bound <= BOUND) {
            p.tiles.push(t);
        }
    }
}

fn last_dim(tb: &TbGraphBuilder, t: Handle<STensor>) -> usize {
    tb.tile_shape(t).map_or(0, |s| s.rank() - 1)
}

/// One to three accumulators over in-loop tiles (a running max and rescaling accumulators
/// now and then): the after-loop tiles with their bounds.
fn accumulators(
    rng: &mut ChaCha8Rng,
    tb: &mut TbGraphBuilder,
    p: &Program,
    f: usize,
) -> Option<Vec<Tile>> {
    let kinds = [
        AccumKind::Nored,
        AccumKind::Max,
        AccumKind::RedLdSum,
        AccumKind::RedLdMean,
        AccumKind::RedLdRms,
        AccumKind::RedtoxLdSum,
    ];
    let mut after = Vec::new();
    for _ in 0..rng.random_range(1..4) {
        let x = *pick(rng, &p.tiles);
        let kind = *pick(rng, &kinds);
        let len = tb.tile_shape(x.t)?.dims().last().copied().unwrap_or(1) as f64;
        let bound = match kind {
            AccumKind::Nored => x.bound * f as f64,
            AccumKind::RedLdSum | AccumKind::RedtoxLdSum => x.bound * len * f as f64,
            _ => x.bound,
        };
        if let Ok(t) = tb.forloop_accum(x.t, kind)
            && bound <= BOUND * 64.0
        {
            after.push(Tile {
                t,
                bound,
                low: None,
                origin: x.origin,
                zero_rows: x.zero_rows,
            });
        }
    }
    // A rescaling accumulator: A ← A·exp(d) + x with d ≤ 0 from a running max (online softmax).
    if rng.random_bool(0.25) {
        let x = *pick(rng, &p.tiles);
        let d = last_dim(tb, x.t);
        if let Ok((_, diff)) = tb.reduction_max(x.t, d)
            && let Ok(scale) = tb.exp(diff)
        {
            let kind = *pick(rng, &[AccumKind::NoredRescale, AccumKind::RedLdSumRescale]);
            let y = *pick(rng, &p.tiles);
            if let Ok(t) = tb.forloop_accum_rescale(y.t, scale, kind) {
                after.push(Tile {
                    t,
                    bound: y.bound * 64.0 * f as f64,
                    low: None,
                    origin: y.origin,
                    zero_rows: y.zero_rows,
                });
            }
        }
    }
    (!after.is_empty()).then_some(after)
}

/// After-loop operators on the accumulators, and an output for each leaf (or for all).
fn outputs(rng: &mut ChaCha8Rng, tb: &mut TbGraphBuilder, after: Vec<Tile>) -> Option<()> {
    let mut leaves = after.clone();
    for _ in 0..rng.random_range(0..3) {
        let x = *pick(rng, &after);
        let y = match rng.random_range(0..3) {
            0 => tb.silu(x.t),
            1 => tb.mul_scalar(x.t, 0.25),
            _ => {
                let z = *pick(rng, &after);
                if z.origin & x.origin != 0 {
                    continue;
                }
                tb.add(x.t, z.t)
            }
        };
        if let Ok(t) = y {
            leaves.push(Tile { t, ..x });
        }
    }
    for l in &leaves {
        let s = tb.tile_shape(l.t)?;
        let grid = tb.grid();
        // Map each grid axis with more than one block to a distinct dim.
        let mut map = [-1i32; 3];
        let mut used = Vec::new();
        for a in 0..3 {
            if grid[a] > 1 {
                let free: Vec<usize> = (0..s.rank()).filter(|d| !used.contains(d)).collect();
                if free.is_empty() {
                    // More split grid axes than dims: this output cannot be placed.
                    return None;
                }
                let d = *pick(rng, &free);
                used.push(d);
                map[a] = d as i32;
            }
        }
        tb.new_output(l.t, DimMap::from(map)).ok()?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_graphs_validate_and_vary() {
        let cfg = GenConfig::default();
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let g = graph(seed, &cfg);
            crate::graph::validate(&g, None).unwrap();
            for (_, op) in g.ops.iter() {
                if let crate::graph::KnOpKind::Customized(tb) = &op.kind {
                    for (_, t) in tb.ops.iter() {
                        kinds.insert(t.kind.name());
                    }
                }
            }
        }
        assert!(kinds.len() >= 15, "{kinds:?}");
    }
}
