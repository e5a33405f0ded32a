//! Rewrites the planner makes before it plans: the caller's graph is never changed; the plan
//! records the graph it was made for ([`Rewrite::graph`]) and what was rewritten and why not.
//!
//! **Producer matmuls fused into their reader.** A kernel-level matmul S = A·B whose product is
//! read by one customized operator only, through one threadblock input, can be computed per tile
//! inside that operator: the input that loaded a tile of S becomes two inputs (the matching rows
//! of A and columns of B, with the whole inner dim k) and a threadblock matmul producing the
//! same tile. S then never exists in device memory: the separate matmul launch, its write of S
//! and the reader's load of S disappear (the attention candidates whose Q·Kᵀ is a kernel-level
//! matmul write and re-read a product as large as K itself). The function is the same; the
//! product is rounded to S's element type in both forms.
//!
//! The partition of S maps onto A and B dim by dim: a grid axis or the for-loop that splits a
//! batch dim splits it in both operands; one that splits S's rows (m) splits A's rows and
//! replicates B (every block along it reads the same B tile); one that splits S's columns (n)
//! splits B's columns and replicates A. The inner dim k is never split. The threadblock matmul
//! needs leading dims of 1, so every batch dim must be split down to one element per block.
//!
//! It is declined where the blocks would load more operand bytes than the matmul and the
//! product's loads move ([`KeptMatmul::Traffic`]): a tile of few rows of A against many columns
//! of B makes every row block re-read B (measured 9× slower on mha_bs8 candidates whose second
//! reader has such tiles).
//!
//! The rewrite applies to every such matmul at once; when the rewritten graph does not plan (the
//! operand tiles exceed shared memory, say), the caller's graph is planned instead and the plan
//! says why ([`KeptMatmul::Plan`]).

use std::collections::BTreeMap;
use std::fmt;

use crate::graph::arena::{Arena, Handle};
use crate::graph::infer;
use crate::graph::kernel::{DTensor, KernelGraph, KnOp, KnOpKind};
use crate::graph::ops::DimMap;
use crate::graph::threadblock::{STensor, TbGraph, TbOp, TbOpKind};

/// The largest inner extent k a fused matmul computes per tile: each block stages k-long rows
/// of A and k-long columns of B (attention's head dims are 64–128); a longer k is a GEMM whose
/// operands cuBLAS streams better than a block that holds them whole.
pub const MAX_FUSED_K: usize = 256;

/// A kernel-level matmul computed per tile inside the customized operator that read its
/// product.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusedMatmul {
    /// The matmul (kernel operator index in the caller's graph).
    pub matmul: usize,
    /// The customized operator that reads the product (index in the caller's graph).
    pub consumer: usize,
    /// The consumer's threadblock input operator that loaded the product (index in the caller's
    /// threadblock graph); in the rewritten graph, two inputs and a matmul take its place.
    pub input_op: usize,
    /// The inner extent each tile of the product sums over.
    pub k: usize,
    /// The per-iteration tiles of A and B.
    pub tiles: [crate::graph::shape::Shape; 2],
}

/// Why a kernel-level matmul stays a separate step.
#[derive(Clone, Debug, PartialEq)]
pub enum KeptMatmul {
    /// Turned off (`--no-fuse-matmuls`).
    Off,
    /// The product is a graph output.
    ProductIsOutput,
    /// The product is read by several operators (or by none).
    Readers {
        /// How many operators read it.
        count: usize,
    },
    /// The product's reader is not a customized operator.
    NotCustomized {
        /// The reader's kernel operator index.
        reader: usize,
    },
    /// The customized operator reads the product through more than one threadblock input
    /// (or lists it more than once).
    ReadTwice,
    /// Operands and product differ in element type.
    MixedTypes,
    /// k exceeds [`MAX_FUSED_K`].
    LongK {
        /// The inner extent.
        k: usize,
    },
    /// The product's tile does not decompose into operand tiles a threadblock matmul takes.
    Tile(Box<TileMismatch>),
    /// The blocks would load more operand bytes than the matmul and the product's loads move
    /// (operand tiles re-read by many blocks: few rows of A against many columns of B).
    Traffic {
        /// Bytes the fused form loads.
        fused: u64,
        /// Bytes the matmul and the loads of its product move.
        kept: u64,
    },
    /// The rewritten graph did not plan or validate; the caller's graph is planned instead.
    Plan(super::plan::RewriteFailure),
}

/// Why a product's tile does not decompose into operand tiles ([`KeptMatmul::Tile`]).
#[derive(Clone, Debug, PartialEq)]
pub enum TileMismatch {
    /// An operand's tile or their product does not infer (the shape rule's message).
    Infer(crate::graph::error::ErrorKind),
    /// The operand tiles multiply to another tile than the one the reader loads.
    Product {
        /// A's tile.
        a: crate::graph::Shape,
        /// B's tile.
        b: crate::graph::Shape,
        /// Their product.
        product: crate::graph::Shape,
        /// The tile the reader loads.
        loaded: crate::graph::Shape,
    },
}

impl fmt::Display for TileMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TileMismatch::Infer(e) => write!(f, "{e}"),
            TileMismatch::Product {
                a,
                b,
                product,
                loaded,
            } => write!(
                f,
                "the operand tiles {a} and {b} multiply to {product}, not the loaded tile {loaded}"
            ),
        }
    }
}

impl fmt::Display for KeptMatmul {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeptMatmul::Off => f.write_str("fusing matmuls into their reader is turned off"),
            KeptMatmul::ProductIsOutput => f.write_str("its product is a graph output"),
            KeptMatmul::Readers { count } => write!(
                f,
                "its product has {count} readers (a fused product has exactly one)"
            ),
            KeptMatmul::NotCustomized { reader } => write!(
                f,
                "its product's reader, kernel op {reader}, is not a customized operator"
            ),
            KeptMatmul::ReadTwice => {
                f.write_str("its reader loads the product through more than one input")
            }
            KeptMatmul::MixedTypes => {
                f.write_str("its operands and product have different element types")
            }
            KeptMatmul::LongK { k } => write!(
                f,
                "k = {k} exceeds {MAX_FUSED_K}: each block would stage whole rows of A and \
                 columns of B"
            ),
            KeptMatmul::Tile(why) => write!(f, "its tiles do not decompose: {why}"),
            KeptMatmul::Traffic { fused, kept } => write!(
                f,
                "its blocks would load {} of operand tiles against the {} the matmul and the \
                 loads of its product move",
                crate::graph::interp::budget::format_bytes(*fused as f64),
                crate::graph::interp::budget::format_bytes(*kept as f64)
            ),
            KeptMatmul::Plan(why) => write!(f, "the fused graph does not plan: {why}"),
        }
    }
}

/// What [`fuse_matmuls`] did to a graph.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rewrite {
    /// The graph the plan is made for, when the rewrite changed the caller's (its kernel
    /// operators are numbered anew: the fused matmuls are gone).
    pub graph: Option<Box<KernelGraph>>,
    /// The matmuls fused into their readers.
    pub fused: Vec<FusedMatmul>,
    /// The kernel-level matmuls kept as separate steps, and why (kernel op index in the caller's
    /// graph).
    pub kept: Vec<(usize, KeptMatmul)>,
    /// The attention kernels whose softmax is computed online, and those that keep their form
    /// and why ([`super::softmax`]; kernel indices of the graph after the matmul fusion).
    pub softmax: super::softmax::SoftmaxRewrite,
    /// The customized operators whose for-loops were refined, and those kept and why
    /// ([`super::refine`]; kernel indices of the graph after the matmul fusion, unchanged by the
    /// softmax rewrite).
    pub loops: super::refine::LoopRewrite,
    /// The loaded scores whose exponentials are taken less their row max, and the kernels that
    /// exponentiate loaded scores as the graph does and why ([`super::shift`]; kernel indices of
    /// the graph after the matmul fusion, on graphs the online-softmax rewrite leaves as they
    /// are).
    pub shift: super::shift::ShiftRewrite,
}

impl Rewrite {
    /// Keeps every fused matmul after all, with `why` (the rewritten graph did not plan).
    pub fn undo(&mut self, why: KeptMatmul) {
        self.graph = None;
        for f in self.fused.drain(..) {
            self.kept.push((f.matmul, why.clone()));
        }
        self.kept.sort_by_key(|(m, _)| *m);
    }
}

/// Maps a dim of the product S (rank r) to the dim of operand `which` (0 = A, 1 = B), or `None`
/// where the operand has no such dim (A has no column dim, B no row dim).
fn operand_dim(d: usize, r: usize, which: usize) -> Option<usize> {
    match (d + 2).cmp(&r) {
        std::cmp::Ordering::Less => Some(d),
        _ if d == r - 2 => (which == 0).then_some(d),
        _ => (which == 1).then_some(d),
    }
}

/// One fusable matmul, found by [`candidate`].
struct Candidate {
    fused: FusedMatmul,
    /// The consumer's input slot that held the product.
    slot: usize,
    a: Handle<DTensor>,
    b: Handle<DTensor>,
    s: Handle<DTensor>,
    maps: [(DimMap, Option<usize>); 2],
}

fn candidate(g: &KernelGraph, m: Handle<KnOp>) -> Result<Candidate, KeptMatmul> {
    let op = &g.ops[m];
    let (a, b, s) = (op.inputs[0], op.inputs[1], op.outputs[0]);
    let readers: Vec<Handle<KnOp>> = g
        .ops
        .iter()
        .filter(|(_, o)| o.inputs.contains(&s))
        .map(|(h, _)| h)
        .collect();
    if readers
        .iter()
        .any(|&h| matches!(g.ops[h].kind, KnOpKind::Output { .. }))
    {
        return Err(KeptMatmul::ProductIsOutput);
    }
    let [c] = readers[..] else {
        return Err(KeptMatmul::Readers {
            count: readers.len(),
        });
    };
    let KnOpKind::Customized(tb) = &g.ops[c].kind else {
        return Err(KeptMatmul::NotCustomized { reader: c.index() });
    };
    let slots: Vec<usize> = (0..g.ops[c].inputs.len())
        .filter(|&i| g.ops[c].inputs[i] == s)
        .collect();
    let [slot] = slots[..] else {
        return Err(KeptMatmul::ReadTwice);
    };
    let loads: Vec<(Handle<TbOp>, DimMap, Option<usize>)> = tb
        .ops
        .iter()
        .filter_map(|(h, o)| match o.kind {
            TbOpKind::Input {
                input,
                imap,
                forloop_dim,
            } if input == slot => Some((h, imap, forloop_dim)),
            _ => None,
        })
        .collect();
    let [(load, imap, forloop_dim)] = loads[..] else {
        return Err(KeptMatmul::ReadTwice);
    };
    let t = |h: Handle<DTensor>| &g.tensors[h];
    if t(a).dtype != t(s).dtype || t(b).dtype != t(s).dtype {
        return Err(KeptMatmul::MixedTypes);
    }
    let r = t(s).shape.rank();
    let k = t(a).shape.dim(r - 1);
    if k > MAX_FUSED_K {
        return Err(KeptMatmul::LongK { k });
    }
    let mut maps = [(DimMap::NONE, None); 2];
    let mut tiles = Vec::new();
    for (which, operand) in [a, b].into_iter().enumerate() {
        let mut map = DimMap::NONE;
        for axis in 0..3 {
            map.0[axis] = imap.axis(axis).and_then(|d| operand_dim(d, r, which));
        }
        let f = forloop_dim.and_then(|d| operand_dim(d, r, which));
        let tile = infer::tb_input(&t(operand).shape, tb.grid, map, f, tb.forloop_range)
            .map_err(|e| KeptMatmul::Tile(Box::new(TileMismatch::Infer(e))))?;
        maps[which] = (map, f);
        tiles.push(tile);
    }
    let product = infer::matmul(&tiles[0], &tiles[1], true)
        .map_err(|e| KeptMatmul::Tile(Box::new(TileMismatch::Infer(e))))?;
    let loaded = tb.tensors[tb.ops[load].outputs[0]].shape;
    if product != loaded {
        return Err(KeptMatmul::Tile(Box::new(TileMismatch::Product {
            a: tiles[0],
            b: tiles[1],
            product,
            loaded,
        })));
    }
    // Bytes each form moves: fused, every block loads its operand tiles (once, or every
    // iteration for a tile the loop walks); kept, the matmul reads A and B and writes S, and the
    // blocks load S's tiles.
    let blocks = tb.num_blocks() as f64;
    let loads = |shape: &crate::graph::shape::Shape, walked: bool| {
        let per = if walked { tb.forloop_range as f64 } else { 1.0 };
        (shape.numel() * t(s).dtype.bytes()) as f64 * blocks * per
    };
    let bytes = |h: Handle<DTensor>| (t(h).shape.numel() * t(h).dtype.bytes()) as f64;
    let fused = loads(&tiles[0], maps[0].1.is_some()) + loads(&tiles[1], maps[1].1.is_some());
    let kept = bytes(a) + bytes(b) + bytes(s) + loads(&loaded, forloop_dim.is_some());
    if fused > kept {
        return Err(KeptMatmul::Traffic {
            fused: fused as u64,
            kept: kept as u64,
        });
    }
    Ok(Candidate {
        fused: FusedMatmul {
            matmul: m.index(),
            consumer: c.index(),
            input_op: load.index(),
            k,
            tiles: [tiles[0], tiles[1]],
        },
        slot,
        a,
        b,
        s,
        maps,
    })
}

/// Finds the kernel-level matmuls that can be fused into their reader and, if any, builds the
/// rewritten graph (see the module documentation). `on` false keeps every matmul
/// ([`KeptMatmul::Off`]).
pub fn fuse_matmuls(g: &KernelGraph, on: bool) -> Rewrite {
    let mut rw = Rewrite::default();
    let mut found: BTreeMap<usize, Vec<Candidate>> = BTreeMap::new();
    for (h, op) in g.ops.iter() {
        if !matches!(op.kind, KnOpKind::Matmul) {
            continue;
        }
        if !on {
            rw.kept.push((h.index(), KeptMatmul::Off));
            continue;
        }
        match candidate(g, h) {
            Ok(c) => {
                rw.fused.push(c.fused.clone());
                found.entry(c.fused.consumer).or_default().push(c);
            }
            Err(why) => rw.kept.push((h.index(), why)),
        }
    }
    if found.is_empty() {
        return rw;
    }
    let g2 = rebuild(g, &found);
    if let Err(e) = crate::graph::validate::validate(&g2, None) {
        rw.undo(KeptMatmul::Plan(super::plan::RewriteFailure::Invalid(e)));
        return rw;
    }
    rw.graph = Some(Box::new(g2));
    rw
}

/// The graph without the fused matmuls and their products, each consumer computing its
/// products' tiles.
fn rebuild(g: &KernelGraph, found: &BTreeMap<usize, Vec<Candidate>>) -> KernelGraph {
    let gone_ops: Vec<usize> = found.values().flatten().map(|c| c.fused.matmul).collect();
    let gone_tensors: Vec<Handle<DTensor>> = found.values().flatten().map(|c| c.s).collect();
    let mut out = KernelGraph::new();
    let mut tmap: BTreeMap<Handle<DTensor>, Handle<DTensor>> = BTreeMap::new();
    for (h, t) in g.tensors.iter() {
        if !gone_tensors.contains(&h) {
            tmap.insert(h, out.tensors.append(t.clone()));
        }
    }
    let mut omap: BTreeMap<Handle<KnOp>, Handle<KnOp>> = BTreeMap::new();
    for (h, op) in g.ops.iter() {
        if gone_ops.contains(&h.index()) {
            continue;
        }
        let mut op = op.clone();
        if let (Some(cands), KnOpKind::Customized(tb)) = (found.get(&h.index()), &mut op.kind) {
            let mut inputs = op.inputs.clone();
            let mut loads = BTreeMap::new();
            for c in cands {
                inputs[c.slot] = c.a;
                inputs.push(c.b);
                loads.insert(c.fused.input_op, (c, inputs.len() - 1));
            }
            op.inputs = inputs;
            **tb = fused_body(tb, &loads);
        }
        op.inputs = op.inputs.iter().map(|t| tmap[t]).collect();
        op.outputs = op.outputs.iter().map(|t| tmap[t]).collect();
        omap.insert(h, out.ops.append(op));
    }
    out.sharding.mesh = g.sharding.mesh;
    for (h, m) in &g.sharding.maps {
        if let Some(&n) = omap.get(h) {
            out.sharding.maps.insert(n, *m);
        }
    }
    out
}

/// `tb` with each load of a fused product (keyed by threadblock op index, with the input slot
/// of B) replaced by loads of its operand tiles and a threadblock matmul into the same tile.
fn fused_body(tb: &TbGraph, loads: &BTreeMap<usize, (&Candidate, usize)>) -> TbGraph {
    let mut out = TbGraph::new(tb.grid, tb.block, tb.forloop_range, tb.reduction_dimx);
    let mut tensors: Arena<STensor> = Arena::new();
    for (_, t) in tb.tensors.iter() {
        tensors.append(t.clone());
    }
    for (h, op) in tb.ops.iter() {
        let Some((c, b_slot)) = loads.get(&h.index()) else {
            out.ops.append(op.clone());
            continue;
        };
        let dtype = tb.tensors[op.outputs[0]].dtype;
        let mut operand = |which: usize, input: usize| {
            let (imap, forloop_dim) = c.maps[which];
            let tile = tensors.append(STensor {
                shape: c.fused.tiles[which],
                dtype,
                after_accum: false,
                guid: None,
            });
            out.ops.append(TbOp {
                kind: TbOpKind::Input {
                    input,
                    imap,
                    forloop_dim,
                },
                inputs: Vec::new(),
                outputs: vec![tile],
            });
            tile
        };
        let ta = operand(0, c.slot);
        let tb_ = operand(1, *b_slot);
        out.ops.append(TbOp {
            kind: TbOpKind::Matmul,
            inputs: vec![ta, tb_],
            outputs: op.outputs.clone(),
        });
    }
    out.tensors = tensors;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::builder::{GraphBuilder, TbGraphBuilder};
    use crate::graph::dtype::DType;
    use crate::graph::ops::AccumKind;

    /// The mha_bs8 candidates' form at small sizes: S = Q·K by a kernel-level matmul, then a
    /// customized operator over (batch, key splits) that exponentiates S's tiles and sums E·V.
    fn attention() -> KernelGraph {
        let mut g = GraphBuilder::new();
        let q = g.new_input(&[4, 16, 64], DType::F16).unwrap();
        let k = g.new_input(&[4, 64, 512], DType::F16).unwrap();
        let v = g.new_input(&[4, 512, 64], DType::F16).unwrap();
        let s = g.matmul(q, k).unwrap();
        let mut tb = TbGraphBuilder::new([4, 2, 1], [128, 1, 1], 4);
        let tv = tb.new_input(&g, v, [0, 1, -1], 1).unwrap();
        let s = tb.new_input(&g, s, [0, 2, -1], 2).unwrap();
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

    #[test]
    fn a_product_read_by_one_input_is_computed_per_tile() {
        let g = attention();
        let rw = fuse_matmuls(&g, true);
        assert_eq!(rw.kept, vec![]);
        let [f] = &rw.fused[..] else { panic!("{rw:?}") };
        assert_eq!((f.matmul, f.k), (3, 64));
        assert_eq!(
            f.tiles.map(|s| s.to_string()),
            ["[1, 16, 64]", "[1, 64, 64]"]
        );
        let g2 = rw.graph.expect("rewritten");
        assert!(
            !g2.ops
                .iter()
                .any(|(_, o)| matches!(o.kind, KnOpKind::Matmul))
        );
        // The same function: the rewritten graph evaluates like the original on the CPU, exactly
        // and with every tensor rounded to its element type (S to fp16 in both forms).
        use crate::graph::interp::{Rounding, output_difference};
        for rounding in [Rounding::Exact, Rounding::Stored] {
            let worst = output_difference(&g, &g2, 7, rounding);
            assert!(worst < 1e-9, "{rounding:?}: relative difference {worst}");
        }
    }

    #[test]
    fn products_with_other_readers_or_long_k_are_kept() {
        let mut g = GraphBuilder::new();
        let a = g.new_input(&[64, 512], DType::F16).unwrap();
        let b = g.new_input(&[512, 64], DType::F16).unwrap();
        let s = g.matmul(a, b).unwrap();
        let mut tb = TbGraphBuilder::new([4, 1, 1], [128, 1, 1], 1);
        let t = tb.new_input(&g, s, [0, -1, -1], -1).unwrap();
        let e = tb.exp(t).unwrap();
        let e = tb.forloop_accum(e, AccumKind::Nored).unwrap();
        tb.new_output(e, [0, -1, -1]).unwrap();
        let o = g.customized(tb).unwrap()[0];
        g.mark_output(o).unwrap();
        let g = g.build().unwrap();
        let rw = fuse_matmuls(&g, true);
        assert_eq!(rw.kept, vec![(2, KeptMatmul::LongK { k: 512 })]);
        assert!(rw.graph.is_none());
        // Few rows of A per block against all of B's columns: every row block re-reads B.
        let mut g = GraphBuilder::new();
        let a = g.new_input(&[4, 16, 64], DType::F16).unwrap();
        let b = g.new_input(&[4, 64, 1024], DType::F16).unwrap();
        let s = g.matmul(a, b).unwrap();
        let mut tb = TbGraphBuilder::new([4, 4, 1], [128, 1, 1], 4);
        let t = tb.new_input(&g, s, [0, 1, -1], 2).unwrap();
        let e = tb.exp(t).unwrap();
        let e = tb.forloop_accum(e, AccumKind::RedLdSum).unwrap();
        tb.new_output(e, [0, 1, -1]).unwrap();
        let o = g.customized(tb).unwrap()[0];
        g.mark_output(o).unwrap();
        let rw = fuse_matmuls(&g.build().unwrap(), true);
        assert!(
            matches!(rw.kept[..], [(2, KeptMatmul::Traffic { fused, kept })] if fused > kept),
            "{rw:?}"
        );
        let off = fuse_matmuls(&attention(), false);
        assert_eq!(off.kept, vec![(3, KeptMatmul::Off)]);
        assert!(off.graph.is_none());
    }
}
