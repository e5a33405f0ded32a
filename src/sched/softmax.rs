//! **Online softmax for split attention** (flash decoding), a rewrite the planner makes before
//! it plans; the caller's graph is never changed.
//!
//! The attention candidates of Mirage's search compute, per block of keys, S = Q·K, E = exp(S),
//! and accumulate E·V and Σ E over the for-loop; grid blocks split the keys, write their
//! partials, and a combining step sums the partials and divides. exp(S) of unnormalised scores
//! overflows 16-bit floats (|S| ≈ 11 already gives 60 000), so on real inputs the partials are
//! infinite. The rewrite computes the same function without overflow:
//!
//! * the attention kernel keeps a running row max m (`reduction_max`, which also gives the
//!   change d = m_old − m_new), exponentiates S − m, and rescales both accumulators by e^d each
//!   iteration (`accum_*_rescale`); it writes three partials per block: O = Σ e^(S−m)·V,
//!   l = Σ e^(S−m) and its final m;
//! * one kernel-level operator, [`KnOpKind::SoftmaxCombine`], replaces the original combining
//!   step (and any kernel-level division after it): per row, M, the max of the splits' m, then
//!   the sums of e^(m−M)·O and e^(m−M)·l over the splits, and their quotient (runtime
//!   `kn::softmax_combine`, planned in `sched::kernel_level`).
//!
//! Exactly: O_final = Σₚ e^(mₚ−M)·Oₚ / Σₚ e^(mₚ−M)·lₚ = Σ e^S·V / Σ e^S. Only the rounding
//! differs; every stored value is bounded (e^(S−m) ≤ 1, lₚ ≤ keys per block).
//!
//! **Key splits folded into the loop** ([`KeyFold`], `--fold-key-splits`): where the grid's
//! blocks without the key splits still fill the GPU, the rewrite may run F consecutive key
//! splits one after the other in one block's for-loop (the split axis keeps splits / F blocks,
//! the loop F times the iterations over the same tiles: block b's iteration i is split
//! b·F + i / n's iteration i mod n, the keys in the same order). Folding every split leaves
//! one block per row block: the kernel then divides O by l after its loop and stores the
//! result itself, and no combining step runs. The running max makes this exact for any
//! number of keys per block.
//!
//! The attention kernel is recognised by structure (one matmul, its exp read by one sum
//! accumulator and by a matmul whose product one `accum_nored` sums; the keys split by at most
//! one grid axis and the for-loop); the combining step, whatever operators it uses, is checked
//! by value: the interpreter runs it on test partials and its result must equal Σ O / Σ l
//! (relative difference ≤ [`COMBINE_TOLERANCE`]). Where either does not hold, the plan says
//! why ([`NoOnlineSoftmax`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::graph::arena::Handle;
use crate::graph::builder::TbGraphBuilder;
use crate::graph::kernel::{DTensor, KernelGraph, KnOp, KnOpKind};
use crate::graph::ops::{AccumKind, BinaryOp, DimMap, UnaryOp};
use crate::graph::shape::Shape;
use crate::graph::threadblock::{STensor, TbGraph, TbOp, TbOpKind};

/// The largest relative difference between the combining step's result on test partials and
/// Σ O / Σ l for the rewrite to replace it (the interpreter computes both in f64).
pub const COMBINE_TOLERANCE: f64 = 1e-9;

/// The most partial elements the combining step is checked on (larger graphs keep their form).
pub const MAX_CHECKED_PARTIALS: usize = 1 << 24;

/// Where the planner applies the rewrite (`--online-softmax`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SoftmaxChoice {
    /// Nowhere: every kernel keeps the graph's form.
    Off,
    /// Where the rewritten attention kernel keeps its scores in registers (a register pipe
    /// with the running max: the rescaling costs a few instructions per element); elsewhere
    /// the graph's form stays, and the plan says why.
    #[default]
    Piped,
    /// Wherever the pattern is recognised, also where the rescaling goes through shared memory
    /// (several times the instructions of the graph's form; measured 1.8–5× the time).
    Always,
}

impl std::str::FromStr for SoftmaxChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(SoftmaxChoice::Off),
            "piped" => Ok(SoftmaxChoice::Piped),
            "always" => Ok(SoftmaxChoice::Always),
            _ => Err(format!(
                "unknown online-softmax choice `{}` (expected off, piped or always)",
                crate::graph::error::clip(s)
            )),
        }
    }
}

impl fmt::Display for SoftmaxChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SoftmaxChoice::Off => "off",
            SoftmaxChoice::Piped => "piped",
            SoftmaxChoice::Always => "always",
        })
    }
}

/// An attention kernel whose softmax the plan computes online.
#[derive(Clone, Debug, PartialEq)]
pub struct OnlineSoftmax {
    /// The attention kernel (kernel operator index in the graph the rewrite was applied to).
    pub kernel: usize,
    /// Its index in the rewritten graph.
    pub rewritten: usize,
    /// The kernel operators the combining operator replaces (same numbering).
    pub replaced: Vec<usize>,
    /// Blocks that split the keys of one row in the graph (1: the for-loop alone walks them).
    pub splits: usize,
    /// What the rewrite did with them.
    pub fold: SplitFold,
    /// The combining operator ([`KnOpKind::SoftmaxCombine`]) in the rewritten graph; `None`
    /// where every key split is folded into the loop and the kernel divides itself.
    pub combine: Option<usize>,
}

/// Whether the rewrite folds key splits into the attention kernel's for-loop
/// (`--fold-key-splits`; see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KeyFold {
    /// Never: every key split stays a block.
    Off,
    /// The planner's rule ([`fold_rule`]).
    #[default]
    Auto,
    /// F consecutive splits per block wherever F divides the splits (F equal to the splits
    /// folds them all).
    By(usize),
}

impl std::str::FromStr for KeyFold {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(KeyFold::Off),
            "auto" => Ok(KeyFold::Auto),
            _ => match s.parse::<usize>() {
                Ok(f) if (1..=MAX_FOLD).contains(&f) => Ok(KeyFold::By(f)),
                _ => Err(format!(
                    "unknown key-split fold `{}` (expected off, auto or a factor from 1 to \
                     {MAX_FOLD})",
                    crate::graph::error::clip(s)
                )),
            },
        }
    }
}

impl fmt::Display for KeyFold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyFold::Off => f.write_str("off"),
            KeyFold::Auto => f.write_str("auto"),
            KeyFold::By(n) => write!(f, "{n}"),
        }
    }
}

/// The largest factor `--fold-key-splits` takes.
pub const MAX_FOLD: usize = 64;

/// What the planner asks of the fold: the choice, and what the rule needs of the target and
/// of the kernels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldAsk {
    /// The choice.
    pub choice: KeyFold,
    /// Whether kernels take the Hopper path (the rule was measured there only).
    pub hopper: bool,
    /// The target's SMs ([`crate::target::Target::typical_sms`]).
    pub sms: usize,
    /// Per kernel operator (its index in the graph), the blocks an SM holds by the shared
    /// memory of its kernel planned with the key splits kept (the planner measures it when the
    /// rule needs it: [`SplitsKept::Unmeasured`]).
    pub resident: BTreeMap<usize, usize>,
}

impl FoldAsk {
    /// No fold anywhere.
    pub const OFF: FoldAsk = FoldAsk {
        choice: KeyFold::Off,
        hopper: false,
        sms: 0,
        resident: BTreeMap::new(),
    };
}

/// Why the key splits folded by the factor they did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoldBy {
    /// `--fold-key-splits N`.
    Asked,
    /// The rule: the grid without any split still has a block for every SM.
    FillsSms,
    /// The rule: the smallest fold whose grid runs in one wave of `resident` blocks per SM
    /// (their shared memory's limit) with a block for every SM.
    OneWave {
        /// Blocks per SM by shared memory.
        resident: usize,
    },
}

/// What the rewrite did with a kernel's key splits ([`OnlineSoftmax::fold`]).
#[derive(Clone, Debug, PartialEq)]
pub enum SplitFold {
    /// Every split stays a block, for this reason.
    Kept(SplitsKept),
    /// `factor` consecutive key splits run in one block's loop: the split axis keeps `left`
    /// blocks (1: the kernel divides O by l and stores the result; no combining step).
    Folded {
        /// Splits per block.
        factor: usize,
        /// Blocks left along the split axis.
        left: usize,
        /// The split axis.
        axis: usize,
        /// The for-loop's iterations before and after.
        forloop: [usize; 2],
        /// What chose it.
        by: FoldBy,
    },
}

/// Why a kernel's key splits stay blocks.
#[derive(Clone, Debug, PartialEq)]
pub enum SplitsKept {
    /// `--fold-key-splits off`.
    Off,
    /// The keys are not split over blocks.
    NoSplit,
    /// The for-loop does not walk the keys of K and V (it runs once).
    NotLooped,
    /// The factor asked for does not divide the splits.
    Indivisible {
        /// The splits.
        splits: usize,
        /// The factor.
        factor: usize,
    },
    /// The rule: not the Hopper path.
    AmperePath,
    /// The rule: the grid already runs in one wave (`blocks` within `wave`, the SMs times the
    /// blocks each holds).
    OneWave {
        /// The grid's blocks.
        blocks: usize,
        /// Blocks of one wave.
        wave: usize,
    },
    /// The rule needs the blocks per SM of the kernel with its splits kept, and that graph did
    /// not plan.
    Unmeasured,
    /// The rule: the grid without the splits would not fill the SMs, and no partial fold both
    /// fits one wave and leaves a block for every SM.
    FewBlocks {
        /// The grid's blocks.
        blocks: usize,
        /// The key splits.
        splits: usize,
        /// The target's SMs.
        sms: usize,
    },
    /// The folded graph does not validate or plan.
    Plan(crate::sched::plan::RewriteFailure),
}

impl fmt::Display for SplitFold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SplitFold::Kept(why) => write!(f, "the key splits stay blocks: {why}"),
            SplitFold::Folded {
                factor,
                left,
                axis,
                forloop: [from, to],
                by,
            } => {
                write!(
                    f,
                    "{factor} key splits folded into each block's for-loop ({left} block{} \
                     along {} left, {to} iterations instead of {from}",
                    if *left == 1 { "" } else { "s" },
                    crate::graph::ops::AXIS_NAMES[*axis]
                )?;
                if *left == 1 {
                    f.write_str(
                        "; the kernel divides O by l and stores the result, no combining step",
                    )?;
                }
                match by {
                    FoldBy::FillsSms => f.write_str(
                        "; the planner's rule: the grid without the splits fills the SMs; \
                         --fold-key-splits off keeps them)",
                    ),
                    FoldBy::OneWave { resident } => write!(
                        f,
                        "; the planner's rule: the smallest fold whose grid runs in one wave of \
                         {resident} blocks per SM (their shared memory's limit) with a block on \
                         every SM; --fold-key-splits off keeps them)"
                    ),
                    FoldBy::Asked => f.write_str("; --fold-key-splits)"),
                }
            }
        }
    }
}

impl fmt::Display for SplitsKept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SplitsKept::Off => f.write_str("--fold-key-splits off"),
            SplitsKept::NoSplit => f.write_str("the keys are not split over blocks"),
            SplitsKept::NotLooped => {
                f.write_str("the for-loop does not walk the keys of K and V (it runs once)")
            }
            SplitsKept::Indivisible { splits, factor } => {
                write!(f, "{factor} does not divide the {splits} key splits")
            }
            SplitsKept::AmperePath => f.write_str(
                "the planner's rule folds on the Hopper path only (--fold-key-splits N asks)",
            ),
            SplitsKept::OneWave { blocks, wave } => write!(
                f,
                "the planner's rule folds where the grid would take more than one wave, and its \
                 {blocks} blocks fit the {wave} of one (--fold-key-splits N asks)"
            ),
            SplitsKept::Unmeasured => f.write_str(
                "the planner's rule needs the blocks per SM of the kernel with its splits kept, \
                 and that graph does not plan (--fold-key-splits N asks)",
            ),
            SplitsKept::FewBlocks {
                blocks,
                splits,
                sms,
            } => write!(
                f,
                "the planner's rule folds every split where the grid without them fills the SMs, \
                 else the least that fits one wave with a block on every SM, and {blocks} blocks \
                 of {splits} splits on {sms} SMs allow neither (--fold-key-splits N asks)"
            ),
            SplitsKept::Plan(why) => write!(f, "the folded graph does not plan: {why}"),
        }
    }
}

/// The planner's rule ([`KeyFold::Auto`]), on the Hopper path: a kernel whose grid without
/// its key splits still has a block for every SM folds all of them into the loop (no combining
/// step runs); otherwise, where the grid takes more than one wave of `resident` blocks per SM
/// (what their shared memory allows; `None`: not measured), the smallest factor whose grid
/// fits one wave and still has a block for every SM (the combining step stays, over fewer
/// partials). Measured on an NVIDIA H100 (docs/benchmarks.md, "Key splits folded into the
/// loop"): mha_bs8 graph 30 (1,024 blocks, 4 splits) 96.5 µs → 90.2 folded fully, 99.2 by 2;
/// gqa_bs8 (1,024 blocks, 16 splits, 5 blocks per SM) 25.5 → 20.1 by 2 (one wave of 660),
/// 23.0 by 4; mqa_bs8 (1,024 blocks, 8 splits, 3 blocks per SM) 34.2 → 33.7 by 2 (512 blocks
/// in waves of 396), 31.2 by 4, 43.6 by 8 (128 blocks on 132 SMs); grids of 128 blocks or
/// fewer, one wave already, slower folded (gqa_bs1 9.0 → 11.4, mqa_bs1 9.8 → 14.6 by 2,
/// mha_bs1 19.2 → 24.2).
pub fn fold_rule(
    blocks: usize,
    splits: usize,
    resident: Option<usize>,
    ask: &FoldAsk,
) -> Result<(usize, FoldBy), SplitsKept> {
    if !ask.hopper {
        return Err(SplitsKept::AmperePath);
    }
    let splits = splits.max(1);
    if blocks / splits >= ask.sms {
        return Ok((splits, FoldBy::FillsSms));
    }
    let resident = resident.ok_or(SplitsKept::Unmeasured)?.max(1);
    let wave = resident * ask.sms;
    if blocks <= wave {
        return Err(SplitsKept::OneWave { blocks, wave });
    }
    (2..splits)
        .find(|&f| splits.is_multiple_of(f) && blocks / f <= wave && blocks / f >= ask.sms)
        .map(|f| (f, FoldBy::OneWave { resident }))
        .ok_or(SplitsKept::FewBlocks {
            blocks,
            splits,
            sms: ask.sms,
        })
}

/// The factor kernel `tb`'s `splits` key splits fold by under `ask` and whether the rule chose
/// it, or why they stay blocks; `looped`: the for-loop walks the keys of K and V.
fn fold_factor(
    tb: &TbGraph,
    kernel: usize,
    splits: usize,
    looped: bool,
    ask: &FoldAsk,
) -> Result<(usize, FoldBy), SplitsKept> {
    if splits <= 1 {
        return Err(SplitsKept::NoSplit);
    }
    let asked = match ask.choice {
        KeyFold::Off | KeyFold::By(..=1) => return Err(SplitsKept::Off),
        KeyFold::By(f) => Some(f),
        KeyFold::Auto => None,
    };
    if !looped {
        return Err(SplitsKept::NotLooped);
    }
    match asked {
        Some(f) if splits.is_multiple_of(f) => Ok((f, FoldBy::Asked)),
        Some(factor) => Err(SplitsKept::Indivisible { splits, factor }),
        None => fold_rule(
            tb.num_blocks(),
            splits,
            ask.resident.get(&kernel).copied(),
            ask,
        ),
    }
}

/// Why a rewritten attention kernel would not keep its running max and rescaling in a
/// register pipe.
#[derive(Clone, Debug, PartialEq)]
pub enum NotPiped {
    /// The rewritten operator is not planned as a threadblock kernel.
    NotThreadblock,
    /// A product goes through shared memory, for this reason.
    Pipe(crate::sched::plan::PipeOff),
    /// No register pipe recognises the running max.
    NoRunningMax,
}

impl fmt::Display for NotPiped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotPiped::NotThreadblock => f.write_str("it is not a threadblock kernel"),
            NotPiped::Pipe(why) => write!(f, "{why}"),
            NotPiped::NoRunningMax => f.write_str("no register pipe recognises the running max"),
        }
    }
}

/// Why an attention-like kernel keeps the softmax as the graph computes it.
#[derive(Clone, Debug, PartialEq)]
pub enum NoOnlineSoftmax {
    /// Turned off (`--online-softmax off`).
    Off,
    /// The rewritten kernel would rescale through shared memory (`--online-softmax piped`).
    NotPiped(NotPiped),
    /// More than one exponential of a matmul product in the kernel.
    SeveralExps,
    /// The scores are loaded (computed by another operator), not a matmul in this kernel.
    ScoresLoaded,
    /// The scores S are read by something besides exp.
    ScoresReadTwice,
    /// exp(S) is not read by exactly one sum accumulator and one matmul E·V.
    ExpReaders(ExpReaders),
    /// The product E·V is not summed by one `accum_nored`.
    ProductNotAccumulated,
    /// The kernel computes something besides the pattern: this threadblock operator.
    OtherOp(TbOpAt),
    /// The kernel's outputs are not exactly the two partials.
    Outputs(OutputsOff),
    /// The keys are not partitioned as the rewrite needs.
    Keys(KeysOff),
    /// The operators after the kernel are not only a combining step.
    Downstream(DownstreamOff),
    /// The combining step does not compute Σ O / Σ l.
    Combine(CombineOff),
    /// The rewritten graph does not validate or plan.
    Plan(crate::sched::plan::RewriteFailure),
}

impl fmt::Display for NoOnlineSoftmax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoOnlineSoftmax::Off => f.write_str("the online-softmax rewrite is turned off"),
            NoOnlineSoftmax::NotPiped(why) => write!(
                f,
                "the rewritten kernel would rescale through shared memory, not in registers \
                 ({why}; --online-softmax always applies it anyway)"
            ),
            NoOnlineSoftmax::SeveralExps => {
                f.write_str("it exponentiates more than one matmul product")
            }
            NoOnlineSoftmax::ScoresLoaded => f.write_str(
                "it loads its scores S (another operator computes Q·K; their max is not known \
                 here)",
            ),
            NoOnlineSoftmax::ScoresReadTwice => {
                f.write_str("its scores S = Q·K are read by more than exp")
            }
            NoOnlineSoftmax::ExpReaders(why) => write!(f, "exp(S) is read by {why}"),
            NoOnlineSoftmax::ProductNotAccumulated => {
                f.write_str("the product exp(S)·V is not summed by one accum_nored")
            }
            NoOnlineSoftmax::OtherOp(op) => write!(f, "it also computes {op}"),
            NoOnlineSoftmax::Outputs(why) => write!(f, "its outputs {why}"),
            NoOnlineSoftmax::Keys(why) => write!(f, "its keys {why}"),
            NoOnlineSoftmax::Downstream(why) => write!(f, "after it, {why}"),
            NoOnlineSoftmax::Combine(why) => write!(f, "the combining step {why}"),
            NoOnlineSoftmax::Plan(why) => write!(f, "the rewritten graph does not plan: {why}"),
        }
    }
}

/// Who reads exp(S) where the pattern wants one sum accumulator and one matmul exp(S)·V.
#[derive(Clone, Debug, PartialEq)]
pub enum ExpReaders {
    /// One of the two is missing; `readers` are the readers there are.
    Missing {
        /// The readers.
        readers: Vec<TbOpAt>,
    },
    /// Both are there, and more readers.
    Extra {
        /// The readers.
        readers: Vec<TbOpAt>,
    },
}

impl fmt::Display for ExpReaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |readers: &[TbOpAt]| {
            readers
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            ExpReaders::Missing { readers } => write!(
                f,
                "{} (the pattern: one sum accumulator and one matmul exp(S)·V; a denominator \
                 computed elsewhere is not rescaled)",
                if readers.is_empty() {
                    "nothing".to_string()
                } else {
                    list(readers)
                }
            ),
            ExpReaders::Extra { readers } => write!(
                f,
                "{} (the pattern: one sum accumulator and one matmul exp(S)·V)",
                list(readers)
            ),
        }
    }
}

/// A threadblock operator a reason names: its number in the kernel's threadblock graph and its
/// kind (printed "op N (kind)").
#[derive(Clone, Debug, PartialEq)]
pub struct TbOpAt {
    /// The operator's number.
    pub op: usize,
    /// Its kind.
    pub kind: TbOpKind,
}

impl TbOpAt {
    /// Operator `h` of `tb`.
    fn of(tb: &TbGraph, h: Handle<TbOp>) -> TbOpAt {
        TbOpAt {
            op: h.index(),
            kind: tb.ops[h].kind.clone(),
        }
    }
}

impl fmt::Display for TbOpAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op {} ({})", self.op, self.kind.name())
    }
}

/// Which of the two partials an output stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Partial {
    /// Σ exp(S)·V.
    O,
    /// Σ exp(S).
    L,
}

impl fmt::Display for Partial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Partial::O => "Σ exp(S)·V",
            Partial::L => "Σ exp(S)",
        })
    }
}

/// Why the kernel's outputs are not the two partials as the rewrite writes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputsOff {
    /// Not both partials are stored.
    Missing,
    /// More than the two partials.
    Extra,
    /// The two partials have different row tiles.
    RowTiles,
    /// Grid axis `axis` places a partial along its last dim (or not) unlike the key split.
    Placed {
        /// The partial.
        what: Partial,
        /// The grid axis.
        axis: usize,
    },
    /// Grid axis `axis` places the two partials differently.
    Differently {
        /// The grid axis.
        axis: usize,
    },
}

impl fmt::Display for OutputsOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |a: &usize| crate::graph::ops::AXIS_NAMES[*a];
        match self {
            OutputsOff::Missing => {
                f.write_str("do not store both partials (Σ exp(S)·V and Σ exp(S))")
            }
            OutputsOff::Extra => {
                f.write_str("are more than the two partials Σ exp(S)·V and Σ exp(S)")
            }
            OutputsOff::RowTiles => f.write_str("have different row tiles"),
            OutputsOff::Placed { what, axis } => write!(
                f,
                "place {what} along its last dim by grid axis {} (the partials of the key \
                 splits go there, and only they)",
                name(axis)
            ),
            OutputsOff::Differently { axis } => {
                write!(f, "are placed differently by grid axis {}", name(axis))
            }
        }
    }
}

/// Why the keys are not partitioned as the rewrite needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeysOff {
    /// S has fewer than two dims.
    NotMatrix,
    /// Q, K or V is a computed tile.
    Computed,
    /// K and V split the keys differently.
    SplitDiffers,
    /// More than one grid axis splits them.
    SeveralAxes,
    /// The for-loop does not walk them in K and V.
    NotLooped,
    /// Q changes over the for-loop.
    QLoops,
    /// Grid axis `axis` splits the keys and Q.
    SplitsQ {
        /// The grid axis.
        axis: usize,
    },
}

impl fmt::Display for KeysOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeysOff::NotMatrix => f.write_str("are not a matrix dim"),
            KeysOff::Computed => {
                f.write_str("come from a computed tile (Q, K and V must be loaded tiles)")
            }
            KeysOff::SplitDiffers => f.write_str("are split differently in K and V"),
            KeysOff::SeveralAxes => f.write_str("are split by more than one grid axis"),
            KeysOff::NotLooped => f.write_str("are not what the for-loop walks in K and V"),
            KeysOff::QLoops => f.write_str("come with a Q that changes over the for-loop"),
            KeysOff::SplitsQ { axis } => write!(
                f,
                "are split by grid axis {}, which also splits Q",
                crate::graph::ops::AXIS_NAMES[*axis]
            ),
        }
    }
}

/// Why the operators after the kernel are not only a combining step.
#[derive(Clone, Debug, PartialEq)]
pub enum DownstreamOff {
    /// Its combining step is shared with another attention kernel.
    Shared,
    /// The result is not a tensor of the partial O's dtype and `want` shape.
    Result {
        /// The result tensor.
        tensor: usize,
        /// O's dtype.
        dtype: crate::graph::dtype::DType,
        /// The shape it should have.
        want: Shape,
    },
    /// Kernel op `op` combines the partials with another tensor.
    CombinesWith {
        /// The operator.
        op: usize,
        /// Its kind's name.
        kind: String,
        /// The other tensor.
        tensor: usize,
    },
    /// The partials or more than one result are graph outputs.
    Outputs,
    /// Kernel op `op` (an input or an all-reduce) reads the partials.
    Reads {
        /// The operator.
        op: usize,
        /// Its kind's name.
        kind: String,
    },
    /// No graph output depends on the partials.
    NoOutput,
    /// The result is read by more than its graph output.
    ResultReadTwice {
        /// The result tensor.
        tensor: usize,
    },
}

impl fmt::Display for DownstreamOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DownstreamOff::Shared => {
                f.write_str("its combining step is shared with another attention kernel")
            }
            DownstreamOff::Result {
                tensor,
                dtype,
                want,
            } => write!(f, "the result %{tensor} is not a {dtype} {want:?} tensor"),
            DownstreamOff::CombinesWith { op, kind, tensor } => {
                write!(
                    f,
                    "kernel op {op} ({kind}) combines the partials with %{tensor}"
                )
            }
            DownstreamOff::Outputs => {
                f.write_str("the partials or more than one result are graph outputs")
            }
            DownstreamOff::Reads { op, kind } => {
                write!(f, "kernel op {op} ({kind}) reads the partials")
            }
            DownstreamOff::NoOutput => f.write_str("no graph output depends on the partials"),
            DownstreamOff::ResultReadTwice { tensor } => {
                write!(
                    f,
                    "the result %{tensor} is read by more than its graph output"
                )
            }
        }
    }
}

/// Why the combining step is not taken as Σ O / Σ l.
#[derive(Clone, Debug, PartialEq)]
pub enum CombineOff {
    /// Its partials have more than [`MAX_CHECKED_PARTIALS`] elements.
    TooLarge,
    /// It does not validate alone.
    NotAlone(crate::graph::error::ValidationErrors),
    /// The interpreter cannot evaluate it.
    NotEvaluated(crate::graph::error::GraphError),
    /// Its result on test partials differs from Σ O / Σ l by `rel`.
    Differs {
        /// The relative difference.
        rel: f64,
    },
}

impl fmt::Display for CombineOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CombineOff::TooLarge => write!(
                f,
                "is not checked: its partials have more than {MAX_CHECKED_PARTIALS} elements"
            ),
            CombineOff::NotAlone(e) => write!(f, "does not stand alone: {e}"),
            CombineOff::NotEvaluated(e) => write!(f, "does not evaluate: {e}"),
            CombineOff::Differs { rel } => write!(
                f,
                "does not compute Σ O / Σ l over the key splits (relative difference {rel:.2e} \
                 on test partials)"
            ),
        }
    }
}

/// What [`online_softmax`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SoftmaxRewrite {
    /// The rewritten graph, when some kernel was rewritten.
    pub graph: Option<Box<KernelGraph>>,
    /// The kernels rewritten.
    pub applied: Vec<OnlineSoftmax>,
    /// Kernels that exponentiate a matmul product but keep their form, and why (kernel
    /// operator index in the graph the rewrite was tried on).
    pub declined: Vec<(usize, NoOnlineSoftmax)>,
}

impl SoftmaxRewrite {
    /// Keeps every rewritten kernel's form after all, with `why` (the rewritten graph did not
    /// plan).
    pub fn undo(&mut self, why: NoOnlineSoftmax) {
        self.graph = None;
        for a in self.applied.drain(..) {
            self.declined.push((a.kernel, why.clone()));
        }
        self.declined.sort_by_key(|(k, _)| *k);
    }
}

/// One recognised attention kernel.
#[derive(Clone)]
struct Found {
    op: Handle<KnOp>,
    exp: Handle<TbOp>,
    sum: Handle<TbOp>,
    acc: Handle<TbOp>,
    out_o: Handle<TbOp>,
    out_l: Handle<TbOp>,
    splits: usize,
    /// The grid axis of the key splits.
    axis: Option<usize>,
    /// Whether the for-loop walks the keys of K and V.
    looped: bool,
    /// Splits per block after the fold and what chose it, or why the splits stay blocks.
    fold: Result<(usize, FoldBy), SplitsKept>,
    o: Handle<DTensor>,
    l: Handle<DTensor>,
    omap: DimMap,
    /// The non-output kernel operators after it that compute the final result.
    downstream: Vec<Handle<KnOp>>,
    /// The final result (what the graph outputs).
    result: Handle<DTensor>,
}

/// Tries the rewrite on every customized operator of `g` that exponentiates a matmul product
/// or multiplies an exponential by a matrix.
/// `on` false declines each with [`NoOnlineSoftmax::Off`].
pub fn online_softmax(g: &KernelGraph, on: bool) -> SoftmaxRewrite {
    online_softmax_where(g, on, &FoldAsk::OFF, &|_| None)
}

/// [`online_softmax`] with key splits folded as `fold` asks, declining the kernels for which
/// `veto` gives a reason.
pub fn online_softmax_where(
    g: &KernelGraph,
    on: bool,
    fold: &FoldAsk,
    veto: &dyn Fn(usize) -> Option<NoOnlineSoftmax>,
) -> SoftmaxRewrite {
    online_softmax_from(g, &recognise_attention(g, on), fold, veto)
}

/// The attention kernels of a graph, each recognised and its combining step checked in the
/// interpreter, or why not ([`recognise_attention`]). Planning tries the rewrite several times
/// over one graph (other fold choices, vetoes): [`online_softmax_from`] reads this instead of
/// checking every combining step again.
pub struct Recognised {
    /// Whether the rewrite is on (off: every kernel declines with [`NoOnlineSoftmax::Off`]).
    on: bool,
    /// Per customized operator that exponentiates a matmul product or multiplies an
    /// exponential by a matrix, in operator order: what was recognised, or why not.
    kernels: Vec<(Handle<KnOp>, Result<Found, NoOnlineSoftmax>)>,
}

/// Recognises the attention kernels of `g` and checks their combining steps (nothing when `on`
/// is false).
pub fn recognise_attention(g: &KernelGraph, on: bool) -> Recognised {
    let mut kernels = Vec::new();
    for (h, op) in g.ops.iter() {
        let KnOpKind::Customized(tb) = &op.kind else {
            continue;
        };
        let exps = exps_of_products(tb);
        if exps.is_empty() {
            continue;
        }
        let found = if on {
            recognise(g, h, tb, &exps).and_then(|f| check_combine(g, tb, f))
        } else {
            Err(NoOnlineSoftmax::Off)
        };
        kernels.push((h, found));
    }
    Recognised { on, kernels }
}

/// [`online_softmax_where`] from the kernels `rec` recognised in `g`.
pub fn online_softmax_from(
    g: &KernelGraph,
    rec: &Recognised,
    fold: &FoldAsk,
    veto: &dyn Fn(usize) -> Option<NoOnlineSoftmax>,
) -> SoftmaxRewrite {
    let mut rw = SoftmaxRewrite::default();
    let mut found = Vec::new();
    for (h, recognised) in &rec.kernels {
        let KnOpKind::Customized(tb) = &g.ops[*h].kind else {
            continue;
        };
        if !rec.on {
            rw.declined.push((h.index(), NoOnlineSoftmax::Off));
            continue;
        }
        if let Some(why) = veto(h.index()) {
            rw.declined.push((h.index(), why));
            continue;
        }
        match recognised.clone() {
            Ok(mut f) => {
                f.fold = fold_factor(tb, h.index(), f.splits, f.looped, fold);
                found.push(f)
            }
            Err(why) => rw.declined.push((h.index(), why)),
        }
    }
    // Two kernels whose combining steps overlap cannot both be replaced; keep the first.
    let mut taken: BTreeSet<Handle<KnOp>> = BTreeSet::new();
    found.retain(|f| {
        let clash = f.downstream.iter().any(|d| taken.contains(d)) || taken.contains(&f.op);
        if clash {
            rw.declined.push((
                f.op.index(),
                NoOnlineSoftmax::Downstream(DownstreamOff::Shared),
            ));
        } else {
            taken.extend(f.downstream.iter().copied());
            taken.insert(f.op);
        }
        !clash
    });
    if found.is_empty() {
        return rw;
    }
    match rebuild(g, &found) {
        Ok((g2, applied)) => {
            rw.graph = Some(Box::new(g2));
            rw.applied = applied;
        }
        Err(why) => {
            for f in &found {
                rw.declined.push((f.op.index(), why.clone()));
            }
        }
    }
    rw.declined.sort_by_key(|(k, _)| *k);
    rw
}

/// The threadblock exp operators that look like attention's: their input is a threadblock
/// matmul's product, or their result is a matmul's left operand. None in a kernel that keeps
/// a running max already (its softmax is online as written).
fn exps_of_products(tb: &TbGraph) -> Vec<Handle<TbOp>> {
    let online = tb.ops.iter().any(|(_, op)| {
        matches!(
            op.kind,
            TbOpKind::Reduction {
                kind: crate::graph::ops::TbReduction::Max,
                ..
            }
        )
    });
    if online {
        return Vec::new();
    }
    let producers = tb.producers();
    // The tiles some matmul takes as A, found once (a scan per exp made long chains quadratic).
    let mut a_of_matmul = vec![false; tb.tensors.len()];
    for (_, r) in tb.ops.iter() {
        if matches!(r.kind, TbOpKind::Matmul) {
            a_of_matmul[r.inputs[0].index()] = true;
        }
    }
    tb.ops
        .iter()
        .filter(|(_, op)| matches!(op.kind, TbOpKind::Unary(UnaryOp::Exp)))
        .filter(|(_, op)| {
            let of_product = producers[op.inputs[0].index()]
                .is_some_and(|p| matches!(tb.ops[p].kind, TbOpKind::Matmul));
            of_product || a_of_matmul[op.outputs[0].index()]
        })
        .map(|(h, _)| h)
        .collect()
}

/// The threadblock input operator that loads `t`, if an input loads it.
fn input_of(tb: &TbGraph, t: Handle<STensor>) -> Option<(usize, DimMap, Option<usize>)> {
    let p = tb.producer(t)?;
    match tb.ops[p].kind {
        TbOpKind::Input {
            input,
            imap,
            forloop_dim,
        } => Some((input, imap, forloop_dim)),
        _ => None,
    }
}

fn recognise(
    g: &KernelGraph,
    h: Handle<KnOp>,
    tb: &TbGraph,
    exps: &[Handle<TbOp>],
) -> Result<Found, NoOnlineSoftmax> {
    let [exp] = exps[..] else {
        return Err(NoOnlineSoftmax::SeveralExps);
    };
    let rd = tb.readers();
    let producers = tb.producers();
    let s = tb.ops[exp].inputs[0];
    let mm1 = match producers[s.index()] {
        Some(p) if matches!(tb.ops[p].kind, TbOpKind::Matmul) => p,
        _ => return Err(NoOnlineSoftmax::ScoresLoaded),
    };
    if rd[s.index()] != [exp] {
        return Err(NoOnlineSoftmax::ScoresReadTwice);
    }
    let e = tb.ops[exp].outputs[0];
    let names = |hs: &[Handle<TbOp>]| hs.iter().map(|&r| TbOpAt::of(tb, r)).collect();
    let mut sum = None;
    let mut mm2 = None;
    for &r in &rd[e.index()] {
        match tb.ops[r].kind {
            TbOpKind::Accum(AccumKind::RedLdSum | AccumKind::Nored | AccumKind::RedtoxLdSum)
                if sum.is_none() =>
            {
                sum = Some(r)
            }
            TbOpKind::Matmul if mm2.is_none() && tb.ops[r].inputs[0] == e => mm2 = Some(r),
            _ => {}
        }
    }
    let (Some(sum), Some(mm2)) = (sum, mm2) else {
        return Err(NoOnlineSoftmax::ExpReaders(ExpReaders::Missing {
            readers: names(&rd[e.index()]),
        }));
    };
    if rd[e.index()].len() != 2 {
        return Err(NoOnlineSoftmax::ExpReaders(ExpReaders::Extra {
            readers: names(&rd[e.index()]),
        }));
    }
    let p = tb.ops[mm2].outputs[0];
    let acc = match rd[p.index()][..] {
        [a] if tb.ops[a].kind == TbOpKind::Accum(AccumKind::Nored) => a,
        _ => return Err(NoOnlineSoftmax::ProductNotAccumulated),
    };
    let pattern = [mm1, exp, sum, mm2, acc];
    for (oh, op) in tb.ops.iter() {
        if !pattern.contains(&oh)
            && !matches!(op.kind, TbOpKind::Input { .. } | TbOpKind::Output { .. })
        {
            return Err(NoOnlineSoftmax::OtherOp(TbOpAt::of(tb, oh)));
        }
    }
    let (o_tile, l_tile) = (tb.ops[acc].outputs[0], tb.ops[sum].outputs[0]);
    let outputs: Vec<(Handle<TbOp>, &TbOp)> = tb
        .ops
        .iter()
        .filter(|(_, op)| matches!(op.kind, TbOpKind::Output { .. }))
        .collect();
    let find = |t: Handle<STensor>| {
        outputs
            .iter()
            .find(|(_, op)| op.inputs[0] == t)
            .map(|&(oh, op)| match op.kind {
                TbOpKind::Output { output, omap } => (oh, output, omap),
                _ => unreachable!(),
            })
    };
    let (Some((out_o, o_slot, omap)), Some((out_l, l_slot, lmap))) = (find(o_tile), find(l_tile))
    else {
        return Err(NoOnlineSoftmax::Outputs(OutputsOff::Missing));
    };
    if outputs.len() != 2 || rd[o_tile.index()].len() != 1 || rd[l_tile.index()].len() != 1 {
        return Err(NoOnlineSoftmax::Outputs(OutputsOff::Extra));
    }
    // Keys: S's last dim; K's (mm1 B) last dim, V's (mm2 B) second to last.
    let r = tb.tensors[s].shape.rank();
    if r < 2 {
        return Err(NoOnlineSoftmax::Keys(KeysOff::NotMatrix));
    }
    let (Some(q_in), Some(k_in), Some(v_in)) = (
        input_of(tb, tb.ops[mm1].inputs[0]),
        input_of(tb, tb.ops[mm1].inputs[1]),
        input_of(tb, tb.ops[mm2].inputs[1]),
    ) else {
        return Err(NoOnlineSoftmax::Keys(KeysOff::Computed));
    };
    let splitting = |imap: DimMap, dim: usize| -> Vec<usize> {
        (0..3)
            .filter(|&a| tb.grid[a] > 1 && imap.axis(a) == Some(dim))
            .collect()
    };
    let split_v = splitting(v_in.1, r - 2);
    let split_k = splitting(k_in.1, r - 1);
    if split_v != split_k {
        return Err(NoOnlineSoftmax::Keys(KeysOff::SplitDiffers));
    }
    let split = match split_v[..] {
        [] => None,
        [a] => Some(a),
        _ => {
            return Err(NoOnlineSoftmax::Keys(KeysOff::SeveralAxes));
        }
    };
    if tb.forloop_range > 1 && (k_in.2 != Some(r - 1) || v_in.2 != Some(r - 2)) {
        return Err(NoOnlineSoftmax::Keys(KeysOff::NotLooped));
    }
    if q_in.2.is_some() {
        return Err(NoOnlineSoftmax::Keys(KeysOff::QLoops));
    }
    if let Some(a) = split
        && q_in.1.axis(a).is_some()
    {
        return Err(NoOnlineSoftmax::Keys(KeysOff::SplitsQ { axis: a }));
    }
    // Partials: the split axis places them along the last dim, the other axes identically.
    let op = &g.ops[h];
    let (o, l) = (op.outputs[o_slot], op.outputs[l_slot]);
    let (ot, lt) = (&tb.tensors[o_tile].shape, &tb.tensors[l_tile].shape);
    if g.tensors[o].shape.rank() != r || ot.dims()[..r - 1] != lt.dims()[..r - 1] {
        return Err(NoOnlineSoftmax::Outputs(OutputsOff::RowTiles));
    }
    for a in 0..3 {
        if tb.grid[a] <= 1 {
            continue;
        }
        let want_last = Some(a) == split;
        for (m, what) in [(omap, Partial::O), (lmap, Partial::L)] {
            if (m.axis(a) == Some(r - 1)) != want_last {
                return Err(NoOnlineSoftmax::Outputs(OutputsOff::Placed {
                    what,
                    axis: a,
                }));
            }
        }
        if omap.axis(a) != lmap.axis(a) {
            return Err(NoOnlineSoftmax::Outputs(OutputsOff::Differently {
                axis: a,
            }));
        }
    }
    let splits = split.map_or(1, |a| tb.grid[a]);
    let (downstream, result) = downstream(g, h, o, l)?;
    let want = g.tensors[o].shape.with_dim(r - 1, ot.dim(r - 1));
    if g.tensors[result].shape != want || g.tensors[result].dtype != g.tensors[o].dtype {
        return Err(NoOnlineSoftmax::Downstream(DownstreamOff::Result {
            tensor: result.index(),
            dtype: g.tensors[o].dtype,
            want,
        }));
    }
    Ok(Found {
        op: h,
        exp,
        sum,
        acc,
        out_o,
        out_l,
        splits,
        axis: split,
        looped: k_in.2 == Some(r - 1) && v_in.2 == Some(r - 2),
        fold: Err(SplitsKept::Off),
        o,
        l,
        omap,
        downstream,
        result,
    })
}

/// The operators after `h` that read its partials `o` and `l` (transitively), up to the one
/// graph output: (the non-output operators, the result).
fn downstream(
    g: &KernelGraph,
    h: Handle<KnOp>,
    o: Handle<DTensor>,
    l: Handle<DTensor>,
) -> Result<(Vec<Handle<KnOp>>, Handle<DTensor>), NoOnlineSoftmax> {
    let mut set: BTreeSet<Handle<DTensor>> = [o, l].into();
    let mut ops = Vec::new();
    let mut result = None;
    for (oh, op) in g.ops.iter().skip(h.index() + 1) {
        if !op.inputs.iter().any(|t| set.contains(t)) {
            continue;
        }
        if let Some(t) = op.inputs.iter().find(|t| !set.contains(t)) {
            return Err(NoOnlineSoftmax::Downstream(DownstreamOff::CombinesWith {
                op: oh.index(),
                kind: op.kind.name(),
                tensor: t.index(),
            }));
        }
        match &op.kind {
            KnOpKind::Output { .. } => {
                let t = op.inputs[0];
                if t == o || t == l || result.is_some() {
                    return Err(NoOnlineSoftmax::Downstream(DownstreamOff::Outputs));
                }
                result = Some(t);
            }
            KnOpKind::Input { .. } | KnOpKind::AllReduce { .. } => {
                return Err(NoOnlineSoftmax::Downstream(DownstreamOff::Reads {
                    op: oh.index(),
                    kind: op.kind.name(),
                }));
            }
            _ => {
                ops.push(oh);
                set.extend(op.outputs.iter().copied());
            }
        }
    }
    let Some(result) = result else {
        return Err(NoOnlineSoftmax::Downstream(DownstreamOff::NoOutput));
    };
    // The result must be read by its output alone (nothing else would see the new kernel).
    let readers = g
        .ops
        .iter()
        .filter(|(_, op)| op.inputs.contains(&result))
        .count();
    if readers != 1 || ops.is_empty() {
        return Err(NoOnlineSoftmax::Downstream(
            DownstreamOff::ResultReadTwice {
                tensor: result.index(),
            },
        ));
    }
    Ok((ops, result))
}

/// Per-dim offsets of the tile that block `c` places with `map` (tile `tile`).
fn offsets(c: [usize; 3], map: DimMap, tile: &Shape) -> Vec<usize> {
    let mut off = vec![0; tile.rank()];
    for (a, &ca) in c.iter().enumerate() {
        if let Some(d) = map.axis(a) {
            off[d] += ca * tile.dim(d);
        }
    }
    off
}

/// Row-major strides of a shape.
fn strides(s: &Shape) -> Vec<usize> {
    s.row_major_strides().0
}

/// A deterministic test value in [1, 2), exact in every 16-bit float type.
fn test_value(i: usize, salt: usize) -> f64 {
    let x = (i.wrapping_add(salt.wrapping_mul(0x9e37_79b9)))
        .wrapping_mul(0x2545_f491)
        .rotate_right(11);
    1.0 + (x % 64) as f64 / 64.0
}

/// Runs the combining step (the operators after the kernel) on test partials in the
/// interpreter and compares its result with Σ O / Σ l.
fn check_combine(g: &KernelGraph, tb: &TbGraph, f: Found) -> Result<Found, NoOnlineSoftmax> {
    let (os, ls) = (g.tensors[f.o].shape, g.tensors[f.l].shape);
    if os.numel() + ls.numel() > MAX_CHECKED_PARTIALS {
        return Err(NoOnlineSoftmax::Combine(CombineOff::TooLarge));
    }
    // The combining step alone: the partials as inputs, its operators, its result.
    let mut mini = KernelGraph::new();
    let mut tmap: BTreeMap<Handle<DTensor>, Handle<DTensor>> = BTreeMap::new();
    let mut inputs = Vec::new();
    for (i, t) in [f.o, f.l].into_iter().enumerate() {
        let d = g.tensors[t].clone();
        let shape = d.shape;
        let n = mini.tensors.append(d);
        tmap.insert(t, n);
        mini.ops.append(KnOp {
            kind: KnOpKind::Input {
                strides: shape.row_major_strides(),
            },
            inputs: vec![],
            outputs: vec![n],
        });
        inputs.push(std::sync::Arc::new(crate::graph::interp::Array {
            shape,
            data: (0..shape.numel()).map(|j| test_value(j, i)).collect(),
        }));
    }
    for &oh in &f.downstream {
        let mut op = g.ops[oh].clone();
        for t in &op.outputs {
            let n = mini.tensors.append(g.tensors[*t].clone());
            tmap.insert(*t, n);
        }
        op.inputs = op.inputs.iter().map(|t| tmap[t]).collect();
        op.outputs = op.outputs.iter().map(|t| tmap[t]).collect();
        mini.ops.append(op);
    }
    mini.ops.append(KnOp {
        kind: KnOpKind::Output { strides: None },
        inputs: vec![tmap[&f.result]],
        outputs: vec![],
    });
    if let Err(e) = crate::graph::validate::validate(&mini, None) {
        return Err(NoOnlineSoftmax::Combine(CombineOff::NotAlone(e)));
    }
    // The walk shares the partials (they are large: no copy).
    let got = match crate::graph::interp::evaluate_shared(&mini, &inputs) {
        Ok(mut v) => v.remove(0),
        Err(e) => {
            return Err(NoOnlineSoftmax::Combine(CombineOff::NotEvaluated(e)));
        }
    };
    // Σ O / Σ l, block by block of the attention kernel.
    let rank = os.rank();
    let o_tile = tile_of(tb, f.acc);
    let l_tile = tile_of(tb, f.sum);
    let rs = g.tensors[f.result].shape;
    let (so, sl, sr) = (strides(&os), strides(&ls), strides(&rs));
    let rows: usize = o_tile.dims()[..rank - 1].iter().product();
    let (dv, w) = (o_tile.dim(rank - 1), l_tile.dim(rank - 1));
    let mut num = vec![0.0; rs.numel()];
    let mut den = vec![0.0; rs.numel() / dv];
    let lead = |idx: usize, tile: &Shape| -> Vec<usize> {
        // Multi-index of row `idx` among the tile's leading (all but last) dims.
        let mut v = vec![0; rank];
        let mut rem = idx;
        for d in (0..rank - 1).rev() {
            v[d] = rem % tile.dim(d);
            rem /= tile.dim(d);
        }
        v
    };
    for cz in 0..tb.grid[2] {
        for cy in 0..tb.grid[1] {
            for cx in 0..tb.grid[0] {
                let c = [cx, cy, cz];
                let oo = offsets(c, f.omap, &o_tile);
                let ol = offsets(c, f.omap, &l_tile);
                for row in 0..rows {
                    let v = lead(row, &o_tile);
                    let base_o: usize = (0..rank - 1).map(|d| (oo[d] + v[d]) * so[d]).sum();
                    let base_l: usize = (0..rank - 1).map(|d| (ol[d] + v[d]) * sl[d]).sum();
                    let base_r: usize = (0..rank - 1).map(|d| (oo[d] + v[d]) * sr[d]).sum();
                    let (lo, ll) = (oo[rank - 1], ol[rank - 1]);
                    for j in 0..dv {
                        num[base_r + j] += inputs[0].data[base_o + lo + j];
                    }
                    let s: f64 = (0..w).map(|k| inputs[1].data[base_l + ll + k]).sum();
                    den[base_r / dv] += s;
                }
            }
        }
    }
    let mut worst = 0.0f64;
    let mut scale = 0.0f64;
    for (i, &x) in got.data.iter().enumerate() {
        let want = num[i] / den[i / dv];
        if !x.is_finite() {
            worst = f64::INFINITY;
        }
        worst = worst.max((x - want).abs());
        scale = scale.max(want.abs());
    }
    let rel = worst / scale.max(f64::MIN_POSITIVE);
    if rel.is_nan() || rel > COMBINE_TOLERANCE {
        return Err(NoOnlineSoftmax::Combine(CombineOff::Differs { rel }));
    }
    Ok(f)
}

/// The after-loop tile an accumulator writes.
fn tile_of(tb: &TbGraph, acc: Handle<TbOp>) -> Shape {
    tb.tensors[tb.ops[acc].outputs[0]].shape
}

/// The rewritten graph and what was applied.
fn rebuild(
    g: &KernelGraph,
    found: &[Found],
) -> Result<(KernelGraph, Vec<OnlineSoftmax>), NoOnlineSoftmax> {
    let plan_err = |e: crate::graph::error::GraphError| {
        NoOnlineSoftmax::Plan(crate::sched::plan::RewriteFailure::Invalid(
            crate::graph::error::ValidationErrors(vec![e]),
        ))
    };
    let mut tensors = g.tensors.clone();
    // Old op → replacement ops (empty: dropped).
    let mut replace: BTreeMap<Handle<KnOp>, Vec<KnOp>> = BTreeMap::new();
    let mut applied = Vec::new();
    // The downstream op that the combining operator takes the place of → its `applied` entry.
    let mut combine_at: BTreeMap<Handle<KnOp>, usize> = BTreeMap::new();
    for f in found {
        let KnOpKind::Customized(tb) = &g.ops[f.op].kind else {
            unreachable!()
        };
        let factor = f.fold.as_ref().map_or(1, |&(k, _)| k);
        let left = f.splits / factor;
        let fold = match (&f.fold, f.axis) {
            (Ok((_, by)), Some(axis)) => SplitFold::Folded {
                factor,
                left,
                axis,
                forloop: [tb.forloop_range, tb.forloop_range * factor],
                by: *by,
            },
            (Err(why), _) => SplitFold::Kept(why.clone()),
            (Ok(_), None) => SplitFold::Kept(SplitsKept::NoSplit),
        };
        let (body, ins, outs) = attention_body(g, f, tb, factor).map_err(plan_err)?;
        let own = |shape: Shape| shape == g.tensors[f.o].shape;
        if left == 1 && factor > 1 {
            // Every split folded: the kernel stores the result, and nothing combines.
            debug_assert_eq!(outs[..], [(g.tensors[f.result].shape, outs[0].1)]);
            replace.insert(
                f.op,
                vec![KnOp {
                    kind: KnOpKind::Customized(Box::new(body)),
                    inputs: ins,
                    outputs: vec![f.result],
                }],
            );
            for &d in &f.downstream {
                replace.insert(d, vec![]);
            }
            applied.push(OnlineSoftmax {
                kernel: f.op.index(),
                rewritten: 0,
                replaced: f.downstream.iter().map(|h| h.index()).collect(),
                splits: f.splits,
                fold,
                combine: None,
            });
            continue;
        }
        // O keeps the graph's partial tensor where its shape stays (no fold).
        let mut outputs = Vec::new();
        for (i, &(shape, dtype)) in outs.iter().enumerate() {
            outputs.push(if i == 0 && own(shape) {
                f.o
            } else {
                tensors.append(DTensor {
                    shape,
                    dtype,
                    guid: None,
                })
            });
        }
        let (o2, l2, m2) = (outputs[0], outputs[1], outputs[2]);
        replace.insert(
            f.op,
            vec![KnOp {
                kind: KnOpKind::Customized(Box::new(body)),
                inputs: ins,
                outputs,
            }],
        );
        let combine = vec![KnOp {
            kind: KnOpKind::SoftmaxCombine { splits: left },
            inputs: vec![o2, l2, m2],
            outputs: vec![f.result],
        }];
        let mut first = true;
        for &d in &f.downstream {
            let v = if first { combine.clone() } else { vec![] };
            if first {
                combine_at.insert(d, applied.len());
            }
            first = false;
            replace.insert(d, v);
        }
        applied.push(OnlineSoftmax {
            kernel: f.op.index(),
            rewritten: 0,
            replaced: f.downstream.iter().map(|h| h.index()).collect(),
            splits: f.splits,
            fold,
            combine: Some(0),
        });
    }
    // New op list, then only the tensors still referenced.
    let mut ops: Vec<(Option<Handle<KnOp>>, KnOp)> = Vec::new();
    for (h, op) in g.ops.iter() {
        match replace.get(&h) {
            Some(v) => {
                if let Some(a) = applied.iter_mut().find(|a| a.kernel == h.index()) {
                    a.rewritten = ops.len();
                }
                if let Some(&i) = combine_at.get(&h) {
                    applied[i].combine = Some(ops.len());
                }
                ops.extend(v.iter().cloned().map(|o| (None, o)))
            }
            None => ops.push((Some(h), op.clone())),
        }
    }
    let mut out = KernelGraph::new();
    let used: BTreeSet<Handle<DTensor>> = ops
        .iter()
        .flat_map(|(_, op)| op.inputs.iter().chain(&op.outputs).copied())
        .collect();
    let mut tmap: BTreeMap<Handle<DTensor>, Handle<DTensor>> = BTreeMap::new();
    for (h, t) in tensors.iter() {
        if used.contains(&h) {
            tmap.insert(h, out.tensors.append(t.clone()));
        }
    }
    out.sharding.mesh = g.sharding.mesh;
    for (old, mut op) in ops {
        op.inputs = op.inputs.iter().map(|t| tmap[t]).collect();
        op.outputs = op.outputs.iter().map(|t| tmap[t]).collect();
        let n = out.ops.append(op);
        if let Some(m) = old.and_then(|o| g.sharding.maps.get(&o)) {
            out.sharding.maps.insert(n, *m);
        }
    }
    if let Err(e) = crate::graph::validate::validate(&out, None) {
        return Err(NoOnlineSoftmax::Plan(
            crate::sched::plan::RewriteFailure::Invalid(e),
        ));
    }
    Ok((out, applied))
}

type Body = (
    TbGraph,
    Vec<Handle<DTensor>>,
    Vec<(Shape, crate::graph::dtype::DType)>,
);

/// The attention kernel with a running max: replays `tb` through a builder, replacing exp and
/// the two accumulators, and stores O, l and m; with `fold` key splits per block, the split
/// axis has 1 / `fold` of the blocks and the loop `fold` times the iterations, and where
/// every split is folded it stores O / l instead (the result).
fn attention_body(
    g: &KernelGraph,
    f: &Found,
    tb: &TbGraph,
    fold: usize,
) -> Result<Body, crate::graph::error::GraphError> {
    let kn = &g.ops[f.op];
    let mut grid = tb.grid;
    // Every split folded: the split axis maps nothing any more.
    let mut full = None;
    if let (Some(a), true) = (f.axis, fold > 1) {
        grid[a] /= fold;
        if grid[a] == 1 {
            full = Some(a);
        }
    }
    let unmap = |m: DimMap| {
        let mut m = m;
        if let Some(a) = full {
            m.0[a] = None;
        }
        m
    };
    let mut b = TbGraphBuilder::new(grid, tb.block, tb.forloop_range * fold)
        .with_reduction_dimx(tb.reduction_dimx);
    let mut map: BTreeMap<Handle<STensor>, Handle<STensor>> = BTreeMap::new();
    let mut rescale = None;
    let mut running_max = None;
    for (h, op) in tb.ops.iter() {
        let new = match &op.kind {
            TbOpKind::Input {
                input,
                imap,
                forloop_dim,
            } => {
                let t = kn.inputs[*input];
                let d = &g.tensors[t];
                b.new_input_of(t, d.shape, d.dtype, unmap(*imap), *forloop_dim)?
            }
            TbOpKind::Matmul => b.matmul(map[&op.inputs[0]], map[&op.inputs[1]])?,
            TbOpKind::Unary(UnaryOp::Exp) if h == f.exp => {
                let s = map[&op.inputs[0]];
                let last = b.tile_shape(s).expect("tile").rank() - 1;
                let (m, d) = b.reduction_max(s, last)?;
                let x = b.binary(BinaryOp::Sub, s, m)?;
                let e = b.unary(UnaryOp::Exp, x)?;
                rescale = Some(b.unary(UnaryOp::Exp, d)?);
                running_max = Some(b.forloop_accum(m, AccumKind::Max)?);
                e
            }
            TbOpKind::Accum(_) if h == f.sum => b.forloop_accum_rescale(
                map[&op.inputs[0]],
                rescale.expect("exp comes first"),
                AccumKind::RedLdSumRescale,
            )?,
            TbOpKind::Accum(_) if h == f.acc => b.forloop_accum_rescale(
                map[&op.inputs[0]],
                rescale.expect("exp comes first"),
                AccumKind::NoredRescale,
            )?,
            TbOpKind::Output { .. } if h == f.out_o || h == f.out_l => continue,
            other => unreachable!("recognised kernels hold no {}", other.name()),
        };
        map.insert(op.outputs[0], new);
    }
    let o = map[&tb.ops[f.acc].outputs[0]];
    let l = map[&tb.ops[f.sum].outputs[0]];
    if full.is_some() {
        // The running max stays accumulated (the register pipe combines its warps' maxima
        // through it); only O / l is stored.
        running_max.expect("exp seen");
        let y = b.binary(BinaryOp::Div, o, l)?;
        b.new_output(y, unmap(f.omap))?;
    } else {
        b.new_output(o, f.omap)?;
        b.new_output(l, f.omap)?;
        b.new_output(running_max.expect("exp seen"), f.omap)?;
    }
    Ok(b.into_parts())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::graph::builder::GraphBuilder;
    use crate::graph::dtype::DType;
    use crate::graph::interp::{InputSpec, evaluate, random_inputs};

    /// gqa_bs8's form at small sizes: per (batch, key split, row block), S = Q·K, exp, its sum
    /// (by `sum`) and E·V accumulated over the for-loop; a combining kernel sums the partials
    /// and divides (inside it, or by a kernel-level division after it).
    pub(crate) fn attention(sum: AccumKind, div_in_kernel: bool) -> KernelGraph {
        attention_sized(sum, div_in_kernel, (2, 16, 8, 64, 2), 2)
    }

    /// [`attention`] with (batch, rows, head dim, keys, key splits), the row blocks.
    fn attention_sized(
        sum: AccumKind,
        div_in_kernel: bool,
        (b, rows, d, keys, splits): (usize, usize, usize, usize, usize),
        row_blocks: usize,
    ) -> KernelGraph {
        let f = 2;
        let mut g = GraphBuilder::new();
        let q = g.new_input(&[b, rows, d], DType::F16).unwrap();
        let k = g.new_input(&[b, d, keys], DType::F16).unwrap();
        let v = g.new_input(&[b, keys, d], DType::F16).unwrap();
        let mut t =
            TbGraphBuilder::new([b, splits, row_blocks], [128, 1, 1], f).with_reduction_dimx(d);
        let tq = t.new_input(&g, q, [0, -1, 1], -1).unwrap();
        let tk = t.new_input(&g, k, [0, 2, -1], 2).unwrap();
        let tv = t.new_input(&g, v, [0, 1, -1], 1).unwrap();
        let s = t.matmul(tq, tk).unwrap();
        let e = t.exp(s).unwrap();
        let l = t.forloop_accum(e, sum).unwrap();
        let p = t.matmul(e, tv).unwrap();
        let o = t.forloop_accum(p, AccumKind::Nored).unwrap();
        t.new_output(l, [0, 2, 1]).unwrap();
        t.new_output(o, [0, 2, 1]).unwrap();
        let parts = g.customized(t).unwrap();
        let (lp, op) = (parts[0], parts[1]);
        let mut c = TbGraphBuilder::new([b, 2, 1], [128, 1, 1], 1).with_reduction_dimx(d);
        let cl = c.new_input(&g, lp, [0, 1, -1], -1).unwrap();
        let co = c.new_input(&g, op, [0, 1, -1], -1).unwrap();
        let sl = c.forloop_accum(cl, AccumKind::RedLdSum).unwrap();
        let so = c.forloop_accum(co, AccumKind::RedtoxLdSum).unwrap();
        if div_in_kernel {
            let y = c.div(so, sl).unwrap();
            c.new_output(y, [0, 1, -1]).unwrap();
            let y = g.customized(c).unwrap()[0];
            g.mark_output(y).unwrap();
        } else {
            c.new_output(so, [0, 1, -1]).unwrap();
            c.new_output(sl, [0, 1, -1]).unwrap();
            let v = g.customized(c).unwrap();
            let y = g.div(v[0], v[1]).unwrap();
            g.mark_output(y).unwrap();
        }
        g.build().unwrap()
    }

    fn max_rel(a: &crate::graph::interp::Array, b: &crate::graph::interp::Array) -> f64 {
        let worst = a
            .data
            .iter()
            .zip(&b.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        worst / b.data.iter().map(|x| x.abs()).fold(0.0, f64::max)
    }

    /// The typed reasons print as `explain` words them.
    #[test]
    fn reasons_print_their_case_and_data() {
        let cases = [
            (
                NoOnlineSoftmax::ExpReaders(ExpReaders::Missing {
                    readers: Vec::new(),
                }),
                "exp(S) is read by nothing (the pattern: one sum accumulator and one matmul \
                 exp(S)·V; a denominator computed elsewhere is not rescaled)",
            ),
            (
                NoOnlineSoftmax::Keys(KeysOff::SplitsQ { axis: 1 }),
                "its keys are split by grid axis y, which also splits Q",
            ),
            (
                NoOnlineSoftmax::Outputs(OutputsOff::Placed {
                    what: Partial::L,
                    axis: 0,
                }),
                "its outputs place Σ exp(S) along its last dim by grid axis x (the partials of \
                 the key splits go there, and only they)",
            ),
            (
                NoOnlineSoftmax::Downstream(DownstreamOff::CombinesWith {
                    op: 5,
                    kind: "kn_add_op".into(),
                    tensor: 7,
                }),
                "after it, kernel op 5 (kn_add_op) combines the partials with %7",
            ),
            (
                NoOnlineSoftmax::Combine(CombineOff::Differs { rel: 0.5 }),
                "the combining step does not compute Σ O / Σ l over the key splits (relative \
                 difference 5.00e-1 on test partials)",
            ),
        ];
        for (why, text) in cases {
            assert_eq!(why.to_string(), text);
        }
    }

    #[test]
    fn every_sum_form_is_rewritten_and_computes_the_same_function() {
        for sum in [
            AccumKind::RedLdSum,
            AccumKind::Nored,
            AccumKind::RedtoxLdSum,
        ] {
            for div_in_kernel in [true, false] {
                let g = attention(sum, div_in_kernel);
                let rw = online_softmax(&g, true);
                assert!(rw.declined.is_empty(), "{sum:?}: {:?}", rw.declined);
                let g2 = rw.graph.expect("rewritten");
                assert_eq!(rw.applied.len(), 1);
                assert_eq!(rw.applied[0].kernel, 3);
                assert_eq!(rw.applied[0].splits, 2);
                assert_eq!(
                    rw.applied[0].replaced.len(),
                    if div_in_kernel { 1 } else { 2 }
                );
                // Scores large enough that exp overflows fp16 (|S| up to 8·16 = 128).
                for scale in [0.5, 4.0] {
                    let inputs = random_inputs(&g, InputSpec { seed: 3, scale });
                    let want = evaluate(&g, &inputs).unwrap();
                    let got = evaluate(&g2, &inputs).unwrap();
                    let rel = max_rel(&got[0], &want[0]);
                    assert!(
                        rel < 1e-12,
                        "{sum:?} {div_in_kernel} scale {scale}: {rel:e}"
                    );
                }
            }
        }
    }

    /// Key splits folded into the loop, all of them (the kernel divides, no combining step)
    /// or half of them (a combining step over the rest): the same function, and the fold
    /// reported; a factor that does not divide the splits, or `off`, keeps them.
    #[test]
    fn folded_key_splits_compute_the_same_function() {
        let g = attention_sized(AccumKind::RedLdSum, true, (2, 16, 8, 256, 4), 2);
        let ask = |choice| FoldAsk {
            choice,
            hopper: true,
            sms: 4,
            resident: BTreeMap::new(),
        };
        for (choice, left) in [(KeyFold::By(4), 1), (KeyFold::By(2), 2), (KeyFold::Auto, 1)] {
            let rw = online_softmax_where(&g, true, &ask(choice), &|_| None);
            assert!(rw.declined.is_empty(), "{choice}: {:?}", rw.declined);
            let a = &rw.applied[0];
            let SplitFold::Folded {
                factor,
                left: l,
                axis: 1,
                forloop: [2, f2],
                by,
            } = a.fold
            else {
                panic!("{choice}: {:?}", a.fold);
            };
            assert_eq!((l, factor * l, f2), (left, 4, 2 * factor), "{choice}");
            let want = match choice {
                KeyFold::Auto => FoldBy::FillsSms,
                _ => FoldBy::Asked,
            };
            assert_eq!(by, want, "{choice}");
            assert_eq!(a.combine.is_none(), left == 1, "{choice}");
            let g2 = rw.graph.expect("rewritten");
            let KnOpKind::Customized(tb) = &g2.ops[Handle::from_index(a.rewritten)].kind else {
                panic!("no kernel");
            };
            assert_eq!((tb.grid, tb.forloop_range), ([2, left, 2], 2 * factor));
            let combines = g2
                .ops
                .iter()
                .filter(|(_, o)| matches!(o.kind, KnOpKind::SoftmaxCombine { .. }))
                .count();
            assert_eq!(combines, usize::from(left > 1), "{choice}");
            for scale in [0.5, 4.0] {
                let inputs = random_inputs(&g, InputSpec { seed: 5, scale });
                let want = evaluate(&g, &inputs).unwrap();
                let got = evaluate(&g2, &inputs).unwrap();
                let rel = max_rel(&got[0], &want[0]);
                assert!(rel < 1e-12, "{choice} scale {scale}: {rel:e}");
            }
        }
        for (choice, why) in [
            (
                KeyFold::By(3),
                SplitsKept::Indivisible {
                    splits: 4,
                    factor: 3,
                },
            ),
            (KeyFold::Off, SplitsKept::Off),
        ] {
            let rw = online_softmax_where(&g, true, &ask(choice), &|_| None);
            assert_eq!(rw.applied[0].fold, SplitFold::Kept(why), "{choice}");
            assert!(rw.applied[0].combine.is_some());
        }
        // The rule: 16 blocks of 4 splits against 8 SMs, two blocks per SM by shared memory:
        // the grid is one wave already; without the blocks per SM, the rule cannot tell.
        let mut few = FoldAsk {
            sms: 8,
            ..ask(KeyFold::Auto)
        };
        let rw = online_softmax_where(&g, true, &few, &|_| None);
        assert_eq!(rw.applied[0].fold, SplitFold::Kept(SplitsKept::Unmeasured));
        few.resident.insert(rw.applied[0].kernel, 2);
        let rw = online_softmax_where(&g, true, &few, &|_| None);
        assert_eq!(
            rw.applied[0].fold,
            SplitFold::Kept(SplitsKept::OneWave {
                blocks: 16,
                wave: 16
            })
        );
        // One block per SM: 16 blocks take two waves of 8; by 2, one wave of 8 blocks.
        few.resident.insert(rw.applied[0].kernel, 1);
        let rw = online_softmax_where(&g, true, &few, &|_| None);
        assert!(
            matches!(
                rw.applied[0].fold,
                SplitFold::Folded {
                    factor: 2,
                    left: 2,
                    by: FoldBy::OneWave { resident: 1 },
                    ..
                }
            ),
            "{:?}",
            rw.applied[0].fold
        );
        let rule = |blocks, splits, resident, sms| {
            fold_rule(
                blocks,
                splits,
                Some(resident),
                &FoldAsk {
                    sms,
                    ..ask(KeyFold::Auto)
                },
            )
            .map(|(f, _)| f)
        };
        assert_eq!(rule(16, 4, 1, 4), Ok(4));
        assert_eq!(rule(16, 4, 1, 3), Ok(4));
        // 16 blocks on 5 SMs of one block each: by 2, 8 blocks take two waves; by 4, 4 leave
        // an SM idle.
        assert!(matches!(
            rule(16, 4, 1, 5),
            Err(SplitsKept::FewBlocks { .. })
        ));
        // The corpus shapes on 132 SMs: gqa_bs8 (5 blocks per SM by shared memory), mha_bs8,
        // mqa_bs8 (3 per SM), gqa_bs1 (one wave already).
        assert_eq!(rule(1024, 16, 5, 132), Ok(2));
        assert_eq!(rule(1024, 4, 3, 132), Ok(4));
        assert_eq!(rule(1024, 8, 3, 132), Ok(4));
        assert_eq!(rule(1024, 8, 4, 132), Ok(2));
        assert!(matches!(
            rule(128, 16, 2, 132),
            Err(SplitsKept::OneWave { .. })
        ));
        let ampere = FoldAsk {
            hopper: false,
            ..ask(KeyFold::Auto)
        };
        let rw = online_softmax_where(&g, true, &ampere, &|_| None);
        assert_eq!(rw.applied[0].fold, SplitFold::Kept(SplitsKept::AmperePath));
    }

    /// 64 query rows per block on 4 warps, 32 keys per iteration: the rewritten kernel keeps
    /// S, m, exp(S − m), the rescale factor and E·V in an online register pipe on both targets
    /// (the default `piped` applies the rewrite), and the generated code packs online.
    #[test]
    fn the_rewritten_kernel_pipes_its_running_max() {
        use crate::sched::plan::{CtaChoice, Options};
        use crate::target::{Arch, Target};
        let g = attention_sized(AccumKind::RedLdSum, true, (2, 64, 16, 128, 2), 1);
        for arch in [Arch::Sm80, Arch::Sm90a] {
            let opts = Options {
                cta: CtaChoice::Graph,
                ..Options::for_target(Target::new(arch))
            };
            let p = crate::sched::plan(&g, &opts).unwrap();
            let sm = &p.rewrite.softmax;
            assert_eq!(sm.applied.len(), 1, "{arch:?}: {:?}", sm.declined);
            let kp = &p.kernels[&sm.applied[0].rewritten];
            let pipe = kp.register_pipes().next().expect("a register pipe");
            let online = pipe.online.as_ref().expect("the online form");
            for t in pipe.tiles() {
                assert!(
                    kp.tiles[t].is_none(),
                    "{arch:?}: tile s{t} reaches shared memory"
                );
            }
            assert_eq!(online.registers.len(), 6);
            // `off` keeps the graph; `always` and `piped` agree here.
            let off = crate::sched::plan(
                &g,
                &Options {
                    online_softmax: SoftmaxChoice::Off,
                    ..opts.clone()
                },
            )
            .unwrap();
            assert!(off.rewrite.graph.is_none());
            assert_eq!(
                off.rewrite.softmax.declined,
                vec![(3, NoOnlineSoftmax::Off)]
            );
        }
        // 16 rows per block on 4 warps cannot pipe: `piped` declines and says why.
        let g = attention_sized(AccumKind::RedLdSum, true, (2, 16, 16, 128, 2), 1);
        let opts = Options {
            cta: CtaChoice::Graph,
            ..Options::for_target(Target::new(Arch::Sm80))
        };
        let p = crate::sched::plan(&g, &opts).unwrap();
        assert!(p.rewrite.graph.is_none());
        assert!(
            matches!(
                &p.rewrite.softmax.declined[..],
                [(
                    3,
                    NoOnlineSoftmax::NotPiped(NotPiped::Pipe(
                        crate::sched::plan::PipeOff::UnevenRows { .. }
                            | crate::sched::plan::PipeOff::UnevenKeys { .. }
                    ))
                )]
            ),
            "{:?}",
            p.rewrite.softmax.declined
        );
        let always = Options {
            online_softmax: SoftmaxChoice::Always,
            ..opts
        };
        let p = crate::sched::plan(&g, &always).unwrap();
        assert_eq!(p.rewrite.softmax.applied.len(), 1);
    }

    /// 16 query rows per block on 4 warps, 64 keys per iteration: the rows do not split over
    /// the warps, so the keys do (mha's shape): the producer runs on 1 × 4 warps, each warp
    /// keeps its own running max, sum and output fragment, and the warps combine them after the
    /// loop through a buffer of one slice per warp (`tests/plan_code.rs` checks the code of the
    /// corpus's key splits).
    #[test]
    fn sixteen_rows_pipe_with_the_keys_split_over_the_warps() {
        use crate::sched::plan::{CtaChoice, Options, SmemKind};
        use crate::target::{Arch, Target};
        let g = attention_sized(AccumKind::RedLdSum, true, (2, 16, 16, 256, 2), 1);
        for arch in [Arch::Sm80, Arch::Sm90a] {
            let opts = Options {
                cta: CtaChoice::Graph,
                ..Options::for_target(Target::new(arch))
            };
            let p = crate::sched::plan(&g, &opts).unwrap();
            let sm = &p.rewrite.softmax;
            assert_eq!(sm.applied.len(), 1, "{arch:?}: {:?}", sm.declined);
            let kp = &p.kernels[&sm.applied[0].rewritten];
            let pipe = kp.register_pipes().next().expect("a register pipe");
            assert_eq!((pipe.warps, pipe.keys), (1, 4), "{arch:?}");
            let online = pipe.online.as_ref().expect("the online form");
            let KnOpKind::Customized(tb) = &p.graph(&g).ops
                [crate::graph::arena::Handle::from_index(sm.applied[0].rewritten)]
            .kind
            else {
                panic!("the attention kernel is customized")
            };
            let out = tb.ops[online.out_acc].outputs[0].index();
            let slices = kp.smem.kinds.iter().find_map(|k| match *k {
                SmemKind::KeySplit {
                    tile,
                    warps,
                    slice_bytes,
                    tile_bytes,
                } if tile == out => Some((warps, slice_bytes, tile_bytes)),
                _ => None,
            });
            // O is 16 × 16 fp32 (1024 bytes), then 16 maxima and 16 sums: 1152 bytes a slice.
            assert_eq!(slices, Some((4, 1152, 1024)), "{arch:?}");
        }
    }

    /// One key split (the for-loop alone walks the keys), four and sixteen: the same function,
    /// the attention kernel followed by one `softmax_combine`.
    #[test]
    fn any_number_of_key_splits_is_rewritten() {
        for splits in [1, 4, 16] {
            let g = attention_sized(AccumKind::Nored, false, (2, 16, 8, 64, splits), 2);
            let rw = online_softmax(&g, true);
            assert!(rw.declined.is_empty(), "{splits}: {:?}", rw.declined);
            assert_eq!(rw.applied[0].splits, splits);
            let g2 = rw.graph.expect("rewritten");
            // The attention kernel, the combining operator, nothing else besides I/O.
            assert_eq!(g2.num_kernels(), 2);
            let (_, combine) = g2
                .ops
                .iter()
                .nth(rw.applied[0].combine.expect("a combining step"))
                .unwrap();
            assert_eq!(combine.kind, KnOpKind::SoftmaxCombine { splits });
            let inputs = random_inputs(
                &g,
                InputSpec {
                    seed: 5,
                    scale: 4.0,
                },
            );
            let want = evaluate(&g, &inputs).unwrap();
            let got = evaluate(&g2, &inputs).unwrap();
            let rel = max_rel(&got[0], &want[0]);
            assert!(rel < 1e-12, "{splits} splits: {rel:e}");
        }
    }

    /// The combining operator is checked like any operator (a wrong split count is an error
    /// naming it), and a rewritten graph cannot be written as Mirage JSON (the format has no
    /// such operator): the export says so instead of writing something Mirage cannot read.
    #[test]
    fn the_combining_operator_validates_and_is_never_exported() {
        let g = attention_sized(AccumKind::Nored, false, (2, 16, 8, 64, 4), 2);
        let rw = online_softmax(&g, true);
        let mut g2 = *rw.graph.expect("rewritten");
        let at = rw.applied[0].combine.expect("a combining step");
        let h = g2.ops.handles().nth(at).unwrap();
        assert_eq!(g2.ops[h].kind, KnOpKind::SoftmaxCombine { splits: 4 });
        assert!(crate::graph::validate::validate(&g2, None).is_ok());
        let e = crate::graph::mirage_json::graph_to_json(&g2, &Default::default()).unwrap_err();
        assert!(
            e.to_string().contains("mucc's internal softmax_combine"),
            "{e}"
        );
        g2.ops[h].kind = KnOpKind::SoftmaxCombine { splits: 3 };
        let e = crate::graph::validate::validate(&g2, None).unwrap_err();
        assert!(e.to_string().contains("softmax_combine of 3 splits"), "{e}");
    }

    #[test]
    fn the_rewritten_kernel_stores_bounded_partials() {
        let g = attention(AccumKind::RedLdSum, true);
        let g2 = online_softmax(&g, true).graph.unwrap();
        let inputs = random_inputs(
            &g,
            InputSpec {
                seed: 1,
                scale: 4.0,
            },
        );
        let (_, excess) = crate::graph::interp::evaluate_ranged(&g, inputs.clone()).unwrap();
        assert!(
            !excess.is_empty(),
            "the original overflows fp16 at this scale"
        );
        let (_, excess) = crate::graph::interp::evaluate_ranged(&g2, inputs).unwrap();
        assert!(excess.is_empty(), "{excess:?}");
    }

    #[test]
    fn off_and_unrecognised_forms_say_why() {
        let g = attention(AccumKind::RedLdSum, true);
        let rw = online_softmax(&g, false);
        assert!(rw.graph.is_none());
        assert_eq!(rw.declined, vec![(3, NoOnlineSoftmax::Off)]);
        // A combining step that does not divide: found by value.
        let mut g3 = g.clone();
        let last = g3.ops.handles().nth(4).unwrap();
        if let KnOpKind::Customized(tb) = &mut g3.ops[last].kind {
            let hs: Vec<_> = tb.ops.handles().collect();
            for h in hs {
                if tb.ops[h].kind == TbOpKind::Binary(BinaryOp::Div) {
                    tb.ops[h].kind = TbOpKind::Binary(BinaryOp::Mul);
                }
            }
        } else {
            panic!("kernel op 4 is the combining kernel");
        }
        let rw = online_softmax(&g3, true);
        assert!(rw.graph.is_none());
        assert!(
            matches!(
                &rw.declined[..],
                [(3, NoOnlineSoftmax::Combine(CombineOff::Differs { .. }))]
            ),
            "{:?}",
            rw.declined
        );
        assert!(rw.declined[0].1.to_string().contains("does not compute"));
    }
}
