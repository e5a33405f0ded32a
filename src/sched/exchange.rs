//! All-reduces fused into the kernel that writes their input (multi-GPU plans).
//!
//! An NCCL all-reduce is a step of its own: a launch, a handshake between the GPUs and a pass
//! over the data, 4.5–7 µs on two H100s for 7–57 KB (docs/multi-gpu.md), paid after the kernel
//! that produced the partial sums has ended. Fused, every block of that kernel stores its tile
//! of the all-reduce's input into the other GPUs' *exchange buffers* as it writes it (remote
//! stores over NVLink, overlapping the other blocks' work); the last block to finish on each
//! GPU raises a flag on every other GPU, waits for theirs and sums the GPUs' values in rank
//! order into the all-reduce's output. The protocol and the buffer layout are in the runtime
//! header `mucc/threadblock/exchange.h`; this module decides where it applies and lays out the
//! regions.
//!
//! The exchange buffers are memory every GPU of the mesh can address (`mucc run` and `bench`
//! allocate them and enable peer access; the caller of the host entry passes them, see
//! docs/multi-gpu.md). Hence an option: [`AllReduceChoice::Nccl`] keeps every all-reduce an
//! NCCL call (the default of the planner and of `transpile`/`build`), [`AllReduceChoice::Fused`]
//! fuses where the rules below hold.

use std::collections::BTreeMap;

use crate::graph::dtype::DType;
use crate::graph::kernel::{KernelGraph, KnOpKind};
use crate::graph::threadblock::TbOpKind;

use super::kernel_level::KnOpPlan;
use super::order::Step;
use super::plan::{Binding, KernelPlan};

/// Most GPUs of a fused all-reduce: their flags fill the region's header.
pub const MAX_GPUS: usize = (HEADER - FLAGS) / 8;
/// Bytes of a region before its first slot (epoch, ticket, one flag per GPU).
pub const HEADER: usize = 256;
/// Offset of the flags in a region.
pub const FLAGS: usize = 64;
/// Alignment of regions and slots.
pub const ALIGN: usize = 256;

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
    Nccl(String),
    /// Performed by kernel operator `kernel` ([`KernelPlan::exchange`]); no step of its own.
    Fused {
        /// The kernel operator writing the input.
        kernel: usize,
    },
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
    /// The all-reduce's input (this kernel's output) and output, which share one layout.
    pub send: Binding,
    /// See [`Exchange::send`].
    pub recv: Binding,
    /// Elements summed: the span of that layout.
    pub count: usize,
    /// Element type (sums in f32).
    pub dtype: DType,
    /// GPUs of the mesh.
    pub gpus: usize,
    /// Blocks that take a ticket: the µGraph's grid (a cluster's CTAs arrive as one).
    pub blocks: usize,
    /// Byte offset of this all-reduce's region in every exchange buffer.
    pub region: usize,
    /// Bytes of one GPU's slot (the span, rounded up to [`ALIGN`]).
    pub slot_bytes: usize,
    /// Elements per access of the last block's sum (16 bytes where sizes and offsets allow).
    pub vector: usize,
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

/// Byte offset of a binding inside its buffer (buffers start on at least 256 bytes).
fn byte_offset(b: Binding, elem_bytes: usize) -> usize {
    match b {
        Binding::Workspace {
            byte_offset,
            elem_offset,
            elem_bytes,
        } => byte_offset + elem_offset * elem_bytes,
        other => other.elem_offset() * elem_bytes,
    }
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
            send,
            recv,
            count,
            gpus,
            ..
        } = kernel_ops[i].clone()
        else {
            continue;
        };
        let decided = decide(
            g, kernel_ops, kernels, choice, i, send, recv, count, gpus, bytes,
        );
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

/// The kernel that performs all-reduce `ar` and its exchange, or why none does.
#[allow(clippy::too_many_arguments)]
fn decide(
    g: &KernelGraph,
    kernel_ops: &[KnOpPlan],
    kernels: &BTreeMap<usize, KernelPlan>,
    choice: AllReduceChoice,
    ar: usize,
    send: Binding,
    recv: Binding,
    count: usize,
    gpus: usize,
    region: usize,
) -> Result<(usize, Exchange), String> {
    if choice == AllReduceChoice::Nccl {
        return Err("--all-reduce nccl".into());
    }
    if gpus > MAX_GPUS {
        return Err(format!(
            "a fused all-reduce takes at most {MAX_GPUS} GPUs, the mesh has {gpus}"
        ));
    }
    let op = &g.ops[crate::graph::arena::Handle::from_index(ar)];
    let x = op.inputs[0];
    let dtype = g.tensors[x].dtype;
    if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32) {
        return Err(format!(
            "a fused all-reduce sums f16, bf16 and f32, not {dtype}"
        ));
    }
    let Some(k) = g.producer(x).map(|h| h.index()) else {
        return Err("no operator writes its input".into());
    };
    let (Some(kp), KnOpKind::Customized(tb)) = (
        kernels.get(&k),
        &g.ops[crate::graph::arena::Handle::from_index(k)].kind,
    ) else {
        return Err(format!(
            "its input is written by kernel op {k}, which is not a threadblock kernel"
        ));
    };
    if kp.exchange.is_some() {
        return Err(format!(
            "kernel op {k} already performs another all-reduce (one per kernel)"
        ));
    }
    if let Some(j) = (k + 1..ar).find(|&j| !matches!(kernel_ops[j], KnOpPlan::Nothing)) {
        return Err(format!(
            "kernel op {j} runs between kernel op {k}, which writes its input, and the all-reduce"
        ));
    }
    let j = g.ops[crate::graph::arena::Handle::from_index(k)]
        .outputs
        .iter()
        .position(|&t| t == x)
        .ok_or("internal: the producer does not list the tensor")?;
    let writers: Vec<usize> = tb
        .ops
        .iter()
        .filter(|(_, t)| matches!(t.kind, TbOpKind::Output { output, .. } if output == j))
        .map(|(h, _)| h.index())
        .collect();
    let [out] = writers[..] else {
        return Err(format!(
            "{} threadblock outputs of kernel op {k} write its input",
            writers.len()
        ));
    };
    let chain = kp.fusion.chain_of[out];
    let post_loop = kp
        .schedule
        .post_loop
        .iter()
        .any(|s| matches!(s, Step::Run(c) if *c == chain));
    if !post_loop {
        return Err(format!(
            "kernel op {k} writes its input before the for-loop ends (op{out} is not a \
             post-loop step)"
        ));
    }
    let elem = dtype.bytes();
    let vector = [16 / elem, 8 / elem, 4 / elem, 2 / elem, 1]
        .into_iter()
        .filter(|&v| v >= 1)
        .find(|&v| {
            let b = v * elem;
            count.is_multiple_of(v)
                && byte_offset(send, elem).is_multiple_of(b)
                && byte_offset(recv, elem).is_multiple_of(b)
        })
        .unwrap_or(1);
    let x = Exchange {
        all_reduce: ar,
        output_op: out,
        send,
        recv,
        count,
        dtype,
        gpus,
        blocks: kp.cta.grid.iter().product(),
        region: round_up(region, ALIGN),
        slot_bytes: round_up(count * elem, ALIGN),
        vector,
    };
    Ok((k, x))
}
