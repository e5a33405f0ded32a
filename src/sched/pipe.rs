//! Register pipes ([`RegisterPipe`]): which products of a tensor-core matmul stay in registers
//! on their way into another matmul's A operand, and the warp grids that makes them need.
//!
//! A candidate is a chain led by a tensor-core matmul whose values go through unary members
//! into a tile that some tensor-core matmul reads as its A operand (attention's
//! `exp(Q·K)` before `·V`). It becomes a pipe when every reader can take the tile from the
//! producing warps' registers:
//!
//! - the readers are that matmul, whose product goes straight into a register accumulator's
//!   fragment, and row-summing accumulators (`accum_red_ld_sum`), each leading its own chain;
//! - both matmuls run in the same phase, in 16-bit types, on a tile kept in that type (a value
//!   rounded to it, as its store would);
//! - the rows (M, a multiple of 16) split evenly over the CTA's warps in tiles of 16 rows, the
//!   product's width (the consumer's K) is a multiple of 16, and both fragments together fit
//!   in [`PIPE_REGISTERS`] registers per thread.
//!
//! Anything else keeps the tile in shared memory, and the decision says why.

use super::ops::{AccumStorage, OpPlan, fragment_registers, operand_load_count, tile_dtypes};
use super::order::{Schedule, schedule_with_pipes};
use super::plan::{OnlinePipe, OnlineShape, PipeDecision, PipeOff, RegisterPipe};
use crate::graph::arena::Handle;
use crate::graph::fusion::FusionPlan;
use crate::graph::ops::{AccumKind, BinaryOp, TbReduction, UnaryOp};
use crate::graph::threadblock::{STensor, TbGraph, TbOp, TbOpKind};

/// fp32 registers per thread the producer's and the consumer's fragments may take together (the
/// rest of the 255 hold operand fragments, addresses and the loop's state).
pub const PIPE_REGISTERS: usize = 128;

/// (M, N, K) of matmul `mm`.
fn mnk(tb: &TbGraph, mm: Handle<TbOp>) -> (usize, usize, usize) {
    let op = &tb.ops[mm];
    let (a, b) = (
        &tb.tensors[op.inputs[0]].shape,
        &tb.tensors[op.inputs[1]].shape,
    );
    let r = a.rank();
    (a.dim(r - 2), b.dim(r - 1), a.dim(r - 1))
}

fn is_mma(ops: &[OpPlan], op: Handle<TbOp>) -> bool {
    matches!(&ops[op.index()], OpPlan::Matmul { instr, .. } if instr.is_mma())
}

/// The register pipes of a threadblock graph planned for `threads` threads (`enabled`: the
/// option that turns them off for comparison), and the schedule they give. For each pipe, sets
/// both matmuls' warp grids to the pipe's (the consumer's A operand to
/// [`super::ops::OperandLoad::Fragment`]) and the consumer's accumulator fragment to match.
/// A pipe whose consumer would still run after a barrier (it reads another tile written at the
/// producer's level, or runs in another phase) is turned off.
pub fn plan_pipes(
    tb: &TbGraph,
    fusion: &FusionPlan,
    ops: &mut [OpPlan],
    threads: usize,
    enabled: bool,
) -> (Vec<PipeDecision>, Schedule) {
    let mut decisions = candidates(tb, fusion, ops, threads, enabled);
    let sched = loop {
        let piped: Vec<usize> = decisions
            .iter()
            .filter_map(PipeDecision::on)
            .flat_map(|p| p.tiles())
            .collect();
        let sched = schedule_with_pipes(tb, fusion, &piped);
        let mut changed = false;
        for d in &mut decisions {
            let PipeDecision::On(p) = d else { continue };
            let at = |c: usize| (sched.phase[c], sched.level[c]);
            let late = p
                .consumers()
                .find(|&o| at(fusion.chain_of[o.index()]) != at(p.producer));
            if let Some(o) = late {
                *d = PipeDecision::Off {
                    tile: p.tile,
                    why: PipeOff::Late {
                        op: o.index(),
                        kind: tb.ops[o].kind.name(),
                    },
                };
                changed = true;
            }
        }
        if !changed {
            break sched;
        }
    };
    for p in decisions.iter().filter_map(PipeDecision::on) {
        let lead = fusion.chains[p.producer].leader();
        set_warps(tb, ops, lead, (p.warps, p.keys), 1, false);
        set_warps(tb, ops, p.matmul, (p.warps, 1), p.keys, true);
        let (m2, n2, _) = mnk(tb, p.matmul);
        let acc = fusion.chain(p.matmul).tail();
        if let OpPlan::Accum {
            storage: AccumStorage::Registers { per_thread, .. },
            ..
        } = &mut ops[acc.index()]
        {
            *per_thread = fragment_registers(m2, n2, (p.warps, 1));
        }
        // The producer's warps sum the rows (by shuffles), not a row split of the CTA.
        for &r in &p.row_sums {
            if let OpPlan::Accum { rows, .. } = &mut ops[r.index()] {
                *rows = None;
            }
        }
        if let Some(o) = &p.online {
            // O in the consumer's fragment; l and the final m in shared memory, written per
            // row by the row's first lane.
            if let OpPlan::Accum { storage, rows, .. } = &mut ops[o.out_acc.index()] {
                *storage = AccumStorage::Registers {
                    per_thread: fragment_registers(m2, n2, (p.warps, 1)),
                    fragment_of: Some(p.matmul),
                };
                *rows = None;
            }
            // (Under a key split, l and m stay in registers per warp and reach their tiles
            // once, after the loop.)
            for a in [o.sum_acc, o.max_acc] {
                if let OpPlan::Accum { storage, rows, .. } = &mut ops[a.index()] {
                    *storage = AccumStorage::Shared;
                    *rows = None;
                }
            }
        }
    }
    (decisions, sched)
}

/// Every candidate tile with its decision, before the schedule is checked.
fn candidates(
    tb: &TbGraph,
    fusion: &FusionPlan,
    ops: &[OpPlan],
    threads: usize,
    enabled: bool,
) -> Vec<PipeDecision> {
    let stored = tile_dtypes(tb);
    let mut decisions = Vec::new();
    for (c, chain) in fusion.chains.iter().enumerate() {
        let lead = chain.leader();
        if !matches!(tb.ops[lead].kind, TbOpKind::Matmul) || !is_mma(ops, lead) {
            continue;
        }
        let tail = chain.tail();
        let Some(&tile) = tb.ops[tail].outputs.first() else {
            continue;
        };
        // Readers of the tile, and the matmul among them that takes it as A.
        let readers: Vec<Handle<TbOp>> = tb
            .ops
            .iter()
            .filter(|(_, op)| op.inputs.contains(&tile))
            .map(|(h, _)| h)
            .collect();
        let running_max = readers.iter().any(|&r| {
            matches!(
                tb.ops[r].kind,
                TbOpKind::Reduction {
                    kind: TbReduction::Max,
                    ..
                }
            )
        });
        if running_max && chain.ops.len() == 1 {
            let decision = if enabled {
                online(tb, fusion, ops, threads, c, &stored)
            } else {
                Err(PipeOff::TurnedOff)
            };
            decisions.push(match decision {
                Ok(p) => PipeDecision::On(p),
                Err(why) => PipeDecision::Off {
                    tile: tile.index(),
                    why,
                },
            });
            continue;
        }
        let Some(&consumer) = readers
            .iter()
            .find(|&&r| matches!(tb.ops[r].kind, TbOpKind::Matmul) && tb.ops[r].inputs[0] == tile)
        else {
            continue;
        };
        let off = |why: PipeOff| PipeDecision::Off {
            tile: tile.index(),
            why,
        };
        let decision = (|| {
            if !enabled {
                return Err(PipeOff::TurnedOff);
            }
            if let Some(&m) = chain.ops[1..]
                .iter()
                .find(|&&m| !matches!(tb.ops[m].kind, TbOpKind::Unary(_)))
            {
                return Err(PipeOff::NotUnary {
                    op: m.index(),
                    kind: tb.ops[m].kind.name(),
                });
            }
            if !matches!(tb.ops[tail].kind, TbOpKind::Matmul | TbOpKind::Unary(_)) {
                return Err(PipeOff::NotUnary {
                    op: tail.index(),
                    kind: tb.ops[tail].kind.name(),
                });
            }
            if !is_mma(ops, consumer) {
                return Err(PipeOff::ConsumerNotMma {
                    op: consumer.index(),
                });
            }
            if tb.ops[consumer].inputs[1] == tile {
                return Err(PipeOff::BothOperands {
                    op: consumer.index(),
                });
            }
            let mut row_sums = Vec::new();
            for &r in &readers {
                if r == consumer {
                    continue;
                }
                let sums = matches!(tb.ops[r].kind, TbOpKind::Accum(AccumKind::RedLdSum))
                    && fusion.is_leader(r);
                if !sums {
                    return Err(PipeOff::OtherReader {
                        op: r.index(),
                        kind: tb.ops[r].kind.name(),
                    });
                }
                row_sums.push(r);
            }
            // The consumer's chain: its product straight into a register accumulator.
            let cchain = fusion.chain(consumer);
            let acc = cchain.tail();
            let into_fragment = cchain.ops.len() == 2
                && matches!(tb.ops[acc].kind, TbOpKind::Accum(AccumKind::Nored))
                && matches!(&ops[acc.index()], OpPlan::Accum {
                    storage: AccumStorage::Registers { fragment_of: Some(f), .. }, ..
                } if *f == consumer);
            if !into_fragment {
                return Err(PipeOff::NotIntoFragment {
                    op: consumer.index(),
                });
            }
            let warps = fragment_fit(tb, lead, consumer, tile, &stored, threads)?;
            Ok(RegisterPipe {
                producer: c,
                tile: tile.index(),
                matmul: consumer,
                row_sums,
                warps,
                keys: 1,
                online: None,
            })
        })();
        decisions.push(match decision {
            Ok(p) => PipeDecision::On(p),
            Err(why) => off(why),
        });
    }
    decisions
}

/// Whether the product of matmul `lead`, kept in tile `tile` (its 16-bit type), can pass in
/// registers into `consumer`'s A operand on the CTA's warps along M: the shapes chain, the
/// tiles are whole 16 × 16 tiles, the row tiles split evenly over the warps, and both
/// fragments fit [`PIPE_REGISTERS`]. Returns the warps.
fn fragment_fit(
    tb: &TbGraph,
    lead: Handle<TbOp>,
    consumer: Handle<TbOp>,
    tile: Handle<STensor>,
    stored: &[crate::graph::dtype::DType],
    threads: usize,
) -> Result<usize, PipeOff> {
    if tb.tensors[tile].dtype != stored[tile.index()] {
        return Err(PipeOff::Widened);
    }
    let (m, n, _) = mnk(tb, lead);
    let (m2, n2, k2) = mnk(tb, consumer);
    if m2 != m || k2 != n {
        return Err(PipeOff::ShapeMismatch);
    }
    if m % 16 != 0 || n % 16 != 0 {
        return Err(PipeOff::NotWhole16 { m, n });
    }
    let warps = (threads / 32).max(1);
    if (m / 16) % warps != 0 {
        return Err(PipeOff::UnevenRows {
            row_tiles: m / 16,
            warps,
        });
    }
    let regs = fragment_registers(m, n, (warps, 1)) + fragment_registers(m2, n2, (warps, 1));
    if regs > PIPE_REGISTERS {
        return Err(PipeOff::Registers { regs });
    }
    Ok(warps)
}

/// The key split of an online pipe whose row tiles do not split evenly over the CTA's warps
/// (`fragment_fit` has checked the shapes and the tile's type): one warp along M, the product's
/// columns (the consumer's K) over all warps in pairs of 8-column tiles, and the producer's
/// share of the scores and the consumer's whole fragment within [`PIPE_REGISTERS`]. Returns
/// (1, warps).
fn key_split_fit(
    tb: &TbGraph,
    lead: Handle<TbOp>,
    consumer: Handle<TbOp>,
    threads: usize,
) -> Result<(usize, usize), PipeOff> {
    let (m, n, _) = mnk(tb, lead);
    let (m2, n2, _) = mnk(tb, consumer);
    let warps = (threads / 32).max(1);
    if warps < 2 || !n.is_multiple_of(16 * warps) {
        return Err(PipeOff::UnevenKeys {
            row_tiles: m / 16,
            cols: n,
            warps,
        });
    }
    let regs = fragment_registers(m, n, (1, warps)) + fragment_registers(m2, n2, (1, 1));
    if regs > PIPE_REGISTERS {
        return Err(PipeOff::Registers { regs });
    }
    Ok((1, warps))
}

/// The online-softmax form of a pipe led by chain `c` (a lone matmul giving the scores S; see
/// [`OnlinePipe`]), or why it cannot run in registers.
fn online(
    tb: &TbGraph,
    fusion: &FusionPlan,
    ops: &[OpPlan],
    threads: usize,
    c: usize,
    stored: &[crate::graph::dtype::DType],
) -> Result<RegisterPipe, PipeOff> {
    let shape = PipeOff::Online;
    let all_readers = tb.readers();
    let readers = |t: Handle<STensor>| all_readers[t.index()].clone();
    let alone = |o: Handle<TbOp>| fusion.is_leader(o) && fusion.chain(o).ops.len() == 1;
    let mm1 = fusion.chains[c].leader();
    let s = tb.ops[mm1].outputs[0];
    let rs = readers(s);
    let find = |hs: &[Handle<TbOp>], f: &dyn Fn(&TbOp) -> bool| {
        hs.iter().copied().find(|&h| f(&tb.ops[h]))
    };
    let (Some(max), Some(sub)) = (
        find(&rs, &|o| {
            matches!(
                o.kind,
                TbOpKind::Reduction {
                    kind: TbReduction::Max,
                    ..
                }
            )
        }),
        find(&rs, &|o| {
            o.kind == TbOpKind::Binary(BinaryOp::Sub) && o.inputs[0] == s
        }),
    ) else {
        return Err(shape(OnlineShape::ScoresReaders));
    };
    if rs.len() != 2 || !alone(max) {
        return Err(shape(OnlineShape::ScoresShared));
    }
    let r = tb.tensors[s].shape.rank();
    if !matches!(tb.ops[max].kind, TbOpKind::Reduction { dim, .. } if dim == r - 1) {
        return Err(shape(OnlineShape::MaxNotOverRows));
    }
    let (m, d) = (tb.ops[max].outputs[0], tb.ops[max].outputs[1]);
    let sub_chain = fusion.chain(sub);
    if tb.ops[sub].inputs[1] != m
        || !fusion.is_leader(sub)
        || sub_chain.ops.len() != 2
        || tb.ops[sub_chain.tail()].kind != TbOpKind::Unary(UnaryOp::Exp)
    {
        return Err(shape(OnlineShape::NoExp));
    }
    let e = tb.ops[sub_chain.tail()].outputs[0];
    let rd = readers(d);
    let (Some(max_acc), &[rescale]) = (
        find(&readers(m), &|o| o.kind == TbOpKind::Accum(AccumKind::Max)),
        &rd[..],
    ) else {
        return Err(shape(OnlineShape::MaxNotAccumulated));
    };
    if readers(m).len() != 2
        || tb.ops[rescale].kind != TbOpKind::Unary(UnaryOp::Exp)
        || !alone(rescale)
        || !alone(max_acc)
    {
        return Err(shape(OnlineShape::MaxShared));
    }
    let rf = tb.ops[rescale].outputs[0];
    let re = readers(e);
    let (Some(mm2), Some(sum_acc)) = (
        find(&re, &|o| {
            o.kind == TbOpKind::Matmul && o.inputs[0] == e && o.inputs[1] != e
        }),
        find(&re, &|o| {
            o.kind == TbOpKind::Accum(AccumKind::RedLdSumRescale) && o.inputs == [e, rf]
        }),
    ) else {
        return Err(shape(OnlineShape::ExpReaders));
    };
    let p = tb.ops[mm2].outputs[0];
    let (Some(out_acc), 2, true, true) = (
        find(&readers(p), &|o| {
            o.kind == TbOpKind::Accum(AccumKind::NoredRescale) && o.inputs == [p, rf]
        }),
        re.len(),
        alone(mm2) && alone(sum_acc),
        readers(rf).len() == 2 && readers(p).len() == 1,
    ) else {
        return Err(shape(OnlineShape::ProductNotRescaled));
    };
    if !alone(out_acc) {
        return Err(shape(OnlineShape::LongerChain));
    }
    if !is_mma(ops, mm1) || !is_mma(ops, mm2) {
        return Err(PipeOff::ConsumerNotMma { op: mm2.index() });
    }
    let (warps, keys) = match fragment_fit(tb, mm1, mm2, e, stored, threads) {
        Ok(w) => (w, 1),
        Err(PipeOff::UnevenRows { .. }) => key_split_fit(tb, mm1, mm2, threads)?,
        Err(why) => return Err(why),
    };
    let x = tb.ops[sub].outputs[0];
    Ok(RegisterPipe {
        producer: c,
        tile: e.index(),
        matmul: mm2,
        row_sums: Vec::new(),
        warps,
        keys,
        online: Some(OnlinePipe {
            max,
            sub,
            rescale,
            max_acc,
            sum_acc,
            out_acc,
            registers: vec![
                s.index(),
                m.index(),
                d.index(),
                x.index(),
                rf.index(),
                p.index(),
            ],
        }),
    })
}

/// Puts matmul `mm` on a grid of `warps` (along M, N), its K split over `keys` warps (A from
/// registers when `a_from_registers`).
fn set_warps(
    tb: &TbGraph,
    ops: &mut [OpPlan],
    mm: Handle<TbOp>,
    warps: (usize, usize),
    keys: usize,
    a_from_registers: bool,
) {
    let (m, n, k) = mnk(tb, mm);
    if let OpPlan::Matmul {
        warps: w,
        loads,
        mma_per_warp,
        load_instrs,
        ..
    } = &mut ops[mm.index()]
    {
        *w = warps;
        if a_from_registers {
            loads.0 = super::ops::OperandLoad::Fragment;
        }
        let k = k.div_ceil(keys.max(1));
        *mma_per_warp = super::ops::mma_per_warp(m, n, k, *w);
        *load_instrs = operand_load_count((m, n, k), *w, *loads);
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::builder::{GraphBuilder, TbGraphBuilder};
    use crate::graph::{AccumKind, DType, KernelGraph};
    use crate::sched::ops::{OpPlan, OperandLoad};
    use crate::sched::plan::{
        CtaChoice, KernelPlan, MatmulLowering, Options, PipeDecision, PipeOff,
    };
    use crate::target::{Arch, Target};

    /// One block of attention: S = Q·Kᵀ over 4 iterations of 128 keys, P = exp(S), l = Σ P
    /// per row, O = Σ P·V; with `extra`, P also feeds an element-wise accumulator.
    fn attention(extra: bool) -> KernelGraph {
        attention_k_rows(extra, 512)
    }

    /// [`attention`] with K's rows `k_row` elements apart (512: dense).
    fn attention_k_rows(extra: bool, k_row: usize) -> KernelGraph {
        let mut g = GraphBuilder::new();
        let q = g.new_input(&[64, 64], DType::F16).unwrap();
        let k = g
            .new_input_strided(&[64, 512], &[k_row, 1], DType::F16)
            .unwrap();
        let v = g.new_input(&[512, 64], DType::F16).unwrap();
        let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 4);
        let tq = tb.new_input(&g, q, [-1, -1, -1], -1).unwrap();
        let tk = tb.new_input(&g, k, [-1, -1, -1], 1).unwrap();
        let tv = tb.new_input(&g, v, [-1, -1, -1], 0).unwrap();
        let s = tb.matmul(tq, tk).unwrap();
        let p = tb.exp(s).unwrap();
        let l = tb.forloop_accum(p, AccumKind::RedLdSum).unwrap();
        let pv = tb.matmul(p, tv).unwrap();
        let o = tb.forloop_accum(pv, AccumKind::Nored).unwrap();
        tb.new_output(l, [-1, -1, -1]).unwrap();
        tb.new_output(o, [-1, -1, -1]).unwrap();
        if extra {
            let e = tb.forloop_accum(p, AccumKind::Nored).unwrap();
            tb.new_output(e, [-1, -1, -1]).unwrap();
        }
        for t in g.customized(tb).unwrap() {
            g.mark_output(t).unwrap();
        }
        g.build().unwrap()
    }

    fn plan(g: &KernelGraph, cta: CtaChoice, pipes: bool) -> KernelPlan {
        let opts = Options {
            cta,
            register_pipes: pipes,
            register_rows: true,
            ..Options::for_target(Target::new(Arch::Sm80))
        };
        let p = crate::sched::plan(g, &opts).unwrap();
        p.kernels.values().next().unwrap().clone()
    }

    /// On sm_90a the pipe's consumer (P·V, V one 128-byte swizzle atom across and loaded by
    /// TMA) runs as wgmma: B by descriptor, 8 instructions per warp (64 rows, K = 128 in steps
    /// of 16); so does its producer (Q·K, K's tile of 128 keys in two atom columns); on sm_80,
    /// or with `wgmma` off, both keep mma.sync and the plan says why.
    #[test]
    fn the_pipe_consumer_takes_wgmma_on_hopper() {
        use crate::sched::ops::MatmulInstr;
        let g = attention(false);
        let plan_on = |arch: Arch, wgmma: bool| {
            let opts = Options {
                cta: CtaChoice::Graph,
                wgmma,
                ..Options::for_target(Target::new(arch))
            };
            let p = crate::sched::plan(&g, &opts).unwrap();
            p.kernels.values().next().unwrap().clone()
        };
        let consumer = |kp: &KernelPlan| {
            let [PipeDecision::On(p)] = kp.pipes.as_slice() else {
                panic!("no pipe: {:?}", kp.pipes)
            };
            let OpPlan::Matmul {
                instr,
                loads,
                mma_per_warp,
                ..
            } = &kp.ops[p.matmul.index()]
            else {
                panic!("no matmul")
            };
            (p.matmul.index(), *instr, *loads, *mma_per_warp)
        };
        let kp = plan_on(Arch::Sm90a, true);
        let (_, instr, loads, per_warp) = consumer(&kp);
        assert_eq!(
            instr,
            MatmulInstr::WgmmaM64K16 {
                dtype: DType::F16,
                n: 64
            }
        );
        assert_eq!(loads, (OperandLoad::Fragment, OperandLoad::WgmmaDescriptor));
        assert_eq!(per_warp, 8);
        // The producer (Q·K over 128 keys) takes wgmma too: Q by ldmatrix, K's tile stored in
        // two atom columns of 64 keys, loaded by one TMA box of (64 keys, 64, 2 columns).
        let producer = kp.fusion.chains[kp.register_pipes().next().unwrap().producer].leader();
        assert!(kp.no_wgmma.is_empty(), "{:?}", kp.no_wgmma);
        let OpPlan::Matmul {
            loads,
            mma_per_warp,
            ..
        } = &kp.ops[producer.index()]
        else {
            panic!("no matmul")
        };
        assert_eq!(
            (*loads, *mma_per_warp),
            ((OperandLoad::Ldmatrix, OperandLoad::WgmmaDescriptor), 8)
        );
        let kt = g.customized_ops().next().unwrap().1.ops[producer].inputs[1].index();
        let c = kp.tiles[kt]
            .as_ref()
            .unwrap()
            .columns
            .expect("atom columns");
        assert_eq!((c.dim, c.width, c.stride), (1, 64, 64 * 64));
        let load = kp
            .tma
            .loads
            .iter()
            .find(|l| l.tile == kt)
            .expect("a TMA load");
        assert_eq!(load.dims, [64, 64, 8]);
        assert_eq!(load.boxes, [64, 64, 2]);
        assert_eq!(load.strides, [1024, 128]);
        assert!(kp.features().contains(&crate::sched::plan::Feature::Wgmma));
        assert!(kp.uniform_warp);
        let off = plan_on(Arch::Sm90a, false);
        assert!(!off.uniform_warp);
        let (op, instr, _, _) = consumer(&off);
        assert!(matches!(instr, MatmulInstr::MmaSyncM16N8K16 { .. }));
        assert!(
            off.no_wgmma
                .contains(&(op, crate::sched::plan::WgmmaOff::TurnedOff))
        );
        assert_eq!(off.no_wgmma.len(), 2);
        // Without wgmma K keeps its rows.
        assert!(off.tiles.iter().flatten().all(|t| t.columns.is_none()));
        let ampere = plan_on(Arch::Sm80, true);
        assert!(matches!(
            consumer(&ampere).1,
            MatmulInstr::MmaSyncM16N8K16 { .. }
        ));
        assert!(ampere.no_wgmma.is_empty());
    }

    fn off_reason(kp: &KernelPlan) -> PipeOff {
        match kp.pipes.as_slice() {
            [PipeDecision::Off { why, .. }] => why.clone(),
            other => panic!("expected one pipe turned off, got {other:?}"),
        }
    }

    /// The attention block's P stays in registers: both matmuls on 4 × 1 warps, the consumer's A
    /// from the fragment, the row sum by the producer's warps, no shared memory for P, and the
    /// consumers at the producer's level with no barrier between them.
    #[test]
    fn attention_keeps_its_probabilities_in_registers() {
        let g = attention(false);
        let kp = plan(&g, CtaChoice::Graph, true);
        let [PipeDecision::On(p)] = kp.pipes.as_slice() else {
            panic!("no pipe: {:?}", kp.pipes)
        };
        assert_eq!(p.warps, 4);
        assert_eq!(p.row_sums.len(), 1);
        assert!(kp.tiles[p.tile].is_none());
        assert_eq!(kp.chains[p.producer].matmul, Some(MatmulLowering::Pipe));
        assert!(kp.chains[p.producer].approx_exp.is_some());
        let producer = kp.fusion.chains[p.producer].leader();
        for mm in [producer, p.matmul] {
            let OpPlan::Matmul { warps, loads, .. } = &kp.ops[mm.index()] else {
                panic!("op{} is no matmul", mm.index())
            };
            assert_eq!(*warps, (4, 1));
            assert_eq!(loads.0 == OperandLoad::Fragment, mm == p.matmul);
        }
        let at = |o: crate::graph::arena::Handle<crate::graph::threadblock::TbOp>| {
            let c = kp.fusion.chain_of[o.index()];
            (kp.schedule.phase[c], kp.schedule.level[c])
        };
        for c in p.consumers() {
            assert_eq!(at(c), at(producer));
            assert!(kp.pipe_into(kp.fusion.chain_of[c.index()]).is_some());
            if let OpPlan::Accum { rows, .. } = &kp.ops[c.index()] {
                assert!(rows.is_none(), "the row sum has no row split of its own");
            }
        }
        // One barrier fewer per iteration than through shared memory.
        let off = plan(&g, CtaChoice::Graph, false);
        assert_eq!(
            off.schedule.barrier_counts().1 + 1,
            kp.schedule.barrier_counts().1 + 2
        );
        assert_eq!(off_reason(&off), PipeOff::TurnedOff);
        assert!(off.tiles[p.tile].is_some());
        assert!(kp.smem.total < off.smem.total);
    }

    /// Where a reader cannot take the tile from registers, or the warps do not own whole rows,
    /// the tile stays in shared memory and the plan says why.
    #[test]
    fn a_pipe_that_cannot_run_says_why() {
        let kp = plan(&attention(true), CtaChoice::Graph, true);
        let why = off_reason(&kp);
        assert!(
            matches!(&why, PipeOff::OtherReader { kind, .. } if kind == "accum_nored"),
            "{why}"
        );
        // 8 warps for 4 row tiles of 16.
        let kp = plan(&attention(false), CtaChoice::Warps(8), true);
        assert_eq!(
            off_reason(&kp),
            PipeOff::UnevenRows {
                row_tiles: 4,
                warps: 8
            }
        );
    }

    /// K's tile goes back to its rows when TMA cannot load it in atom columns (rows 1032 bytes
    /// apart: no multiple of 16), and Q·K keeps mma.sync with the reason.
    #[test]
    fn atom_columns_need_a_tma_load() {
        let g = attention_k_rows(false, 516);
        let opts = Options {
            cta: CtaChoice::Graph,
            ..Options::for_target(Target::new(Arch::Sm90a))
        };
        let kp = crate::sched::plan(&g, &opts).unwrap();
        let kp = kp.kernels.values().next().unwrap();
        assert!(
            kp.tiles.iter().flatten().all(|t| t.columns.is_none()),
            "{:?} {:?}",
            kp.tma,
            kp.tiles
        );
        let producer = kp.fusion.chains[kp.register_pipes().next().unwrap().producer].leader();
        assert!(
            kp.no_wgmma
                .iter()
                .any(|&(o, why)| o == producer.index()
                    && why == crate::sched::plan::WgmmaOff::BLayout),
            "{:?}",
            kp.no_wgmma
        );
    }
}
