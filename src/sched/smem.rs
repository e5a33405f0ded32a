//! Shared-memory buffers of a customized operator and their lifetimes, in schedule steps
//! (barriers included): what the DSA packing of [`super::memory`] places.
//!
//! A tile lives from the start of the barrier interval that writes it (chains between two
//! barriers run concurrently) to the barrier after its last reader (a buffer is free only once
//! every thread is past the reads). Pipelined input tiles, shared-memory accumulators and the
//! state of a running max live through the whole loop (their initial values are written just
//! before it, after the pre-loop phase); register accumulators get a write-back buffer after the
//! loop, only if something reads them; tiles written before the loop and read in it live
//! through the loop.

use super::memory::{self, Buffer};
use super::ops::{AccumStorage, CopyEngine, OpPlan};
use super::order::{Phase, Schedule, Step};
use super::plan::{SmemKind, SmemPlan};
use super::tma::TMA_SLOT_ALIGN;
use crate::graph::fusion::FusionPlan;
use crate::graph::mirage_json::names;
use crate::graph::ops::TbReduction;
use crate::graph::threadblock::{TbGraph, TbOpKind};
use crate::layout::swizzle::TileGeometry;

/// Bytes of one shared-memory line (32 banks of 4 bytes): the alignment of every tile of that
/// size or more.
pub const SMEM_LINE: usize = 128;

/// Bytes of one warp's slice of a key split's output buffer ([`SmemKind::KeySplit`]): the tile
/// (`tile_bytes`), then a running max and a row sum per row (fp32), rounded up to a line.
pub fn key_split_slice_bytes(tile_bytes: usize, rows: usize) -> usize {
    (tile_bytes + 2 * 4 * rows).next_multiple_of(SMEM_LINE)
}

/// Shared-memory buffers and their lifetimes in schedule steps (barriers included), packed
/// from `base`. When `base` plus the lower bound of any packing exceeds `limit` (bytes per
/// block), the buffers are not packed: the plan's peak is that lower bound and every offset 0,
/// a plan only fit to be refused.
///
/// `key_splits` maps the output accumulator of each key split ([`super::plan::RegisterPipe`]
/// with `keys` > 1) to its warps: its write-back buffer holds a slice per warp
/// ([`SmemKind::KeySplit`], [`key_split_slice_bytes`]).
#[allow(clippy::too_many_arguments)]
pub fn smem_plan(
    tb: &TbGraph,
    fusion: &FusionPlan,
    sched: &Schedule,
    ops: &[OpPlan],
    tiles: &[Option<TileGeometry>],
    base: usize,
    limit: usize,
    key_splits: &std::collections::BTreeMap<usize, usize>,
) -> SmemPlan {
    let steps: Vec<(Phase, &Step)> = sched.steps().collect();
    let total_steps = steps.len();
    let phase_range = |ph: Phase| -> (usize, usize) {
        let idx: Vec<usize> = steps
            .iter()
            .enumerate()
            .filter(|(_, (p, _))| *p == ph)
            .map(|(i, _)| i)
            .collect();
        match (idx.first(), idx.last()) {
            (Some(&a), Some(&b)) => (a, b + 1),
            _ => {
                // An empty phase sits between its neighbours.
                let before = steps.iter().filter(|(p, _)| *p < ph).count();
                (before, before)
            }
        }
    };
    let (loop_start, loop_end) = phase_range(Phase::Loop);
    let (post_start, _) = phase_range(Phase::PostLoop);
    let end_barrier = sched
        .body
        .last()
        .is_some_and(|s| matches!(s, Step::Barrier(_)));
    // Step index of each chain.
    let mut run_at = vec![0usize; fusion.chains.len()];
    for (i, (_, st)) in steps.iter().enumerate() {
        if let Step::Run(c) = st {
            run_at[*c] = i;
        }
    }
    // The first barrier at or after step i, within the same phase, or the phase's end.
    let release = |i: usize| -> usize {
        let ph = steps[i].0;
        for (j, (p, st)) in steps.iter().enumerate().skip(i) {
            if *p != ph {
                return j;
            }
            if matches!(st, Step::Barrier(_)) {
                return j + 1;
            }
        }
        total_steps
    };
    // The first step of the barrier interval holding step i: chains between two barriers run
    // concurrently, so a tile written in an interval is live from the interval's start (two
    // tiles written in one interval must not share memory, even if one is never read).
    let acquire = |i: usize| -> usize {
        let ph = steps[i].0;
        (0..i)
            .rev()
            .find(|&j| steps[j].0 != ph || matches!(steps[j].1, Step::Barrier(_)))
            .map_or(0, |j| j + 1)
    };
    // Readers of each tile: the chains that take it as input (leaders' inputs and binary
    // members' side tiles).
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); tb.tensors.len()];
    for c in 0..fusion.chains.len() {
        for t in fusion.reads(tb, c) {
            readers[t.index()].push(c);
        }
    }
    let mut buffers = Vec::new();
    let mut kinds = Vec::new();
    for (h, op) in tb.ops.iter() {
        let c = fusion.chain_of[h.index()];
        if fusion.chains[c].tail() != h {
            continue;
        }
        for &t in &op.outputs {
            let Some(geo) = &tiles[t.index()] else {
                continue;
            };
            let ph = sched.phase[c];
            let last_read = readers[t.index()].iter().map(|&r| run_at[r]).max();
            let end_of = |from: usize| last_read.map_or(from + 1, |r| release(r).max(from + 1));
            let name = format!("s{} ({})", t.index(), names::tb_name(&op.kind, false));
            let mut stages = 1;
            // A tile of a line or more starts on a line: a warp's 16-byte accesses to one
            // 128-byte row of the tile then touch one line of the banks, not two.
            let mut align = if geo.bytes >= SMEM_LINE {
                SMEM_LINE
            } else {
                16
            };
            let (start, end, kind) = match (&op.kind, &ops[h.index()]) {
                (
                    TbOpKind::Input { .. },
                    OpPlan::Input {
                        stages: s, engine, ..
                    },
                ) if *s > 1 => {
                    stages = *s;
                    if *engine == CopyEngine::Tma {
                        align = TMA_SLOT_ALIGN;
                    }
                    (
                        loop_start,
                        loop_end.max(end_of(loop_start)),
                        SmemKind::Tile {
                            tile: t.index(),
                            stages: *s,
                        },
                    )
                }
                (
                    TbOpKind::Accum(_),
                    OpPlan::Accum {
                        storage: AccumStorage::Registers { .. },
                        ..
                    },
                ) if key_splits.contains_key(&h.index()) => {
                    // The warps' states meet here even if nothing reads the tile (the sum and
                    // max accumulators are written from it).
                    let warps = key_splits[&h.index()];
                    let shape = tb.tensors[t].shape;
                    let rows = shape.numel() / shape.dim(shape.rank() - 1).max(1);
                    let slice_bytes = key_split_slice_bytes(geo.bytes, rows);
                    stages = warps;
                    align = SMEM_LINE;
                    (
                        post_start,
                        end_of(post_start),
                        SmemKind::KeySplit {
                            tile: t.index(),
                            warps,
                            slice_bytes,
                            tile_bytes: geo.bytes,
                        },
                    )
                }
                (
                    TbOpKind::Accum(_),
                    OpPlan::Accum {
                        storage: AccumStorage::Registers { .. },
                        ..
                    },
                ) => {
                    if readers[t.index()].is_empty() {
                        continue;
                    }
                    (
                        post_start,
                        end_of(post_start),
                        SmemKind::Writeback { tile: t.index() },
                    )
                }
                (TbOpKind::Accum(_), _) => (
                    loop_start,
                    end_of(loop_start).max(loop_end),
                    SmemKind::Tile {
                        tile: t.index(),
                        stages: 1,
                    },
                ),
                // The running max's state carries over from one iteration to the next.
                (
                    TbOpKind::Reduction {
                        kind: TbReduction::Max,
                        ..
                    },
                    _,
                ) if t == op.outputs[0] => (
                    loop_start,
                    end_of(loop_start).max(loop_end),
                    SmemKind::Tile {
                        tile: t.index(),
                        stages: 1,
                    },
                ),
                _ => {
                    let def = run_at[c];
                    let (s, e) = match ph {
                        Phase::PreLoop => (
                            acquire(def),
                            end_of(def).max(
                                if readers[t.index()]
                                    .iter()
                                    .any(|&r| sched.phase[r] == Phase::Loop)
                                {
                                    loop_end
                                } else {
                                    0
                                },
                            ),
                        ),
                        Phase::Loop if !end_barrier => (loop_start, loop_end),
                        _ => (acquire(def), end_of(def)),
                    };
                    (
                        s,
                        e,
                        SmemKind::Tile {
                            tile: t.index(),
                            stages: 1,
                        },
                    )
                }
            };
            let (label, bytes) = match kind {
                SmemKind::KeySplit {
                    warps, slice_bytes, ..
                } => (
                    format!("{name} x{warps} warps' slices"),
                    warps * slice_bytes,
                ),
                _ if stages > 1 => (format!("{name} x{stages} stages"), geo.bytes * stages),
                _ => (name, geo.bytes),
            };
            buffers.push(Buffer {
                name: label,
                bytes,
                start,
                end: end.max(start + 1),
                align,
            });
            kinds.push(kind);
        }
    }
    // A plan whose live tiles alone exceed the limit is refused whatever the packing: do not
    // pack it (packing tiles that all live at once costs the square of their number).
    let lower_bound = memory::lower_bound(&buffers);
    let packing = if base.saturating_add(lower_bound) > limit {
        memory::Packing {
            offsets: vec![0; buffers.len()],
            peak: lower_bound,
            lower_bound,
            heuristic: "none: the lower bound exceeds the limit",
        }
    } else {
        memory::pack_from(&buffers, base)
    };
    let total = base + packing.peak;
    SmemPlan {
        buffers,
        kinds,
        packing,
        base,
        total,
    }
}
