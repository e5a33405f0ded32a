//! Layout resolution: which dim of every tensor is innermost (stride 1), which dim of every
//! shared-memory tile is swizzled, and which dim each element-wise chain walks with consecutive
//! threads — decided jointly for a whole kernel graph by optimisation with Z3.
//!
//! # Variables
//! - `d{t}.inner{i}`: dim i of DTensor t is innermost;
//! - `k{o}.s{t}.inner{i}` / `k{o}.s{t}.sw{i}`: dim i of tile t of customized op o is innermost /
//!   swizzled (threads walk it although it is not innermost, so its rows must be spread over the
//!   banks). Only tiles that exist in shared memory get variables: the tiles between members of
//!   a fusion chain live in registers;
//! - `k{o}.op{p}.iter{i}`: the element-wise chain led by op p maps consecutive threads to dim i.
//!
//! Only dims of extent > 1 are candidates (a stride-1 dim of extent 1 says nothing about the
//! memory order); a tensor whose dims are all 1 uses its last dim.
//!
//! # Hard constraints
//! 1. Every tensor has exactly one innermost dim; a tile has at most one swizzled dim, never its
//!    innermost one.
//! 2. Graph inputs, and graph outputs with user strides, have the innermost dim of their strides
//!    (the last stride-1 dim of extent > 1; if no such dim exists, the smallest-stride dim).
//! 3. Kernel-level matmul: every operand's innermost dim is one of its last two dims (cuBLAS
//!    addresses matrices through a leading dimension).
//! 4. Threadblock matmul: for A, B and the chain's stored result, whichever of the two matrix dims
//!    is not innermost is swizzled (`ldmatrix` reads 8 rows of 16 bytes at once).
//! 5. Element-wise, reduction, concat, rms_norm and accumulator chains: exactly one iteration dim;
//!    it is never a reduced dim (unless no other dim has extent > 1); every tile the chain reads
//!    or stores is, along the iteration dim, either innermost or swizzled.
//! 6. An all-reduce of a graph on several GPUs: input and output have the same innermost dim
//!    (NCCL sums them as flat arrays).
//!
//! # Costs (minimised; every weight below is multiplied by 1024, and a cost of 1 is added for
//! every innermost or iteration dim other than the tensor's last candidate, so that among equal
//! layouts the row-major one wins and the result does not depend on the solver's tie-breaking)
//! | name | weight | paid when |
//! |---|---|---|
//! | `TB_INPUT_NO_CP_ASYNC` | 20000 | a threadblock input's tile has another innermost dim than its DTensor (no 16-byte asynchronous copies) |
//! | `TB_INPUT_SHORT_RUNS` | 8000 | a threadblock input's tile spans fewer than 128 bytes of its DTensor's innermost dim and more than one element of another dim (short reads far apart) |
//! | `TB_OUTPUT_NO_WIDE_COPY` | 4000 | a stored tile (or the iteration dim of a chain that stores directly) differs from the output DTensor's innermost dim |
//! | `TB_MATMUL_NO_LDMATRIX` | 10000 | a threadblock matmul operand has neither matrix dim innermost |
//! | `TB_FEW_ROWS_A_BY_COLUMNS` | 2000 | a threadblock matmul's A of at most 8 rows has its row dim innermost |
//! | `KN_OPERAND_MISMATCH` | 4000 | an operand of a kernel-level element-wise operator has another innermost dim than its result (uncoalesced accesses) |
//! | `SWIZZLE_DIM` | 1000 | per swizzled dim |
//! | shared-memory bytes | bytes | a tile's padded size under its innermost dim |
//!
//! If Z3 answers `unknown` (or runs past its time limit) a deterministic search finds a feasible
//! layout instead and the plan says so; `unsat` is an error naming the constraints in conflict.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use z3::ast::Bool;
use z3::{Optimize, Params, SatResult};

use super::model::{Choice, ConstraintKind, Lit, Model, Var};
use super::strides::padded_strides;
use crate::graph::fusion::FusionPlan;
use crate::graph::kernel::{KernelGraph, KnOpKind};
use crate::graph::mirage_json::names;
use crate::graph::ops::TbReduction;
use crate::graph::shape::Shape;
use crate::graph::threadblock::{TbGraph, TbOpKind};

/// A threadblock input whose tile loses the DTensor's innermost dim.
pub const TB_INPUT_NO_CP_ASYNC: i64 = 20_000;
/// A threadblock input whose tile spans fewer than [`SECTOR_RUN_BYTES`] of its DTensor's
/// innermost dim while spreading over another dim: each block reads the device tensor in short
/// pieces far apart (mqa_bs8's division kernel read its [8, 1024, 512] workspace in 16-byte
/// chunks 2 KB apart: 12.9 µs for 9 MB on an H100, ncu, 2026-11-26).
pub const TB_INPUT_SHORT_RUNS: i64 = 8_000;
/// Contiguous bytes of a block's read below which [`TB_INPUT_SHORT_RUNS`] is paid (a 128-byte
/// line).
pub const SECTOR_RUN_BYTES: usize = 128;
/// A stored tile whose innermost dim is not the output DTensor's.
pub const TB_OUTPUT_NO_WIDE_COPY: i64 = 4_000;
/// A threadblock matmul operand with neither matrix dim innermost.
pub const TB_MATMUL_NO_LDMATRIX: i64 = 10_000;
/// A matmul A operand of at most 8 rows (the m16n8k16 fragment's rows 8–15 are zero, so
/// `ldmatrix` saves little) whose rows are not contiguous: the element-wise pass that writes
/// it (decode's silu ⊙ Y) then stores with a stride instead of vectors.
pub const TB_FEW_ROWS_A_BY_COLUMNS: i64 = 2_000;
/// A kernel-level operand laid out differently from the result.
pub const KN_OPERAND_MISMATCH: i64 = 4_000;
/// One swizzled dim.
pub const SWIZZLE_DIM: i64 = 1_000;
/// Scale of real costs relative to tie-breaks.
const SCALE: i64 = 1024;

/// Layout of one shared-memory tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileLayout {
    /// The stride-1 dim.
    pub innermost: usize,
    /// The dim threads walk although it is not innermost.
    pub swizzled: Option<usize>,
}

/// Layout decisions of one customized operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelLayout {
    /// Per tile: its layout, or `None` if it never lives in shared memory.
    pub tiles: Vec<Option<TileLayout>>,
    /// Per operator: the iteration dim of the element-wise chain it leads.
    pub iter_dim: Vec<Option<usize>>,
}

/// How the layout was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SolveMethod {
    /// Z3 found the optimum.
    Z3,
    /// Z3 gave up; a deterministic search found a feasible layout.
    Fallback {
        /// What Z3 said.
        reason: String,
    },
}

/// The solver's report.
#[derive(Clone, Debug)]
pub struct SolveReport {
    /// How the layout was found.
    pub method: SolveMethod,
    /// Wall time of the solve.
    pub elapsed: Duration,
    /// Variables in the model.
    pub variables: usize,
    /// Hard constraints in the model.
    pub constraints: usize,
}

/// The layout plan of a kernel graph.
#[derive(Clone, Debug)]
pub struct LayoutPlan {
    /// Innermost dim of every DTensor (by index).
    pub dtensors: Vec<usize>,
    /// Per customized operator (by kernel op index).
    pub kernels: BTreeMap<usize, KernelLayout>,
    /// The cost of the chosen layout (the table above, without tie-breaks).
    pub cost: i64,
    /// How it was found.
    pub report: SolveReport,
}

/// Options of the solver.
#[derive(Clone, Copy, Debug)]
pub struct SolveOptions {
    /// Z3's time limit: a safety net only ([`SolveOptions::rlimit`] decides, the same on every
    /// machine, so that the generated code does not depend on the machine's speed).
    pub timeout: Duration,
    /// Z3's resource budget (its deterministic `rlimit` count); past it the fallback search
    /// plans the layout. Default 5,000,000: the corpus needs at most 74,360 (qknorm_gqa_bs8).
    pub rlimit: u32,
    /// Skip Z3 and use the fallback search (for tests and comparisons).
    pub force_fallback: bool,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            timeout: Duration::from_secs(10),
            rlimit: 5_000_000,
            force_fallback: false,
        }
    }
}

/// Why no layout exists.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no layout satisfies the constraints of {}", .conflict.join("; "))]
pub struct LayoutError {
    /// The origins of a set of constraints that cannot hold together.
    pub conflict: Vec<String>,
}

/// Candidate innermost dims of a shape: the dims of extent > 1, or the last dim.
pub fn candidates(s: &Shape) -> Vec<usize> {
    let c: Vec<usize> = (0..s.rank()).filter(|&d| s.dim(d) > 1).collect();
    if c.is_empty() { vec![s.rank() - 1] } else { c }
}

#[derive(Clone)]
struct TileVars {
    inner: Vec<Option<Var>>,
    sw: Vec<Option<Var>>,
}

struct Builder<'a> {
    g: &'a KernelGraph,
    fusion: &'a BTreeMap<usize, FusionPlan>,
    m: Model,
    /// Real costs (unscaled) as (literals, weight) for reporting.
    real: Vec<(Vec<Lit>, i64)>,
    dvars: Vec<Vec<Option<Var>>>,
    tiles: BTreeMap<usize, Vec<Option<TileVars>>>,
    iters: BTreeMap<usize, Vec<Option<Vec<Option<Var>>>>>,
}

fn lit_or_const(v: Option<Var>, positive: bool) -> Option<Lit> {
    v.map(|v| if positive { v.pos() } else { v.negative() })
}

impl<'a> Builder<'a> {
    fn cost(&mut self, when: Vec<Lit>, weight: i64) {
        self.real.push((when.clone(), weight));
        self.m.cost(when, weight * SCALE);
    }

    /// Exactly-one innermost variables over the candidate dims of `s`.
    fn inner_vars(&mut self, prefix: &str, s: &Shape) -> Vec<Option<Var>> {
        let cand = candidates(s);
        let mut vars = vec![None; s.rank()];
        for &d in &cand {
            vars[d] = Some(self.m.var(format!("{prefix}.inner{d}")));
        }
        let list: Vec<Var> = cand
            .iter()
            .rev()
            .map(|&d| vars[d].expect("candidate"))
            .collect();
        self.m.require(
            ConstraintKind::ExactlyOne(list.clone()),
            format!("{prefix}: one innermost dim"),
        );
        // Tie-break: prefer the last candidate.
        for &v in &list[1..] {
            self.m.cost(vec![v.pos()], 1);
        }
        self.m.choices.push(Choice { options: list });
        vars
    }

    fn build(&mut self) {
        let g = self.g;
        for (h, t) in g.tensors.iter() {
            let v = self.inner_vars(&format!("d{}", h.index()), &t.shape);
            self.dvars.push(v);
        }
        let mut all_reduced = vec![false; g.tensors.len()];
        if g.sharding.num_gpus() > 1 {
            for (_, op) in g.ops.iter() {
                if let KnOpKind::AllReduce { .. } = op.kind {
                    all_reduced[op.outputs[0].index()] = true;
                }
            }
        }
        for (h, op) in g.ops.iter() {
            let here = format!("kernel op {} ({})", h.index(), names::kn_name(&op.kind));
            match &op.kind {
                KnOpKind::Input { strides } => {
                    let t = op.outputs[0];
                    self.fix_user_layout(t.index(), strides.as_slice(), &here);
                }
                // The output of a multi-GPU all-reduce keeps its input's layout; user strides
                // that differ get a copy (see `sched::dtensors`), so they pin nothing here.
                KnOpKind::Output { strides: Some(st) } if !all_reduced[op.inputs[0].index()] => {
                    let t = op.inputs[0];
                    self.fix_user_layout(t.index(), st.as_slice(), &here);
                }
                // …but the caller's innermost dim is preferred: with it the all-reduce can
                // write straight into the output buffer when the strides match.
                KnOpKind::Output { strides: Some(st) } => {
                    let t = op.inputs[0].index();
                    if let Some(d) = self.user_innermost(t, st.as_slice())
                        && let Some(v) = self.dvars[t][d]
                    {
                        self.cost(vec![v.negative()], KN_OPERAND_MISMATCH);
                    }
                }
                KnOpKind::Output { strides: None } => {}
                KnOpKind::Matmul => {
                    for (name, t) in [
                        ("A", op.inputs[0]),
                        ("B", op.inputs[1]),
                        ("C", op.outputs[0]),
                    ] {
                        let r = g.tensors[t].shape.rank();
                        let lits: Vec<Lit> = [r - 2, r - 1]
                            .iter()
                            .filter_map(|&d| self.dvars[t.index()][d].map(Var::pos))
                            .collect();
                        if !lits.is_empty() {
                            self.m.require(
                                ConstraintKind::Clause(lits),
                                format!("{here}: {name}'s innermost dim must be one of its last two (cuBLAS)"),
                            );
                        }
                    }
                }
                KnOpKind::Customized(tb) => {
                    let plan = &self.fusion[&h.index()];
                    self.customized(h.index(), tb, plan, &op.inputs, &op.outputs);
                }
                KnOpKind::AllReduce { .. } if g.sharding.num_gpus() > 1 => {
                    // NCCL sums flat arrays: input and output share one layout.
                    let (x, y) = (op.inputs[0].index(), op.outputs[0].index());
                    for d in 0..g.tensors[op.outputs[0]].shape.rank() {
                        if let (Some(a), Some(b)) = (self.dvars[x][d], self.dvars[y][d]) {
                            for (p, q) in [(a, b), (b, a)] {
                                self.m.require(
                                    ConstraintKind::Clause(vec![p.negative(), q.pos()]),
                                    format!(
                                        "{here}: input and output share their innermost dim \
                                         (NCCL sums flat arrays)"
                                    ),
                                );
                            }
                        }
                    }
                }
                _ => {
                    // Element-wise style: operands should share the result's layout.
                    let (reference, others): (usize, Vec<usize>) = match &op.kind {
                        KnOpKind::Split { .. } | KnOpKind::Chunk { .. } => (
                            op.inputs[0].index(),
                            op.outputs.iter().map(|t| t.index()).collect(),
                        ),
                        _ => (
                            op.outputs[0].index(),
                            op.inputs.iter().map(|t| t.index()).collect(),
                        ),
                    };
                    for o in others {
                        let rs = g.tensors[crate::graph::Handle::from_index(reference)].shape;
                        let os = g.tensors[crate::graph::Handle::from_index(o)].shape;
                        for d in 0..rs.rank().min(os.rank()) {
                            if os.dim(d) == 1 {
                                continue;
                            }
                            if let (Some(rv), ov) = (self.dvars[reference][d], self.dvars[o][d]) {
                                let mut when = vec![rv.pos()];
                                when.extend(lit_or_const(ov, false));
                                self.cost(when, KN_OPERAND_MISMATCH);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The innermost dim the caller's `strides` give tensor `t` (the last stride-1 dim of
    /// extent > 1, else the smallest-stride dim of extent > 1).
    fn user_innermost(&self, t: usize, strides: &[usize]) -> Option<usize> {
        let shape = self.g.tensors[crate::graph::Handle::from_index(t)].shape;
        (0..shape.rank())
            .rev()
            .find(|&d| strides[d] == 1 && shape.dim(d) > 1)
            .or_else(|| {
                (0..shape.rank())
                    .filter(|&d| shape.dim(d) > 1)
                    .min_by_key(|&d| (strides[d], usize::MAX - d))
            })
    }

    /// Whether the caller's strides fix tensor `t`'s layout (a graph input, or an output with
    /// strides): costs that depend only on its innermost dim change nothing there.
    fn pinned(&self, t: usize) -> bool {
        self.g.ops.iter().any(|(_, op)| match &op.kind {
            KnOpKind::Input { .. } => op.outputs[0].index() == t,
            KnOpKind::Output { strides: Some(_) } => op.inputs[0].index() == t,
            _ => false,
        })
    }

    fn fix_user_layout(&mut self, t: usize, strides: &[usize], here: &str) {
        if let Some(d) = self.user_innermost(t, strides)
            && let Some(v) = self.dvars[t][d]
        {
            self.m.require(
                ConstraintKind::Clause(vec![v.pos()]),
                format!("{here}: the caller's strides make dim {d} innermost"),
            );
        }
    }

    fn customized(
        &mut self,
        k: usize,
        tb: &TbGraph,
        plan: &FusionPlan,
        kn_ins: &[crate::graph::Handle<crate::graph::DTensor>],
        kn_outs: &[crate::graph::Handle<crate::graph::DTensor>],
    ) {
        let materialized = plan.materialized(tb);
        let mut tiles: Vec<Option<TileVars>> = vec![None; tb.tensors.len()];
        for (h, s) in tb.tensors.iter() {
            if !materialized[h.index()] {
                continue;
            }
            let prefix = format!("k{k}.s{}", h.index());
            let inner = self.inner_vars(&prefix, &s.shape);
            let mut sw = vec![None; s.shape.rank()];
            for d in 0..s.shape.rank() {
                if s.shape.dim(d) > 1 {
                    let v = self.m.var(format!("{prefix}.sw{d}"));
                    sw[d] = Some(v);
                    self.cost(vec![v.pos()], SWIZZLE_DIM);
                    if let Some(iv) = inner[d] {
                        self.m.require(
                            ConstraintKind::Clause(vec![v.negative(), iv.negative()]),
                            format!("{prefix}: the swizzled dim is not the innermost"),
                        );
                    }
                }
            }
            let sws: Vec<Var> = sw.iter().flatten().copied().collect();
            if sws.len() > 1 {
                self.m.require(
                    ConstraintKind::AtMostOne(sws),
                    format!("{prefix}: at most one swizzled dim"),
                );
            }
            // Shared-memory bytes under each innermost choice.
            let elem = (s.dtype.bits() / 8).max(1) as usize;
            for (d, v) in inner.iter().enumerate() {
                if let Some(v) = v {
                    let (_, phys) = padded_strides(&s.shape, d, None, elem);
                    self.cost(vec![v.pos()], (phys * elem) as i64);
                }
            }
            tiles[h.index()] = Some(TileVars { inner, sw });
        }
        let mut iters: Vec<Option<Vec<Option<Var>>>> = vec![None; tb.ops.len()];
        for chain in &plan.chains {
            let lead = chain.leader();
            let op = &tb.ops[lead];
            let tail_op = &tb.ops[chain.tail()];
            let here = format!(
                "kernel op {k}, threadblock op {} ({})",
                lead.index(),
                names::tb_name(&op.kind, false)
            );
            // The tile the chain stores, if any.
            let stored = tail_op
                .outputs
                .first()
                .copied()
                .filter(|t| materialized[t.index()]);
            match &op.kind {
                TbOpKind::Input { input, .. } => {
                    let d = kn_ins[*input].index();
                    let s = op.outputs[0].index();
                    let Some(tv) = tiles[s].clone() else { continue };
                    let ts = &tb.tensors[op.outputs[0]];
                    let elem = (ts.dtype.bits() / 8).max(1) as usize;
                    let spread =
                        ts.shape.dims().iter().filter(|&&e| e > 1).count() > 1 && !self.pinned(d);
                    for dim in 0..self.dvars[d].len() {
                        if let Some(dv) = self.dvars[d][dim] {
                            let mut when = vec![dv.pos()];
                            when.extend(lit_or_const(tv.inner.get(dim).copied().flatten(), false));
                            self.cost(when, TB_INPUT_NO_CP_ASYNC);
                            if spread && ts.shape.dim(dim) * elem < SECTOR_RUN_BYTES {
                                self.cost(vec![dv.pos()], TB_INPUT_SHORT_RUNS);
                            }
                        }
                    }
                }
                TbOpKind::Output { output, .. } => {
                    // A store on its own: the tile's layout against the DTensor's.
                    let d = kn_outs[*output].index();
                    let s = op.inputs[0].index();
                    if let Some(tv) = tiles[s].clone() {
                        for dim in 0..tv.inner.len() {
                            if let Some(sv) = tv.inner[dim] {
                                let mut when = vec![sv.pos()];
                                when.extend(lit_or_const(self.dvars[d][dim], false));
                                self.cost(when, TB_OUTPUT_NO_WIDE_COPY);
                            }
                        }
                    }
                }
                TbOpKind::Matmul => {
                    let r = tb.tensors[op.inputs[0]].shape.rank();
                    let mut operands = vec![("A", op.inputs[0]), ("B", op.inputs[1])];
                    if let Some(c) = stored {
                        operands.push(("the stored result", c));
                    }
                    for (name, t) in operands {
                        let Some(tv) = tiles[t.index()].clone() else {
                            continue;
                        };
                        for dim in [r - 2, r - 1] {
                            if let (Some(iv), Some(sv)) = (tv.inner[dim], tv.sw[dim]) {
                                self.m.require(
                                    ConstraintKind::Clause(vec![iv.pos(), sv.pos()]),
                                    format!("{here}: {name}'s matrix dim {dim} is innermost or swizzled (ldmatrix)"),
                                );
                            }
                        }
                        if name != "the stored result" {
                            let when: Vec<Lit> = [r - 2, r - 1]
                                .iter()
                                .filter_map(|&d| tv.inner[d].map(Var::negative))
                                .collect();
                            if when.len() == 2 {
                                self.cost(when, TB_MATMUL_NO_LDMATRIX);
                            }
                        }
                        if name == "A"
                            && tb.tensors[t].shape.dim(r - 2) <= 8
                            && let Some(m_inner) = tv.inner[r - 2]
                        {
                            self.cost(vec![m_inner.pos()], TB_FEW_ROWS_A_BY_COLUMNS);
                        }
                    }
                    self.fused_store_cost(tb, chain.tail(), None, kn_outs);
                }
                _ => {
                    // Element-wise style chain: choose the dim consecutive threads walk.
                    let (space, reduced): (Shape, Option<usize>) = match &op.kind {
                        TbOpKind::Reduction { dim, .. } => {
                            (tb.tensors[op.inputs[0]].shape, Some(*dim))
                        }
                        TbOpKind::RmsNorm => {
                            let s = tb.tensors[op.inputs[0]].shape;
                            (s, Some(s.rank() - 1))
                        }
                        TbOpKind::Accum(kind) => {
                            let s = tb.tensors[op.inputs[0]].shape;
                            (s, kind.reduces_last_dim().then(|| s.rank() - 1))
                        }
                        _ => (tb.tensors[op.outputs[0]].shape, None),
                    };
                    // A reducing accumulator at the end of the chain reduces the last dim too.
                    let reduced = reduced.or_else(|| match tail_op.kind {
                        TbOpKind::Accum(kind) if kind.reduces_last_dim() => Some(space.rank() - 1),
                        _ => None,
                    });
                    let mut cand = candidates(&space);
                    if let Some(r) = reduced
                        && cand.len() > 1
                    {
                        cand.retain(|&d| d != r);
                    }
                    // A plain max whose rows are split over several threads each
                    // ([`super::threads_per_row`]): consecutive threads read consecutive
                    // elements of a row (`tb::for_each_row`).
                    if let (
                        TbOpKind::Reduction {
                            dim,
                            kind: TbReduction::PlainMax,
                        },
                        Some(_),
                    ) = (&op.kind, reduced)
                    {
                        let len = space.dim(*dim);
                        let threads: usize = tb.block.iter().product();
                        let rows = space.numel() / len.max(1);
                        if len > 1 && super::threads_per_row(rows, len, threads) > 1 {
                            cand = vec![*dim];
                        }
                    }
                    let mut it = vec![None; space.rank()];
                    for &d in &cand {
                        it[d] = Some(self.m.var(format!("k{k}.op{}.iter{d}", lead.index())));
                    }
                    let list: Vec<Var> = cand
                        .iter()
                        .rev()
                        .map(|&d| it[d].expect("candidate"))
                        .collect();
                    self.m.require(
                        ConstraintKind::ExactlyOne(list.clone()),
                        format!("{here}: one iteration dim"),
                    );
                    for &v in &list[1..] {
                        self.m.cost(vec![v.pos()], 1);
                    }
                    self.m.choices.push(Choice { options: list });
                    let mut touched: Vec<crate::graph::Handle<crate::graph::STensor>> =
                        op.inputs.clone();
                    touched.extend(stored);
                    for t in touched {
                        let Some(tv) = tiles[t.index()].clone() else {
                            continue;
                        };
                        let ts = tb.tensors[t].shape;
                        for d in 0..space.rank().min(ts.rank()) {
                            let Some(iv) = it[d] else { continue };
                            if ts.dim(d) <= 1 {
                                continue;
                            }
                            let mut clause = vec![iv.negative()];
                            clause.extend(tv.inner[d].map(Var::pos));
                            clause.extend(tv.sw[d].map(Var::pos));
                            self.m.require(
                                ConstraintKind::Clause(clause),
                                format!("{here}: threads walk dim {d}, so tile s{} must have it innermost or swizzled", t.index()),
                            );
                        }
                    }
                    self.fused_store_cost(tb, chain.tail(), Some(&it), kn_outs);
                    iters[lead.index()] = Some(it);
                }
            }
        }
        self.tiles.insert(k, tiles);
        self.iters.insert(k, iters);
    }

    /// A chain that ends in an output and has more than one member writes global memory from
    /// its leader's iteration: price the write pattern against the DTensor's innermost dim.
    fn fused_store_cost(
        &mut self,
        tb: &TbGraph,
        tail: crate::graph::Handle<crate::graph::TbOp>,
        it: Option<&Vec<Option<Var>>>,
        kn_outs: &[crate::graph::Handle<crate::graph::DTensor>],
    ) {
        let TbOpKind::Output { output, .. } = tb.ops[tail].kind else {
            return;
        };
        let Some(it) = it else { return };
        let d = kn_outs[output].index();
        for dim in 0..it.len().min(self.dvars[d].len()) {
            if let Some(iv) = it[dim] {
                let mut when = vec![iv.pos()];
                when.extend(lit_or_const(self.dvars[d][dim], false));
                self.cost(when, TB_OUTPUT_NO_WIDE_COPY);
            }
        }
    }
}

/// Resolves the layouts of `g` (validated), given the fusion plan of each customized operator.
pub fn resolve(
    g: &KernelGraph,
    fusion: &BTreeMap<usize, FusionPlan>,
    opts: &SolveOptions,
) -> Result<LayoutPlan, LayoutError> {
    let start = Instant::now();
    let mut b = Builder {
        g,
        fusion,
        m: Model::default(),
        real: Vec::new(),
        dvars: Vec::new(),
        tiles: BTreeMap::new(),
        iters: BTreeMap::new(),
    };
    b.build();
    let Builder {
        m: model,
        real,
        dvars,
        tiles,
        iters,
        ..
    } = b;
    let (assignment, method) = if opts.force_fallback {
        let a = fallback(&model)?;
        (
            a,
            SolveMethod::Fallback {
                reason: "requested".into(),
            },
        )
    } else {
        match solve_z3(&model, opts.timeout, opts.rlimit) {
            Z3Outcome::Sat(a) => (a, SolveMethod::Z3),
            Z3Outcome::Unsat(core) => return Err(LayoutError { conflict: core }),
            Z3Outcome::Unknown(reason) => (fallback(&model)?, SolveMethod::Fallback { reason }),
        }
    };
    if let Some(c) = model.check(&assignment) {
        // Z3's model violating a constraint would be a bug in the encoding.
        return Err(LayoutError {
            conflict: vec![format!(
                "internal: the solver's layout violates `{}`",
                c.origin
            )],
        });
    }
    let cost = real
        .iter()
        .filter(|(when, _)| when.iter().all(|l| l.eval(&assignment)))
        .map(|(_, w)| w)
        .sum();
    let pick = |vars: &[Option<Var>]| vars.iter().position(|v| v.is_some_and(|v| assignment[v.0]));
    let dtensors = dvars.iter().map(|v| pick(v).unwrap_or(0)).collect();
    let mut kernels = BTreeMap::new();
    for (k, tv) in tiles {
        let t: Vec<Option<TileLayout>> = tv
            .iter()
            .map(|o| {
                o.as_ref().map(|tv| TileLayout {
                    innermost: pick(&tv.inner).unwrap_or(0),
                    swizzled: pick(&tv.sw),
                })
            })
            .collect();
        let it = iters[&k]
            .iter()
            .map(|o| o.as_ref().and_then(|v| pick(v)))
            .collect();
        kernels.insert(
            k,
            KernelLayout {
                tiles: t,
                iter_dim: it,
            },
        );
    }
    Ok(LayoutPlan {
        dtensors,
        kernels,
        cost,
        report: SolveReport {
            method,
            elapsed: start.elapsed(),
            variables: model.names.len(),
            constraints: model.constraints.len(),
        },
    })
}

fn fallback(model: &Model) -> Result<Vec<bool>, LayoutError> {
    model.search(1_000_000).ok_or_else(|| LayoutError {
        conflict: vec!["the fallback search found no feasible layout within its step limit".into()],
    })
}

enum Z3Outcome {
    Sat(Vec<bool>),
    Unsat(Vec<String>),
    Unknown(String),
}

fn z3_constraint(c: &ConstraintKind, vars: &[Bool]) -> Bool {
    let lit = |l: &Lit| {
        if l.positive {
            vars[l.var.0].clone()
        } else {
            vars[l.var.0].not()
        }
    };
    match c {
        ConstraintKind::Clause(lits) => {
            let ls: Vec<Bool> = lits.iter().map(lit).collect();
            Bool::or(&ls)
        }
        ConstraintKind::ExactlyOne(vs) => {
            let w: Vec<(&Bool, i32)> = vs.iter().map(|v| (&vars[v.0], 1)).collect();
            Bool::pb_eq(&w, 1)
        }
        ConstraintKind::AtMostOne(vs) => {
            let w: Vec<(&Bool, i32)> = vs.iter().map(|v| (&vars[v.0], 1)).collect();
            Bool::pb_le(&w, 1)
        }
    }
}

/// The origins of an unsatisfiable subset of the hard constraints (a plain solver with tracked
/// assertions: cheaper than tracking inside the optimiser on the common, satisfiable path).
fn unsat_core(model: &Model, vars: &[Bool], timeout: Duration) -> Vec<String> {
    let solver = z3::Solver::new();
    let mut params = Params::new();
    params.set_u32("timeout", timeout.as_millis().min(u32::MAX as u128) as u32);
    solver.set_params(&params);
    for (i, c) in model.constraints.iter().enumerate() {
        let tracker = Bool::new_const(format!("constraint{i}"));
        solver.assert_and_track(z3_constraint(&c.kind, vars), &tracker);
    }
    let mut names: Vec<String> = match solver.check() {
        SatResult::Unsat => solver
            .get_unsat_core()
            .iter()
            .filter_map(|b| {
                b.to_string()
                    .strip_prefix("constraint")
                    .and_then(|i| i.parse::<usize>().ok())
                    .map(|i| model.constraints[i].origin.clone())
            })
            .collect(),
        _ => Vec::new(),
    };
    names.sort();
    names.dedup();
    if names.is_empty() {
        names.push("(Z3 returned no unsat core)".into());
    }
    names
}

fn solve_z3(model: &Model, timeout: Duration, rlimit: u32) -> Z3Outcome {
    let opt = Optimize::new();
    let mut params = Params::new();
    params.set_u32("timeout", timeout.as_millis().min(u32::MAX as u128) as u32);
    // The deterministic budget decides in practice; the clock is a safety net.
    params.set_u32("rlimit", rlimit);
    opt.set_params(&params);
    let vars: Vec<Bool> = model
        .names
        .iter()
        .map(|n| Bool::new_const(n.as_str()))
        .collect();
    for c in &model.constraints {
        opt.assert(z3_constraint(&c.kind, &vars));
    }
    // Costs as weighted soft clauses (MaxSAT): "not all of `when`" with the cost's weight.
    for c in &model.costs {
        let negs: Vec<Bool> = c
            .when
            .iter()
            .map(|l| {
                if l.positive {
                    vars[l.var.0].not()
                } else {
                    vars[l.var.0].clone()
                }
            })
            .collect();
        opt.assert_soft(&Bool::or(&negs), c.weight, None);
    }
    match opt.check(&[]) {
        SatResult::Sat => {
            let Some(m) = opt.get_model() else {
                return Z3Outcome::Unknown("Z3 reported sat without a model".into());
            };
            let a = vars
                .iter()
                .map(|v| m.eval(v, true).and_then(|b| b.as_bool()).unwrap_or(false))
                .collect();
            Z3Outcome::Sat(a)
        }
        SatResult::Unsat => Z3Outcome::Unsat(unsat_core(model, &vars, timeout)),
        SatResult::Unknown => Z3Outcome::Unknown(
            opt.get_reason_unknown()
                .unwrap_or_else(|| "no reason given".into()),
        ),
    }
}
