//! **Loaded scores less their row max**, a rewrite the planner makes before it plans; the
//! caller's graph is never changed.
//!
//! Some attention candidates compute the scores S = Q·K in one operator (a kernel-level matmul)
//! and exponentiate them in others, as loaded: a kernel-level `exp`, or a customized operator
//! that loads tiles of S and applies `exp`. exp(S) of unnormalised scores overflows 16-bit
//! floats (|S| ≈ 11 already gives 60 000), and no running max can be kept where S is only
//! loaded. The rewrite computes M, the max of each row of S over its last dim (the keys), once
//! ([`KnOpKind::RowMax`], runtime `kn::reduce` with the max), and every reader exponentiates
//! S − M instead (a kernel-level `exp` becomes [`KnOpKind::ShiftedExp`]; inside a customized
//! operator, a tile of M loaded beside S's and a `sub` before the `exp`). Every exponential
//! is then scaled by e^(−M) of its row, at most 1.
//!
//! That computes the same function when the factor cancels, which a data-flow check proves
//! before anything changes: following every value computed from the shifted exponentials, the
//! factor of its row is kept by row-preserving linear steps (sums along the last dim, matmuls
//! taking it as A, products with unshifted values, tiles and outputs whose grid axes place the
//! same rows), and it must vanish in a division whose numerator and denominator both carry it,
//! the denominator being a sum of exponentials over every key of its row (so at least e⁰ = 1:
//! it cannot underflow to 0 where the graph's form would not). A shifted value that reaches a
//! graph output, an operator that does not keep the factor (exp, rms_norm, an all-reduce), a
//! sum of shifted and unshifted values, or a for-loop walking a row leaves the graph as it is,
//! and the plan says why ([`NoShift`]).
//!
//! Where the factor of a whole row would not cancel but every block that loads S (to
//! exponentiate it) or exp(S) (computed by a kernel-level `exp`) holds one contiguous group of
//! a row's keys (a grid axis splits them), M is the max of each group instead (`RowMax {
//! groups }`, M's last dim the groups; `ShiftedExp { groups }` reads one M per group), each
//! block loads its group's M, and the check runs again with these changes: the block's keys
//! count as the whole row (a sum over them is the group's denominator), no scaled value may
//! leave a customized operator, and no kernel-level operator but the `exp` may take one
//! (elsewhere the group of each element is not tracked). The reason reported when both fail is
//! the whole row's.
//!
//! An `exp` that a customized operator takes of a tile it computes (not loads) and writes as an
//! output, the tile's only use, first moves after the operator ([`HoistedExp`]): the operator
//! writes S and a kernel-level `exp` reads it. Only moves after which S shifts are kept.
//!
//! Only f16 scores are shifted (bf16, f32 and f64 hold e^S up to S ≈ 88), on one GPU.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::graph::arena::Handle;
use crate::graph::dtype::DType;
use crate::graph::kernel::{DTensor, KernelGraph, KnOp, KnOpKind};
use crate::graph::ops::{AccumKind, BinaryOp, DimMap, TbReduction, UnaryOp};
use crate::graph::shape::Shape;
use crate::graph::threadblock::{STensor, TbGraph, TbOp, TbOpKind};
use crate::sched::plan::RewriteFailure;

/// Scores whose exponentials the plan computes less their row max.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShiftedScores {
    /// The scores S (tensor index in the graph the shift was applied to).
    pub scores: usize,
    /// The kernel operators that exponentiate S (operator indices of that graph).
    pub readers: Vec<usize>,
    /// The row max operator ([`KnOpKind::RowMax`]) in the rewritten graph; `None` where every
    /// reader computes the max itself ([`ShiftedScores::in_block`]).
    pub row_max: Option<usize>,
    /// Groups of contiguous keys per row that each have their own max (1: the whole row; more
    /// where every block of the readers holds one group and divides by its sum).
    pub groups: usize,
    /// The operators whose blocks take the max of their tiles of S themselves (a plain max
    /// threadblock reduction) instead of loading M: every reader where no row max operator is
    /// needed (each tile it exponentiates holds whole groups, or whole rows, of keys), or the
    /// operator the exps went into ([`ShiftedScores::folded_into`]); empty where M is computed.
    pub in_block: Vec<usize>,
    /// The customized operator writing S that now exponentiates its tile itself, less the
    /// tile's max (its tile holds whole groups; the kernel-level exp of S, moved there or the
    /// graph's own, went into it): S is then no tensor of the rewritten graph, and `scores`
    /// the number it had in the graph the shift was tried on.
    pub folded_into: Option<usize>,
}

/// Why a value computed from the shifted exponentials would not keep its row's factor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Flow {
    /// It reaches a graph output.
    Output,
    /// An operator does not keep the factor of each row (`kind` names it).
    Op {
        /// The operator's name.
        kind: String,
    },
    /// Its leading dims are not the scores' rows.
    Rows,
    /// A for-loop walks one of its rows.
    LoopOverRows,
    /// A grid axis places its rows unlike the value it is combined with (or its output).
    Placement,
    /// It is added to, or multiplied by, a value with another factor.
    Mixed,
    /// It is divided by a value that is not a sum of exponentials over every key of the row.
    Denominator,
    /// It divides a value that does not carry the factor.
    Divisor,
}

impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Flow::Output => f.write_str("a value scaled by the row max reaches a graph output"),
            Flow::Op { kind } => {
                write!(f, "{kind} of a scaled value does not keep the row's factor")
            }
            Flow::Rows => f.write_str("a scaled value's leading dims are not the scores' rows"),
            Flow::LoopOverRows => f.write_str("a for-loop walks the rows of a scaled value"),
            Flow::Placement => {
                f.write_str("a grid axis places the rows of a scaled tile unlike its partner's")
            }
            Flow::Mixed => f.write_str("a scaled value is combined with one of another factor"),
            Flow::Denominator => f.write_str(
                "a scaled value is divided by something other than a sum over every key of its row",
            ),
            Flow::Divisor => f.write_str("a scaled value is the divisor of an unscaled one"),
        }
    }
}

/// Why the exponentials of loaded scores keep the graph's form.
#[derive(Clone, Debug, PartialEq)]
pub enum NoShift {
    /// Turned off (`--online-softmax off`).
    Off,
    /// The graph runs on several GPUs (a row max across ranks is not planned).
    Mesh,
    /// The scores are not 16-bit floats.
    Dtype(DType),
    /// A value computed from the exponentials would not keep its row's factor (at kernel op
    /// `op` of the graph the shift was tried on).
    Flow {
        /// The kernel operator where it fails.
        op: usize,
        /// What fails.
        why: Flow,
    },
    /// The values computed from these scores meet those of scores shifted already.
    Shared,
    /// The rewritten graph does not validate or plan.
    Plan(RewriteFailure),
}

impl fmt::Display for NoShift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoShift::Off => f.write_str("the shift by the row max is turned off"),
            NoShift::Mesh => f.write_str("the graph runs on several GPUs"),
            NoShift::Dtype(dt) => write!(f, "the scores are {dt}, not f16"),
            NoShift::Flow { op, why } => {
                write!(f, "the row max would not cancel: at kernel op {op}, {why}")
            }
            NoShift::Shared => f.write_str("its values meet those of other shifted scores"),
            NoShift::Plan(why) => write!(f, "the shifted graph does not plan: {why}"),
        }
    }
}

/// What [`shift_scores`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShiftRewrite {
    /// The rewritten graph, when some scores were shifted.
    pub graph: Option<Box<KernelGraph>>,
    /// The scores shifted.
    pub applied: Vec<ShiftedScores>,
    /// Kernel operators that exponentiate loaded scores as the graph does, and why (operator
    /// indices of the graph the shift was tried on).
    pub declined: Vec<(usize, NoShift)>,
    /// Exponentials that customized operators took of tiles they computed and wrote, moved
    /// after them so that their scores could be shifted.
    pub hoisted: Vec<HoistedExp>,
}

/// An exponential a customized operator took of a tile it computed and wrote as an output,
/// moved after the operator: the operator writes the tile (the scores S) to a new tensor and a
/// kernel-level `exp` of S writes the output, which the shift then takes less the row max of S.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoistedExp {
    /// The customized operator (operator index in the graph the shift was tried on).
    pub kernel: usize,
    /// Its output that held the exponentials.
    pub output: usize,
    /// The scores it writes instead (tensor index in the rewritten graph).
    pub scores: usize,
    /// Whether the operator's tile holds whole groups of keys (or whole rows), so that the
    /// `exp` went back into it, taken less the tile's max ([`TbReduction::PlainMax`]): the
    /// move only served the check that the max cancels.
    pub in_block: bool,
}

impl ShiftRewrite {
    /// Keeps every exponential's form after all, with `why` (the rewritten graph did not plan).
    pub fn undo(&mut self, why: NoShift) {
        self.graph = None;
        self.hoisted.clear();
        for a in self.applied.drain(..) {
            for r in a.readers {
                self.declined.push((r, why.clone()));
            }
        }
        self.declined.sort_by_key(|(k, _)| *k);
    }

    /// Whether kernel op `k` exponentiates shifted scores.
    pub fn shifts(&self, k: usize) -> Option<&ShiftedScores> {
        self.applied.iter().find(|a| a.readers.contains(&k))
    }
}

/// Which keys an element-wise value of the shifted exponentials holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Keys {
    /// Every key of its rows (a tile spanning the last dim, a whole tensor).
    Tile,
    /// Every key of its rows over the for-loop's iterations (the loop walks the last dim).
    Loop,
    /// Fewer (a grid axis splits the keys).
    Some,
}

/// What a value computed from the shifted exponentials is, as far as the denominator rule
/// needs: e^(S − M) element by element, a sum over every key of its row, or anything else that
/// keeps the factor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cover {
    Elem(Keys),
    All,
    Part,
}

/// A tile carrying the factor: for each leading (row) dim, the grid axis that places it (none:
/// the tile spans the dim), and its cover.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TileTag {
    axes: Vec<Option<usize>>,
    cover: Cover,
}

/// Per-row scaling facts for one candidate S.
struct Scores<'a> {
    g: &'a KernelGraph,
    s: Handle<DTensor>,
    rank: usize,
    /// `Some(len)`: M is the max of each group of `len` contiguous keys, every block of the
    /// readers holds exactly one group, and no scaled value leaves the operator that computes
    /// it (the factor of a group must cancel where the group is whole); `None`: M is the max
    /// of the whole row.
    group: Option<usize>,
}

impl Scores<'_> {
    /// Whether tensor `t` has the scores' rows as its leading dims.
    fn rows_match(&self, t: Handle<DTensor>) -> bool {
        let (a, b) = (self.g.tensors[t].shape, self.g.tensors[self.s].shape);
        a.rank() == self.rank && a.dims()[..self.rank - 1] == b.dims()[..self.rank - 1]
    }

    /// Each tensor's cover (by index; `None`: unscaled); `Err((op, why))` where the factor
    /// would not cancel.
    fn flow(&self) -> Result<Vec<Option<Cover>>, (usize, Flow)> {
        let g = self.g;
        let mut tags: Vec<Option<Cover>> = vec![None; g.tensors.len()];
        for (h, op) in g.ops.iter() {
            let at = |why: Flow| (h.index(), why);
            let tag = |t: Handle<DTensor>| tags[t.index()];
            let reads_s = exponentiates(op, self.s);
            if let KnOpKind::Customized(tb) = &op.kind {
                if !reads_s && !op.inputs.iter().any(|&t| tag(t).is_some()) {
                    continue;
                }
                let outs = self.tb_flow(op, tb, &tags).map_err(at)?;
                for (&t, c) in op.outputs.iter().zip(outs) {
                    if c.is_some() && self.group.is_some() {
                        return Err(at(Flow::Output));
                    }
                    if c.is_some() && !self.rows_match(t) {
                        return Err(at(Flow::Rows));
                    }
                    tags[t.index()] = c;
                }
                continue;
            }
            if reads_s {
                tags[op.outputs[0].index()] = Some(Cover::Elem(Keys::Tile));
                continue;
            }
            let ins: Vec<Option<Cover>> = op.inputs.iter().map(|&t| tag(t)).collect();
            if ins.iter().all(Option::is_none) {
                continue;
            }
            if self.group.is_some() {
                // Only blocks holding one group each may read exponentials shifted by groups.
                return Err(at(Flow::Op {
                    kind: op.kind.name(),
                }));
            }
            let name = || Flow::Op {
                kind: op.kind.name(),
            };
            let out = match &op.kind {
                // A factor below 1 could take a denominator's sum (at least 1) to 0 in f16.
                KnOpKind::Unary(UnaryOp::MulScalar(c)) if *c >= 1.0 => ins[0],
                KnOpKind::Unary(UnaryOp::MulScalar(_)) => Some(Cover::Part),
                KnOpKind::Binary(b) => binary(*b, ins[0], ins[1]).map_err(at)?,
                KnOpKind::Matmul if ins[1].is_none() => Some(Cover::Part),
                KnOpKind::Reduction { dim } if *dim == self.rank - 1 => {
                    let to = g.tensors[op.outputs[0]].shape.dim(*dim);
                    Some(summed(ins[0].expect("tagged"), to == 1))
                }
                KnOpKind::Concat { dim }
                | KnOpKind::Split { dim }
                | KnOpKind::Chunk { dim, .. }
                    if *dim == self.rank - 1 && ins.iter().all(Option::is_some) =>
                {
                    Some(Cover::Part)
                }
                KnOpKind::Output { .. } => return Err(at(Flow::Output)),
                _ => return Err(at(name())),
            };
            for &t in &op.outputs {
                if out.is_some() && !self.rows_match(t) {
                    return Err(at(Flow::Rows));
                }
                tags[t.index()] = out;
            }
        }
        Ok(tags)
    }

    /// The covers of a customized operator's outputs (`None`: unscaled).
    fn tb_flow(
        &self,
        op: &KnOp,
        tb: &TbGraph,
        tags: &[Option<Cover>],
    ) -> Result<Vec<Option<Cover>>, Flow> {
        let last = self.rank - 1;
        let mut tiles: Vec<Option<TileTag>> = vec![None; tb.tensors.len()];
        let mut s_tiles: BTreeMap<usize, TileTag> = BTreeMap::new();
        let mut outs = vec![None; op.outputs.len()];
        for (_, t) in tb.ops.iter() {
            let tin: Vec<Option<TileTag>> =
                t.inputs.iter().map(|x| tiles[x.index()].clone()).collect();
            let out: Option<TileTag> = match &t.kind {
                TbOpKind::Input {
                    input,
                    imap,
                    forloop_dim,
                } => {
                    let d = op.inputs[*input];
                    let cover = tags[d.index()];
                    let is_s = d == self.s;
                    if cover.is_none() && !is_s {
                        None
                    } else {
                        if forloop_dim.is_some_and(|f| f < last) {
                            if cover.is_some() || tb_reads_exp(tb, t.outputs[0]) {
                                return Err(Flow::LoopOverRows);
                            }
                            continue;
                        }
                        let axes = row_axes(*imap, tb.grid, last);
                        let split = (0..3).any(|a| tb.grid[a] > 1 && imap.axis(a) == Some(last));
                        if let Some(len) = self.group
                            && block_keys(self.g.tensors[d].shape, *imap, tb.grid) != len
                        {
                            return Err(Flow::Denominator);
                        }
                        let keys = if split && self.group.is_none() {
                            Keys::Some
                        } else if *forloop_dim == Some(last) && tb.forloop_range > 1 {
                            Keys::Loop
                        } else {
                            Keys::Tile
                        };
                        if is_s {
                            s_tiles.insert(
                                t.outputs[0].index(),
                                TileTag {
                                    axes,
                                    cover: Cover::Elem(keys),
                                },
                            );
                            None
                        } else {
                            let cover = match cover.expect("tagged") {
                                Cover::Elem(_) => Cover::Elem(keys),
                                c => c,
                            };
                            Some(TileTag { axes, cover })
                        }
                    }
                }
                TbOpKind::Unary(UnaryOp::Exp) if s_tiles.contains_key(&t.inputs[0].index()) => {
                    Some(s_tiles[&t.inputs[0].index()].clone())
                }
                _ if tin.iter().all(Option::is_none) => None,
                TbOpKind::Output { output, omap } => {
                    let tag = tin[0].clone().expect("tagged");
                    for d in 0..last {
                        let placed = (0..3).find(|&a| tb.grid[a] > 1 && omap.axis(a) == Some(d));
                        if placed != tag.axes[d] {
                            return Err(Flow::Placement);
                        }
                    }
                    outs[*output] = Some(match tag.cover {
                        Cover::Elem(_) => Cover::Part,
                        c => c,
                    });
                    continue;
                }
                TbOpKind::Unary(UnaryOp::MulScalar(c)) => {
                    let mut x = tin[0].clone().expect("tagged");
                    if *c < 1.0 {
                        x.cover = Cover::Part;
                    }
                    Some(x)
                }
                TbOpKind::Binary(b) => {
                    let (x, y) = (&tin[0], &tin[1]);
                    if let (Some(x), Some(y)) = (x, y)
                        && x.axes != y.axes
                    {
                        return Err(Flow::Placement);
                    }
                    // A scaled tile broadcast along a row would carry one row's factor into
                    // several rows.
                    let rows = |h: Handle<STensor>| tb.tensors[h].shape.dims()[..last].to_vec();
                    let out_rows = rows(t.outputs[0]);
                    for (k, tag) in tin.iter().enumerate() {
                        if tag.is_some() && rows(t.inputs[k]) != out_rows {
                            return Err(Flow::Rows);
                        }
                    }
                    let axes = x.as_ref().or(y.as_ref()).expect("tagged").axes.clone();
                    binary(*b, x.as_ref().map(|x| x.cover), y.as_ref().map(|y| y.cover))?
                        .map(|cover| TileTag { axes, cover })
                }
                TbOpKind::Matmul if tin[1].is_none() => Some(TileTag {
                    cover: Cover::Part,
                    ..tin[0].clone().expect("tagged")
                }),
                TbOpKind::Reduction {
                    dim,
                    kind: TbReduction::Sum,
                } if *dim == last => {
                    let x = tin[0].clone().expect("tagged");
                    Some(TileTag {
                        cover: summed(x.cover, true),
                        ..x
                    })
                }
                TbOpKind::Reduction {
                    dim,
                    kind: TbReduction::ToDimx,
                } if *dim == last => Some(TileTag {
                    cover: summed(tin[0].as_ref().expect("tagged").cover, false),
                    ..tin[0].clone().expect("tagged")
                }),
                TbOpKind::Concat { dim } if *dim == last && tin.iter().all(Option::is_some) => {
                    if tin[0].as_ref().map(|x| &x.axes) != tin[1].as_ref().map(|x| &x.axes) {
                        return Err(Flow::Placement);
                    }
                    Some(TileTag {
                        cover: Cover::Part,
                        ..tin[0].clone().expect("tagged")
                    })
                }
                TbOpKind::Accum(kind) => {
                    let x = tin[0].clone().expect("tagged");
                    let cover = match (kind, x.cover) {
                        (AccumKind::Nored, Cover::All) => Cover::All,
                        (AccumKind::Nored, _) => Cover::Part,
                        (AccumKind::RedLdSum | AccumKind::RedLdMean, Cover::Elem(Keys::Tile))
                        | (AccumKind::RedLdSum | AccumKind::RedLdMean, Cover::Elem(Keys::Loop))
                        | (AccumKind::RedLdSum | AccumKind::RedLdMean, Cover::All) => Cover::All,
                        (AccumKind::RedLdSum | AccumKind::RedLdMean, _) => Cover::Part,
                        (AccumKind::RedtoxLdSum, Cover::All) => Cover::All,
                        (AccumKind::RedtoxLdSum, _) => Cover::Part,
                        _ => {
                            return Err(Flow::Op {
                                kind: t.kind.name(),
                            });
                        }
                    };
                    Some(TileTag { cover, ..x })
                }
                _ => {
                    return Err(Flow::Op {
                        kind: t.kind.name(),
                    });
                }
            };
            for &o in &t.outputs {
                tiles[o.index()] = out.clone();
            }
        }
        Ok(outs)
    }
}

/// The cover of a sum along the last dim of a value with cover `c` (`whole`: to extent 1, not
/// in groups).
fn summed(c: Cover, whole: bool) -> Cover {
    match c {
        Cover::Elem(Keys::Tile) if whole => Cover::All,
        Cover::All => Cover::All,
        _ => Cover::Part,
    }
}

/// The cover of a binary operator's result from its operands' (`None`: unscaled).
fn binary(b: BinaryOp, x: Option<Cover>, y: Option<Cover>) -> Result<Option<Cover>, Flow> {
    Ok(match (b, x, y) {
        (_, None, None) => None,
        (BinaryOp::Div, Some(_), Some(Cover::All)) => None,
        (BinaryOp::Div, Some(_), Some(_)) => return Err(Flow::Denominator),
        (BinaryOp::Div, Some(_), None) => Some(Cover::Part),
        (BinaryOp::Div, None, Some(_)) => return Err(Flow::Divisor),
        (BinaryOp::Mul, Some(_), None) | (BinaryOp::Mul, None, Some(_)) => Some(Cover::Part),
        (BinaryOp::Add, Some(Cover::All), Some(Cover::All)) => Some(Cover::All),
        (BinaryOp::Add | BinaryOp::Sub, Some(_), Some(_)) => Some(Cover::Part),
        (BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul, _, _) => return Err(Flow::Mixed),
        (BinaryOp::Pow, _, _) => {
            return Err(Flow::Op {
                kind: b.name().into(),
            });
        }
    })
}

/// For each leading dim of a tile (all but `last`), the grid axis that splits it (axes of one
/// block do not split).
fn row_axes(map: DimMap, grid: [usize; 3], last: usize) -> Vec<Option<usize>> {
    (0..last)
        .map(|d| (0..3).find(|&a| grid[a] > 1 && map.axis(a) == Some(d)))
        .collect()
}

/// The keys (elements of the last dim) one block of a grid `grid` holds of a tensor of `shape`
/// read through `map`, over all its for-loop iterations.
fn block_keys(shape: Shape, map: DimMap, grid: [usize; 3]) -> usize {
    let last = shape.rank() - 1;
    let parts: usize = (0..3)
        .filter(|&a| map.axis(a) == Some(last))
        .map(|a| grid[a])
        .product();
    shape.dim(last) / parts.max(1)
}

/// The group length a chunked shift of `s` would use: the keys one block holds of S (where a
/// customized operator exponentiates its tiles) or of exp(S) (where a kernel-level `exp`
/// computes it), the same at every such load, and fewer than the row's.
fn chunk_len(g: &KernelGraph, s: Handle<DTensor>, readers: &[Handle<KnOp>]) -> Option<usize> {
    let shape = g.tensors[s].shape;
    // S and the kernel-level exponentials of S.
    let mut held: BTreeSet<Handle<DTensor>> = BTreeSet::from([s]);
    for &r in readers {
        if matches!(g.ops[r].kind, KnOpKind::Unary(UnaryOp::Exp)) {
            held.insert(g.ops[r].outputs[0]);
        }
    }
    let mut len = None;
    for (_, op) in g.ops.iter() {
        let KnOpKind::Customized(tb) = &op.kind else {
            continue;
        };
        for (_, t) in tb.ops.iter() {
            let TbOpKind::Input { input, imap, .. } = t.kind else {
                continue;
            };
            let d = op.inputs[input];
            if !held.contains(&d) || (d == s && !tb_reads_exp(tb, t.outputs[0])) {
                continue;
            }
            let here = block_keys(g.tensors[d].shape, imap, tb.grid);
            if *len.get_or_insert(here) != here {
                return None;
            }
        }
    }
    len.filter(|&l| l < shape.dim(shape.rank() - 1))
}

/// Whether tile `t` is read by an `exp`.
fn tb_reads_exp(tb: &TbGraph, t: Handle<STensor>) -> bool {
    tb.ops.iter().any(|(_, o)| {
        matches!(o.kind, TbOpKind::Unary(UnaryOp::Exp)) && o.inputs.first() == Some(&t)
    })
}

/// The input operators of `tb` that load tiles of `s` read by an `exp`.
fn exp_sites(tb: &TbGraph, op: &KnOp, s: Handle<DTensor>) -> Vec<Handle<TbOp>> {
    tb.ops
        .iter()
        .filter(|(_, o)| match o.kind {
            TbOpKind::Input { input, .. } => {
                op.inputs.get(input) == Some(&s) && tb_reads_exp(tb, o.outputs[0])
            }
            _ => false,
        })
        .map(|(h, _)| h)
        .collect()
}

/// The tensors some operator exponentiates as loaded, in order of first appearance: scores
/// computed by a matmul or a customized operator (exponentials of inputs and element-wise
/// results are not attention's and keep their form unreported).
fn loaded_scores(g: &KernelGraph) -> Vec<Handle<DTensor>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (_, op) in g.ops.iter() {
        for &t in op.inputs.iter().filter(|&&t| exponentiates(op, t)) {
            let computed = g.producer(t).is_some_and(|p| {
                matches!(g.ops[p].kind, KnOpKind::Matmul | KnOpKind::Customized(_))
            });
            if computed && seen.insert(t) {
                out.push(t);
            }
        }
    }
    out
}

/// Shifts the exponentials of every loaded score tensor of `g` by its row max where the factor
/// provably cancels ([`ShiftRewrite`]); `on` false declines each with [`NoShift::Off`]. An
/// exponential a customized operator takes of a tile it computes and writes is first moved
/// after the operator ([`HoistedExp`]) where its scores then shift by their row max.
pub fn shift_scores(g: &KernelGraph, on: bool) -> ShiftRewrite {
    let (mut rw, tried) = shift_moving(g, on);
    let identity: Vec<usize> = (0..g.ops.len()).collect();
    match &tried {
        Some((h, old)) => fold(&mut rw, h, old),
        None => fold(&mut rw, g, &identity),
    }
    rw
}

/// [`shift_scores`] without putting exps back into the operators writing their scores; where
/// exps moved, also the graph the shift was tried on and its operator numbers in `g`.
fn shift_moving(g: &KernelGraph, on: bool) -> (ShiftRewrite, Option<(KernelGraph, Vec<usize>)>) {
    let base = shift_loaded(g, on);
    if !on || g.sharding.mesh.is_some_and(|m| m.num_gpus() > 1) {
        return (base, None);
    }
    // Each site alone: its scores' whole-row flow must hold in the graph with it moved.
    let kept: Vec<Site> = hoist_sites(g)
        .into_iter()
        .filter(|site| {
            hoist(g, std::slice::from_ref(site)).is_ok_and(|(h, t)| {
                let rank = h.tensors[t[0]].shape.rank();
                let row = Scores {
                    g: &h,
                    s: t[0],
                    rank,
                    group: None,
                };
                let readers: Vec<Handle<KnOp>> = h
                    .ops
                    .iter()
                    .filter(|(_, op)| exponentiates(op, t[0]))
                    .map(|(k, _)| k)
                    .collect();
                row.flow().is_ok()
                    || chunk_len(&h, t[0], &readers).is_some_and(|len| {
                        (Scores {
                            group: Some(len),
                            ..row
                        })
                        .flow()
                        .is_ok()
                    })
            })
        })
        .collect();
    if kept.is_empty() {
        return (base, None);
    }
    let Ok((h, scores)) = hoist(g, &kept) else {
        return (base, None);
    };
    let mut rw = shift_loaded(&h, on);
    if !scores
        .iter()
        .all(|t| rw.applied.iter().any(|a| a.scores == t.index()))
    {
        return (base, None);
    }
    // Operator numbers of `h` → `g`'s: the moved exps are numbered as their operator.
    let mut old = Vec::with_capacity(h.ops.len());
    for (k, _) in g.ops.iter() {
        let moved = kept.iter().filter(|s| s.kernel == k).count();
        old.extend(std::iter::repeat_n(k.index(), 1 + moved));
    }
    for a in &mut rw.applied {
        for r in &mut a.readers {
            *r = old[*r];
        }
        a.readers.dedup();
    }
    for (k, _) in &mut rw.declined {
        *k = old[*k];
    }
    rw.hoisted = kept
        .iter()
        .zip(&scores)
        .map(|(site, t)| HoistedExp {
            kernel: site.kernel.index(),
            output: site.output,
            scores: t.index(),
            in_block: false,
        })
        .collect();
    (rw, Some((h, old)))
}

/// Puts the kernel-level exps of shifted scores back into the customized operators that write
/// the scores, where the operator's tile holds whole groups of keys ([`fold_back`]), and
/// renumbers what `rw` says: `tried` is the graph the shift was tried on (the scores' and the
/// moved exps' numbering), `old` its operator numbers in the caller's graph.
fn fold(rw: &mut ShiftRewrite, tried: &KernelGraph, old: &[usize]) {
    let Some(g2) = rw.graph.take() else {
        return;
    };
    let scores: Vec<Handle<DTensor>> = rw
        .applied
        .iter()
        .map(|a| Handle::from_index(a.scores))
        .collect();
    let (g3, renumber, back) = fold_back(&g2, &scores, &rw.applied);
    if back.is_empty() {
        rw.graph = Some(g2);
        return;
    }
    // The folded scores and their maxes are no tensors any more: the rest renumbered.
    let (g4, at) = g3.without_unused_tensors();
    for a in &mut rw.applied {
        let s = Handle::from_index(a.scores);
        a.row_max = a.row_max.and_then(|r| renumber[r]);
        if back.contains(&s) {
            let w = old[tried
                .producer(s)
                .expect("folded scores are written")
                .index()];
            a.folded_into = Some(w);
            a.in_block = vec![w];
        } else {
            a.scores = at[a.scores].expect("kept scores are read");
        }
    }
    for h in &mut rw.hoisted {
        let s = Handle::from_index(h.scores);
        h.in_block = back.contains(&s);
        if !h.in_block {
            h.scores = at[h.scores].expect("kept scores are read");
        }
    }
    rw.graph = Some(Box::new(g4));
}

/// `g` (a shifted graph) with the kernel-level `shifted_exp` of each of `scores` put into the
/// customized operator writing them, where that operator's output tile holds whole groups of
/// keys and the `shifted_exp` and the `row_max` are the scores' only readers: the operator
/// takes its tile less the tile's plain max, exponentiates it and writes the exponentials, and
/// the two kernel-level operators go. Returns the graph, the new number of each operator of
/// `g` (`None`: removed) and the scores folded back.
fn fold_back(
    g: &KernelGraph,
    scores: &[Handle<DTensor>],
    applied: &[ShiftedScores],
) -> (KernelGraph, Vec<Option<usize>>, BTreeSet<Handle<DTensor>>) {
    // Writer → (its output index, the exponentials' tensor); the operators that go.
    let mut back: BTreeMap<Handle<KnOp>, Vec<(usize, Handle<DTensor>)>> = BTreeMap::new();
    let mut gone: BTreeSet<Handle<KnOp>> = BTreeSet::new();
    let mut folded = BTreeSet::new();
    for &s in scores {
        let Some(a) = applied.iter().find(|a| a.scores == s.index()) else {
            continue;
        };
        let readers: Vec<Handle<KnOp>> = g
            .ops
            .iter()
            .filter(|(_, op)| op.inputs.contains(&s))
            .map(|(h, _)| h)
            .collect();
        let (Some(w), [x, r]) = (g.producer(s), &readers[..]) else {
            continue;
        };
        let (x, r) = match (&g.ops[*x].kind, &g.ops[*r].kind) {
            (KnOpKind::ShiftedExp { .. }, KnOpKind::RowMax { .. }) => (*x, *r),
            (KnOpKind::RowMax { .. }, KnOpKind::ShiftedExp { .. }) => (*r, *x),
            _ => continue,
        };
        let m = g.ops[r].outputs[0];
        let m_read = g
            .ops
            .iter()
            .filter(|(_, op)| op.inputs.contains(&m))
            .count();
        let KnOpKind::Customized(tb) = &g.ops[w].kind else {
            continue;
        };
        let k = g.ops[w]
            .outputs
            .iter()
            .position(|&t| t == s)
            .expect("written");
        let whole = tb.ops.iter().any(|(_, o)| {
            matches!(o.kind, TbOpKind::Output { output, .. } if output == k)
                && holds_groups(tb.tensors[o.inputs[0]].shape, g.tensors[s].shape, a.groups)
        });
        if m_read != 1 || g.ops[x].inputs[1] != m || !whole {
            continue;
        }
        back.entry(w).or_default().push((k, g.ops[x].outputs[0]));
        gone.extend([x, r]);
        folded.insert(s);
    }
    let mut out = KernelGraph::new();
    out.tensors = g.tensors.clone();
    out.sharding.mesh = g.sharding.mesh;
    let mut renumber = vec![None; g.ops.len()];
    for (h, op) in g.ops.iter() {
        if gone.contains(&h) {
            continue;
        }
        let op = match (&op.kind, back.get(&h)) {
            (KnOpKind::Customized(tb), Some(outs)) => {
                let mut outputs = op.outputs.clone();
                for &(k, e) in outs {
                    outputs[k] = e;
                }
                let ks: Vec<usize> = outs.iter().map(|&(k, _)| k).collect();
                KnOp {
                    kind: KnOpKind::Customized(Box::new(exp_before_outputs(tb, &ks))),
                    inputs: op.inputs.clone(),
                    outputs,
                }
            }
            _ => op.clone(),
        };
        renumber[h.index()] = Some(append_op(&mut out, g, Some(h), op).index());
    }
    (out, renumber, folded)
}

/// `tb` with the tile each output operator writing one of `outputs` reads taken less its plain
/// max over the last dim and exponentiated first.
fn exp_before_outputs(tb: &TbGraph, outputs: &[usize]) -> TbGraph {
    let mut out = TbGraph::new(tb.grid, tb.block, tb.forloop_range, tb.reduction_dimx);
    let mut map: BTreeMap<Handle<STensor>, Handle<STensor>> = BTreeMap::new();
    for (_, t) in tb.ops.iter() {
        let mut ins: Vec<Handle<STensor>> = t.inputs.iter().map(|x| map[x]).collect();
        if let TbOpKind::Output { output, .. } = t.kind
            && outputs.contains(&output)
        {
            let x = ins[0];
            let st = out.tensors[x].clone();
            let last = st.shape.rank() - 1;
            let mut add = |kind: TbOpKind, inputs: Vec<Handle<STensor>>, shape: Shape| {
                let y = out.tensors.append(STensor {
                    shape,
                    guid: None,
                    ..st.clone()
                });
                out.ops.append(TbOp {
                    kind,
                    inputs,
                    outputs: vec![y],
                });
                y
            };
            let m = add(
                TbOpKind::Reduction {
                    dim: last,
                    kind: TbReduction::PlainMax,
                },
                vec![x],
                st.shape.with_dim(last, 1),
            );
            let d = add(TbOpKind::Binary(BinaryOp::Sub), vec![x, m], st.shape);
            ins[0] = add(TbOpKind::Unary(UnaryOp::Exp), vec![d], st.shape);
        }
        copy_tb_op(&mut out, tb, t, ins, &mut map);
    }
    out
}

/// An exponential (threadblock operator `exp`) a customized operator takes of a tile it
/// computes and writes as its output `output`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Site {
    kernel: Handle<KnOp>,
    output: usize,
    exp: Handle<TbOp>,
}

/// The exponentials of f16 tiles computed inside a customized operator (not loaded) whose only
/// reader is an output operator, once per for-loop (a loop of one iteration or a tile after the
/// accumulators).
fn hoist_sites(g: &KernelGraph) -> Vec<Site> {
    let mut out = Vec::new();
    for (k, op) in g.ops.iter() {
        let KnOpKind::Customized(tb) = &op.kind else {
            continue;
        };
        let readers = tb.readers();
        for (_, o) in tb.ops.iter() {
            let TbOpKind::Output { output, .. } = o.kind else {
                continue;
            };
            let Some(exp) = tb.producer(o.inputs[0]) else {
                continue;
            };
            if tb.ops[exp].kind != TbOpKind::Unary(UnaryOp::Exp)
                || readers[o.inputs[0].index()].len() != 1
                || g.tensors[op.outputs[output]].dtype != DType::F16
            {
                continue;
            }
            let x = tb.ops[exp].inputs[0];
            let computed = tb
                .producer(x)
                .is_some_and(|p| !matches!(tb.ops[p].kind, TbOpKind::Input { .. }));
            if computed && (tb.forloop_range == 1 || tb.tensors[x].after_accum) {
                out.push(Site {
                    kernel: k,
                    output,
                    exp,
                });
            }
        }
    }
    out
}

/// `g` with every site's exponential moved after its operator: the operator writes the
/// exponent to a new tensor (returned, in site order) and a kernel-level `exp` right after it
/// writes the output.
fn hoist(
    g: &KernelGraph,
    sites: &[Site],
) -> Result<(KernelGraph, Vec<Handle<DTensor>>), RewriteFailure> {
    let mut out = KernelGraph::new();
    out.tensors = g.tensors.clone();
    out.sharding.mesh = g.sharding.mesh;
    let mut scores = Vec::new();
    for (k, op) in g.ops.iter() {
        let here: Vec<&Site> = sites.iter().filter(|s| s.kernel == k).collect();
        let tb = match &op.kind {
            KnOpKind::Customized(tb) if !here.is_empty() => tb,
            _ => {
                append_op(&mut out, g, Some(k), op.clone());
                continue;
            }
        };
        let mut tb2 = TbGraph::new(tb.grid, tb.block, tb.forloop_range, tb.reduction_dimx);
        let mut map: BTreeMap<Handle<STensor>, Handle<STensor>> = BTreeMap::new();
        for (h, t) in tb.ops.iter() {
            if here.iter().any(|s| s.exp == h) {
                // The output operator reads the exponent instead.
                map.insert(t.outputs[0], map[&t.inputs[0]]);
                continue;
            }
            let ins: Vec<Handle<STensor>> = t.inputs.iter().map(|x| map[x]).collect();
            copy_tb_op(&mut tb2, tb, t, ins, &mut map);
        }
        let mut outputs = op.outputs.clone();
        let mut exps = Vec::new();
        for s in &here {
            let orig = op.outputs[s.output];
            let t = out.tensors.append(DTensor {
                guid: None,
                ..g.tensors[orig].clone()
            });
            outputs[s.output] = t;
            scores.push((sites.iter().position(|x| x == *s).expect("a site"), t));
            exps.push(KnOp {
                kind: KnOpKind::Unary(UnaryOp::Exp),
                inputs: vec![t],
                outputs: vec![orig],
            });
        }
        let kernel = KnOp {
            kind: KnOpKind::Customized(Box::new(tb2)),
            inputs: op.inputs.clone(),
            outputs,
        };
        append_op(&mut out, g, Some(k), kernel);
        for e in exps {
            append_op(&mut out, g, None, e);
        }
    }
    crate::graph::validate::validate(&out, None).map_err(RewriteFailure::Invalid)?;
    scores.sort_by_key(|(i, _)| *i);
    Ok((out, scores.into_iter().map(|(_, t)| t).collect()))
}

/// Appends a copy of `t` (an operator of `tb`) to `out`, reading `ins` (tiles of `out`), with
/// new output tiles like `t`'s, which `map` then maps `t`'s to; returns them.
fn copy_tb_op(
    out: &mut TbGraph,
    tb: &TbGraph,
    t: &TbOp,
    ins: Vec<Handle<STensor>>,
    map: &mut BTreeMap<Handle<STensor>, Handle<STensor>>,
) -> Vec<Handle<STensor>> {
    let outs: Vec<Handle<STensor>> = t
        .outputs
        .iter()
        .map(|&o| out.tensors.append(tb.tensors[o].clone()))
        .collect();
    for (&o, &n) in t.outputs.iter().zip(&outs) {
        map.insert(o, n);
    }
    out.ops.append(TbOp {
        kind: t.kind.clone(),
        inputs: ins,
        outputs: outs.clone(),
    });
    outs
}

/// Appends `op` to `out`, with the sharding map of `g`'s operator `old` it stands for.
fn append_op(
    out: &mut KernelGraph,
    g: &KernelGraph,
    old: Option<Handle<KnOp>>,
    op: KnOp,
) -> Handle<KnOp> {
    let n = out.ops.append(op);
    if let Some(m) = old.and_then(|o| g.sharding.maps.get(&o)) {
        out.sharding.maps.insert(n, *m);
    }
    n
}

/// [`shift_scores`] without moving any exponential.
fn shift_loaded(g: &KernelGraph, on: bool) -> ShiftRewrite {
    let mut rw = ShiftRewrite::default();
    let mut taken: BTreeSet<usize> = BTreeSet::new();
    // Readers of the scores chosen so far, and of those shifted by groups.
    let mut read: BTreeSet<usize> = BTreeSet::new();
    let mut read_grouped: BTreeSet<usize> = BTreeSet::new();
    let mut chosen: Vec<Choice> = Vec::new();
    for s in loaded_scores(g) {
        let rank = g.tensors[s].shape.rank();
        if rank == 0 {
            continue;
        }
        let readers: Vec<Handle<KnOp>> = g
            .ops
            .iter()
            .filter(|(_, op)| exponentiates(op, s))
            .map(|(h, _)| h)
            .collect();
        let decline = |why: NoShift, rw: &mut ShiftRewrite| {
            for r in &readers {
                rw.declined.push((r.index(), why.clone()));
            }
        };
        let dt = g.tensors[s].dtype;
        let why = if !on {
            Some(NoShift::Off)
        } else if g.sharding.mesh.is_some_and(|m| m.num_gpus() > 1) {
            Some(NoShift::Mesh)
        } else if dt != DType::F16 {
            Some(NoShift::Dtype(dt))
        } else {
            None
        };
        if let Some(why) = why {
            decline(why, &mut rw);
            continue;
        }
        let row = Scores {
            g,
            s,
            rank,
            group: None,
        };
        let (tags, groups) = match row.flow() {
            Ok(tags) => (tags, 1),
            Err((op, why)) => {
                // Where every block of the readers holds one group of keys and divides by
                // its sum, the max of each group cancels there.
                let chunked = chunk_len(g, s, &readers).and_then(|len| {
                    let group = Some(len);
                    let n = g.tensors[s].shape.dim(rank - 1);
                    (Scores { group, ..row }).flow().ok().map(|t| (t, n / len))
                });
                match chunked {
                    Some(c) => c,
                    None => {
                        decline(NoShift::Flow { op, why }, &mut rw);
                        continue;
                    }
                }
            }
        };
        let flowed: BTreeSet<usize> = (0..tags.len()).filter(|&i| tags[i].is_some()).collect();
        let ops: BTreeSet<usize> = readers.iter().map(|r| r.index()).collect();
        // Values of grouped scores stay inside their readers: two scores meet there.
        let meet = if groups > 1 { &read } else { &read_grouped };
        if !flowed.is_disjoint(&taken) || taken.contains(&s.index()) || !ops.is_disjoint(meet) {
            decline(NoShift::Shared, &mut rw);
            continue;
        }
        taken.extend(flowed);
        if groups > 1 {
            read_grouped.extend(ops.iter().copied());
        }
        read.extend(ops);
        chosen.push((s, readers, groups));
    }
    if !chosen.is_empty() {
        match rebuild(g, &chosen) {
            Ok((g2, applied)) => {
                rw.graph = Some(Box::new(g2));
                rw.applied = applied;
            }
            Err(e) => {
                for (_, readers, _) in &chosen {
                    for r in readers {
                        rw.declined.push((r.index(), NoShift::Plan(e.clone())));
                    }
                }
            }
        }
    }
    rw.declined.sort_by_key(|(k, _)| *k);
    rw
}

/// Scores to shift: S, the operators exponentiating it, and its groups of keys per row.
type Choice = (Handle<DTensor>, Vec<Handle<KnOp>>, usize);

/// Whether kernel operator `op` exponentiates `s` as loaded (a kernel-level `exp` of it, or a
/// customized operator with an `exp` of a tile of it).
fn exponentiates(op: &KnOp, s: Handle<DTensor>) -> bool {
    match &op.kind {
        KnOpKind::Unary(UnaryOp::Exp) => op.inputs[0] == s,
        KnOpKind::Customized(tb) => !exp_sites(tb, op, s).is_empty(),
        _ => false,
    }
}

/// The graph with M = row max of each chosen S after S's producer and every exponential of S
/// taken of S − M.
fn rebuild(
    g: &KernelGraph,
    chosen: &[Choice],
) -> Result<(KernelGraph, Vec<ShiftedScores>), RewriteFailure> {
    let mut out = KernelGraph::new();
    out.tensors = g.tensors.clone();
    out.sharding.mesh = g.sharding.mesh;
    // S → its groups per row; S → M, where some reader loads M.
    let mut groups_of: BTreeMap<Handle<DTensor>, usize> = BTreeMap::new();
    let mut maxes: BTreeMap<Handle<DTensor>, Handle<DTensor>> = BTreeMap::new();
    for (s, readers, groups) in chosen {
        let (s, groups) = (*s, *groups);
        groups_of.insert(s, groups);
        if all_in_block(g, s, readers, groups) {
            continue;
        }
        let d = &g.tensors[s];
        let m = out.tensors.append(DTensor {
            shape: d.shape.with_dim(d.shape.rank() - 1, groups),
            dtype: d.dtype,
            guid: None,
        });
        maxes.insert(s, m);
    }
    let mut row_max_at: BTreeMap<Handle<DTensor>, usize> = BTreeMap::new();
    // Scores that are graph inputs or defined before any op: M right at the start is wrong (M
    // reads S); every S has a producer (an input op at least), so M follows it.
    for (h, op) in g.ops.iter() {
        match &op.kind {
            KnOpKind::Unary(UnaryOp::Exp) if maxes.contains_key(&op.inputs[0]) => {
                let s = op.inputs[0];
                let ms = out.tensors[maxes[&s]].shape;
                append_op(
                    &mut out,
                    g,
                    Some(h),
                    KnOp {
                        kind: KnOpKind::ShiftedExp {
                            groups: ms.dim(ms.rank() - 1),
                        },
                        inputs: vec![s, maxes[&s]],
                        outputs: op.outputs.clone(),
                    },
                );
            }
            KnOpKind::Customized(tb) if op.inputs.iter().any(|t| groups_of.contains_key(t)) => {
                let (tb2, inputs) = shifted_body(&out.tensors, op, tb, &groups_of, &maxes)?;
                append_op(
                    &mut out,
                    g,
                    Some(h),
                    KnOp {
                        kind: KnOpKind::Customized(Box::new(tb2)),
                        inputs,
                        outputs: op.outputs.clone(),
                    },
                );
            }
            _ => {
                append_op(&mut out, g, Some(h), op.clone());
            }
        }
        for &t in &op.outputs {
            if let Some(&m) = maxes.get(&t) {
                let ms = out.tensors[m].shape;
                let groups = ms.dim(ms.rank() - 1);
                let n = append_op(
                    &mut out,
                    g,
                    None,
                    KnOp {
                        kind: KnOpKind::RowMax { groups },
                        inputs: vec![t],
                        outputs: vec![m],
                    },
                );
                row_max_at.insert(t, n.index());
            }
        }
    }
    crate::graph::validate::validate(&out, None).map_err(RewriteFailure::Invalid)?;
    let applied = chosen
        .iter()
        .map(|(s, readers, groups)| ShiftedScores {
            scores: s.index(),
            readers: readers.iter().map(|r| r.index()).collect(),
            row_max: row_max_at.get(s).copied(),
            groups: *groups,
            in_block: if row_max_at.contains_key(s) {
                Vec::new()
            } else {
                readers.iter().map(|r| r.index()).collect()
            },
            folded_into: None,
        })
        .collect();
    Ok((out, applied))
}

/// Whether a tile of `tile`'s shape holds whole groups of keys of scores of shape `s` in
/// `groups` groups per row: exactly one group along the last dim (the whole row when `groups`
/// is 1), so that its max is the group's.
fn holds_groups(tile: Shape, s: Shape, groups: usize) -> bool {
    let last = s.rank() - 1;
    tile.rank() == s.rank() && tile.dim(last) * groups == s.dim(last)
}

/// Whether every customized operator exponentiating tiles of `s` loads tiles holding whole
/// groups (so each can compute its max itself), and no kernel-level `exp` reads `s`: then no
/// row max operator is needed, and each reader takes the max of its tiles.
fn all_in_block(
    g: &KernelGraph,
    s: Handle<DTensor>,
    readers: &[Handle<KnOp>],
    groups: usize,
) -> bool {
    readers.iter().all(|&r| in_block(g, r, s, groups))
}

/// Whether kernel operator `r` is a customized operator whose every tile of `s` that an `exp`
/// reads holds whole groups of keys ([`holds_groups`]).
fn in_block(g: &KernelGraph, r: Handle<KnOp>, s: Handle<DTensor>, groups: usize) -> bool {
    let op = &g.ops[r];
    match &op.kind {
        KnOpKind::Customized(tb) => exp_sites(tb, op, s).iter().all(|&h| {
            holds_groups(
                tb.tensors[tb.ops[h].outputs[0]].shape,
                g.tensors[s].shape,
                groups,
            )
        }),
        _ => false,
    }
}

/// A customized operator's body with, after each tile of S that an `exp` reads, its max (a
/// plain max of the tile where it holds whole groups of keys, else a tile of M loaded beside
/// it), and those `exp`s taken of S − max; returns it and the operator's inputs (M appended
/// where loaded).
fn shifted_body(
    tensors: &crate::graph::arena::Arena<DTensor>,
    op: &KnOp,
    tb: &TbGraph,
    groups_of: &BTreeMap<Handle<DTensor>, usize>,
    maxes: &BTreeMap<Handle<DTensor>, Handle<DTensor>>,
) -> Result<(TbGraph, Vec<Handle<DTensor>>), RewriteFailure> {
    let mut inputs = op.inputs.clone();
    let mut out = TbGraph::new(tb.grid, tb.block, tb.forloop_range, tb.reduction_dimx);
    let mut map: BTreeMap<Handle<STensor>, Handle<STensor>> = BTreeMap::new();
    // Tile of S (new handle) → tile of M beside it.
    let mut beside: BTreeMap<Handle<STensor>, Handle<STensor>> = BTreeMap::new();
    // M tensor → its input index.
    let mut m_input: BTreeMap<Handle<DTensor>, usize> = BTreeMap::new();
    for (_, t) in tb.ops.iter() {
        let ins: Vec<Handle<STensor>> = t.inputs.iter().map(|x| map[x]).collect();
        if let TbOpKind::Unary(UnaryOp::Exp) = t.kind
            && let Some(&m) = beside.get(&ins[0])
        {
            let st = out.tensors[ins[0]].clone();
            let diff = out.tensors.append(STensor { guid: None, ..st });
            out.ops.append(TbOp {
                kind: TbOpKind::Binary(BinaryOp::Sub),
                inputs: vec![ins[0], m],
                outputs: vec![diff],
            });
            let e = out.tensors.append(STensor {
                guid: None,
                ..tb.tensors[t.outputs[0]].clone()
            });
            out.ops.append(TbOp {
                kind: t.kind.clone(),
                inputs: vec![diff],
                outputs: vec![e],
            });
            map.insert(t.outputs[0], e);
            continue;
        }
        let outs = copy_tb_op(&mut out, tb, t, ins, &mut map);
        if let TbOpKind::Input {
            input,
            imap,
            forloop_dim: _,
        } = t.kind
            && let Some(&groups) = groups_of.get(&op.inputs[input])
            && tb_reads_exp(tb, t.outputs[0])
        {
            let s = op.inputs[input];
            let last = tensors[s].shape.rank() - 1;
            if !maxes.contains_key(&s) {
                // No row max operator: every tile of S exponentiated holds its rows' whole
                // groups, and their max is computed here (where some reader loads M, loading
                // it beside the tile costs less than a pass over the tile).
                if !holds_groups(tb.tensors[t.outputs[0]].shape, tensors[s].shape, groups) {
                    return Err(RewriteFailure::Internal(
                        "a tile of the scores without whole groups or a row max",
                    ));
                }
                let st = &tb.tensors[t.outputs[0]];
                let mt = out.tensors.append(STensor {
                    shape: st.shape.with_dim(last, 1),
                    guid: None,
                    ..st.clone()
                });
                out.ops.append(TbOp {
                    kind: TbOpKind::Reduction {
                        dim: last,
                        kind: TbReduction::PlainMax,
                    },
                    inputs: vec![outs[0]],
                    outputs: vec![mt],
                });
                beside.insert(outs[0], mt);
                continue;
            }
            let m = maxes[&s];
            let k = *m_input.entry(m).or_insert_with(|| {
                inputs.push(m);
                inputs.len() - 1
            });
            // The block's max: a row's (the axes splitting S's keys do not split M's one
            // column), or its group's (they split M's groups as S's keys, one per block).
            let mut mm = imap;
            if tensors[m].shape.dim(last) == 1 {
                for a in 0..3 {
                    if mm.0[a] == Some(last) {
                        mm.0[a] = None;
                    }
                }
            }
            let shape: Shape = crate::graph::infer::tb_input(
                &tensors[m].shape,
                tb.grid,
                mm,
                None,
                tb.forloop_range,
            )
            .map_err(|e| {
                RewriteFailure::Invalid(crate::graph::error::ValidationErrors(vec![
                    crate::graph::error::GraphError::new(e),
                ]))
            })?;
            let mt = out.tensors.append(STensor {
                shape,
                dtype: tensors[m].dtype,
                after_accum: false,
                guid: None,
            });
            out.ops.append(TbOp {
                kind: TbOpKind::Input {
                    input: k,
                    imap: mm,
                    forloop_dim: None,
                },
                inputs: vec![],
                outputs: vec![mt],
            });
            beside.insert(outs[0], mt);
        }
    }
    Ok((out, inputs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::builder::{GraphBuilder, TbGraphBuilder};
    use crate::graph::interp::{InputSpec, evaluate, evaluate_ranged, random_inputs};

    /// mha_bs8 graph 1's form at small sizes: S = Q·K by a kernel-level matmul; a customized
    /// operator exponentiates tiles of S (keys split over 2 blocks and the loop) and sums
    /// exp(S)·V; a kernel-level exp of S; a combining operator sums the partials and exp(S)
    /// over every key, and divides.
    fn loaded(denominator_over_all_keys: bool) -> KernelGraph {
        let (b, q, d, k) = (4, 16, 64, 256);
        let mut g = GraphBuilder::new();
        let qt = g.new_input(&[b, q, d], DType::F16).unwrap();
        let kt = g.new_input(&[b, d, k], DType::F16).unwrap();
        let vt = g.new_input(&[b, k, d], DType::F16).unwrap();
        let s = g.matmul(qt, kt).unwrap();
        let mut t = TbGraphBuilder::new([b, 2, 1], [128, 1, 1], 2);
        let v = t.new_input(&g, vt, [0, 1, -1], 1).unwrap();
        let st = t.new_input(&g, s, [0, 2, -1], 2).unwrap();
        let e = t.unary(UnaryOp::Exp, st).unwrap();
        let p = t.matmul(e, v).unwrap();
        let a = t.forloop_accum(p, AccumKind::Nored).unwrap();
        t.new_output(a, [0, 2, -1]).unwrap();
        let o = g.customized(t).unwrap()[0];
        let es = g.unary(UnaryOp::Exp, s).unwrap();
        let mut t = TbGraphBuilder::new([b, 2, 1], [128, 1, 1], 1).with_reduction_dimx(d);
        // Over part of the keys: the grid's y axis splits them, not the rows, and each block
        // divides by the sum of its half.
        let rows = if denominator_over_all_keys { 1 } else { -1 };
        let oi = t.new_input(&g, o, [0, rows, -1], -1).unwrap();
        let ei = if denominator_over_all_keys {
            t.new_input(&g, es, [0, 1, -1], -1).unwrap()
        } else {
            t.new_input(&g, es, [0, 2, -1], -1).unwrap()
        };
        let num = t.forloop_accum(oi, AccumKind::RedtoxLdSum).unwrap();
        let den = t.forloop_accum(ei, AccumKind::RedLdSum).unwrap();
        let y = t.binary(BinaryOp::Div, num, den).unwrap();
        let cols = if denominator_over_all_keys { -1 } else { 2 };
        t.new_output(y, [0, rows.max(cols), -1]).unwrap();
        let y = g.customized(t).unwrap()[0];
        g.mark_output(y).unwrap();
        g.build().unwrap()
    }

    fn max_rel(a: &crate::graph::interp::Array, b: &crate::graph::interp::Array) -> f64 {
        let n: f64 = a.data.iter().map(|x| x * x).sum::<f64>().sqrt();
        let d: f64 = a
            .data
            .iter()
            .zip(&b.data)
            .map(|(x, y)| (x - y) * (x - y))
            .sum::<f64>()
            .sqrt();
        d / n
    }

    /// `g` and the shifted `g2` compute the same function at inputs of scale 0.5, and at inputs
    /// of `scale`, where `g` leaves f16's range, `g2` stays within it.
    fn same_function_in_range(g: &KernelGraph, g2: &KernelGraph, seed: u64, scale: f64) {
        let small = random_inputs(g, InputSpec { seed, scale: 0.5 });
        let a = evaluate(g, &small).unwrap();
        let b = evaluate(g2, &small).unwrap();
        assert!(max_rel(&a[0], &b[0]) < 1e-12);
        in_range_where_the_graph_overflows(g, g2, seed, scale);
    }

    /// At inputs of `scale`, `g` stores values beyond f16's range, the shifted `g2` none, and
    /// their outputs agree (the f64 interpreter).
    fn in_range_where_the_graph_overflows(
        g: &KernelGraph,
        g2: &KernelGraph,
        seed: u64,
        scale: f64,
    ) {
        let ins = random_inputs(g, InputSpec { seed, scale });
        let (a, over) = evaluate_ranged(g, ins.to_vec()).unwrap();
        assert!(!over.is_empty());
        let (b, over) = evaluate_ranged(g2, ins).unwrap();
        assert!(over.is_empty(), "{over:?}");
        assert!(max_rel(&a[0], &b[0]) < 1e-9);
    }

    #[test]
    fn shifted_scores_compute_the_same_function_without_overflow() {
        let g = loaded(true);
        let rw = shift_scores(&g, true);
        assert!(rw.declined.is_empty(), "{:?}", rw.declined);
        let g2 = rw.graph.as_deref().expect("shifted");
        assert_eq!(rw.applied.len(), 1);
        assert_eq!(rw.applied[0].readers.len(), 2);
        assert!(matches!(
            g2.ops[Handle::from_index(rw.applied[0].row_max.expect("a row max operator"))].kind,
            KnOpKind::RowMax { groups: 1 }
        ));
        // At scale 2 the graph's exponentials leave f16's range; the shifted ones do not.
        same_function_in_range(&g, g2, 3, 2.0);
    }

    #[test]
    fn a_denominator_over_part_of_the_keys_keeps_the_form() {
        let g = loaded(false);
        let rw = shift_scores(&g, true);
        assert!(rw.graph.is_none());
        assert_eq!(rw.declined.len(), 2);
        for (_, why) in &rw.declined {
            assert!(
                matches!(
                    why,
                    NoShift::Flow {
                        why: Flow::Denominator,
                        ..
                    }
                ),
                "{why}"
            );
        }
    }

    #[test]
    fn exponentials_reaching_an_output_keep_the_form() {
        let mut g = GraphBuilder::new();
        let x = g.new_input(&[4, 8], DType::F16).unwrap();
        let w = g.new_input(&[8, 16], DType::F16).unwrap();
        let s = g.matmul(x, w).unwrap();
        let e = g.unary(UnaryOp::Exp, s).unwrap();
        g.mark_output(e).unwrap();
        let g = g.build().unwrap();
        let rw = shift_scores(&g, true);
        assert!(rw.graph.is_none());
        assert_eq!(
            rw.declined,
            vec![(
                3,
                NoShift::Flow {
                    op: 4,
                    why: Flow::Output
                }
            )]
        );
        assert_eq!(
            rw.declined[0].1.to_string(),
            "the row max would not cancel: at kernel op 4, a value scaled by the row max \
             reaches a graph output"
        );
    }

    #[test]
    fn a_scaled_tile_broadcast_along_its_rows_keeps_the_form() {
        let mut g = GraphBuilder::new();
        let x = g.new_input(&[2, 2, 8], DType::F16).unwrap();
        let w = g.new_input(&[2, 8, 16], DType::F16).unwrap();
        let u = g.new_input(&[2, 2, 16], DType::F16).unwrap();
        let s = g.matmul(x, w).unwrap();
        // Each block's tile of S holds one row; the product spreads it over both rows.
        let mut t = TbGraphBuilder::new([2, 2, 1], [128, 1, 1], 1);
        let st = t.new_input(&g, s, [0, 1, -1], -1).unwrap();
        let e = t.unary(UnaryOp::Exp, st).unwrap();
        let ut = t.new_input(&g, u, [0, -1, -1], -1).unwrap();
        let m = t.binary(BinaryOp::Mul, e, ut).unwrap();
        let a = t.forloop_accum(m, AccumKind::Nored).unwrap();
        t.new_output(a, [0, 2, -1]).unwrap();
        let y = g.customized(t).unwrap()[0];
        g.mark_output(y).unwrap();
        let rw = shift_scores(&g.build().unwrap(), true);
        assert!(rw.graph.is_none());
        assert_eq!(
            rw.declined,
            vec![(
                4,
                NoShift::Flow {
                    op: 4,
                    why: Flow::Rows
                }
            )]
        );
    }

    #[test]
    fn off_declines_and_other_dtypes_keep_the_form() {
        let rw = shift_scores(&loaded(true), false);
        assert!(rw.graph.is_none());
        assert!(rw.declined.iter().all(|(_, w)| *w == NoShift::Off));
        let mut g = GraphBuilder::new();
        let x = g.new_input(&[4, 8], DType::BF16).unwrap();
        let w = g.new_input(&[8, 16], DType::BF16).unwrap();
        let s = g.matmul(x, w).unwrap();
        let e = g.unary(UnaryOp::Exp, s).unwrap();
        let d = g.reduction(e, 1).unwrap();
        let y = g.binary(BinaryOp::Div, e, d).unwrap();
        g.mark_output(y).unwrap();
        let rw = shift_scores(&g.build().unwrap(), true);
        assert!(rw.graph.is_none());
        assert_eq!(rw.declined, vec![(3, NoShift::Dtype(DType::BF16))]);
    }

    /// A softmax over each half of the keys: S = Q·K by a kernel-level matmul; a customized
    /// operator whose blocks each load one half of a row's keys exponentiates its tile and
    /// divides by the tile's sum (qknorm_gqa_bs8 graph 0's form at small sizes). `leak`: the
    /// exponentials are also an output of the operator. `looped`: a for-loop of two iterations
    /// walks each block's keys (a tile holds a quarter of the row).
    fn halves(leak: bool, looped: bool) -> KernelGraph {
        let (b, r, d, n) = (2, 4, 8, 32);
        let mut g = GraphBuilder::new();
        let qt = g.new_input(&[b, r, d], DType::F16).unwrap();
        let kt = g.new_input(&[b, d, n], DType::F16).unwrap();
        let s = g.matmul(qt, kt).unwrap();
        let (range, fdim) = if looped { (2, 2) } else { (1, -1) };
        let mut t = TbGraphBuilder::new([b, 2, 1], [128, 1, 1], range);
        let st = t.new_input(&g, s, [0, 2, -1], fdim).unwrap();
        let e = t.unary(UnaryOp::Exp, st).unwrap();
        let num = t.forloop_accum(e, AccumKind::Nored).unwrap();
        let den = t.forloop_accum(e, AccumKind::RedLdSum).unwrap();
        let y = t.binary(BinaryOp::Div, num, den).unwrap();
        t.new_output(y, [0, 2, -1]).unwrap();
        if leak {
            t.new_output(num, [0, 2, -1]).unwrap();
        }
        for y in g.customized(t).unwrap() {
            g.mark_output(y).unwrap();
        }
        g.build().unwrap()
    }

    /// The plain max threadblock reductions of `g`'s customized operators.
    fn plain_maxes(g: &KernelGraph) -> usize {
        g.customized_ops()
            .flat_map(|(_, tb)| tb.ops.iter().map(|(_, o)| o.kind.clone()))
            .filter(|k| {
                matches!(
                    k,
                    TbOpKind::Reduction {
                        kind: TbReduction::PlainMax,
                        ..
                    }
                )
            })
            .count()
    }

    /// The operators of `g` of kind `k`.
    fn count_ops(g: &KernelGraph, k: &KnOpKind) -> usize {
        g.ops.iter().filter(|(_, o)| o.kind == *k).count()
    }

    #[test]
    fn blocks_holding_their_group_take_its_max_themselves() {
        let g = halves(false, false);
        let rw = shift_scores(&g, true);
        assert!(rw.declined.is_empty(), "{:?}", rw.declined);
        let g2 = rw.graph.as_deref().expect("shifted");
        assert_eq!(rw.applied.len(), 1);
        let a = &rw.applied[0];
        assert_eq!((a.groups, a.row_max, &a.in_block), (2, None, &vec![3]));
        assert_eq!(count_ops(g2, &KnOpKind::RowMax { groups: 2 }), 0);
        assert_eq!(plain_maxes(g2), 1);
        same_function_in_range(&g, g2, 5, 4.0);
        // The plain max is mucc's own: the rewritten graph is no Mirage graph.
        let e = crate::graph::mirage_json::graph_to_json(g2, &Default::default())
            .expect_err("no Mirage operator");
        assert!(e.to_string().contains("reduction_2_plain_max"), "{e}");
    }

    #[test]
    fn scores_divided_by_each_blocks_sum_are_shifted_by_the_groups_max() {
        // The loop walks the block's group: each tile holds half of it, so M is loaded.
        let g = halves(false, true);
        let rw = shift_scores(&g, true);
        assert!(rw.declined.is_empty(), "{:?}", rw.declined);
        let g2 = rw.graph.as_deref().expect("shifted");
        assert_eq!(rw.applied.len(), 1);
        assert_eq!(rw.applied[0].groups, 2);
        assert!(rw.applied[0].in_block.is_empty());
        assert_eq!(plain_maxes(g2), 0);
        let m = &g2.ops[Handle::from_index(rw.applied[0].row_max.expect("a row max operator"))];
        assert_eq!(m.kind, KnOpKind::RowMax { groups: 2 });
        assert_eq!(g2.tensors[m.outputs[0]].shape.dims(), &[2, 4, 2]);
        same_function_in_range(&g, g2, 5, 4.0);
    }

    #[test]
    fn group_scaled_values_leaving_their_operator_keep_the_form() {
        let rw = shift_scores(&halves(true, false), true);
        assert!(rw.graph.is_none());
        // The whole row's reason is the one reported.
        assert!(
            matches!(
                rw.declined[..],
                [(
                    _,
                    NoShift::Flow {
                        why: Flow::Denominator,
                        ..
                    }
                )]
            ),
            "{:?}",
            rw.declined
        );
    }

    /// A graph whose customized operator computes S = Q·K ([2, 4, 8] · [2, 8, 32]; each of the
    /// grid's (2, 2) blocks two rows over all keys) and writes exp(S) through `omap`.
    fn exps_written(omap: [i32; 3]) -> (GraphBuilder, Handle<DTensor>) {
        let (b, r, d, n) = (2, 4, 8, 32);
        let mut g = GraphBuilder::new();
        let qt = g.new_input(&[b, r, d], DType::F16).unwrap();
        let kt = g.new_input(&[b, d, n], DType::F16).unwrap();
        let mut t = TbGraphBuilder::new([b, 2, 1], [128, 1, 1], 1);
        let q = t.new_input(&g, qt, [0, 1, -1], -1).unwrap();
        let k = t.new_input(&g, kt, [0, -1, -1], -1).unwrap();
        let st = t.matmul(q, k).unwrap();
        let a = t.forloop_accum(st, AccumKind::Nored).unwrap();
        let e = t.unary(UnaryOp::Exp, a).unwrap();
        t.new_output(e, omap).unwrap();
        let e = g.customized(t).unwrap()[0];
        (g, e)
    }

    /// A customized operator computes S = Q·K for whole rows and writes exp(S); kernel-level
    /// operators sum it over the keys and divide (qknorm_gqa_bs8 graph 5's form). `halves`:
    /// each block writes its rows' exponentials as one half of the keys of a [b, rows / 2,
    /// 2·keys] tensor (its tile holds half a row of what the kernel-level sum adds).
    fn written_exps(sum_over_keys: bool, halves: bool) -> KernelGraph {
        let (mut g, e) = exps_written(if halves { [0, 2, -1] } else { [0, 1, -1] });
        let den = g.reduction(e, if sum_over_keys { 2 } else { 1 }).unwrap();
        let y = g.binary(BinaryOp::Div, e, den).unwrap();
        g.mark_output(y).unwrap();
        g.build().unwrap()
    }

    #[test]
    fn exponentials_a_kernel_writes_of_whole_rows_are_shifted_in_place() {
        let g = written_exps(true, false);
        let rw = shift_scores(&g, true);
        assert!(rw.declined.is_empty(), "{:?}", rw.declined);
        let g2 = rw.graph.as_deref().expect("shifted");
        assert_eq!(rw.hoisted.len(), 1);
        assert_eq!((rw.hoisted[0].kernel, rw.hoisted[0].output), (2, 0));
        assert!(rw.hoisted[0].in_block);
        assert_eq!(rw.applied.len(), 1);
        let a = &rw.applied[0];
        assert_eq!(
            (&a.readers, a.row_max, a.folded_into),
            (&vec![2], None, Some(2))
        );
        // The operator still exponentiates, less its tile's max: nothing kernel-level is added.
        assert_eq!(count_ops(g2, &KnOpKind::ShiftedExp { groups: 1 }), 0);
        assert_eq!(count_ops(g2, &KnOpKind::RowMax { groups: 1 }), 0);
        assert_eq!(
            (plain_maxes(g2), g2.ops.len(), g2.tensors.len()),
            (1, g.ops.len(), g.tensors.len())
        );
        same_function_in_range(&g, g2, 9, 4.0);
    }

    #[test]
    fn exponentials_a_kernel_writes_move_after_it_and_shift() {
        // Each block writes half of the keys the kernel-level sum adds: the exp moves out.
        let g = written_exps(true, true);
        let rw = shift_scores(&g, true);
        assert!(rw.declined.is_empty(), "{:?}", rw.declined);
        let g2 = rw.graph.as_deref().expect("shifted");
        assert_eq!(rw.hoisted.len(), 1);
        assert_eq!((rw.hoisted[0].kernel, rw.hoisted[0].output), (2, 0));
        assert!(!rw.hoisted[0].in_block);
        assert_eq!(plain_maxes(g2), 0);
        assert_eq!(rw.applied.len(), 1);
        assert_eq!(rw.applied[0].readers, vec![2]);
        assert_eq!(rw.applied[0].scores, rw.hoisted[0].scores);
        // The operator no longer exponentiates: a shifted_exp reads what it writes.
        let shifted: Vec<_> = g2
            .ops
            .iter()
            .filter(|(_, o)| o.kind == KnOpKind::ShiftedExp { groups: 1 })
            .collect();
        assert_eq!(shifted.len(), 1);
        assert_eq!(shifted[0].1.inputs[0].index(), rw.hoisted[0].scores);
        same_function_in_range(&g, g2, 9, 4.0);
    }

    /// As [`written_exps`], but each block writes its rows' exponentials as one group of the
    /// last dim of a [b, rows/2, 2·keys] tensor, and a second customized operator divides each
    /// group by its sum (qknorm_gqa_bs8 graph 19's form).
    fn written_groups() -> KernelGraph {
        let (mut g, e) = exps_written([0, 2, -1]);
        let b = 2;
        let mut t = TbGraphBuilder::new([b, 2, 1], [128, 1, 1], 1);
        let x = t.new_input(&g, e, [0, 2, -1], -1).unwrap();
        let num = t.forloop_accum(x, AccumKind::Nored).unwrap();
        let den = t.forloop_accum(x, AccumKind::RedLdSum).unwrap();
        let y = t.binary(BinaryOp::Div, num, den).unwrap();
        t.new_output(y, [0, 2, -1]).unwrap();
        let y = g.customized(t).unwrap()[0];
        g.mark_output(y).unwrap();
        g.build().unwrap()
    }

    #[test]
    fn written_exponentials_divided_by_groups_move_and_shift_by_groups() {
        let g = written_groups();
        let rw = shift_scores(&g, true);
        assert!(rw.declined.is_empty(), "{:?}", rw.declined);
        let g2 = rw.graph.as_deref().expect("shifted");
        assert_eq!(rw.hoisted.len(), 1);
        assert_eq!(rw.applied[0].groups, 2);
        // Each block writes one whole group: the exp stays, less the group's max.
        assert!(rw.hoisted[0].in_block && rw.applied[0].folded_into == Some(2));
        assert_eq!(count_ops(g2, &KnOpKind::ShiftedExp { groups: 2 }), 0);
        assert_eq!(plain_maxes(g2), 1);
        same_function_in_range(&g, g2, 4, 4.0);
    }

    #[test]
    fn written_exponentials_that_would_not_shift_stay_in_their_operator() {
        // A sum over the rows: no factor cancels, so nothing moves.
        let g = written_exps(false, false);
        let rw = shift_scores(&g, true);
        assert!(rw.graph.is_none());
        assert!(rw.hoisted.is_empty());
        assert!(rw.declined.is_empty(), "{:?}", rw.declined);
        assert!(
            shift_scores(&written_exps(true, false), false)
                .hoisted
                .is_empty()
        );
    }

    #[test]
    fn a_kernel_level_softmax_is_shifted() {
        let mut g = GraphBuilder::new();
        let x = g.new_input(&[4, 8], DType::F16).unwrap();
        let w = g.new_input(&[8, 16], DType::F16).unwrap();
        let s = g.matmul(x, w).unwrap();
        let e = g.unary(UnaryOp::Exp, s).unwrap();
        let d = g.reduction(e, 1).unwrap();
        let y = g.binary(BinaryOp::Div, e, d).unwrap();
        g.mark_output(y).unwrap();
        let g = g.build().unwrap();
        let rw = shift_scores(&g, true);
        let g2 = rw.graph.as_deref().expect("shifted");
        in_range_where_the_graph_overflows(&g, g2, 1, 4.0);
    }
}
