//! Regression tests of the hardening issue (issue 12), one per defect; each failed before its
//! fix. The second round (issue 33) is in `hardening/second_round.rs`. Defect 1 (file names injecting code) is `hostile_file_names_do_not_reach_the_code` in
//! `tests/cli.rs`; corrupted NVRTC cache entries are in `tests/nvrtc_compile.rs`; GPU faults and
//! device-memory limits are in `scripts/gpu-test.sh` (step `faults`).

mod common;
#[path = "hardening/second_round.rs"]
mod second_round;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::corpus_dir;
use mucc::graph::mirage_json::{ExportOptions, graph_to_json};
use mucc::graph::ops::AccumKind;
use mucc::graph::{DType, GraphBuilder, KernelGraph, TbGraphBuilder};
use mucc::sched::Options;
use mucc::target::Target;
use serde_json::Value;

fn mucc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mucc"))
        .args(args)
        .output()
        .expect("run mucc")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn corpus(name: &str) -> String {
    corpus_dir().join(name).to_string_lossy().into_owned()
}

/// A fresh temporary folder for one test.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mucc-hardening-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write_graph(path: &Path, g: &KernelGraph) {
    let v = graph_to_json(g, &ExportOptions::default()).unwrap();
    std::fs::write(path, v.to_string()).unwrap();
}

/// Runs mucc and returns its output with its peak resident set (bytes), read from
/// `/proc/PID/status` (`VmHWM`) while it runs. (A child's `ru_maxrss` keeps the high-water
/// mark of the test process it was forked from, which other tests running at the same time
/// inflate.) Polled every millisecond: a peak in mucc's last millisecond may be missed.
fn mucc_rss(args: &[&str]) -> (Output, u64) {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_mucc"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run mucc");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0u64;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_file)
            && let Some(kb) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        {
            peak = peak.max(kb * 1024);
        }
        if let Some(status) = child.try_wait().expect("wait for mucc") {
            break status;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let output = Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    };
    (output, peak)
}

/// Defect 2: the reference's memory and work are bounded before it runs.
#[test]
fn eval_refuses_huge_graphs_at_once() {
    let d = dir("eval");
    // A small file asking for a 32 GB tensor.
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[65536, 65536], DType::F64).unwrap();
    let y = g.exp(x).unwrap();
    g.mark_output(y).unwrap();
    let file = d.join("huge.json");
    write_graph(&file, &g.build().unwrap());
    let size = std::fs::metadata(&file).unwrap().len();
    assert!(size < 1500, "{size} bytes");
    let t = Instant::now();
    let (o, rss) = mucc_rss(&["eval", file.to_str().unwrap()]);
    let took = t.elapsed();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("host memory") && err.contains("--max-memory"),
        "{err}"
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(rss < 200 << 20, "{rss} bytes");
    // A 65536² matmul: memory first; with memory allowed, the work limit.
    let mut g = GraphBuilder::new();
    let a = g.new_input(&[65536, 65536], DType::F32).unwrap();
    let b = g.new_input(&[65536, 65536], DType::F32).unwrap();
    let c = g.matmul(a, b).unwrap();
    g.mark_output(c).unwrap();
    let mm = d.join("matmul.json");
    write_graph(&mm, &g.build().unwrap());
    let o = mucc(&["eval", mm.to_str().unwrap(), "--max-memory", "1000G"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--max-work"), "{}", stderr(&o));
    // Strided input whose buffer spans 240 GB: refused by the memory estimate.
    let mut g = GraphBuilder::new();
    let x = g
        .new_input_strided(&[56, 8], &[4294967296, 1], DType::F16)
        .unwrap();
    let y = g.exp(x).unwrap();
    g.mark_output(y).unwrap();
    let st = d.join("strided.json");
    write_graph(&st, &g.build().unwrap());
    let o = mucc(&["eval", st.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("host memory"), "{}", stderr(&o));
    // An outer product with a 1 TB intermediate: transpile refuses to plan it.
    let mut g = GraphBuilder::new();
    let a = g.new_input(&[1, 524288, 1], DType::F32).unwrap();
    let b = g.new_input(&[1, 1, 524288], DType::F32).unwrap();
    let p = g.matmul(a, b).unwrap();
    let s = g.reduction(p, 2).unwrap();
    g.mark_output(s).unwrap();
    let op = d.join("outer.json");
    write_graph(&op, &g.build().unwrap());
    let o = mucc(&["transpile", op.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("device memory"), "{}", stderr(&o));
    // --scale must be a finite positive number (defect 7).
    for bad in ["NaN", "inf", "-1", "0"] {
        let o = mucc(&["eval", &corpus("lora.json"), &format!("--scale={bad}")]);
        assert_ne!(o.status.code(), Some(0), "--scale {bad}");
        assert!(stderr(&o).contains("scale"), "{}", stderr(&o));
    }
}

/// Defects 3 and 4: valid graphs the emitter once rejected or printed as C++ that did not
/// compile — a max and a rescaling accumulator on 16-bit tiles of a single-iteration loop, and
/// a tb reduction feeding row-summing accumulators.
#[test]
fn once_rejected_valid_graphs_transpile() {
    let mut graphs = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        let mut g = GraphBuilder::new();
        let x = g.new_input(&[16, 64], dtype).unwrap();
        let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 1);
        let tx = tb.new_input(&g, x, [-1, -1, -1], -1).unwrap();
        let e = tb.exp(tx).unwrap();
        let m = tb.forloop_accum(e, AccumKind::Max).unwrap();
        let r = tb.reduction(tx, 1).unwrap();
        let s = tb.sigmoid(r).unwrap();
        let n = tb
            .forloop_accum_rescale(tx, s, AccumKind::NoredRescale)
            .unwrap();
        tb.new_output(m, [-1, -1, -1]).unwrap();
        tb.new_output(n, [-1, -1, -1]).unwrap();
        for kind in [
            AccumKind::RedLdSum,
            AccumKind::RedLdMean,
            AccumKind::RedLdRms,
        ] {
            let k = tb.reduction(tx, 0).unwrap();
            let a = tb.forloop_accum(k, kind).unwrap();
            tb.new_output(a, [-1, -1, -1]).unwrap();
        }
        let outs = g.customized(tb).unwrap();
        for o in outs {
            g.mark_output(o).unwrap();
        }
        graphs.push(g.build().unwrap());
    }
    for g in &graphs {
        for t in Target::all() {
            let (_, e) = mucc::transpile::transpile(g, &Options::for_target(t), "test")
                .unwrap_or_else(|e| panic!("{}: {e}", t.arch));
            assert!(e.source.contains("mucc::tb::acc_max("));
            assert!(e.source.contains("mucc::tb::acc_rescale("));
            if std::env::var_os("MUCC_SKIP_CUDA").is_some_and(|v| v == "1") {
                continue;
            }
            let c = mucc::cuda::Compiler::new(mucc::cuda::CompilerOptions {
                no_cache: true,
                ..Default::default()
            })
            .expect("NVRTC (source scripts/cuda-toolchain.sh)");
            c.compile(&mucc::cuda::Source {
                path: "defects-3-4.cu",
                text: &e.source,
                arch: t.arch,
            })
            .unwrap_or_else(|e| panic!("{}: {e}", t.arch));
        }
    }
}

/// Defect 5: input files are read only if regular and within a size limit.
#[test]
fn input_reading_is_bounded() {
    let t = Instant::now();
    let o = mucc(&["inspect", "/dev/zero"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
    assert!(t.elapsed() < Duration::from_secs(2));
    let o = mucc(&[
        "inspect",
        &corpus("gated_mlp.json"),
        "--max-input-bytes",
        "1K",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--max-input-bytes"), "{}", stderr(&o));
    assert!(
        mucc(&["inspect", &corpus("gated_mlp.json")])
            .status
            .success()
    );
}

/// Defect 6: outputs are checked together before any is written, never the input, written
/// whole.
#[test]
fn outputs_are_never_lost_or_half_written() {
    let d = dir("outputs");
    let input = d.join("lora.json");
    std::fs::copy(corpus("lora.json"), &input).unwrap();
    let original = std::fs::read(&input).unwrap();
    let inp = input.to_str().unwrap();
    // Output = input, even with --force: refused, input intact.
    for args in [
        vec!["export", inp, "-o", inp, "--force"],
        vec!["transpile", inp, "--graph", "0", "-o", inp, "--force"],
        vec!["explain", inp, "--svg", inp, "--force"],
    ] {
        let o = mucc(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&o).contains("input file"),
            "{args:?}: {}",
            stderr(&o)
        );
        assert_eq!(std::fs::read(&input).unwrap(), original, "{args:?}");
    }
    // Two outputs on one path.
    let x = d.join("x.cu");
    let xs = x.to_str().unwrap();
    let o = mucc(&[
        "transpile",
        inp,
        "--graph",
        "0",
        "-o",
        xs,
        "--plan",
        xs,
        "--force",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("same file"), "{}", stderr(&o));
    assert!(!x.exists());
    // The second output exists: nothing is written.
    let plan = d.join("p.json");
    std::fs::write(&plan, "keep").unwrap();
    let o = mucc(&[
        "transpile",
        inp,
        "--graph",
        "0",
        "-o",
        xs,
        "--plan",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        !x.exists(),
        "the .cu was written before the plan was refused"
    );
    assert_eq!(std::fs::read_to_string(&plan).unwrap(), "keep");
    // explain --svg of a two-kernel graph whose second drawing exists: the first is not written.
    // (gqa_bs1 graph 0 in the graph's form: two customized kernels; online, the second is a
    // kernel-level combining operator.)
    let mha = corpus("gqa_bs1.json");
    let svg = d.join("plan.svg");
    let explain = |svg: &std::path::Path| {
        mucc(&[
            "explain",
            &mha,
            "--online-softmax",
            "off",
            "--svg",
            svg.to_str().unwrap(),
        ])
    };
    let o = explain(&svg);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let second: Vec<PathBuf> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("plan.k"))
        .collect();
    assert_eq!(second.len(), 1, "{second:?}");
    std::fs::remove_file(&svg).unwrap();
    let o = explain(&svg);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        !svg.exists(),
        "P.svg was written before P.kN.svg was refused"
    );
    // eval --dump refuses to overwrite an earlier dump without --force.
    let dump = d.join("dump");
    let ds = dump.to_str().unwrap();
    assert!(mucc(&["eval", inp, "--dump", ds]).status.success());
    let manifest = std::fs::read(dump.join("manifest.json")).unwrap();
    let o = mucc(&["eval", inp, "--dump", ds, "--seed", "7"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    assert_eq!(std::fs::read(dump.join("manifest.json")).unwrap(), manifest);
    assert!(
        mucc(&["eval", inp, "--dump", ds, "--seed", "7", "--force"])
            .status
            .success()
    );
    // build checks its output before compiling anything.
    let t = Instant::now();
    let missing = d.join("no/such/dir/libx.so");
    let o = mucc(&[
        "build",
        inp,
        "--graph",
        "0",
        "-o",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
    assert!(t.elapsed() < Duration::from_secs(5));
    // No temporary file is left beside the outputs.
    let leftovers: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp") || n.contains("mucc-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Defect 8: messages on odd JSON.
#[test]
fn odd_json_gets_clear_messages() {
    let d = dir("messages");
    let text = std::fs::read_to_string(corpus("single_gated_mlp.json")).unwrap();
    let file = d.join("f.json");
    let run = |content: &str| {
        std::fs::write(&file, content).unwrap();
        mucc(&["inspect", file.to_str().unwrap()])
    };
    // A UTF-8 byte-order mark is skipped.
    let o = run(&format!("\u{feff}{text}"));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // 2^64 is an integer out of range, not "a floating-point number".
    let doc: Value = serde_json::from_str(&text).unwrap();
    let big = text.replacen(
        "\"guid\": ",
        "\"guid\": 18446744073709551616, \"x_guid\": ",
        1,
    );
    let o = run(&big);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("out of range"), "{}", stderr(&o));
    // A huge op_type comes back clipped.
    let long = "x".repeat(5_000_000);
    let o = run(&text.replacen("kn_input_op", &long, 1));
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stderr.len() < 2000, "{} bytes of stderr", o.stderr.len());
    assert!(stderr(&o).contains("bytes in all"), "{}", stderr(&o));
    // Duplicate keys are rejected.
    let o = run(&text.replacen(
        "\"op_type\": ",
        "\"op_type\": \"kn_exp_op\", \"op_type\": ",
        1,
    ));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("duplicate key `op_type`"),
        "{}",
        stderr(&o)
    );
    // Unknown layouts and over-long dim arrays are rejected.
    let o = run(&text.replacen("DmemRowMajor", "DmemDiagonal", 1));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("unknown layout `DmemDiagonal`"),
        "{}",
        stderr(&o)
    );
    let mut five = doc.clone();
    five[0][0]["output_tensors"][0]["dim"] = serde_json::json!([8, 4096, 0, 0, 0]);
    let o = run(&five.to_string());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("MAX_TENSOR_DIMS"), "{}", stderr(&o));
    // Candidates naming different dtype tables.
    let g = mucc::parse_str(&text, None, &Default::default()).unwrap();
    let a = graph_to_json(&g.graphs[0].graph, &ExportOptions::default()).unwrap();
    let mut b = a.clone();
    b[0]["mucc_dtype_table"] = Value::String("mid".into());
    let o = run(&Value::Array(vec![a, b]).to_string());
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("one file is read with one table"),
        "{}",
        stderr(&o)
    );
}

/// Defect 8, last part: the overflow warning of `eval` ignores values infinite in the
/// reference itself and summarises long lists.
#[test]
fn overflow_warnings_are_summarised() {
    // A chain of 40 squarings of f16: every tensor after the fifth overflows.
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[4, 8], DType::F16).unwrap();
    let mut t = g.mul_scalar(x, 10.0).unwrap();
    for _ in 0..40 {
        t = g.square(t).unwrap();
        t = g.mul_scalar(t, 1.0).unwrap();
    }
    g.mark_output(t).unwrap();
    let d = dir("overflow");
    let f = d.join("chain.json");
    write_graph(&f, &g.build().unwrap());
    let o = mucc(&["eval", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let warnings = stderr(&o)
        .lines()
        .filter(|l| l.starts_with("warning"))
        .count();
    assert!(warnings <= 5, "{}", stderr(&o));
    // The online-softmax golden: the running max's first difference is −∞ by design; no
    // warning.
    let golden =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/threadblock/online_softmax_f16.json");
    let o = mucc(&["eval", golden.to_str().unwrap(), "--scale", "0.25"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(!stderr(&o).contains("reaches |x| = inf"), "{}", stderr(&o));
}
