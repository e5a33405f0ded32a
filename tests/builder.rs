//! Builder-made graphs: the builder's checks, the interpreter's semantics of every operator
//! (against hand-written loops), and JSON round trips of what Mirage cannot serialise.

use mucc::graph::interp::{self, Array, HostTensor, InputSpec};
use mucc::graph::mirage_json::{ExportOptions, graph_to_json};
use mucc::graph::{AccumKind, DType, ErrorKind, GraphBuilder, KernelGraph, Shape, TbGraphBuilder};
use mucc::{ImportOptions, parse_str};

fn shape(d: &[usize]) -> Shape {
    Shape::new(d).unwrap()
}

/// Deterministic small values.
fn values(n: usize, salt: u64) -> Vec<f64> {
    (0..n)
        .map(|i| (((i as u64 * 2654435761 + salt * 97) % 1000) as f64 / 500.0 - 1.0) * 0.9)
        .collect()
}

fn input(d: &[usize], salt: u64) -> HostTensor {
    let s = shape(d);
    HostTensor::from_array(&Array::from_vec(s, values(s.numel(), salt)))
}

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-12 * (1.0 + y.abs()),
            "element {i}: {x} vs {y}"
        );
    }
}

fn round_trip(g: &KernelGraph) {
    let text = graph_to_json(g, &ExportOptions::default())
        .unwrap()
        .to_string();
    let back = parse_str(&text, None, &ImportOptions::default()).unwrap();
    back.graphs[0].validate().unwrap();
    // The builder records no guids; export numbers the tensors.
    let mut back = back.graphs[0].graph.clone();
    back.clear_guids();
    assert_eq!(&back, g);
}

/// Softmax attention through the online-softmax operators: reduction_max, sub, exp and both
/// rescaling accumulators, against exp(QK)/Σexp(QK)·V computed directly.
#[test]
fn online_softmax_operators_compute_attention() {
    let (s, d, n, f) = (4, 8, 32, 4);
    let mut g = GraphBuilder::new();
    let q = g.new_input(&[1, s, d], DType::F32).unwrap();
    let k = g.new_input(&[1, d, n], DType::F32).unwrap();
    let v = g.new_input(&[1, n, d], DType::F32).unwrap();
    let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], f);
    let tq = tb.new_input(&g, q, [-1, -1, -1], -1).unwrap();
    let tk = tb.new_input(&g, k, [-1, -1, -1], 2).unwrap();
    let tv = tb.new_input(&g, v, [-1, -1, -1], 1).unwrap();
    let sc = tb.matmul(tq, tk).unwrap();
    let (m, diff) = tb.reduction_max(sc, 2).unwrap();
    let centred = tb.sub(sc, m).unwrap();
    let p = tb.exp(centred).unwrap();
    let r = tb.exp(diff).unwrap();
    let l = tb
        .forloop_accum_rescale(p, r, AccumKind::RedLdSumRescale)
        .unwrap();
    let pv = tb.matmul(p, tv).unwrap();
    let o = tb
        .forloop_accum_rescale(pv, r, AccumKind::NoredRescale)
        .unwrap();
    let out = tb.div(o, l).unwrap();
    tb.new_output(out, [-1, -1, -1]).unwrap();
    let outs = g.customized(tb).unwrap();
    g.mark_output(outs[0]).unwrap();
    let g = g.build().unwrap();
    round_trip(&g);

    let ins = vec![
        input(&[1, s, d], 1),
        input(&[1, d, n], 2),
        input(&[1, n, d], 3),
    ];
    let got = interp::evaluate(&g, &ins).unwrap();
    // Direct computation, scaled up so that exp matters.
    let (qv, kv, vv) = (&ins[0].data, &ins[1].data, &ins[2].data);
    let mut want = vec![0.0; s * d];
    for i in 0..s {
        let scores: Vec<f64> = (0..n)
            .map(|j| (0..d).map(|t| qv[i * d + t] * kv[t * n + j]).sum())
            .collect();
        let den: f64 = scores.iter().map(|x| x.exp()).sum();
        for c in 0..d {
            want[i * d + c] = (0..n).map(|j| scores[j].exp() * vv[j * d + c]).sum::<f64>() / den;
        }
    }
    close(&got[0].data, &want);
}

/// redtox folds side-by-side partial results with a stride of reduction_dimx; red_ld_mean and
/// red_ld_rms normalise by the whole reduced extent L·F; max is element-wise over iterations.
#[test]
fn accumulator_semantics() {
    let (rows, cols, f, dimx) = (2, 64, 2, 8);
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[rows, cols], DType::F16).unwrap();
    let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], f).with_reduction_dimx(dimx);
    let t = tb.new_input(&g, x, [-1, -1, -1], 1).unwrap();
    let kinds = [
        AccumKind::RedtoxLdSum,
        AccumKind::RedLdMean,
        AccumKind::RedLdRms,
        AccumKind::RedLdSum,
        AccumKind::Nored,
    ];
    for kind in kinds {
        let a = tb.forloop_accum(t, kind).unwrap();
        tb.new_output(a, [-1, -1, -1]).unwrap();
    }
    let outs = g.customized(tb).unwrap();
    for o in &outs {
        g.mark_output(*o).unwrap();
    }
    // Element-wise max over iterations walking the rows.
    let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], rows);
    let t = tb.new_input(&g, x, [-1, -1, -1], 0).unwrap();
    let a = tb.forloop_accum(t, AccumKind::Max).unwrap();
    tb.new_output(a, [-1, -1, -1]).unwrap();
    let mx = g.customized(tb).unwrap();
    g.mark_output(mx[0]).unwrap();
    let g = g.build().unwrap();
    round_trip(&g);

    let ins = interp::random_inputs(
        &g,
        InputSpec {
            seed: 5,
            scale: 1.0,
        },
    );
    let xv = ins[0].data.clone();
    let got = interp::evaluate(&g, &ins).unwrap();
    let row = |r: usize| &xv[r * cols..(r + 1) * cols];
    let mut redtox = vec![0.0; rows * dimx];
    for r in 0..rows {
        for (c, v) in row(r).iter().enumerate() {
            redtox[r * dimx + c % dimx] += v;
        }
    }
    close(&got[0].data, &redtox);
    let mean: Vec<f64> = (0..rows)
        .map(|r| row(r).iter().sum::<f64>() / cols as f64)
        .collect();
    close(&got[1].data, &mean);
    let rms: Vec<f64> = (0..rows)
        .map(|r| (row(r).iter().map(|v| v * v).sum::<f64>() / cols as f64).sqrt())
        .collect();
    close(&got[2].data, &rms);
    let sum: Vec<f64> = (0..rows).map(|r| row(r).iter().sum::<f64>()).collect();
    close(&got[3].data, &sum);
    // nored over a loop that walks columns: tile i holds columns 32i..32i+31.
    let nored: Vec<f64> = (0..rows)
        .flat_map(|r| (0..cols / f).map(move |c| (r, c)))
        .map(|(r, c)| row(r)[c] + row(r)[c + cols / f])
        .collect();
    close(&got[4].data, &nored);
    let colmax: Vec<f64> = (0..cols).map(|c| row(0)[c].max(row(1)[c])).collect();
    close(&got[5].data, &colmax);
}

/// Kernel-level operators, a column-major input, and the grid/loop offsets of tiles.
#[test]
fn kernel_operators_and_strided_inputs() {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[2, 3], DType::BF16).unwrap();
    // W is 3×5 stored column-major.
    let w = g.new_input_strided(&[3, 5], &[1, 3], DType::BF16).unwrap();
    let xw = g.matmul(x, w).unwrap(); // 2×5
    let r = g.reduction(xw, 1).unwrap(); // 2×1
    let q = g.div(xw, r).unwrap(); // broadcast
    let n = g.rms_norm(q, 2).unwrap();
    let parts = g.chunk(n, 0, 2).unwrap();
    let cat = g.concat(&[parts[1], parts[0]], 0).unwrap();
    let sp = g.split(cat, 1, &[2, 3]).unwrap();
    let c = g.clamp(sp[1], -0.5, 0.5).unwrap();
    let s = g.mul_scalar(c, 3.0).unwrap();
    let gl = g.gelu(sp[0]).unwrap();
    g.mark_output(s).unwrap();
    g.mark_output_strided(gl, &[1, 2]).unwrap();
    let g = g.build().unwrap();
    round_trip(&g);

    let xs = values(6, 1);
    let wl = values(15, 2); // logical row-major 3×5
    let mut wphys = vec![f64::NAN; 15];
    for i in 0..3 {
        for j in 0..5 {
            wphys[i + 3 * j] = wl[i * 5 + j];
        }
    }
    let ins = vec![
        HostTensor::from_array(&Array::from_vec(shape(&[2, 3]), xs.clone())),
        HostTensor {
            shape: shape(&[3, 5]),
            strides: mucc::graph::Strides(vec![1, 3]),
            data: wphys,
        },
    ];
    let got = interp::evaluate(&g, &ins).unwrap();
    // The same walk over the logical arrays, shared instead of copied (the column-major W
    // gathered; the row-major X taken as it is).
    let arrays: Vec<std::sync::Arc<Array>> = ins
        .iter()
        .map(|h| std::sync::Arc::new(h.to_array()))
        .collect();
    assert_eq!(arrays[1].data, wl);
    assert_eq!(arrays[0].data, xs);
    assert_eq!(interp::evaluate_shared(&g, &arrays).unwrap(), got);
    // By hand.
    let mut m = [[0.0; 5]; 2];
    for i in 0..2 {
        for j in 0..5 {
            m[i][j] = (0..3).map(|k| xs[i * 3 + k] * wl[k * 5 + j]).sum();
        }
    }
    let mut q = m;
    for row in q.iter_mut() {
        let s: f64 = row.iter().sum();
        row.iter_mut().for_each(|v| *v /= s);
    }
    let rms = (q.iter().flatten().map(|v| v * v).sum::<f64>() / 10.0).sqrt();
    let nrm: Vec<Vec<f64>> = q
        .iter()
        .map(|r| r.iter().map(|v| v / rms).collect())
        .collect();
    let swapped = [nrm[1].clone(), nrm[0].clone()];
    let right: Vec<f64> = swapped
        .iter()
        .flat_map(|r| r[2..].iter().map(|v| v.clamp(-0.5, 0.5) * 3.0))
        .collect();
    close(&got[0].data, &right);
    let gelu = |v: f64| 0.5 * v * (1.0 + libm_erf(v / 2f64.sqrt()));
    let left: Vec<f64> = swapped
        .iter()
        .flat_map(|r| r[..2].iter().map(|&v| gelu(v)))
        .collect();
    close(&got[1].data, &left);
}

/// erf by its Taylor series (small arguments only), independent of the crate's libm.
fn libm_erf(x: f64) -> f64 {
    let mut sum = 0.0;
    let mut term = x;
    for n in 0..60 {
        sum += term / (2 * n + 1) as f64;
        term *= -x * x / (n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// A tile's origin combines the block's chunk and the iteration's sub-chunk when one dim is
/// both grid-mapped and walked by the loop (as in every attention file).
#[test]
fn grid_and_loop_on_one_dim() {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[3, 48], DType::F32).unwrap();
    // 2 blocks along x split dim 1 into 24 each; 3 iterations walk 8 at a time; a loop-invariant
    // copy of the block's row 0..3 × whole chunk is read too.
    let mut tb = TbGraphBuilder::new([2, 1, 1], [64, 1, 1], 3);
    let t = tb.new_input(&g, x, [1, -1, -1], 1).unwrap();
    let acc = tb.forloop_accum(t, AccumKind::Nored).unwrap();
    let sq = tb.square(acc).unwrap();
    tb.new_output(sq, [1, -1, -1]).unwrap();
    let outs = g.customized(tb).unwrap();
    g.mark_output(outs[0]).unwrap();
    let g = g.build().unwrap();
    assert_eq!(g.tensors[outs[0]].shape, shape(&[3, 16]));
    let ins = vec![input(&[3, 48], 9)];
    let xv = ins[0].data.clone();
    let got = interp::evaluate(&g, &ins).unwrap();
    let mut want = vec![0.0; 3 * 16];
    for r in 0..3 {
        for b in 0..2 {
            for c in 0..8 {
                let s: f64 = (0..3).map(|i| xv[r * 48 + b * 24 + i * 8 + c]).sum();
                want[r * 16 + b * 8 + c] = s * s;
            }
        }
    }
    close(&got[0].data, &want);
}

#[test]
fn builder_rejects_bad_operands_with_located_errors() {
    let mut g = GraphBuilder::new();
    let a = g.new_input(&[8, 64], DType::F16).unwrap();
    let b = g.new_input(&[32, 16], DType::F16).unwrap();
    let e = g.matmul(a, b).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Operands(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "(kn_matmul_op, kernel op 2 (builder)): invalid operands: matmul inner extents differ: A [8, 64] has k = 64, B [32, 16] has k = 32"
    );
    let f = g.new_input(&[8, 64], DType::F32).unwrap();
    assert!(matches!(
        g.add(a, f).unwrap_err().kind,
        ErrorKind::DtypeMismatch { .. }
    ));
    assert!(matches!(
        g.new_input_strided(&[4, 4], &[4, 2], DType::F16)
            .unwrap_err()
            .kind,
        ErrorKind::BadStrides { .. }
    ));

    let mut tb = TbGraphBuilder::new([3, 1, 1], [128, 1, 1], 1);
    let e = tb.new_input(&g, a, [1, -1, -1], -1).unwrap_err();
    assert_eq!(
        e.kind.to_string(),
        "grid axis x (3 blocks) partitions: extent 64 of dim 1 is not divisible by 3"
    );
    let mut tb = TbGraphBuilder::new([2, 2, 1], [128, 1, 1], 4);
    let t = tb.new_input(&g, a, [1, 0, -1], 1).unwrap(); // [4, 8]
    assert!(tb.new_output(t, [1, 0, -1]).is_err(), "in-loop tile");
    let acc = tb.forloop_accum(t, AccumKind::Nored).unwrap();
    assert!(matches!(
        tb.add(t, acc).unwrap_err().kind,
        ErrorKind::MixedAfterAccum
    ));
    assert!(
        tb.forloop_accum(acc, AccumKind::Nored).is_err(),
        "accumulating an after-loop tile"
    );
    let e = tb.new_output(acc, [1, -1, -1]).unwrap_err();
    assert!(
        matches!(e.kind, ErrorKind::UnmappedGridAxis { axis: "y", size: 2 }),
        "{e}"
    );
    let e = tb.new_output(acc, [1, 1, -1]).unwrap_err();
    assert!(
        matches!(
            e.kind,
            ErrorKind::AxesShareDim {
                a: "x",
                b: "y",
                dim: 1
            }
        ),
        "{e}"
    );
    tb.new_output(acc, [1, 0, -1]).unwrap();
    let outs = g.customized(tb).unwrap();
    // Grid axes restore their dims; the loop's split of dim 1 is not restored.
    assert_eq!(g.shape(outs[0]), Some(shape(&[8, 16])));
    // No outputs marked: the graph is incomplete.
    let e = g.build().unwrap_err();
    assert!(e.to_string().contains("the graph has no outputs"), "{e}");
}
