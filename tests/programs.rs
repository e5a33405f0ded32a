//! The interpreter as an oracle: for every benchmark file except `qknorm_gqa_*` (whose
//! candidates are not equivalent to their program, §5.3 of the format reference), every
//! candidate is evaluated, all candidates agree with each other, and they agree with the program
//! the file stands for, written here independently with plain loops.

mod common;

use common::corpus_dir;
use std::sync::Arc;

use mucc::graph::interp::{self, Array, HostTensor, InputSpec};
use mucc::{ImportOptions, read_file};

/// Relative difference ‖a − b‖ / ‖b‖.
fn rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let n: f64 = b.iter().map(|y| y * y).sum();
    (d / n).sqrt()
}

/// Batched row-major matmul: [batch, m, k] × [batch, k, n].
fn matmul(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; batch * m * n];
    for t in 0..batch {
        for i in 0..m {
            for p in 0..k {
                let x = a[t * m * k + i * k + p];
                for j in 0..n {
                    c[t * m * n + i * n + j] += x * b[t * k * n + p * n + j];
                }
            }
        }
    }
    c
}

/// Row-wise x / sqrt(mean(x²)) over rows of length `n`.
fn rms_rows(x: &[f64], n: usize) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|row| {
            let r = (row.iter().map(|v| v * v).sum::<f64>() / n as f64).sqrt();
            row.iter().map(move |v| v / r)
        })
        .collect()
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// Loads `file`, evaluates every candidate on one seeded input set, checks pairwise agreement
/// and agreement with `program` (which gets the inputs' logical row-major values).
fn check(file: &str, program: impl Fn(&[&[f64]]) -> Vec<f64>) {
    let f = read_file(&corpus_dir().join(file), &ImportOptions::default()).unwrap();
    let first = &f.graphs[0].graph;
    let inputs: Vec<HostTensor> = interp::random_inputs(
        first,
        InputSpec {
            seed: 7,
            scale: 1.0,
        },
    );
    // Converted once and shared by every candidate's walk (the attention inputs are GBs in f64).
    let arrays: Vec<Arc<Array>> = interp::logical_arrays(&inputs);
    drop(inputs);
    let logical: Vec<&[f64]> = arrays.iter().map(|a| a.data.as_slice()).collect();
    let expected = program(&logical);
    let mut outputs: Vec<Array> = Vec::new();
    for (i, lg) in f.graphs.iter().enumerate() {
        lg.validate().unwrap();
        let sig: Vec<_> = lg
            .graph
            .inputs()
            .iter()
            .map(|&(_, t)| lg.graph.tensors[t].shape)
            .collect();
        let sig0: Vec<_> = first
            .inputs()
            .iter()
            .map(|&(_, t)| first.tensors[t].shape)
            .collect();
        assert_eq!(sig, sig0, "{file}: candidates share their inputs");
        let mut out = interp::evaluate_shared(&lg.graph, &arrays).unwrap();
        assert_eq!(out.len(), 1, "{file} graph {i}: one output");
        let o = out.remove(0);
        assert!(
            o.data.iter().all(|x| x.is_finite()),
            "{file} graph {i}: every element written and finite"
        );
        let e = rel(&o.data, &expected);
        assert!(
            e < 1e-9,
            "{file} graph {i}: relative difference to the program {e:e}"
        );
        outputs.push(o);
    }
    let mut worst = 0.0f64;
    for a in 0..outputs.len() {
        for b in a + 1..outputs.len() {
            worst = worst.max(rel(&outputs[a].data, &outputs[b].data));
        }
    }
    assert!(worst < 1e-9, "{file}: candidates differ by {worst:e}");
    eprintln!(
        "{file}: {} candidates agree with the program",
        outputs.len()
    );
}

fn gated_mlp(x: &[&[f64]]) -> Vec<f64> {
    let (m, k, n) = (8, 4096, 4096);
    let a = matmul(x[0], x[1], 1, m, k, n);
    let b = matmul(x[0], x[2], 1, m, k, n);
    a.iter().zip(&b).map(|(p, q)| silu(*p) * q).collect()
}

fn lora(x: &[&[f64]]) -> Vec<f64> {
    // X 16×256, W 256×4096, A 256×16, B 16×4096.
    let xw = matmul(x[0], x[1], 1, 16, 256, 4096);
    let xa = matmul(x[0], x[2], 1, 16, 256, 16);
    let xab = matmul(&xa, x[3], 1, 16, 16, 4096);
    xw.iter().zip(&xab).map(|(p, q)| p + q).collect()
}

/// exp(Q·K) / Σⱼ exp(Q·K) · V, no max subtraction, no scaling.
fn attention(heads: usize, s: usize) -> impl Fn(&[&[f64]]) -> Vec<f64> {
    move |x| {
        let (d, n) = (64, 4096);
        let e: Vec<f64> = matmul(x[0], x[1], heads, s, d, n)
            .iter()
            .map(|v| v.exp())
            .collect();
        let num = matmul(&e, x[2], heads, s, n, d);
        let den: Vec<f64> = e.chunks(n).map(|r| r.iter().sum()).collect();
        num.iter()
            .enumerate()
            .map(|(i, v)| v / den[i / d])
            .collect()
    }
}

/// rms(X + α ⊙ (rms(H) + X)); inputs H, X, α.
fn ntrans(x: &[&[f64]]) -> Vec<f64> {
    let n = 4096;
    let rh = rms_rows(x[0], n);
    let t: Vec<f64> = (0..x[1].len())
        .map(|i| x[1][i] + x[2][i] * (rh[i] + x[1][i]))
        .collect();
    rms_rows(&t, n)
}

/// rms(X) · W.
fn rmsnorm(rows: usize) -> impl Fn(&[&[f64]]) -> Vec<f64> {
    move |x| matmul(&rms_rows(x[0], 4096), x[1], 1, rows, 4096, 6144)
}

#[test]
fn gated_mlp_file() {
    check("gated_mlp.json", gated_mlp);
}
#[test]
fn single_gated_mlp_file() {
    check("single_gated_mlp.json", gated_mlp);
}
#[test]
fn lora_file() {
    check("lora.json", lora);
}
#[test]
fn single_lora_file() {
    check("single_lora.json", lora);
}
#[test]
fn legacy_checkpoint_lora_file() {
    check("legacy_checkpoint_lora.json", lora);
}
#[test]
fn gqa_bs1_file() {
    check("gqa_bs1.json", attention(2, 256));
}
#[test]
fn gqa_bs8_file() {
    check("gqa_bs8.json", attention(16, 256));
}
#[test]
fn mha_bs1_file() {
    check("mha_bs1.json", attention(32, 16));
}
#[test]
fn mha_bs8_file() {
    check("mha_bs8.json", attention(256, 16));
}
#[test]
fn mqa_bs1_file() {
    check("mqa_bs1.json", attention(1, 1024));
}
#[test]
fn single_mqa_bs1_file() {
    check("single_mqa_bs1.json", attention(1, 1024));
}
#[test]
fn mqa_bs8_file() {
    check("mqa_bs8.json", attention(8, 1024));
}
#[test]
fn ntrans_bs1_file() {
    check("ntrans_bs1.json", ntrans);
}
#[test]
fn ntrans_bs8_file() {
    check("ntrans_bs8.json", ntrans);
}
#[test]
fn rmsnorm_bs1_file() {
    check("rmsnorm_bs1.json", rmsnorm(2));
}
#[test]
fn rmsnorm_bs8_file() {
    check("rmsnorm_bs8.json", rmsnorm(16));
}

/// The qknorm files are not oracles for their program, but every candidate must evaluate to
/// finite values (a smoke test of the interpreter on their operator mix).
#[test]
fn qknorm_candidates_evaluate() {
    for file in ["qknorm_gqa_bs1.json", "qknorm_gqa_bs8.json"] {
        let f = read_file(&corpus_dir().join(file), &ImportOptions::default()).unwrap();
        let inputs = interp::random_inputs(&f.graphs[0].graph, InputSpec::default());
        for (i, lg) in f.graphs.iter().enumerate().step_by(19) {
            let out = interp::evaluate(&lg.graph, &inputs).unwrap();
            assert!(
                out[0].data.iter().all(|x| x.is_finite()),
                "{file} graph {i}"
            );
        }
    }
}
