//! The interpreter's range report (tensors whose f64 reference values do not fit their dtype)
//! and its storage-rounding mode.

mod common;

use mucc::graph::interp::{self, HostTensor, Rounding};
use mucc::graph::ops::AccumKind;
use mucc::graph::{DType, GraphBuilder, Shape, TbGraphBuilder};

fn input(dims: &[usize], values: Vec<f64>) -> HostTensor {
    let shape = Shape::new(dims).unwrap();
    HostTensor {
        shape,
        strides: shape.row_major_strides(),
        data: values,
    }
}

#[test]
fn f16_intermediate_beyond_range_is_reported_and_f32_is_not() {
    // exp(12) = 162755 > 65504: the f16 intermediate overflows, the f64 reference does not;
    // dividing by exp(12) again brings the output back into range.
    for (dtype, expect) in [(DType::F16, 1usize), (DType::F32, 0)] {
        let mut b = GraphBuilder::new();
        let x = b.new_input(&[2], dtype).unwrap();
        let e = b.exp(x).unwrap();
        let y = b.div(e, e).unwrap();
        b.mark_output(y).unwrap();
        let g = b.build().unwrap();
        let (outs, excess) =
            interp::evaluate_ranged(&g, vec![input(&[2], vec![12.0, 1.0])]).unwrap();
        assert_eq!(outs[0].data, vec![1.0, 1.0]);
        assert_eq!(excess.len(), expect, "{dtype:?}: {excess:?}");
        if let Some(x) = excess.first() {
            assert_eq!(x.place, interp::RangePlace::Tensor(e));
            assert_eq!(x.dtype, DType::F16);
            assert_eq!(x.limit, 65504.0);
            assert!((x.max_abs - 12f64.exp()).abs() < 1e-6);
        }
    }
}

#[test]
fn f16_tiles_inside_a_customized_kernel_are_checked_too() {
    // gqa_bs1 graph 0 exponentiates Q·K in a threadblock graph (no max subtraction): at input
    // scale 1 its f16 tiles overflow (reported first, before the kernel-level tensors they
    // produce); at 0.5 nothing overflows (the scale the GPU checks use).
    let path = common::corpus_dir().join("gqa_bs1.json");
    let file = mucc::read_file(&path, &Default::default()).unwrap();
    let g = &file.graphs[0].graph;
    let run = |scale: f64| {
        let inputs = interp::random_inputs(g, interp::InputSpec { seed: 0, scale });
        interp::evaluate_ranged(g, inputs).unwrap().1
    };
    let at1 = run(1.0);
    assert!(!at1.is_empty());
    assert!(
        matches!(at1[0].place, interp::RangePlace::Tile { .. }) && at1[0].dtype == DType::F16,
        "{at1:?}"
    );
    assert!(
        at1[0].place.to_string().starts_with("tile s"),
        "{}",
        at1[0].place
    );
    assert!(run(0.5).is_empty());
}

/// `Rounding::Stored` rounds every kernel-level tensor, every tile and every accumulator update
/// to its dtype; `Rounding::Exact` rounds nowhere. 2⁻⁹ is a quarter of bf16's unit at 1, so
/// 1 + 2⁻⁹ rounds back to 1 (and 1 + 3·2⁻⁹ accumulated step by step stays 1).
#[test]
fn stored_rounding_rounds_tensors_tiles_and_accumulators() {
    let q = 2f64.powi(-9);
    for (dtype, rounds) in [(DType::BF16, true), (DType::F32, false)] {
        // Kernel level: x + y.
        let mut b = GraphBuilder::new();
        let x = b.new_input(&[1], dtype).unwrap();
        let y = b.new_input(&[1], dtype).unwrap();
        let s = b.add(x, y).unwrap();
        b.mark_output(s).unwrap();
        let g = b.build().unwrap();
        let ins = || vec![input(&[1], vec![1.0]), input(&[1], vec![q])];
        let eval = |r| interp::evaluate_rounded(&g, ins(), r).unwrap().0[0].data[0];
        assert_eq!(eval(Rounding::Exact), 1.0 + q, "{dtype:?}");
        assert_eq!(
            eval(Rounding::Stored),
            if rounds { 1.0 } else { 1.0 + q },
            "{dtype:?}"
        );

        // Threadblock level: a no-reduction accumulator over a for-loop of 4 one-element tiles.
        let mut b = GraphBuilder::new();
        let x = b.new_input(&[1, 4], dtype).unwrap();
        let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 4);
        let t = tb.new_input(&b, x, [-1, -1, -1], 1).unwrap();
        let a = tb.forloop_accum(t, AccumKind::Nored).unwrap();
        tb.new_output(a, [-1, -1, -1]).unwrap();
        let outs = b.customized(tb).unwrap();
        b.mark_output(outs[0]).unwrap();
        let g = b.build().unwrap();
        let ins = || vec![input(&[1, 4], vec![1.0, q, q, q])];
        let eval = |r| interp::evaluate_rounded(&g, ins(), r).unwrap().0[0].data[0];
        assert_eq!(eval(Rounding::Exact), 1.0 + 3.0 * q, "{dtype:?}");
        assert_eq!(
            eval(Rounding::Stored),
            if rounds { 1.0 } else { 1.0 + 3.0 * q },
            "{dtype:?}"
        );
    }
}
