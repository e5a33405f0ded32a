//! The interpreter's range report: tensors whose f64 reference values do not fit their dtype.

mod common;

use mucc::graph::interp::{self, HostTensor};
use mucc::graph::{DType, GraphBuilder, Shape};

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
