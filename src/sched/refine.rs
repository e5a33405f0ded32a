//! **Loop refinement**, a rewrite the planner makes before it plans when asked
//! (`--refine-loops R`, [`super::Options::refine_loops`]); the caller's graph is never changed.
//!
//! A customized operator's for-loop of F iterations over tiles of extent t along the loop
//! becomes R·F iterations over tiles of t / R: every input the loop walks loads a tile R times
//! thinner, in the same order. Each block then stages R times less shared memory per ring stage,
//! so that more blocks fit on an SM and one block's start (its first loads, an idle ring) is
//! covered by the others' streaming — the attention candidates with a few long iterations hold
//! one 200 KB block per SM otherwise.
//!
//! The function is the same where every per-iteration value reaches the accumulators linearly.
//! The rewrite tracks what each tile holds: a loop-invariant tile, a tile that
//! carries the loop's dim (a slice of it per iteration), or a partial sum over the iteration's
//! slice (a matmul over the carried dim, a sum reduction over it). It applies when
//! - element-wise operators, row norms, reductions and matmuls only ever combine a carried tile
//!   with tiles that carry the same dim or broadcast along it, and never reduce over the carried
//!   dim other than by a sum;
//! - partial sums only reach sum reductions and sum accumulators (`accum_nored`,
//!   `accum_red_ld_sum`), whose totals over R·F thinner iterations are the totals over F;
//! - a carried tile reaches an accumulator only where it reduces the carried dim away: the
//!   last-dim sum, mean and RMS accumulators (the mean divides by the last dim's extent times
//!   the iteration count, a product the rewrite keeps), and the strided to-dimx sums where the
//!   thinner tile still holds whole groups;
//! - a running max and rescaling accumulators appear only in the online-softmax form: the
//!   running max of a carried tile's rows over the loop's dim, S − m and exp(S − m) carried,
//!   exp(m_old − m_new) the factor of the accumulators that rescale (a row sum of exp(S − m),
//!   the product of exp(S − m) with a carried tile), each with the factor of the max its
//!   summands subtract. The final max is the same over thinner iterations, and so are the
//!   rescaled sums (up to rounding).
//!
//! Only the summation order changes. Where a kernel's body breaks a rule, the plan says which
//! ([`NotRefined`]); where the refined graph does not plan, the caller's is planned.
//!
//! The same rules allow the inverse, **coarsening** by C (`--coarsen-loops C`,
//! [`LoopScale::Coarsen`]): F / C iterations over tiles C times thicker, where C divides F.
//! Every iteration then stages C times the bytes and pays its fixed costs (the stage wait, the
//! barriers, the refill) once for C times the work.

use std::fmt;

use crate::graph::kernel::{KernelGraph, KnOpKind};
use crate::graph::ops::{AccumKind, BinaryOp, TbReduction, UnaryOp};
use crate::graph::threadblock::{TbGraph, TbOpKind};

/// The largest refinement factor (`--refine-loops`), and the largest coarsening factor
/// (`--coarsen-loops`).
pub const MAX_REFINE: usize = 8;

/// How a loop rewrite changes a for-loop ([`LoopRewrite::scale`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoopScale {
    /// R times the iterations over tiles R times thinner (1: unchanged).
    Refine(usize),
    /// 1 / C of the iterations over tiles C times thicker.
    Coarsen(usize),
}

impl Default for LoopScale {
    fn default() -> Self {
        LoopScale::Refine(1)
    }
}

impl LoopScale {
    /// The factor, either way.
    pub fn factor(self) -> usize {
        match self {
            LoopScale::Refine(f) | LoopScale::Coarsen(f) => f,
        }
    }

    /// Whether the rewrite changes any loop (a factor above 1).
    pub fn changes(self) -> bool {
        self.factor() > 1
    }

    /// The participle `explain` says of a changed loop ("refined", "coarsened").
    pub fn participle(self) -> &'static str {
        match self {
            LoopScale::Refine(_) => "refined",
            LoopScale::Coarsen(_) => "coarsened",
        }
    }

    /// The command-line option that asks for it.
    pub fn option(self) -> &'static str {
        match self {
            LoopScale::Refine(_) => "--refine-loops",
            LoopScale::Coarsen(_) => "--coarsen-loops",
        }
    }

    /// The iterations of a loop of `forloop`, `None` where the factor does not divide them.
    fn iterations(self, forloop: usize) -> Option<usize> {
        match self {
            LoopScale::Refine(r) => Some(forloop * r),
            LoopScale::Coarsen(c) => forloop.is_multiple_of(c).then(|| forloop / c),
        }
    }

    /// A carried tile's extent along the loop, `None` where the factor does not divide it.
    fn extent(self, extent: usize) -> Option<usize> {
        match self {
            LoopScale::Refine(r) => (extent.is_multiple_of(r) && extent >= r).then(|| extent / r),
            LoopScale::Coarsen(c) => Some(extent * c),
        }
    }
}

impl fmt::Display for LoopScale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoopScale::Refine(r) => write!(f, "refined by {r}"),
            LoopScale::Coarsen(c) => write!(f, "coarsened by {c}"),
        }
    }
}

/// The factor of the planner's rule ([`super::plan::RefineChoice::Auto`]).
pub const AUTO_FACTOR: usize = 2;

/// The blocks per SM a loop refined by the planner's rule for occupancy must fit (the kernel is
/// planned for them: rings of 2 stages where deeper ones would not fit), else the loop stays.
pub const AUTO_BLOCKS: usize = 3;

/// The deepest ring of a loop the planner's rule refines so that it pipelines.
pub const AUTO_PIPELINE_STAGES: usize = 2;

/// Why the planner's rule ([`super::plan::RefineChoice::Auto`]) refines a loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleRefinement {
    /// A grid of 4 or more blocks per SM whose blocks shared memory holds one of per SM:
    /// refined, [`AUTO_BLOCKS`] fit.
    Occupancy,
    /// A grid of fewer than 4 blocks per SM whose loop is too short to pipeline: refined, its
    /// loads pipeline in rings of at most [`AUTO_PIPELINE_STAGES`] stages.
    Pipeline,
    /// A split attention kernel whose every key split was folded into its loop
    /// ([`super::softmax::SplitFold`]): refined and planned as the large grid it came from,
    /// [`AUTO_BLOCKS`] of the µGraph's CTA per SM.
    Folded,
}

impl fmt::Display for RuleRefinement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleRefinement::Occupancy => write!(
                f,
                "the planner's rule: its large grid of small blocks held one block per SM, \
                 refined {AUTO_BLOCKS} fit"
            ),
            RuleRefinement::Pipeline => write!(
                f,
                "the planner's rule: its small grid's loop was too short to pipeline, refined its \
                 loads pipeline in rings of {AUTO_PIPELINE_STAGES}"
            ),
            RuleRefinement::Folded => write!(
                f,
                "the planner's rule: its key splits were folded into the loop, refined {AUTO_BLOCKS} \
                 blocks of the µGraph's CTA fit per SM as in the grid it came from"
            ),
        }
    }
}

/// Why the planner's rule ([`super::plan::RefineChoice::Auto`]) leaves a refinable loop as it
/// is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleKept {
    /// The Ampere path (the rule was measured on the Hopper path).
    AmperePath,
    /// The CTA was asked for (`--warps`).
    CtaAsked,
    /// The grid has fewer than 4 blocks per SM, and its loads are pipelined already.
    Pipelined {
        /// Blocks in the grid.
        blocks: usize,
    },
    /// The grid has fewer than 4 blocks per SM, and its loop refined would still be too short
    /// to pipeline.
    TooShort {
        /// The loop's iterations.
        forloop: usize,
    },
    /// The grid has fewer than 4 blocks per SM, and its loop is longer than the cost model's
    /// short loops.
    NotShort {
        /// The loop's iterations.
        forloop: usize,
    },
    /// Refined, the loads still do not pipeline.
    NoRing,
    /// The µGraph's CTA has 8 warps or more.
    WideCta {
        /// Its warps.
        warps: usize,
    },
    /// Shared memory holds several blocks per SM already.
    Resident {
        /// How many.
        blocks: usize,
    },
    /// Refined, shared memory would hold fewer than [`AUTO_BLOCKS`] blocks per SM.
    TooFew {
        /// How many.
        blocks: usize,
    },
}

impl fmt::Display for RuleKept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleKept::AmperePath => f.write_str("the Ampere path"),
            RuleKept::CtaAsked => f.write_str("the CTA was asked for"),
            RuleKept::Pipelined { blocks } => write!(
                f,
                "its grid of {blocks} blocks has fewer than 4 per SM and its loads pipeline already"
            ),
            RuleKept::TooShort { forloop } => write!(
                f,
                "its grid has fewer than 4 blocks per SM and refined by {AUTO_FACTOR} its loop of \
                 {forloop} iterations would still be too short to pipeline"
            ),
            RuleKept::NotShort { forloop } => write!(
                f,
                "its grid has fewer than 4 blocks per SM and its loop of {forloop} iterations is \
                 not a short one"
            ),
            RuleKept::NoRing => write!(f, "refined by {AUTO_FACTOR}, its loads would not pipeline"),
            RuleKept::WideCta { warps } => write!(f, "its CTA has {warps} warps"),
            RuleKept::Resident { blocks } => {
                write!(
                    f,
                    "shared memory holds {blocks} of its blocks per SM already"
                )
            }
            RuleKept::TooFew { blocks } => write!(
                f,
                "refined by {AUTO_FACTOR}, shared memory would hold {blocks} of its blocks per \
                 SM, fewer than {AUTO_BLOCKS}"
            ),
        }
    }
}

/// A customized operator whose for-loop was refined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefinedLoop {
    /// The customized operator (kernel op index).
    pub kernel: usize,
    /// Iterations before and after.
    pub forloop: [usize; 2],
    /// The extent along the loop of the tiles that carry it, before and after (the first such
    /// tile's).
    pub tile: [usize; 2],
    /// Why the planner's rule refined it (`None`: a factor was asked for).
    pub rule: Option<RuleRefinement>,
}

/// What a tile holds, for the rules of the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The same tile every iteration (or a tile after the loop).
    Invariant,
    /// One slice per iteration of the loop's dim, carried in tile dim `.0`.
    Carries(usize),
    /// A per-iteration sum over the iteration's slice of the loop's dim.
    Partial,
}

/// What a tile of the online-softmax form holds (module documentation), beside its [`Role`];
/// each names the running-max reduction (its op index) it derives from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Online {
    /// The running max m of a carried tile's rows (the reduction's first output).
    Max(usize),
    /// m_old − m_new (its second output).
    Change(usize),
    /// exp(m_old − m_new), the factor of the rescaling accumulators.
    Factor(usize),
    /// S − m, carried in tile dim `.0`.
    Shifted(usize, usize),
    /// exp(S − m), carried in tile dim `.0`.
    Weights(usize, usize),
    /// A per-iteration product of exp(S − m) with a carried tile (a sum over the slice).
    Product(usize),
}

/// A tile's role and, in the online-softmax form, what it holds there.
type Roles = (Role, Option<Online>);

/// The roles of `op`'s outputs where it takes part in the online-softmax form (reads such a
/// tile, is a running max of a carried tile, or rescales), `Ok(None)` where it does not. The
/// form refines because its final m is the max over all iterations however thin, and the
/// rescaled sums of exp(S − m) equal the sums of exp(S − m_final) whatever the iterations' maxima
/// (only rounding differs) — as long as every rescaling uses the factor of the max subtracted
/// from its summands, which these rules check.
fn online_roles(
    tb: &TbGraph,
    i: usize,
    roles: &[Role],
    online: &[Option<Online>],
) -> Result<Option<Vec<Roles>>, &'static str> {
    let op = &tb.ops[crate::graph::arena::Handle::from_index(i)];
    let ins: Vec<Roles> = op
        .inputs
        .iter()
        .map(|t| (roles[t.index()], online[t.index()]))
        .collect();
    let shape = |k: usize| tb.tensors[op.inputs[k]].shape;
    let any_online = ins.iter().any(|(_, o)| o.is_some());
    let rescales = matches!(
        op.kind,
        TbOpKind::Accum(AccumKind::NoredRescale | AccumKind::RedLdSumRescale)
    );
    let running = matches!(
        (&op.kind, ins.first()),
        (TbOpKind::Reduction { kind: TbReduction::Max, dim }, Some((Role::Carries(d), None)))
            if d == dim && op.outputs.len() == 2
    );
    if !any_online && !rescales && !running {
        return Ok(None);
    }
    let reads = "it reads the online softmax's state other than as the online softmax does";
    let out = match (&op.kind, &ins[..]) {
        (TbOpKind::Reduction { .. }, _) if running => {
            vec![
                (Role::Invariant, Some(Online::Max(i))),
                (Role::Invariant, Some(Online::Change(i))),
            ]
        }
        (TbOpKind::Unary(UnaryOp::Exp), [(_, Some(Online::Change(x)))]) => {
            vec![(Role::Invariant, Some(Online::Factor(*x)))]
        }
        (TbOpKind::Unary(UnaryOp::Exp), [(r, Some(Online::Shifted(d, x)))]) => {
            vec![(*r, Some(Online::Weights(*d, *x)))]
        }
        (
            TbOpKind::Binary(BinaryOp::Sub),
            [(Role::Carries(d), None), (_, Some(Online::Max(x)))],
        ) if shape(1).dim(*d) == 1 => {
            vec![(Role::Carries(*d), Some(Online::Shifted(*d, *x)))]
        }
        (TbOpKind::Matmul, [(_, Some(Online::Weights(a, x))), (Role::Carries(b), None)])
            if *a == shape(0).rank() - 1 && *b == shape(0).rank() - 2 =>
        {
            vec![(Role::Partial, Some(Online::Product(*x)))]
        }
        (TbOpKind::Accum(AccumKind::Max), [(_, Some(Online::Max(_)))]) => {
            vec![(Role::Invariant, None)]
        }
        (
            TbOpKind::Accum(AccumKind::NoredRescale),
            [(_, Some(Online::Product(x))), (_, Some(Online::Factor(y)))],
        ) if x == y => vec![(Role::Invariant, None)],
        (
            TbOpKind::Accum(AccumKind::RedLdSumRescale),
            [
                (_, Some(Online::Weights(d, x))),
                (_, Some(Online::Factor(y))),
            ],
        ) if x == y && *d == shape(0).rank() - 1 => vec![(Role::Invariant, None)],
        _ if rescales => {
            return Err("it rescales by other than the factor of the max its summands subtract");
        }
        _ => return Err(reads),
    };
    Ok(Some(out))
}

/// Why a customized operator's loop is not refined.
#[derive(Clone, Debug, PartialEq)]
pub enum NotRefined {
    /// The loop runs once: nothing to refine (such kernels may keep their rows in registers).
    Once,
    /// No input tile is walked by the loop.
    NoWalkedInput,
    /// The loop's iterations do not divide by the coarsening factor.
    Iterations {
        /// The loop's iterations.
        forloop: usize,
        /// The factor.
        factor: usize,
    },
    /// A tile's extent along the loop does not divide by the factor.
    Indivisible {
        /// The threadblock op whose tile it is.
        op: usize,
        /// The tile's extent along the loop.
        extent: usize,
    },
    /// An operator combines per-iteration tiles in a way that thinner iterations would change.
    Operator {
        /// The threadblock op.
        op: usize,
        /// Its name (`accum_nored`, `reduction_2_max`, …).
        name: String,
        /// Why.
        why: &'static str,
    },
    /// The refined graph does not validate or plan; the caller's is planned.
    Plan(super::plan::RewriteFailure),
    /// The planner's rule found no kernel plan of the operator in the caller's graph's plan.
    NoKernelPlan {
        /// The kernel operator.
        kernel: usize,
    },
    /// The planner's rule does not ask for it (`--refine-loops N` refines it anyway).
    Rule(RuleKept),
}

impl fmt::Display for NotRefined {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotRefined::Once => f.write_str("the loop runs once"),
            NotRefined::NoWalkedInput => f.write_str("no input tile is walked by the loop"),
            NotRefined::Iterations { forloop, factor } => {
                write!(f, "its {forloop} iterations do not divide by {factor}")
            }
            NotRefined::Indivisible { op, extent } => write!(
                f,
                "op{op}'s tile has {extent} elements along the loop, which the factor does not \
                 divide"
            ),
            NotRefined::Operator { op, name, why } => write!(f, "op{op} {name}: {why}"),
            NotRefined::Plan(why) => write!(f, "the refined graph does not plan: {why}"),
            NotRefined::NoKernelPlan { kernel } => write!(
                f,
                "the refined graph does not plan: kernel op {kernel} has no kernel plan"
            ),
            NotRefined::Rule(why) => write!(
                f,
                "the planner's rule refines the loops of a large grid's kernel holding one block \
                 per SM and the short loops of a small grid's, and {why}"
            ),
        }
    }
}

/// What [`refine_loops`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoopRewrite {
    /// The change asked for (refined by 1: off).
    pub scale: LoopScale,
    /// Whether the planner's rule chose the loops ([`super::plan::RefineChoice::Auto`]).
    pub rule: bool,
    /// The refined graph, when a loop was refined (the same operators, numbered alike).
    pub graph: Option<Box<KernelGraph>>,
    /// The refined loops.
    pub refined: Vec<RefinedLoop>,
    /// The customized operators whose loops stay, and why.
    pub kept: Vec<(usize, NotRefined)>,
}

impl LoopRewrite {
    /// Keeps every loop after all, with `why` (the refined graph did not plan).
    pub fn undo(&mut self, why: NotRefined) {
        self.graph = None;
        for r in self.refined.drain(..) {
            self.kept.push((r.kernel, why.clone()));
        }
        self.kept.sort_by_key(|(k, _)| *k);
    }
}

/// Refines by `factor` the for-loop of every customized operator of `g` whose body allows it
/// (see the module documentation); `factor` 1 refines nothing.
pub fn refine_loops(g: &KernelGraph, factor: usize) -> LoopRewrite {
    rescale_loops(g, LoopScale::Refine(factor))
}

/// Refines or coarsens by `scale` the for-loop of every customized operator of `g` whose body
/// allows it (see the module documentation).
pub fn rescale_loops(g: &KernelGraph, scale: LoopScale) -> LoopRewrite {
    refine_loops_where(g, scale, &|_| Ok(None))
}

/// [`refine_loops`] for the customized operators for which `rule` (given the kernel op index)
/// says why (`Ok(Some(_))`, the planner's rule) or says nothing (`Ok(None)`); the others, whose
/// loops would refine, keep their loops with its reason.
pub fn refine_loops_where(
    g: &KernelGraph,
    scale: LoopScale,
    rule: &dyn Fn(usize) -> Result<Option<RuleRefinement>, NotRefined>,
) -> LoopRewrite {
    let mut lr = LoopRewrite {
        scale,
        ..LoopRewrite::default()
    };
    if !scale.changes() {
        return lr;
    }
    let mut out = g.clone();
    for (h, op) in g.ops.iter() {
        let KnOpKind::Customized(tb) = &op.kind else {
            continue;
        };
        match refine_body(tb, scale).and_then(|(b, t)| Ok((b, t, rule(h.index())?))) {
            Ok((body, tile, why)) => {
                lr.refined.push(RefinedLoop {
                    kernel: h.index(),
                    forloop: [tb.forloop_range, body.forloop_range],
                    tile,
                    rule: why,
                });
                out.ops[h].kind = KnOpKind::Customized(Box::new(body));
            }
            Err(why) => lr.kept.push((h.index(), why)),
        }
    }
    if lr.refined.is_empty() {
        return lr;
    }
    if let Err(e) = crate::graph::validate::validate(&out, None) {
        lr.undo(NotRefined::Plan(super::plan::RewriteFailure::Invalid(e)));
        return lr;
    }
    lr.graph = Some(Box::new(out));
    lr
}

/// `tb` with its loop refined by `r`, and the first walked tile's extent along the loop before
/// and after.
fn refine_body(tb: &TbGraph, scale: LoopScale) -> Result<(TbGraph, [usize; 2]), NotRefined> {
    if tb.forloop_range <= 1 {
        return Err(NotRefined::Once);
    }
    let mut roles = vec![Role::Invariant; tb.tensors.len()];
    let mut online: Vec<Option<Online>> = vec![None; tb.tensors.len()];
    let mut out = tb.clone();
    out.forloop_range = scale
        .iterations(tb.forloop_range)
        .ok_or(NotRefined::Iterations {
            forloop: tb.forloop_range,
            factor: scale.factor(),
        })?;
    // Strided groups of the carried dim stay whole groups where the new extent holds them.
    let groups_whole = |extent: usize| {
        let e = match scale {
            LoopScale::Refine(r) => extent / r,
            LoopScale::Coarsen(c) => extent * c,
        };
        e.is_multiple_of(tb.reduction_dimx)
    };
    let mut tile = None;
    for (h, op) in tb.ops.iter() {
        let i = h.index();
        let bad = |why: &'static str| NotRefined::Operator {
            op: i,
            name: op.kind.name(),
            why,
        };
        let role = |k: usize| roles[op.inputs[k].index()];
        let shape = |k: usize| tb.tensors[op.inputs[k]].shape;
        // Operators after the loop read accumulated tiles only.
        let after = !op.inputs.is_empty() && op.inputs.iter().all(|t| tb.tensors[*t].after_accum);
        let in_loop =
            !after && !matches!(op.kind, TbOpKind::Input { .. } | TbOpKind::Output { .. });
        if in_loop && let Some(outs) = online_roles(tb, i, &roles, &online).map_err(bad)? {
            for (&t, (role, o)) in op.outputs.iter().zip(outs) {
                roles[t.index()] = role;
                online[t.index()] = o;
                if let Role::Carries(d) = role {
                    let extent = tb.tensors[t].shape.dim(d);
                    let Some(e) = scale.extent(extent) else {
                        return Err(NotRefined::Indivisible { op: i, extent });
                    };
                    let s = &mut out.tensors[t].shape;
                    *s = s.with_dim(d, e);
                }
            }
            continue;
        }
        let produced = match &op.kind {
            TbOpKind::Input { forloop_dim, .. } => match forloop_dim {
                Some(d) => Role::Carries(*d),
                None => Role::Invariant,
            },
            TbOpKind::Output { .. } => continue,
            _ if after => Role::Invariant,
            TbOpKind::Unary(_) => match role(0) {
                Role::Partial => return Err(bad("it applies a function to a partial sum")),
                r0 => r0,
            },
            TbOpKind::Binary(_) => match (role(0), role(1)) {
                (Role::Invariant, Role::Invariant) => Role::Invariant,
                (Role::Carries(d), Role::Carries(e)) if d == e => Role::Carries(d),
                (Role::Carries(d), Role::Invariant) if shape(1).dim(d) == 1 => Role::Carries(d),
                (Role::Invariant, Role::Carries(d)) if shape(0).dim(d) == 1 => Role::Carries(d),
                (Role::Partial, _) | (_, Role::Partial) => {
                    return Err(bad("it combines a partial sum element-wise"));
                }
                _ => {
                    return Err(bad(
                        "it combines a tile walked by the loop with one that does not step along",
                    ));
                }
            },
            TbOpKind::Matmul => {
                let rank = shape(0).rank();
                match (role(0), role(1)) {
                    (Role::Invariant, Role::Invariant) => Role::Invariant,
                    (Role::Carries(a), Role::Carries(b)) if a == rank - 1 && b == rank - 2 => {
                        Role::Partial
                    }
                    (Role::Carries(a), Role::Invariant) if a == rank - 2 => Role::Carries(a),
                    (Role::Invariant, Role::Carries(b)) if b == rank - 1 => Role::Carries(b),
                    (Role::Partial, _) | (_, Role::Partial) => {
                        return Err(bad("it multiplies a partial sum"));
                    }
                    _ => return Err(bad("the loop walks its operands along different dims")),
                }
            }
            TbOpKind::Reduction { dim, kind } => match (role(0), kind) {
                (Role::Invariant, _) => Role::Invariant,
                (_, TbReduction::Max) => return Err(bad("it keeps a running max")),
                (Role::Carries(d), TbReduction::PlainMax) if d == *dim => {
                    return Err(bad("it takes a max along the loop's dim"));
                }
                (Role::Partial, TbReduction::PlainMax) => {
                    return Err(bad("it takes a max of a partial sum"));
                }
                (Role::Carries(d), TbReduction::Sum) if d == *dim => Role::Partial,
                // Strided groups of the carried dim stay the same groups in thinner tiles whose
                // extent the group count divides.
                (Role::Carries(d), TbReduction::ToDimx)
                    if d == *dim && groups_whole(shape(0).dim(d)) =>
                {
                    Role::Partial
                }
                (Role::Carries(d), _) if d == *dim => {
                    return Err(bad(
                        "it groups the loop's dim by strides into more groups than a thinner tile holds whole",
                    ));
                }
                (Role::Carries(d), _) => Role::Carries(d),
                (Role::Partial, TbReduction::Sum) => Role::Partial,
                (Role::Partial, _) => return Err(bad("it groups a partial sum by strides")),
            },
            TbOpKind::RmsNorm => match role(0) {
                Role::Invariant => Role::Invariant,
                Role::Carries(d) if d + 1 < shape(0).rank() => Role::Carries(d),
                Role::Carries(_) => return Err(bad("it normalises along the loop's dim")),
                Role::Partial => return Err(bad("it normalises a partial sum")),
            },
            TbOpKind::Concat { dim } => match (role(0), role(1)) {
                (Role::Invariant, Role::Invariant) => Role::Invariant,
                (Role::Carries(d), Role::Carries(e)) if d == e && d != *dim => Role::Carries(d),
                _ => {
                    return Err(bad(
                        "it concatenates per-iteration tiles along the loop's dim, or with tiles that do not step along",
                    ));
                }
            },
            TbOpKind::Accum(kind) => {
                let last = shape(0).rank() - 1;
                match (role(0), kind) {
                    (Role::Partial, AccumKind::Nored | AccumKind::RedLdSum) => {}
                    (
                        Role::Carries(d),
                        AccumKind::RedLdSum | AccumKind::RedLdMean | AccumKind::RedLdRms,
                    ) if d == last => {}
                    (Role::Carries(d), AccumKind::RedtoxLdSum)
                        if d == last && groups_whole(shape(0).dim(d)) => {}
                    (Role::Invariant, AccumKind::Max) => {}
                    (_, AccumKind::NoredRescale | AccumKind::RedLdSumRescale) => {
                        return Err(bad("it rescales per iteration"));
                    }
                    (Role::Invariant, _) => {
                        return Err(bad("it sums a loop-invariant tile once per iteration"));
                    }
                    (Role::Partial, _) => {
                        return Err(bad("it accumulates a partial sum other than by a sum"));
                    }
                    (Role::Carries(_), _) => {
                        return Err(bad("its accumulator would hold a thinner tile"));
                    }
                }
                Role::Invariant
            }
        };
        for &t in &op.outputs {
            roles[t.index()] = produced;
            if let Role::Carries(d) = produced {
                let extent = tb.tensors[t].shape.dim(d);
                let Some(e) = scale.extent(extent) else {
                    return Err(NotRefined::Indivisible { op: i, extent });
                };
                if matches!(op.kind, TbOpKind::Input { .. }) && tile.is_none() {
                    tile = Some([extent, e]);
                }
                let s = &mut out.tensors[t].shape;
                *s = s.with_dim(d, e);
            }
        }
    }
    let tile = tile.ok_or(NotRefined::NoWalkedInput)?;
    Ok((out, tile))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::builder::{GraphBuilder, TbGraphBuilder};
    use crate::graph::dtype::DType;
    use crate::graph::interp::{Rounding, output_difference};

    /// mha_bs8's fused attention form at small sizes: per (batch, key split) block, S = Q·K
    /// per tile of keys, E = exp(S), Σ E and Σ E·V over the loop.
    fn attention(forloop: usize) -> KernelGraph {
        attention_of(4, 512, 2, forloop)
    }

    /// The attention form for `heads` heads of 16 query rows and `keys` keys (head dim 64),
    /// the keys split over `splits` blocks per head.
    fn attention_of(heads: usize, keys: usize, splits: usize, forloop: usize) -> KernelGraph {
        let mut g = GraphBuilder::new();
        let q = g.new_input(&[heads, 16, 64], DType::F16).unwrap();
        let k = g.new_input(&[heads, 64, keys], DType::F16).unwrap();
        let v = g.new_input(&[heads, keys, 64], DType::F16).unwrap();
        let mut tb = TbGraphBuilder::new([heads, splits, 1], [128, 1, 1], forloop);
        let tq = tb.new_input(&g, q, [0, -1, -1], -1).unwrap();
        let tk = tb.new_input(&g, k, [0, 2, -1], 2).unwrap();
        let tv = tb.new_input(&g, v, [0, 1, -1], 1).unwrap();
        let s = tb.matmul(tq, tk).unwrap();
        let e = tb.exp(s).unwrap();
        let sum = tb.forloop_accum(e, AccumKind::RedLdSum).unwrap();
        let o = tb.matmul(e, tv).unwrap();
        let o = tb.forloop_accum(o, AccumKind::Nored).unwrap();
        tb.new_output(o, [0, 2, -1]).unwrap();
        tb.new_output(sum, [0, 2, -1]).unwrap();
        let outs = g.customized(tb).unwrap();
        g.mark_output(outs[0]).unwrap();
        g.mark_output(outs[1]).unwrap();
        g.build().unwrap()
    }

    fn assert_same_function(g: &KernelGraph, g2: &KernelGraph) {
        let worst = output_difference(g, g2, 3, Rounding::Exact);
        assert!(worst < 1e-9, "relative difference {worst}");
    }

    #[test]
    fn attention_loops_refine_to_the_same_function() {
        let g = attention(4);
        for r in [2, 4, 8] {
            let lr = refine_loops(&g, r);
            assert_eq!(lr.kept, vec![], "{r}");
            assert_eq!(
                lr.refined,
                vec![RefinedLoop {
                    kernel: 3,
                    forloop: [4, 4 * r],
                    tile: [64, 64 / r],
                    rule: None,
                }]
            );
            let g2 = lr.graph.expect("refined");
            let KnOpKind::Customized(tb) = &g2.ops.iter().nth(3).unwrap().1.kind else {
                panic!("kernel 3 is customized")
            };
            let shapes: Vec<String> = tb
                .tensors
                .iter()
                .map(|(_, t)| t.shape.to_string())
                .collect();
            assert_eq!(shapes[1], format!("[1, 64, {}]", 64 / r));
            assert_eq!(shapes[2], format!("[1, {}, 64]", 64 / r));
            assert_same_function(&g, &g2);
        }
        assert_eq!(refine_loops(&g, 1), LoopRewrite::default());
        // 64 keys per iteration do not split 3 ways.
        let lr = refine_loops(&g, 3);
        assert!(lr.graph.is_none());
        assert!(
            matches!(
                lr.kept[..],
                [(3, NotRefined::Indivisible { extent: 64, .. })]
            ),
            "{lr:?}"
        );
    }

    /// Coarsening is the inverse: 8 iterations of 32 keys become 4 of 64, 2 of 128 or one of
    /// 256, the same function; iterations the factor does not divide stay.
    #[test]
    fn attention_loops_coarsen_to_the_same_function() {
        let g = attention(8);
        for c in [2, 4, 8] {
            let lr = rescale_loops(&g, LoopScale::Coarsen(c));
            assert_eq!(lr.kept, vec![], "{c}");
            assert_eq!(
                lr.refined,
                vec![RefinedLoop {
                    kernel: 3,
                    forloop: [8, 8 / c],
                    tile: [32, 32 * c],
                    rule: None,
                }]
            );
            let g2 = lr.graph.expect("coarsened");
            let KnOpKind::Customized(tb) = &g2.ops.iter().nth(3).unwrap().1.kind else {
                panic!("kernel 3 is customized")
            };
            assert_eq!(
                tb.tensors.iter().nth(1).unwrap().1.shape.to_string(),
                format!("[1, 64, {}]", 32 * c)
            );
            assert_same_function(&g, &g2);
        }
        assert_eq!(
            rescale_loops(&g, LoopScale::Coarsen(1)),
            LoopRewrite {
                scale: LoopScale::Coarsen(1),
                ..LoopRewrite::default()
            }
        );
        let lr = rescale_loops(&g, LoopScale::Coarsen(3));
        assert!(lr.graph.is_none());
        assert_eq!(
            lr.kept,
            vec![(
                3,
                NotRefined::Iterations {
                    forloop: 8,
                    factor: 3
                }
            )]
        );
        assert_eq!(
            lr.kept[0].1.to_string(),
            "its 8 iterations do not divide by 3"
        );
    }

    #[test]
    fn what_does_not_refine_is_said() {
        // A loop-invariant tile summed every iteration.
        let mut g = GraphBuilder::new();
        let x = g.new_input(&[64, 64], DType::F16).unwrap();
        let mut tb = TbGraphBuilder::new([4, 1, 1], [128, 1, 1], 4);
        let t = tb.new_input(&g, x, [0, -1, -1], -1).unwrap();
        let a = tb.forloop_accum(t, AccumKind::Nored).unwrap();
        tb.new_output(a, [0, -1, -1]).unwrap();
        let o = g.customized(tb).unwrap()[0];
        g.mark_output(o).unwrap();
        let lr = refine_loops(&g.build().unwrap(), 2);
        assert!(lr.graph.is_none());
        let [(1, why)] = &lr.kept[..] else {
            panic!("{lr:?}")
        };
        assert_eq!(
            why.to_string(),
            "op1 accum_nored: it sums a loop-invariant tile once per iteration"
        );
        // A walked tile accumulated element-wise: the accumulator would be thinner.
        let mut g = GraphBuilder::new();
        let x = g.new_input(&[64, 256], DType::F16).unwrap();
        let mut tb = TbGraphBuilder::new([4, 1, 1], [128, 1, 1], 4);
        let t = tb.new_input(&g, x, [0, -1, -1], 1).unwrap();
        let e = tb.exp(t).unwrap();
        let a = tb.forloop_accum(e, AccumKind::Nored).unwrap();
        tb.new_output(a, [0, -1, -1]).unwrap();
        let o = g.customized(tb).unwrap()[0];
        g.mark_output(o).unwrap();
        let lr = refine_loops(&g.build().unwrap(), 2);
        assert!(
            matches!(&lr.kept[..], [(1, NotRefined::Operator { op: 2, .. })]),
            "{lr:?}"
        );
        // A row mean over the walked last dim keeps its divisor (extent × iterations).
        let mut g = GraphBuilder::new();
        let x = g.new_input(&[64, 256], DType::F32).unwrap();
        let mut tb = TbGraphBuilder::new([4, 1, 1], [128, 1, 1], 4);
        let t = tb.new_input(&g, x, [0, -1, -1], 1).unwrap();
        let sq = tb.unary(crate::graph::ops::UnaryOp::Square, t).unwrap();
        let a = tb.forloop_accum(sq, AccumKind::RedLdMean).unwrap();
        tb.new_output(a, [0, -1, -1]).unwrap();
        let o = g.customized(tb).unwrap()[0];
        g.mark_output(o).unwrap();
        let g = g.build().unwrap();
        let lr = refine_loops(&g, 2);
        assert_eq!(lr.kept, vec![]);
        assert_same_function(&g, &lr.graph.expect("refined"));
        // A one-iteration loop stays.
        let lr = refine_loops(&attention(1), 2);
        assert_eq!(lr.kept, vec![(3, NotRefined::Once)]);
    }

    /// The online-softmax form (the rewrite of `sched::softmax`) refines: its final max is the
    /// same over thinner iterations and the rescaled sums agree. A rescaling by the factor of
    /// another max than its summands subtract does not.
    #[test]
    fn the_online_form_refines_and_a_mismatched_rescale_does_not() {
        let g = crate::sched::softmax::tests::attention(AccumKind::RedLdSum, true);
        let g2 = crate::sched::softmax::online_softmax(&g, true)
            .graph
            .expect("rewritten");
        for r in [2, 4] {
            let lr = refine_loops(&g2, r);
            assert_eq!(lr.kept, vec![], "{r}");
            assert_eq!(lr.refined.len(), 1);
            assert_same_function(&g2, &lr.graph.expect("refined"));
        }
        // S − m with one running max, the sums rescaled by the factor of another.
        let mut g = GraphBuilder::new();
        let q = g.new_input(&[2, 16, 64], DType::F16).unwrap();
        let k = g.new_input(&[2, 64, 128], DType::F16).unwrap();
        let v = g.new_input(&[2, 128, 64], DType::F16).unwrap();
        let mut tb = TbGraphBuilder::new([2, 1, 1], [128, 1, 1], 4);
        let tq = tb.new_input(&g, q, [0, -1, -1], -1).unwrap();
        let tk = tb.new_input(&g, k, [0, -1, -1], 2).unwrap();
        let tv = tb.new_input(&g, v, [0, -1, -1], 1).unwrap();
        let s = tb.matmul(tq, tk).unwrap();
        let (m, _) = tb.reduction_max(s, 2).unwrap();
        let s2 = tb.exp(s).unwrap();
        let (_, d2) = tb.reduction_max(s2, 2).unwrap();
        let x = tb.sub(s, m).unwrap();
        let e = tb.exp(x).unwrap();
        let f = tb.exp(d2).unwrap();
        let p = tb.matmul(e, tv).unwrap();
        let o = tb
            .forloop_accum_rescale(p, f, AccumKind::NoredRescale)
            .unwrap();
        tb.new_output(o, [0, -1, -1]).unwrap();
        let o = g.customized(tb).unwrap()[0];
        g.mark_output(o).unwrap();
        let lr = refine_loops(&g.build().unwrap(), 2);
        assert!(lr.graph.is_none());
        let [(3, why)] = &lr.kept[..] else {
            panic!("{lr:?}")
        };
        assert!(
            why.to_string()
                .contains("rescales by other than the factor"),
            "{why}"
        );
    }

    /// The planner's rule (`RefineChoice::Auto`): mha_bs8's attention (1024 blocks of 4 warps,
    /// 208 KB each: one per SM) is refined by 2 and planned for 3 blocks per SM on the Hopper
    /// path, mha_bs1's (64 blocks, a loop too short to pipeline) so that it pipelines;
    /// `--refine-loops 1`, the Ampere path, a loop that stays short and one that pipelines
    /// already keep the loop.
    #[test]
    fn the_rule_refines_one_block_per_sm_and_short_loops() {
        use crate::sched::plan::{Options, RefineChoice};
        use crate::target::{Arch, Target};
        let g = attention_of(256, 4096, 4, 4);
        let sm90 = Options::for_target(Target::new(Arch::Sm90a));
        let p = crate::sched::plan(&g, &sm90).unwrap();
        let loops = &p.rewrite.loops;
        assert!(
            loops.rule && loops.scale == LoopScale::Refine(AUTO_FACTOR),
            "{loops:?}"
        );
        let [r] = &loops.refined[..] else {
            panic!("{loops:?}")
        };
        assert_eq!((r.kernel, r.forloop, r.tile), (3, [4, 8], [256, 128]));
        assert_eq!(r.rule, Some(RuleRefinement::Occupancy));
        let kp = &p.kernels[&3];
        assert_eq!(kp.cta.threads, 128);
        assert_eq!(kp.cta.min_blocks_per_sm, AUTO_BLOCKS);
        assert_eq!(p.graph(&g).ops.len(), g.ops.len());
        // Asked for no refinement: one CTA of 8 warps per SM.
        let off = Options {
            refine_loops: RefineChoice::Factor(1),
            ..sm90.clone()
        };
        let p = crate::sched::plan(&g, &off).unwrap();
        assert!(p.rewrite.loops.refined.is_empty() && !p.rewrite.loops.rule);
        assert_eq!(p.kernels[&3].cta.min_blocks_per_sm, 1);
        // mha_bs1's shape (64 blocks, 4 iterations of 512 keys): too short to pipeline as it
        // is; refined, its loads pipeline in rings of 2.
        let small = attention_of(32, 4096, 2, 4);
        let p = crate::sched::plan(&small, &sm90).unwrap();
        let loops = &p.rewrite.loops;
        let [r] = &loops.refined[..] else {
            panic!("{loops:?}")
        };
        assert_eq!(
            (r.forloop, r.rule),
            ([4, 8], Some(RuleRefinement::Pipeline))
        );
        let stages: Vec<usize> = p.kernels[&3]
            .ops
            .iter()
            .filter_map(|o| match o {
                crate::sched::ops::OpPlan::Input { stages, .. } if *stages > 1 => Some(*stages),
                _ => None,
            })
            .collect();
        assert!(!stages.is_empty() && stages.iter().all(|&s| s == AUTO_PIPELINE_STAGES));
        // A loop of 2 refined is still short; a small grid that pipelines already stays.
        let p = crate::sched::plan(&attention_of(32, 2048, 2, 2), &sm90).unwrap();
        assert_eq!(
            p.rewrite.loops.kept,
            vec![(3, NotRefined::Rule(RuleKept::TooShort { forloop: 2 }))]
        );
        let p = crate::sched::plan(&attention(4), &sm90).unwrap();
        assert_eq!(
            p.rewrite.loops.kept,
            vec![(3, NotRefined::Rule(RuleKept::Pipelined { blocks: 8 }))]
        );
        // The Ampere path keeps the loop, and says why.
        let sm80 = Options::for_target(Target::new(Arch::Sm80));
        let p = crate::sched::plan(&g, &sm80).unwrap();
        assert_eq!(
            p.rewrite.loops.kept,
            vec![(3, NotRefined::Rule(RuleKept::AmperePath))]
        );
        assert!(
            NotRefined::Rule(RuleKept::TooFew { blocks: 1 })
                .to_string()
                .ends_with(
                    "refined by 2, shared memory would hold 1 of its blocks per SM, fewer than 3"
                )
        );
    }
}

#[cfg(test)]
mod random_tests {
    use super::*;
    use crate::graph::interp::{Rounding, output_difference};
    use crate::graph::random::{GenConfig, graph};

    /// On the random graphs of `mucc::graph::random`: every refined graph validates and computes
    /// what the original does (the interpreter, exactly).
    #[test]
    fn refined_random_graphs_compute_the_same_function() {
        let cfg = GenConfig::default();
        let mut refined = 0;
        for seed in 0..1500 {
            let g = graph(seed, &cfg);
            for scale in [
                LoopScale::Refine(2),
                LoopScale::Refine(4),
                LoopScale::Coarsen(2),
            ] {
                let lr = rescale_loops(&g, scale);
                let Some(g2) = lr.graph else { continue };
                refined += 1;
                let worst = output_difference(&g, &g2, seed, Rounding::Exact);
                assert!(worst < 1e-9, "seed {seed}, {scale}: {worst}");
            }
        }
        assert!(refined >= 10, "only {refined} refined graphs");
    }
}
