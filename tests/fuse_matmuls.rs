//! The planner's matmul fusion (`sched::rewrite`) on random graphs: a kernel-level matmul
//! S = A·B read by one customized operator, partitioned along any of S's dims by the grid and the
//! for-loop. Every such graph is rewritten unless its blocks would load more operand bytes than
//! the matmul and the product's loads move; the rewritten graph computes what the caller's
//! computes (the f64 interpreter, exactly and with storage rounding), and it plans on both
//! targets with the plan's indices referring to it.

use mucc::graph::builder::{GraphBuilder, TbGraphBuilder};
use mucc::graph::interp::{InputSpec, Rounding, evaluate_rounded, random_inputs};
use mucc::graph::{AccumKind, DType, KernelGraph, KnOpKind};
use mucc::sched::Options;
use mucc::target::{Arch, Target};
use proptest::prelude::*;

/// How a random graph cuts S = A·B ([b, m, k] · [b, k, n]): grid y over S's rows or columns
/// (`y_dim` 1 or 2, `gy` blocks), the for-loop over rows, columns or nothing (`f_dim`, `f`
/// iterations), after an element-wise op `unary` (0 exp of a scaled tile, 1 square, 2 none).
#[derive(Clone, Debug)]
struct Case {
    b: usize,
    m: usize,
    k: usize,
    n: usize,
    y_dim: usize,
    gy: usize,
    f_dim: Option<usize>,
    f: usize,
    unary: u8,
    bf16: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..3,
        prop_oneof![Just(16usize), Just(32), Just(64)],
        prop_oneof![Just(16usize), Just(32), Just(64)],
        prop_oneof![Just(32usize), Just(64), Just(128)],
        1usize..3,
        prop_oneof![Just(1usize), Just(2)],
        prop_oneof![Just(None), Just(Some(1usize)), Just(Some(2))],
        prop_oneof![Just(1usize), Just(2)],
        0u8..3,
        any::<bool>(),
    )
        .prop_map(|(b, m, k, n, y_dim, gy, f_dim, f, unary, bf16)| Case {
            b,
            m,
            k,
            n,
            y_dim,
            gy,
            f_dim,
            f: if f_dim.is_some() { f } else { 1 },
            unary,
            bf16,
        })
}

fn build(c: &Case) -> Option<KernelGraph> {
    let dtype = if c.bf16 { DType::BF16 } else { DType::F16 };
    let mut g = GraphBuilder::new();
    let a = g.new_input(&[c.b, c.m, c.k], dtype).ok()?;
    let w = g.new_input(&[c.b, c.k, c.n], dtype).ok()?;
    let s = g.matmul(a, w).ok()?;
    let mut tb = TbGraphBuilder::new([c.b, c.gy, 1], [128, 1, 1], c.f);
    let y = c.y_dim as i32;
    let t = tb
        .new_input(&g, s, [0, y, -1], c.f_dim.map_or(-1, |d| d as i32))
        .ok()?;
    let t = match c.unary {
        0 => {
            let scaled = tb.mul_scalar(t, 0.125).ok()?;
            tb.exp(scaled).ok()?
        }
        1 => tb.square(t).ok()?,
        _ => t,
    };
    let acc = tb.forloop_accum(t, AccumKind::Nored).ok()?;
    tb.new_output(acc, [0, y, -1]).ok()?;
    let o = g.customized(tb).ok()?[0];
    g.mark_output(o).ok()?;
    g.build().ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn fused_products_compute_the_same_function_and_plan(c in case()) {
        let g = build(&c).expect("every case is a valid graph");
        let rw = mucc::sched::rewrite::fuse_matmuls(&g, true);
        if let [(_, mucc::sched::rewrite::KeptMatmul::Traffic { fused, kept })] = rw.kept[..] {
            // Operand tiles re-read by many blocks: the matmul stays, for the traffic alone.
            prop_assert!(fused > kept && rw.graph.is_none());
            return Ok(());
        }
        prop_assert_eq!(rw.kept.len(), 0, "{:?}", rw.kept);
        prop_assert_eq!(rw.fused.len(), 1);
        let g2 = rw.graph.as_deref().expect("rewritten");
        prop_assert!(!g2.ops.iter().any(|(_, o)| matches!(o.kind, KnOpKind::Matmul)));
        prop_assert_eq!(g2.inputs().len(), g.inputs().len());
        prop_assert_eq!(g2.outputs().len(), g.outputs().len());
        let inputs = random_inputs(&g, InputSpec { seed: 3, scale: 0.5 });
        for rounding in [Rounding::Exact, Rounding::Stored] {
            let (want, _) = evaluate_rounded(&g, inputs.clone(), rounding).unwrap();
            let (got, _) = evaluate_rounded(g2, inputs.clone(), rounding).unwrap();
            for (w, o) in want.iter().zip(&got) {
                prop_assert_eq!(w.shape, o.shape);
                for (x, y) in w.data.iter().zip(&o.data) {
                    prop_assert!(
                        (x - y).abs() <= 1e-9 * x.abs().max(1.0),
                        "{:?}: {} against {}", rounding, x, y
                    );
                }
            }
        }
        for arch in [Arch::Sm80, Arch::Sm90a] {
            let p = mucc::sched::plan(&g, &Options::for_target(Target::new(arch)))
                .map_err(|e| TestCaseError::fail(format!("{arch}: {e}")))?;
            // Planned as rewritten, or the caller's graph with the reason.
            match (&p.rewrite.graph, &p.rewrite.kept[..]) {
                (Some(_), []) => {
                    prop_assert_eq!(p.kernels.len(), 1);
                    prop_assert!(p.graph(&g).ops.len() == g.ops.len() - 1);
                }
                (None, [(_, why)]) => prop_assert!(
                    matches!(why, mucc::sched::rewrite::KeptMatmul::Plan(_)),
                    "{why}"
                ),
                other => prop_assert!(false, "{other:?}"),
            }
            // The plan emits against the graph it was made for.
            mucc::emit::emit(&g, &p, "fuse_matmuls")
                .map_err(|e| TestCaseError::fail(format!("{arch}: {e}")))?;
        }
    }
}
