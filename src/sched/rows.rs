//! Register rows: a threadblock kernel that computes every tile in registers.
//!
//! A customized operator whose loop runs once and whose operators are all element-wise (unary,
//! binary over tiles of one shape), row RMS norms, one-input accumulators (the identity over
//! one iteration), inputs and outputs reads each input element once and writes each output
//! element once. The plan fixes one element-to-thread map for every tile: the last dim (a row
//! of `cols` elements) is cut into 16-byte runs of `vec` elements, thread `t` owns runs `t`,
//! `t + threads`, … of every row, and keeps them in registers from the input's vector load to
//! the output's vector store. Row sums (the RMS norms) meet through warp shuffles and one
//! small shared-memory exchange per norm; nothing else touches shared memory or waits at a
//! barrier. Measured on an H100 (docs/benchmarks.md, nTrans): a probe of this form took 2.03
//! µs where the tile kernel took 3.59.

use std::fmt;

use crate::graph::DType;
use crate::graph::ops::AccumKind;
use crate::graph::threadblock::{TbGraph, TbOpKind};

use super::plan::{BlockRegion, DTensorGeometry};

/// Values one thread may keep per tile (rows × runs × run length): beyond it the registers of
/// a few live tiles would spill.
const MAX_VALUES_PER_TILE: usize = 32;

/// The largest CTA.
const MAX_THREADS: usize = 1024;

/// Bytes of static shared memory the row sums may take (one array of the warps' partial sums
/// per row norm; a CTA's static shared memory is at most 48 KB).
const MAX_ROW_SUM_BYTES: usize = 32 * 1024;

/// How a register-rows kernel maps elements to threads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterRows {
    /// Rows of every tile (the product of its leading dims).
    pub rows: usize,
    /// Elements per row (the tiles' last dim).
    pub cols: usize,
    /// Elements per 16-byte run.
    pub vec: usize,
    /// Threads of the CTA.
    pub threads: usize,
    /// Runs of a row each thread owns.
    pub runs: usize,
    /// Per input and output operator (threadblock operator index): the element offset of each
    /// tile row in the block's region of its device tensor.
    pub row_offsets: Vec<(usize, Vec<usize>)>,
    /// Row sums per kernel (one shared-memory exchange each).
    pub row_sums: usize,
    /// Static shared memory of the row sums' exchange: per sum and row, a float per warp.
    pub scratch_bytes: usize,
    /// The first output operator (threadblock operator index): every input has been read
    /// before it, so a kernel that triggers the next launch does so there.
    pub first_output: usize,
}

impl RegisterRows {
    /// The row offsets of input or output operator `op` (threadblock operator index).
    pub fn offsets_of(&self, op: usize) -> Option<&[usize]> {
        self.row_offsets
            .iter()
            .find(|(o, _)| *o == op)
            .map(|(_, v)| v.as_slice())
    }
}

impl fmt::Display for RegisterRows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "register rows: {} row(s) of {}, {} threads each own {} run(s) of {} elements per \
             row (16-byte loads and stores), {} row sum(s) by warp shuffles and {} B of static \
             shared memory; no tiles in shared memory",
            self.rows,
            self.cols,
            self.threads,
            self.runs,
            self.vec,
            self.row_sums,
            self.scratch_bytes
        )
    }
}

/// Why a kernel's body does not take register rows ([`super::plan::Body::Tiles`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowsOff {
    /// Not planned yet (the state before `plan_kernel` decides).
    NotPlanned,
    /// `--no-register-rows` (or a tuning variant).
    TurnedOff,
    /// The graph runs on several GPUs.
    SeveralGpus,
    /// The CTA was asked for (`--warps`).
    CtaAsked,
    /// The loop runs more than once.
    Loop {
        /// Iterations.
        iterations: usize,
    },
    /// Elements of a type other than f16, bf16 or f32.
    ElementType(DType),
    /// The graph has no tiles.
    NoTiles,
    /// Its tiles differ in shape.
    ShapesDiffer,
    /// Its tiles differ in element type.
    TypesDiffer,
    /// A row is no whole number of 16-byte runs.
    PartialRun {
        /// Elements per row.
        cols: usize,
    },
    /// A row's 16-byte runs fill no whole warp.
    NoWholeWarp {
        /// Runs per row.
        runs: usize,
    },
    /// A thread would keep too many values per tile.
    TooManyValues {
        /// Values per thread and tile.
        values: usize,
    },
    /// An operator reads a tile defined after it.
    ReadsLater {
        /// The operator.
        op: usize,
    },
    /// An operator is not element-wise, a row norm or a one-input accumulator.
    NotElementwise {
        /// The operator.
        op: usize,
        /// Its kind's name.
        kind: String,
    },
    /// An input's or output's device tensor has a last dim that is not contiguous.
    NotContiguous {
        /// The operator.
        op: usize,
        /// Its kind's name.
        kind: String,
    },
    /// An input or output has no block region.
    NoRegion {
        /// The operator.
        op: usize,
        /// Its kind's name.
        kind: String,
    },
    /// An input's or output's block regions do not start on 16 bytes.
    RegionUnaligned {
        /// The operator.
        op: usize,
        /// Its kind's name.
        kind: String,
    },
    /// An input's or output's rows do not start on 16 bytes.
    RowsUnaligned {
        /// The operator.
        op: usize,
        /// Its kind's name.
        kind: String,
    },
    /// The row norms' partial sums would take too much shared memory.
    RowSumBytes {
        /// Row norms.
        sums: usize,
        /// Bytes their partial sums would take.
        bytes: usize,
    },
}

impl fmt::Display for RowsOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RowsOff::NotPlanned => f.write_str("not planned"),
            RowsOff::TurnedOff => f.write_str("turned off (--no-register-rows)"),
            RowsOff::SeveralGpus => f.write_str("the graph runs on several GPUs"),
            RowsOff::CtaAsked => f.write_str("the CTA was asked for (--warps)"),
            RowsOff::Loop { iterations } => write!(f, "the loop runs {iterations} times"),
            RowsOff::ElementType(d) => write!(f, "{d} elements"),
            RowsOff::NoTiles => f.write_str("no tiles"),
            RowsOff::ShapesDiffer => f.write_str("its tiles differ in shape"),
            RowsOff::TypesDiffer => f.write_str("its tiles differ in element type"),
            RowsOff::PartialRun { cols } => {
                write!(f, "a row of {cols} is no whole number of 16-byte runs")
            }
            RowsOff::NoWholeWarp { runs } => {
                write!(f, "a row's {runs} runs of 16 bytes fill no whole warp")
            }
            RowsOff::TooManyValues { values } => write!(
                f,
                "a thread would keep {values} values per tile (at most {MAX_VALUES_PER_TILE})"
            ),
            RowsOff::ReadsLater { op } => write!(f, "op{op} reads a tile defined after it"),
            RowsOff::NotElementwise { op, kind } => write!(
                f,
                "op{op} {kind} is not element-wise, a row norm or a one-input accumulator"
            ),
            RowsOff::NotContiguous { op, kind } => {
                write!(
                    f,
                    "op{op} {kind}: its device tensor's last dim is not contiguous"
                )
            }
            RowsOff::NoRegion { op, kind } => write!(f, "op{op} {kind} has no block region"),
            RowsOff::RegionUnaligned { op, kind } => {
                write!(
                    f,
                    "op{op} {kind}: its block regions do not start on 16 bytes"
                )
            }
            RowsOff::RowsUnaligned { op, kind } => {
                write!(f, "op{op} {kind}: its rows do not start on 16 bytes")
            }
            RowsOff::RowSumBytes { sums, bytes } => write!(
                f,
                "its {sums} row norms would need {bytes} bytes of partial sums (at most \
                 {MAX_ROW_SUM_BYTES})"
            ),
        }
    }
}

/// The register-rows form of threadblock graph `tb`, or why it does not apply. `regions` are
/// the block regions of its inputs and outputs (the plan's), `ins` and `outs` the geometry of
/// the customized operator's device tensors, `dtype` its element type.
pub(super) fn plan_rows(
    tb: &TbGraph,
    regions: &[Option<BlockRegion>],
    ins: &[&DTensorGeometry],
    outs: &[&DTensorGeometry],
    dtype: DType,
) -> Result<RegisterRows, RowsOff> {
    if tb.forloop_range != 1 {
        return Err(RowsOff::Loop {
            iterations: tb.forloop_range,
        });
    }
    let bytes = dtype.bytes();
    if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32) {
        return Err(RowsOff::ElementType(dtype));
    }
    let mut shapes = tb.tensors.iter().map(|(_, t)| t.shape);
    let Some(shape) = shapes.next() else {
        return Err(RowsOff::NoTiles);
    };
    if shapes.any(|s| s != shape) {
        return Err(RowsOff::ShapesDiffer);
    }
    if tb.tensors.iter().any(|(_, t)| t.dtype != dtype) {
        return Err(RowsOff::TypesDiffer);
    }
    let rank = shape.rank();
    let cols = shape.dim(rank - 1);
    let rows: usize = (0..rank - 1).map(|d| shape.dim(d)).product();
    let vec = 16 / bytes;
    if !cols.is_multiple_of(vec) {
        return Err(RowsOff::PartialRun { cols });
    }
    let lanes = cols / vec;
    let threads = (32..=MAX_THREADS.min(lanes))
        .rev()
        .step_by(32)
        .find(|t| t % 32 == 0 && lanes.is_multiple_of(*t))
        .ok_or(RowsOff::NoWholeWarp { runs: lanes })?;
    let runs = lanes / threads;
    if rows * runs * vec > MAX_VALUES_PER_TILE {
        return Err(RowsOff::TooManyValues {
            values: rows * runs * vec,
        });
    }
    let mut defined = vec![false; tb.tensors.len()];
    let mut row_offsets = Vec::new();
    let mut row_sums = 0;
    for (h, op) in tb.ops.iter() {
        if op.inputs.iter().any(|t| !defined[t.index()]) {
            return Err(RowsOff::ReadsLater { op: h.index() });
        }
        let geometry = match &op.kind {
            TbOpKind::Input { input, .. } => Some(ins[*input]),
            TbOpKind::Output { output, .. } => Some(outs[*output]),
            TbOpKind::Unary(_) | TbOpKind::Binary(_) => None,
            TbOpKind::RmsNorm => {
                row_sums += 1;
                None
            }
            TbOpKind::Accum(AccumKind::Nored) => None,
            other => {
                return Err(RowsOff::NotElementwise {
                    op: h.index(),
                    kind: other.name(),
                });
            }
        };
        if let Some(g) = geometry {
            let strides = &g.strides.0;
            if strides[rank - 1] != 1 {
                return Err(RowsOff::NotContiguous {
                    op: h.index(),
                    kind: op.kind.name(),
                });
            }
            let region = regions[h.index()]
                .as_ref()
                .ok_or_else(|| RowsOff::NoRegion {
                    op: h.index(),
                    kind: op.kind.name(),
                })?;
            if region
                .steps
                .iter()
                .any(|&(_, e)| !(e * bytes).is_multiple_of(16))
            {
                return Err(RowsOff::RegionUnaligned {
                    op: h.index(),
                    kind: op.kind.name(),
                });
            }
            // Row r of the tile, unravelled over the leading dims (row-major), at its device
            // tensor's strides.
            let offsets: Vec<usize> = (0..rows)
                .map(|r| {
                    let mut rest = r;
                    let mut off = 0;
                    for d in (0..rank - 1).rev() {
                        off += (rest % shape.dim(d)) * strides[d];
                        rest /= shape.dim(d);
                    }
                    off
                })
                .collect();
            if offsets.iter().any(|o| !(o * bytes).is_multiple_of(16)) {
                return Err(RowsOff::RowsUnaligned {
                    op: h.index(),
                    kind: op.kind.name(),
                });
            }
            row_offsets.push((h.index(), offsets));
        }
        for t in &op.outputs {
            defined[t.index()] = true;
        }
    }
    // The compute type of every element type the rows take is float.
    let scratch = row_sums * rows * (threads / 32) * 4;
    let first_output = tb
        .ops
        .iter()
        .find(|(_, op)| matches!(op.kind, TbOpKind::Output { .. }))
        .map_or(tb.ops.len(), |(h, _)| h.index());
    if scratch > MAX_ROW_SUM_BYTES {
        return Err(RowsOff::RowSumBytes {
            sums: row_sums,
            bytes: scratch,
        });
    }
    Ok(RegisterRows {
        rows,
        cols,
        vec,
        threads,
        runs,
        row_offsets,
        row_sums,
        scratch_bytes: scratch,
        first_output,
    })
}

#[cfg(test)]
mod tests {
    use crate::graph::DType;
    use crate::graph::ops::UnaryOp;
    use crate::graph::workloads::row_block;
    use crate::sched::plan::{Body, Options};
    use crate::target::Target;

    fn body(g: &crate::graph::KernelGraph) -> Body {
        let p = crate::sched::plan(g, &Options::for_target(Target::all()[1])).unwrap();
        p.kernels.values().next().unwrap().body.clone()
    }

    #[test]
    fn a_thread_per_run_and_runs_beyond_the_largest_cta() {
        let g = row_block(
            &[8, 4096],
            [8, 1, 1],
            [0, -1, -1],
            UnaryOp::Silu,
            DType::F16,
        )
        .unwrap();
        let Body::Rows(r) = body(&g) else {
            panic!("{:?}", body(&g))
        };
        assert_eq!(
            (r.rows, r.cols, r.vec, r.threads, r.runs, r.row_sums),
            (1, 4096, 8, 512, 1, 2)
        );
        assert_eq!(r.row_offsets.len(), 3, "two inputs and the output");
        let g = row_block(
            &[2, 32768],
            [2, 1, 1],
            [0, -1, -1],
            UnaryOp::Relu,
            DType::BF16,
        )
        .unwrap();
        let Body::Rows(r) = body(&g) else {
            panic!("{:?}", body(&g))
        };
        assert_eq!((r.vec, r.threads, r.runs), (8, 1024, 4));
        // Two rows per block of a [4, 6, 768] tensor cut along both leading dims: the rows sit
        // a row of 768 apart in the device tensor.
        let g = row_block(
            &[4, 6, 768],
            [3, 4, 1],
            [1, 0, -1],
            UnaryOp::Exp,
            DType::F16,
        )
        .unwrap();
        let Body::Rows(r) = body(&g) else {
            panic!("{:?}", body(&g))
        };
        assert_eq!((r.rows, r.threads), (2, 96));
        assert!(
            r.row_offsets.iter().all(|(_, o)| o == &[0, 768]),
            "{:?}",
            r.row_offsets
        );
    }

    #[test]
    fn what_register_rows_refuse_is_said() {
        let why = |g: &crate::graph::KernelGraph| match body(g) {
            Body::Tiles(why) => why,
            Body::Rows(r) => panic!("register rows: {r}"),
        };
        use super::RowsOff;
        // Too many values per thread: 8 rows of 1024 per block.
        let g = row_block(
            &[8, 1024],
            [1, 1, 1],
            [0, -1, -1],
            UnaryOp::Silu,
            DType::F16,
        )
        .unwrap();
        assert!(
            matches!(why(&g), RowsOff::TooManyValues { .. }),
            "{}",
            why(&g)
        );
        // A row of 100 f16 elements is no whole number of 16-byte runs.
        let g = row_block(&[4, 100], [4, 1, 1], [0, -1, -1], UnaryOp::Silu, DType::F16).unwrap();
        assert_eq!(why(&g), RowsOff::PartialRun { cols: 100 });
        // A row of 64 f16 runs only 8 threads wide.
        let g = row_block(&[4, 64], [4, 1, 1], [0, -1, -1], UnaryOp::Silu, DType::F16).unwrap();
        assert_eq!(why(&g), RowsOff::NoWholeWarp { runs: 8 });
        // A loop of more than one iteration.
        let g = crate::graph::workloads::decode_graphs()
            .unwrap()
            .remove(0)
            .1;
        assert!(matches!(why(&g), RowsOff::Loop { .. }), "{}", why(&g));
    }
}
