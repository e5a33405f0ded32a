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
             row (16-byte loads and stores), {} row sum(s) by warp shuffles and shared memory; \
             no tiles in shared memory",
            self.rows, self.cols, self.threads, self.runs, self.vec, self.row_sums
        )
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
) -> Result<RegisterRows, String> {
    if tb.forloop_range != 1 {
        return Err(format!("the loop runs {} times", tb.forloop_range));
    }
    let bytes = dtype.bytes();
    if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32) {
        return Err(format!("{dtype} elements"));
    }
    let mut shapes = tb.tensors.iter().map(|(_, t)| t.shape);
    let Some(shape) = shapes.next() else {
        return Err("no tiles".into());
    };
    if shapes.any(|s| s != shape) {
        return Err("its tiles differ in shape".into());
    }
    if tb.tensors.iter().any(|(_, t)| t.dtype != dtype) {
        return Err("its tiles differ in element type".into());
    }
    let rank = shape.rank();
    let cols = shape.dim(rank - 1);
    let rows: usize = (0..rank - 1).map(|d| shape.dim(d)).product();
    let vec = 16 / bytes;
    if !cols.is_multiple_of(vec) {
        return Err(format!(
            "a row of {cols} is no whole number of 16-byte runs"
        ));
    }
    let lanes = cols / vec;
    let threads = (32..=MAX_THREADS.min(lanes))
        .rev()
        .step_by(32)
        .find(|t| t % 32 == 0 && lanes.is_multiple_of(*t))
        .ok_or_else(|| format!("a row's {lanes} runs of 16 bytes fill no whole warp"))?;
    let runs = lanes / threads;
    if rows * runs * vec > MAX_VALUES_PER_TILE {
        return Err(format!(
            "a thread would keep {} values per tile (at most {MAX_VALUES_PER_TILE})",
            rows * runs * vec
        ));
    }
    let mut defined = vec![false; tb.tensors.len()];
    let mut row_offsets = Vec::new();
    let mut row_sums = 0;
    for (h, op) in tb.ops.iter() {
        if op.inputs.iter().any(|t| !defined[t.index()]) {
            return Err(format!("op{} reads a tile defined after it", h.index()));
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
                return Err(format!(
                    "op{} {} is not element-wise, a row norm or a one-input accumulator",
                    h.index(),
                    other.name()
                ));
            }
        };
        if let Some(g) = geometry {
            let strides = &g.strides.0;
            if strides[rank - 1] != 1 {
                return Err(format!(
                    "op{} {}: its device tensor's last dim is not contiguous",
                    h.index(),
                    op.kind.name()
                ));
            }
            let region = regions[h.index()]
                .as_ref()
                .ok_or_else(|| format!("op{} {} has no block region", h.index(), op.kind.name()))?;
            if region
                .steps
                .iter()
                .any(|&(_, e)| !(e * bytes).is_multiple_of(16))
            {
                return Err(format!(
                    "op{} {}: its block regions do not start on 16 bytes",
                    h.index(),
                    op.kind.name()
                ));
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
                return Err(format!(
                    "op{} {}: its rows do not start on 16 bytes",
                    h.index(),
                    op.kind.name()
                ));
            }
            row_offsets.push((h.index(), offsets));
        }
        for t in &op.outputs {
            defined[t.index()] = true;
        }
    }
    let scratch = row_sums * rows * (threads / 32) * 4;
    if scratch > MAX_ROW_SUM_BYTES {
        return Err(format!(
            "its {row_sums} row norms would need {scratch} bytes of partial sums (at most \
             {MAX_ROW_SUM_BYTES})"
        ));
    }
    Ok(RegisterRows {
        rows,
        cols,
        vec,
        threads,
        runs,
        row_offsets,
        row_sums,
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
        // Too many values per thread: 8 rows of 1024 per block.
        let g = row_block(
            &[8, 1024],
            [1, 1, 1],
            [0, -1, -1],
            UnaryOp::Silu,
            DType::F16,
        )
        .unwrap();
        assert!(why(&g).contains("values per tile"), "{}", why(&g));
        // A row of 100 f16 elements is no whole number of 16-byte runs.
        let g = row_block(&[4, 100], [4, 1, 1], [0, -1, -1], UnaryOp::Silu, DType::F16).unwrap();
        assert!(why(&g).contains("16-byte runs"), "{}", why(&g));
        // A row of 64 f16 runs only 8 threads wide.
        let g = row_block(&[4, 64], [4, 1, 1], [0, -1, -1], UnaryOp::Silu, DType::F16).unwrap();
        assert!(why(&g).contains("no whole warp"), "{}", why(&g));
        // A loop of more than one iteration.
        let g = crate::graph::workloads::decode_graphs()
            .unwrap()
            .remove(0)
            .1;
        assert!(why(&g).contains("the loop runs"), "{}", why(&g));
    }
}
