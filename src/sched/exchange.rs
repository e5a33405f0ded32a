//! All-reduces fused into the kernel that writes their input (multi-GPU plans).
//!
//! An NCCL all-reduce is a step of its own: a launch, a handshake between the GPUs and a pass
//! over the data, 4.5–7 µs on two H100s for 7–57 KB (docs/multi-gpu.md), paid after the kernel
//! that produced the partial sums has ended. Fused, every block of that kernel also stores its
//! tile of the all-reduce's input into every GPU's *exchange buffer* as it writes it, each
//! element as a (value, flag) word (remote stores over NVLink, overlapping the other blocks'
//! work; a word is its own signal, so no fence or handshake is needed); the last
//! [`Exchange::helpers`] blocks to finish on each GPU sum the GPUs' words in rank order into the
//! all-reduce's output, re-reading a word until it carries the execution's flag. Measured 2–4
//! µs faster than NCCL on two H100s (docs/multi-gpu.md). The protocol and the buffer layout are
//! in the runtime header `mucc/threadblock/exchange.h`; this module decides where it applies and
//! lays out the regions.
//!
//! The exchange buffers are memory every GPU of the mesh can address (`mucc run` and `bench`
//! allocate them and enable peer access; the caller of the host entry passes them, see
//! docs/multi-gpu.md). Hence an option: [`AllReduceChoice::Nccl`] keeps every all-reduce an
//! NCCL call (the default of the planner and of `transpile`/`build`/`explain`),
//! [`AllReduceChoice::Fused`] (the default of `run` and `bench`) fuses where the rules hold.

use std::collections::BTreeMap;

use crate::graph::dtype::DType;
use crate::graph::kernel::{KernelGraph, KnOpKind};

use super::kernel_level::KnOpPlan;
use super::order::Step;
use super::plan::{Binding, KernelPlan};

/// Most GPUs of a fused all-reduce (the last blocks' sum unrolls over them).
pub const MAX_GPUS: usize = 16;
/// Bytes of a region before its first slot (the ticket: blocks counted over all executions).
pub const HEADER: usize = 256;
/// Alignment of regions and slots.
pub const ALIGN: usize = 256;
/// Bytes of exchange buffer per element: the value and the execution's flag in one word.
pub const WORD: usize = 8;
/// Elements each summing block takes (256 threads, 8 words each in flight).
pub const ELEMS_PER_HELPER: usize = 2048;
/// Most blocks that sum (they wait for the others, so they stay few).
pub const MAX_HELPERS: usize = 16;

/// How the planner runs all-reduces (`--all-reduce`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllReduceChoice {
    /// Every all-reduce is an NCCL call; no exchange buffers.
    #[default]
    Nccl,
    /// Fused into the kernel writing its input wherever the rules hold (the caller provides
    /// exchange buffers).
    Fused,
}

impl std::fmt::Display for AllReduceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AllReduceChoice::Nccl => "nccl",
            AllReduceChoice::Fused => "fused",
        })
    }
}

impl std::str::FromStr for AllReduceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nccl" => Ok(AllReduceChoice::Nccl),
            "fused" => Ok(AllReduceChoice::Fused),
            _ => Err(format!("`{s}` is not nccl or fused")),
        }
    }
}

/// How one all-reduce runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllReduceForm {
    /// An `ncclAllReduce` step, and why it is not fused.
    Nccl(NotFused),
    /// Performed by kernel operator `kernel` ([`KernelPlan::exchange`]); no step of its own.
    Fused {
        /// The kernel operator writing the input.
        kernel: usize,
    },
}

/// Why an all-reduce stays an NCCL step ([`AllReduceForm::Nccl`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotFused {
    /// Not decided yet (the state `kernel_level` leaves; `fuse_all_reduces` decides).
    Undecided,
    /// The options ask for NCCL ([`NCCL_CHOSEN`]).
    Chosen,
    /// More GPUs than [`MAX_GPUS`].
    TooManyGpus {
        /// The mesh's GPUs.
        gpus: usize,
    },
    /// An element type the fused sum does not take.
    DType(DType),
    /// No operator writes the input.
    NoProducer,
    /// The input's writer is no threadblock kernel.
    NotThreadblock {
        /// The writer (kernel operator index).
        kernel: usize,
    },
    /// The writer performs another all-reduce already.
    AlreadyFused {
        /// The writer.
        kernel: usize,
    },
    /// The writer's loop is split over the grid ([`super::plan::GridSplit`]): its blocks
    /// finish in the order their last CTAs arrive, a case the exchange was not measured with.
    GridSplit {
        /// The writer.
        kernel: usize,
    },
    /// A step runs between the writer and the all-reduce.
    StepBetween {
        /// That step's kernel operator.
        op: usize,
        /// The writer.
        kernel: usize,
    },
    /// The writer's outputs do not list the input (a case the graph's validation rules out).
    NotListed,
    /// Not exactly one threadblock output writes the input.
    Writers {
        /// How many do.
        count: usize,
        /// The writer.
        kernel: usize,
    },
    /// The input is written before the for-loop ends.
    InLoop {
        /// The writer.
        kernel: usize,
        /// Its threadblock output operator.
        op: usize,
    },
    /// The input's layout has padding, which no block writes.
    Padding {
        /// Elements of the layout's span.
        count: usize,
        /// Elements of the tensor.
        numel: usize,
    },
}

impl std::fmt::Display for NotFused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotFused::Undecided => f.write_str("not yet decided"),
            NotFused::Chosen => f.write_str(NCCL_CHOSEN),
            NotFused::TooManyGpus { gpus } => write!(
                f,
                "a fused all-reduce takes at most {MAX_GPUS} GPUs, the mesh has {gpus}"
            ),
            NotFused::DType(d) => write!(f, "a fused all-reduce sums f16, bf16 and f32, not {d}"),
            NotFused::NoProducer => f.write_str("no operator writes its input"),
            NotFused::NotThreadblock { kernel } => write!(
                f,
                "its input is written by kernel op {kernel}, which is not a threadblock kernel"
            ),
            NotFused::AlreadyFused { kernel } => write!(
                f,
                "kernel op {kernel} already performs another all-reduce (one per kernel)"
            ),
            NotFused::GridSplit { kernel } => write!(
                f,
                "kernel op {kernel} splits its loop over the grid (not combined with a fused \
                 all-reduce)"
            ),
            NotFused::StepBetween { op, kernel } => write!(
                f,
                "kernel op {op} runs between kernel op {kernel}, which writes its input, and the \
                 all-reduce"
            ),
            NotFused::NotListed => f.write_str("internal: the producer does not list the tensor"),
            NotFused::Writers { count, kernel } => write!(
                f,
                "{count} threadblock outputs of kernel op {kernel} write its input"
            ),
            NotFused::InLoop { kernel, op } => write!(
                f,
                "kernel op {kernel} writes its input before the for-loop ends (op{op} is not a \
                 post-loop step)"
            ),
            NotFused::Padding { count, numel } => write!(
                f,
                "its layout has padding (a span of {count} for {numel} elements), which no block \
                 writes"
            ),
        }
    }
}

/// An all-reduce fused into a threadblock kernel: what the kernel's blocks mirror and where,
/// and what its last block sums.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// The `kn_allreduce_op` (kernel operator index).
    pub all_reduce: usize,
    /// The threadblock output operator writing the all-reduce's input: its stores also go to
    /// the other GPUs' slots.
    pub output_op: usize,
    /// The all-reduce's output (its input is the kernel's output that `output_op` writes; both
    /// share one layout).
    pub recv: Binding,
    /// Elements summed: the span of that layout.
    pub count: usize,
    /// GPUs of the mesh.
    pub gpus: usize,
    /// Blocks that take a ticket: the µGraph's grid (a cluster's CTAs arrive as one).
    pub blocks: usize,
    /// Byte offset of this all-reduce's region in every exchange buffer.
    pub region: usize,
    /// Bytes of one GPU's slot (a [`WORD`] per element of the span, rounded up to [`ALIGN`]).
    pub slot_bytes: usize,
    /// The last blocks to finish that sum, each a share of the elements
    /// ([`ELEMS_PER_HELPER`] each, at most [`MAX_HELPERS`] and the grid).
    pub helpers: usize,
}

impl Exchange {
    /// Bytes of the region: header and two parities of one slot per GPU.
    pub fn region_bytes(&self) -> usize {
        HEADER + 2 * self.gpus * self.slot_bytes
    }
}

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// Fuses the all-reduces of a plan where `choice` allows and the rules hold, recording the
/// decision in each [`KnOpPlan::AllReduce`]'s `fused` and the kernel's [`KernelPlan::exchange`].
/// Returns the bytes of one GPU's exchange buffer (0: none needed).
pub(super) fn fuse_all_reduces(
    g: &KernelGraph,
    kernel_ops: &mut [KnOpPlan],
    kernels: &mut BTreeMap<usize, KernelPlan>,
    choice: AllReduceChoice,
) -> usize {
    let mut bytes = 0;
    for i in 0..kernel_ops.len() {
        let KnOpPlan::AllReduce {
            recv, count, gpus, ..
        } = kernel_ops[i].clone()
        else {
            continue;
        };
        let decided = decide(g, kernel_ops, kernels, choice, i, recv, count, gpus, bytes);
        let form = match decided {
            Ok((k, x)) => {
                bytes += x.region_bytes();
                if let Some(kp) = kernels.get_mut(&k) {
                    kp.exchange = Some(x);
                }
                AllReduceForm::Fused { kernel: k }
            }
            Err(why) => AllReduceForm::Nccl(why),
        };
        if let KnOpPlan::AllReduce { fused, .. } = &mut kernel_ops[i] {
            *fused = form;
        }
    }
    bytes
}

/// Why an all-reduce stays NCCL when the options ask for it (the default of `transpile`,
/// `build` and `explain`; `run` and `bench` default to the fused form, which this names so that
/// `explain` does not mislead about what a run does).
pub const NCCL_CHOSEN: &str = "--all-reduce nccl (the default of transpile, build and explain; run \
     and bench default to --all-reduce fused, whose plan `explain --all-reduce fused` shows)";

/// The kernel that performs all-reduce `ar` and its exchange, or why none does.
#[allow(clippy::too_many_arguments)]
fn decide(
    g: &KernelGraph,
    kernel_ops: &[KnOpPlan],
    kernels: &BTreeMap<usize, KernelPlan>,
    choice: AllReduceChoice,
    ar: usize,
    recv: Binding,
    count: usize,
    gpus: usize,
    region: usize,
) -> Result<(usize, Exchange), NotFused> {
    if choice == AllReduceChoice::Nccl {
        return Err(NotFused::Chosen);
    }
    if gpus > MAX_GPUS {
        return Err(NotFused::TooManyGpus { gpus });
    }
    let op = &g.ops[crate::graph::arena::Handle::from_index(ar)];
    let x = op.inputs[0];
    let dtype = g.tensors[x].dtype;
    if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32) {
        return Err(NotFused::DType(dtype));
    }
    let Some(k) = g.producer(x).map(|h| h.index()) else {
        return Err(NotFused::NoProducer);
    };
    let (Some(kp), KnOpKind::Customized(tb)) = (
        kernels.get(&k),
        &g.ops[crate::graph::arena::Handle::from_index(k)].kind,
    ) else {
        return Err(NotFused::NotThreadblock { kernel: k });
    };
    if kp.exchange.is_some() {
        return Err(NotFused::AlreadyFused { kernel: k });
    }
    if kp.split.grid().is_some() {
        return Err(NotFused::GridSplit { kernel: k });
    }
    if let Some(j) = (k + 1..ar).find(|&j| !matches!(kernel_ops[j], KnOpPlan::Nothing)) {
        return Err(NotFused::StepBetween { op: j, kernel: k });
    }
    let j = g.ops[crate::graph::arena::Handle::from_index(k)]
        .outputs
        .iter()
        .position(|&t| t == x)
        .ok_or(NotFused::NotListed)?;
    let writers: Vec<usize> = tb.output_writers(j).iter().map(|h| h.index()).collect();
    let [out] = writers[..] else {
        return Err(NotFused::Writers {
            count: writers.len(),
            kernel: k,
        });
    };
    let chain = kp.fusion.chain_of[out];
    let post_loop = kp
        .schedule
        .post_loop
        .iter()
        .any(|s| matches!(s, Step::Run(c) if *c == chain));
    if !post_loop {
        return Err(NotFused::InLoop { kernel: k, op: out });
    }
    let numel = g.tensors[x].shape.numel();
    if count != numel {
        return Err(NotFused::Padding { count, numel });
    }
    let blocks: usize = kp.cta.grid.iter().product();
    let x = Exchange {
        all_reduce: ar,
        output_op: out,
        recv,
        count,
        gpus,
        blocks,
        region: round_up(region, ALIGN),
        slot_bytes: round_up(count * WORD, ALIGN),
        helpers: count
            .div_ceil(ELEMS_PER_HELPER)
            .clamp(1, MAX_HELPERS.min(blocks)),
    };
    Ok((k, x))
}
