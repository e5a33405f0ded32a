//! The `mucc` command line: outputs, exit codes (0 ok, 1 user error, 2 internal error), and
//! that it never overwrites a file without being asked.

mod common;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use common::corpus_dir;

/// Runs mucc with a cache of its own (not the developer's: a tuned variant there would change
/// what transpile prints).
fn mucc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mucc"))
        .args(args)
        .env(
            "MUCC_CACHE_DIR",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .output()
        .expect("run mucc")
}

fn corpus(name: &str) -> String {
    corpus_dir().join(name).to_string_lossy().into_owned()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mucc-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn inspect_summarises_every_candidate() {
    let o = mucc(&["inspect", &corpus("gated_mlp.json")]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("form: list of candidate graphs, 32 graphs"),
        "{out}"
    );
    assert!(out.contains("dtype table: legacy"), "{out}");
    assert!(out.contains("32 of 32 graphs valid"), "{out}");
    assert!(
        out.contains("customized[grid (128, 1, 1), forloop 64, 10 ops]"),
        "{out}"
    );
}

#[test]
fn inspect_one_graph_dumps_it() {
    let o = mucc(&["inspect", &corpus("single_gated_mlp.json"), "--graph", "0"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(0));
    for needle in [
        "%0 = input -> [8, 4096] f16 strides [4096, 1]",
        "s1 = input %1 imap (1, -1, -1) forloop_dim 0 -> [64, 32]",
        "s5 = accum_nored(s3) -> [8, 32] after-loop",
        "s7 = silu(s5) -> [8, 32] after-loop",
        "%5 = mul(%3, %4) -> [8, 4096] f16",
        "validation: ok",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in\n{out}");
    }
}

#[test]
fn inspect_reports_invalid_graphs_and_fails() {
    let src = std::fs::read_to_string(corpus("single_gated_mlp.json")).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&src).unwrap();
    // Make blocks of 4096 threads.
    doc[0][3]["bgraph"]["block_dim"]["x"] = 4096.into();
    let p = tmp("bad_block.json");
    std::fs::write(&p, doc.to_string()).unwrap();
    let o = mucc(&["inspect", p.to_str().unwrap()]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(out.contains("INVALID"), "{out}");
    assert!(out.contains("at [0][3].bgraph.block_dim"), "{out}");
    assert!(
        out.contains("block_dim x = 4096 is outside 1..=1024"),
        "{out}"
    );
    assert!(out.contains("0 of 1 graphs valid"), "{out}");
}

#[test]
fn eval_all_reports_agreement() {
    let o = mucc(&["eval", &corpus("lora.json"), "--all", "--seed", "3"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(
        out.matches("output 0: shape [16, 4096]").count(),
        4,
        "{out}"
    );
    assert!(out.contains("candidates agree: yes"), "{out}");
    // stderr is a pipe here: no progress bar.
    assert!(err.is_empty(), "{err:?}");
    // Same seed, same numbers.
    let again = mucc(&["eval", &corpus("lora.json"), "--graph", "2", "--seed", "3"]);
    let line = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("graph 2: output 0"))
            .map(|l| l.split(" (").next().unwrap().to_string())
    };
    assert_eq!(line(&out), line(&text(&again).0));
}

#[test]
fn eval_rounding_stored_rounds_like_the_gpu_stores() {
    let exact = mucc(&["eval", &corpus("lora.json"), "--graph", "0", "--seed", "3"]);
    let stored = mucc(&[
        "eval",
        &corpus("lora.json"),
        "--graph",
        "0",
        "--seed",
        "3",
        "--rounding",
        "stored",
    ]);
    let ((eo, ee), (so, se)) = (text(&exact), text(&stored));
    assert_eq!(exact.status.code(), Some(0), "{ee}");
    assert_eq!(stored.status.code(), Some(0), "{se}");
    assert!(
        so.contains("every stored tensor, tile and accumulator rounded"),
        "{so}"
    );
    assert!(!eo.contains("every stored tensor"), "{eo}");
    let checksum = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("graph 0: output 0"))
            .and_then(|l| l.split("checksum ").nth(1))
            .and_then(|r| r.split(' ').next())
            .and_then(|c| c.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no checksum in {s}"))
    };
    let (ce, cs) = (checksum(&eo), checksum(&so));
    // An f16 output: storage rounding moves the sum a little, never a lot.
    assert_ne!(ce, cs);
    assert!((ce - cs).abs() < 1e-2 * ce.abs(), "{ce} vs {cs}");
    let bad = mucc(&["eval", &corpus("lora.json"), "--rounding", "f8"]);
    let (_, be) = text(&bad);
    assert_eq!(bad.status.code(), Some(1), "{be}");
    assert!(be.contains("possible values: exact, stored"), "{be}");
}

#[test]
fn eval_of_qknorm_candidates_reports_disagreement() {
    let o = mucc(&["eval", &corpus("qknorm_gqa_bs1.json"), "--graph", "0"]);
    assert_eq!(o.status.code(), Some(0));
    let (out, _) = text(&o);
    assert!(
        out.contains("graph 0: output 0: shape [2, 256, 64]"),
        "{out}"
    );
}

#[test]
fn user_errors_exit_1_with_a_message() {
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["inspect".into(), "/nonexistent/x.json".into()],
            "cannot read file",
        ),
        (
            vec![
                "eval".into(),
                corpus("lora.json"),
                "--graph".into(),
                "9".into(),
            ],
            "there is no graph 9; the file has 4 graphs (0..=3)",
        ),
        (
            vec![
                "inspect".into(),
                corpus("lora.json"),
                "--dtype-table".into(),
                "newest".into(),
            ],
            "unknown dtype table `newest`",
        ),
        (vec!["frobnicate".into()], "unrecognized subcommand"),
        (vec![], "Usage"),
    ];
    for (args, needle) in cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = mucc(&a);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: `{needle}` not in {err}");
    }
}

#[test]
fn syntax_errors_name_line_and_column() {
    let p = tmp("truncated.json");
    std::fs::write(&p, "[[{\"op_type\": \"kn_input_op\"").unwrap();
    let o = mucc(&["inspect", p.to_str().unwrap()]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("truncated.json: invalid JSON at line 1, column"),
        "{err}"
    );
    assert!(err.contains("the file is truncated"), "{err}");
}

#[test]
fn export_round_trips_and_never_overwrites_silently() {
    let p = tmp("export.json");
    let _ = std::fs::remove_file(&p);
    let ps = p.to_str().unwrap();
    let o = mucc(&["export", &corpus("legacy_checkpoint_lora.json"), "-o", ps]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let first = std::fs::read_to_string(&p).unwrap();
    // The converted file is current Mirage: current names and codes, explicit outputs.
    assert!(first.contains("\"kn_output_op\""));
    assert!(first.contains("\"tb_forloop_accum_nored_op\""));
    assert!(first.contains("\"data_type\":940"));
    let again = mucc(&["export", &corpus("lora.json"), "-o", ps]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again).1.contains("exists; pass --force"),
        "{}",
        text(&again).1
    );
    assert_eq!(
        std::fs::read_to_string(&p).unwrap(),
        first,
        "the file is untouched"
    );
    let forced = mucc(&["export", &corpus("lora.json"), "-o", ps, "--force"]);
    assert_eq!(forced.status.code(), Some(0));
    let o = mucc(&["inspect", ps]);
    let (out, _) = text(&o);
    assert!(out.contains("4 of 4 graphs valid"), "{out}");
    assert!(
        out.contains("dtype table: current (named by `mucc_dtype_table`"),
        "{out}"
    );
}

#[test]
fn a_closed_stdout_is_not_an_error() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mucc"))
        .args(["inspect", &corpus("qknorm_gqa_bs8.json")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = [0u8; 16];
    stdout.read_exact(&mut buf).unwrap();
    drop(stdout);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("internal error") && !err.contains("panicked"),
        "{err}"
    );
    assert_ne!(o.status.code(), Some(2));
}

/// `--max-stages` caps every ring (explain's target line and operator lines say so); values
/// outside 1–4 are refused by the argument parser.
#[test]
fn max_stages_caps_the_rings_and_explain_says_so() {
    let file = corpus("single_gated_mlp.json");
    let o = mucc(&["explain", &file, "--arch", "sm_90a", "--max-stages", "2"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("target sm_90a (pipeline rings of at most 2 stages"),
        "{out}"
    );
    assert!(out.contains("pipelined x2"), "{out}");
    assert!(
        !out.contains("pipelined x3") && !out.contains("pipelined x4"),
        "{out}"
    );
    let o = mucc(&["explain", &file, "--arch", "sm_90a"]);
    let (out, _) = text(&o);
    assert!(out.contains("target sm_90a\n"), "{out}");
    for bad in ["0", "5"] {
        let o = mucc(&["explain", &file, "--max-stages", bad]);
        let (_, err) = text(&o);
        assert_ne!(o.status.code(), Some(0), "{err}");
        assert!(err.contains("--max-stages"), "{err}");
    }
}

#[test]
fn explain_all_prints_every_graph_in_order() {
    let o = mucc(&["explain", &corpus("lora.json"), "--all", "--arch", "sm_90a"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let headers: Vec<&str> = out.lines().filter(|l| l.starts_with("file: ")).collect();
    assert_eq!(headers.len(), 4, "{out}");
    for (i, h) in headers.iter().enumerate() {
        assert!(h.ends_with(&format!(", graph {i}")), "{h}");
    }
    assert_eq!(out.matches("target sm_90a").count(), 4);
    // One graph or all of them, not both; no drawing of every graph into one file.
    for extra in [["--graph", "1"], ["--svg", "x.svg"]] {
        let o = mucc(&["explain", &corpus("lora.json"), "--all", extra[0], extra[1]]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("cannot be used with"), "{err}");
    }
}

#[test]
fn attention_softmax_is_online_where_it_pipes() {
    // gqa_bs8 graph 8: 16 key splits, 64-row tiles on 4 warps: the rewritten kernel keeps its
    // scores in an online register pipe, and one softmax_combine operator replaces kernel op 4
    // (its 16 splits kept as blocks here; the fold is tested below).
    let args = [
        "explain",
        &corpus("gqa_bs8.json"),
        "--graph",
        "8",
        "--arch",
        "sm_90a",
        "--fold-key-splits",
        "off",
    ];
    let o = mucc(&args);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("online softmax: kernel op 3 (16 key splits) keeps a running row max m"),
        "{out}"
    );
    assert!(out.contains("in place of kernel op 4"), "{out}");
    assert!(
        out.contains(
            "kernel op 4 (kn_softmax_combine_op): softmax combination of 16 key splits for 4096 \
             rows of 64: 32 threads per row (8 along the outputs with 8-element vectors x 4 \
             along the splits, summed by warp shuffles)"
        ),
        "{out}"
    );
    assert!(
        out.contains("with op4 reduction_2_max's running max"),
        "{out}"
    );
    // mha_bs8 graph 25: 16 query rows do not split over its 4 warps, so its keys do; `off`
    // keeps the graph's form.
    let mha = [
        "explain",
        &corpus("mha_bs8.json"),
        "--graph",
        "25",
        "--arch",
        "sm_90a",
    ];
    let o = mucc(&mha);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("online softmax: kernel op 3 (4 key splits)")
            && out.contains("the keys (the product's op10 matmul's K) split over 4 warps")
            && out.contains("after the loop the 4 warps meet in a buffer of a slice per warp")
            && out.contains("op10 matmul: 1 x 1 warps with K split over 4 warps"),
        "{out}"
    );
    let o = mucc(&[&mha[..], &["--online-softmax", "off"]].concat());
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("softmax: kernel op 3 exponentiates a matmul product as the graph writes it, without a running max (the online-softmax rewrite is turned off")
            && out.contains("register pipe: none for s2 (the 1 row tiles of 16 do not split evenly over 4 warps)"),
        "{out}"
    );
    let o = mucc(&[&args[..], &["--online-softmax", "off"]].concat());
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains(
            "(the online-softmax rewrite is turned off; kernel ops numbered as in the file)"
        ),
        "{out}"
    );
    let o = mucc(&[&args[..], &["--online-softmax", "sometimes"]].concat());
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("expected off, piped or always"), "{err}");
}

/// Key splits folded into the loop: by the planner's rule on sm_90a (gqa_bs8's 1,024 blocks of
/// 16 splits by 2, mqa_bs8's of 8 splits by 4, mha_bs8's 4 splits all, without a combining
/// kernel; gqa_bs1's one wave not at all), none on sm_80 unless asked, a factor that does not
/// divide the splits refused with its reason, a bad value an error.
#[test]
fn key_splits_fold_into_the_loop() {
    let explain = |file: &str, graph: &str, arch: &str, extra: &[&str]| {
        let f = corpus(file);
        let mut args = vec!["explain", f.as_str(), "--graph", graph, "--arch", arch];
        args.extend_from_slice(extra);
        let o = mucc(&args);
        let (out, err) = text(&o);
        (o.status.code(), out, err)
    };
    let (code, out, err) = explain("gqa_bs8.json", "8", "sm_90a", &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "key splits: kernel op 3: 2 key splits folded into each block's for-loop (8 blocks \
             along y left, 8 iterations instead of 4; the planner's rule: the smallest fold \
             whose grid runs in one wave of 5 blocks per SM (their shared memory's limit) with \
             a block on every SM"
        ),
        "{out}"
    );
    assert!(out.contains("softmax combination of 8 key splits"), "{out}");
    let (code, out, err) = explain("mqa_bs8.json", "0", "sm_90a", &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "4 key splits folded into each block's for-loop (2 blocks along y left, 16 \
             iterations instead of 4; the planner's rule: the smallest fold whose grid runs in \
             one wave of 3 blocks per SM"
        ),
        "{out}"
    );
    let (code, out, err) = explain("gqa_bs1.json", "0", "sm_90a", &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "the key splits stay blocks: the planner's rule folds where the grid would \
             take more than one wave, and its 256 blocks fit the 396 of one"
        ),
        "{out}"
    );
    let (code, out, err) = explain("mha_bs8.json", "30", "sm_90a", &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("it divides O by l itself, in place of kernel ops 4, 5"),
        "{out}"
    );
    assert!(
        out.contains("no combining step; the planner's rule"),
        "{out}"
    );
    assert!(!out.contains("kn_softmax_combine_op"), "{out}");
    assert!(
        out.contains("its key splits were folded into the loop, refined 3 blocks"),
        "{out}"
    );
    let (code, out, err) = explain("gqa_bs8.json", "8", "sm_80", &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "the key splits stay blocks: the planner's rule folds on the Hopper path only"
        ),
        "{out}"
    );
    let (code, out, err) = explain("gqa_bs8.json", "8", "sm_80", &["--fold-key-splits", "4"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("4 key splits folded into each block's for-loop (4 blocks along y left, 16 iterations instead of 4; --fold-key-splits)"), "{out}");
    let (code, out, err) = explain("gqa_bs8.json", "8", "sm_90a", &["--fold-key-splits", "3"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("the key splits stay blocks: 3 does not divide the 16 key splits"),
        "{out}"
    );
    let (code, _, err) = explain("gqa_bs8.json", "8", "sm_90a", &["--fold-key-splits", "0"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("expected off, auto or a factor from 1 to 64"),
        "{err}"
    );
}

#[test]
fn matmuls_fuse_into_their_reader_unless_turned_off() {
    // mha_bs8 graph 25: S = Q·K (a kernel-level matmul) read by one customized operator (its
    // key splits kept as blocks: folded, the rule plans another CTA).
    let args = [
        "explain",
        &corpus("mha_bs8.json"),
        "--graph",
        "25",
        "--arch",
        "sm_90a",
        "--fold-key-splits",
        "off",
    ];
    let o = mucc(&args);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("rewrite: kernel op 3 (matmul, k = 64) computed per tile inside kernel op 4"),
        "{out}"
    );
    assert!(!out.contains("cuBLAS"), "{out}");
    // The fused kernel's 208 KB leave an SM one block: on sm_90a the planner's rule refines its
    // loop so that three fit (below); unrefined, it gets 8 warps (sm_80 keeps the µGraph's 4:
    // measured on Hopper only).
    assert!(
        out.contains("CTA: 4 warps (cost model: block_dim kept: the loop was refined so that more blocks of it fit per SM"),
        "{out}"
    );
    let o = mucc(&[&args[..], &["--refine-loops", "1"]].concat());
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("CTA: 8 warps (cost model: the grid has 4 or more blocks per SM, but shared memory holds one block of fewer than 8 warps"),
        "{out}"
    );
    let o = mucc(&[
        "explain",
        &corpus("mha_bs8.json"),
        "--graph",
        "25",
        "--arch",
        "sm_80",
    ]);
    let (ampere, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!ampere.contains("CTA: 8 warps"), "{ampere}");
    let o = mucc(&[&args[..], &["--no-fuse-matmuls"]].concat());
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("matmul: kernel op 3 stays a separate step (fusing matmuls into their reader is turned off)"),
        "{out}"
    );
    assert!(!out.contains("rewrite:"), "{out}");
    // The transpiled code follows: no cuBLAS call once the product is fused.
    let cu = tmp("mha_bs8_g25.cu");
    let _ = std::fs::remove_file(&cu);
    let o = mucc(&[
        "transpile",
        &corpus("mha_bs8.json"),
        "--graph",
        "25",
        "--arch",
        "sm_90a",
        "-o",
        cu.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let src = std::fs::read_to_string(&cu).unwrap();
    assert!(!src.contains("cublasGemm"), "the fused graph calls cuBLAS");
}

#[test]
fn explain_prints_the_plan_and_draws_it() {
    let svg = tmp("plan.svg");
    let _ = std::fs::remove_file(&svg);
    let s = svg.to_str().unwrap();
    // The µGraph's CTA (4 warps): the cost model's choice is tested below.
    let o = mucc(&[
        "explain",
        &corpus("single_gated_mlp.json"),
        "--arch",
        "sm_90a",
        "--warps",
        "graph",
        "--svg",
        s,
    ]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    for needle in [
        "target sm_90a",
        "layout: z3 optimum",
        "chain op3 matmul -> op5 accum_nored",
        "schedule: - | 0,1,2 3,4 | 7,8",
        "barrier (the next iteration overwrites tiles read at the last level)",
        "op5 accum_nored: registers (4 per thread, the mma fragment of op3)",
        "code path: sm80 emitter (uses TMA, ldmatrix, mma.sync, cluster); launch bounds (128, 4)",
        "cluster split: 2 CTAs per block along x (launch grid (256, 1, 1), __cluster_dims__(2, 1, 1)), 32 of 64 iterations each; 4 CTA(s) per SM fit",
        "A by ldmatrix, B by ldmatrix.trans",
        "shared memory:",
        "workspace:",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in\n{out}");
    }
    // The Ampere path on the same target: no split; the Hopper path on sm_80: a clear error.
    let ampere = mucc(&[
        "explain",
        &corpus("single_gated_mlp.json"),
        "--arch",
        "sm_90a",
        "--path",
        "ampere",
    ]);
    let (aout, aerr) = text(&ampere);
    assert_eq!(ampere.status.code(), Some(0), "{aerr}");
    assert!(aout.contains("cluster split: none (Ampere path)"), "{aout}");
    assert!(aout.contains("launch bounds (256, 1)"), "{aout}");
    let wrong = mucc(&[
        "explain",
        &corpus("single_gated_mlp.json"),
        "--arch",
        "sm_80",
        "--path",
        "hopper",
    ]);
    let (_, werr) = text(&wrong);
    assert_eq!(wrong.status.code(), Some(1), "{werr}");
    assert!(
        werr.contains("the hopper path needs sm_90a, but the target is sm_80"),
        "{werr}"
    );
    // The CTA shape: the cost model's choice and why; `--warps N` and `--warps graph` win; a
    // bad count is a clear error.
    let cta = |extra: &[&str]| {
        let mut args = vec!["explain", "--arch", "sm_80"];
        let file = corpus("ntrans_bs1.json");
        args.push(&file);
        args.extend_from_slice(extra);
        let o = mucc(&args);
        let (out, err) = text(&o);
        (o.status.code(), out, err)
    };
    let (code, out, err) = cta(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("grid (8, 1, 1), 512 threads, forloop 1"),
        "{out}"
    );
    // Its operators are element-wise and row norms over one iteration: register rows, a
    // thread per 16-byte run of a row of 4096.
    assert!(
        out.contains("CTA: 16 warps (cost model: register rows: a thread per 16-byte run")
            && out.contains("body: register rows: 1 row(s) of 4096, 512 threads"),
        "{out}"
    );
    let (_, out, _) = cta(&["--no-register-rows"]);
    assert!(
        out.contains("CTA: 16 warps (cost model: the grid leaves SMs short of warps")
            && out.contains("body: shared-memory tiles (register rows: turned off"),
        "{out}"
    );
    let (_, out, _) = cta(&["--warps", "2"]);
    assert!(out.contains("CTA: 2 warps (asked for"), "{out}");
    let (_, out, _) = cta(&["--warps", "graph"]);
    assert!(
        out.contains("CTA: 4 warps (the µGraph's block_dim;"),
        "{out}"
    );
    let (code, _, err) = cta(&["--warps", "33"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("unknown warp count `33`"), "{err}");
    // Loop refinement: by the planner's rule (mha_bs8 graph 25: its 208 KB CTA holds one block
    // per SM; refined by 2, three fit), none with `--refine-loops 1`; asked for, each customized
    // operator's loop is refined or says why not, and the refined kernel stages thinner tiles.
    let refine = |extra: &[&str]| {
        let file = corpus("mha_bs8.json");
        let mut args = vec![
            "explain",
            "--arch",
            "sm_90a",
            "--graph",
            "25",
            "--fold-key-splits",
            "off",
            file.as_str(),
        ];
        args.extend_from_slice(extra);
        let o = mucc(&args);
        let (out, err) = text(&o);
        (o.status.code(), out, err)
    };
    let (code, out, err) = refine(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "loop: kernel op 3 refined by 2: 8 iterations over tiles of 128 along the loop \
             instead of 4 over 256 (the planner's rule"
        ) && out.contains("launch bounds (128, 3); 3 resident block(s) per SM budgeted")
            && out.contains("pipelined x2")
            && !out.contains("loop: kernel op 4"),
        "{out}"
    );
    let (code, out, err) = refine(&["--refine-loops", "1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("loop: kernel op"), "{out}");
    assert!(out.contains("launch bounds (256, 1)"), "{out}");
    // Where the rule does not apply, explain says why (mha_bs8 graph 32's attention kernel,
    // kernel op 5 after the row max that the score shift adds, holds two blocks per SM).
    let file = corpus("mha_bs8.json");
    let o = mucc(&[
        "explain",
        "--arch",
        "sm_90a",
        "--graph",
        "32",
        file.as_str(),
    ]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("loop: kernel op 5 not refined (the planner's rule refines the loops of a large grid's kernel holding one block per SM and the short loops of a small grid's, and shared memory holds 2 of its blocks per SM already)"),
        "{out}"
    );
    // (Kernel op 4 is the online softmax's combining operator, no customized operator.)
    let (code, out, err) = refine(&["--refine-loops", "2"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "loop: kernel op 3 refined by 2: 8 iterations over tiles of 128 along the loop \
             instead of 4 over 256 (--refine-loops"
        ) && !out.contains("loop: kernel op 4")
            && out.contains("grid (256, 4, 1), 128 threads, forloop 8")
            && out.contains("3 resident block(s) per SM budgeted"),
        "{out}"
    );
    // The graph's form has a customized division kernel, whose loop runs once.
    let (code, out, err) = refine(&["--refine-loops", "2", "--online-softmax", "off"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("loop: kernel op 4 not refined (the loop runs once)")
            && out.contains("2 resident block(s) per SM budgeted"),
        "{out}"
    );
    for bad in ["0", "9", "x"] {
        let (code, _, err) = refine(&["--refine-loops", bad]);
        assert_eq!(code, Some(1), "{bad}: {err}");
        assert!(err.contains("--refine-loops"), "{err}");
    }
    let drawing = std::fs::read_to_string(&svg).unwrap();
    assert!(drawing.starts_with("<svg") && drawing.contains("s1 (tb_input_op)"));
    let again = mucc(&["explain", &corpus("single_gated_mlp.json"), "--svg", s]);
    assert_eq!(again.status.code(), Some(1));
    assert!(text(&again).1.contains("exists; pass --force"));
    let bad = mucc(&["explain", &corpus("lora.json"), "--arch", "sm_70"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad).1.contains("unsupported architecture `sm_70`"));
}

#[test]
fn transpile_writes_source_and_plan() {
    let cu = tmp("lora0.cu");
    let plan = tmp("lora0.plan.json");
    let _ = std::fs::remove_file(&cu);
    let _ = std::fs::remove_file(&plan);
    let o = mucc(&[
        "transpile",
        &corpus("legacy_checkpoint_lora.json"),
        "--graph",
        "0",
        "-o",
        cu.to_str().unwrap(),
        "--plan",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let src = std::fs::read_to_string(&cu).unwrap();
    assert!(src.starts_with("// Generated by mucc"));
    assert!(src.contains("#include \"mucc/runtime.h\""));
    assert!(src.contains("extern \"C\" int mucc_execute(const void* const* inputs, void* const* outputs, void* workspace,"));
    assert!(src.contains("cublasGemmStridedBatchedEx"));
    assert!(src.contains("reinterpret_cast<const void*>(&k7_add)"));
    assert!(src.contains("mucc::host::launch(kernel,"));
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    assert_eq!(p["steps"].as_array().unwrap().len(), 4);
    assert_eq!(p["steps"][3]["kind"], "kernel");
    assert_eq!(p["steps"][3]["name"], "k7_add");
    assert_eq!(p["outputs"][0]["shape"], serde_json::json!([16, 4096]));
    // Never overwrite silently.
    let again = mucc(&[
        "transpile",
        &corpus("legacy_checkpoint_lora.json"),
        "--graph",
        "0",
        "-o",
        cu.to_str().unwrap(),
    ]);
    assert_eq!(again.status.code(), Some(1));
    // Customized operators become threadblock kernels.
    let tb_cu = tmp("gated_mlp.cu");
    let _ = std::fs::remove_file(&tb_cu);
    let o = mucc(&[
        "transpile",
        &corpus("single_gated_mlp.json"),
        "-o",
        tb_cu.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    let src = std::fs::read_to_string(&tb_cu).unwrap();
    // 8 warps per CTA (the cost model: 128 blocks leave the SMs short of warps).
    assert!(src.contains("extern \"C\" __global__ void __launch_bounds__(256, 1) k3_customized("));
    // 36992 bytes of dynamic shared memory (tiles on 128-byte lines after the 16-byte zero
    // page): under the 48 KB default, no attribute needed.
    assert!(src.contains("dim3(128, 1, 1), dim3(256, 1, 1), 36992, stream, args)"));
    assert!(!src.contains("cudaFuncAttributeMaxDynamicSharedMemorySize"));
    // --all writes one file per graph into a directory.
    let dir = tmp("all");
    let _ = std::fs::remove_dir_all(&dir);
    let o = mucc(&[
        "transpile",
        &corpus("legacy_checkpoint_lora.json"),
        "--all",
        "--out-dir",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
    for g in 0..3 {
        assert!(
            dir.join(format!("legacy_checkpoint_lora.g{g}.sm_80.cu"))
                .exists()
        );
    }
    assert!(dir.join("legacy_checkpoint_lora.g0.sm_80.cu").exists());
    assert!(
        dir.join("legacy_checkpoint_lora.g0.sm_80.plan.json")
            .exists()
    );
}

#[test]
fn run_and_bench_without_a_gpu_fail_with_one_line() {
    // This test is for machines without a GPU (CI): with one, `mucc run` would run.
    let has_driver = [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists());
    if has_driver {
        eprintln!("a CUDA driver is installed: skipping the no-GPU test");
        return;
    }
    let file = corpus("single_gated_mlp.json");
    for args in [
        vec!["run", &file, "--check"],
        vec!["bench", &file, "--all"],
        vec!["bench", &file, "--json"],
    ] {
        let o = mucc(&args);
        let (out, err) = text(&o);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{args:?}: stdout: {out}\nstderr: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(
            err.starts_with("error: no CUDA driver found"),
            "{args:?}: names the problem: {err}"
        );
        assert!(out.is_empty(), "{args:?}: {out}");
    }
}

#[test]
fn bench_refuses_to_overwrite_its_json_report() {
    let report = tmp("bench_report.json");
    std::fs::write(&report, "keep me").unwrap();
    let r = report.to_string_lossy().into_owned();
    let o = mucc(&["bench", &corpus("lora.json"), "--json-out", &r]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("exists; pass --force"), "{err}");
    assert_eq!(std::fs::read_to_string(&report).unwrap(), "keep me");
}

#[test]
fn bench_checks_its_svg_chart_path_before_touching_the_gpu() {
    // Every refusal comes before the GPU is opened, so these hold with or without one.
    let lora = corpus("lora.json");
    let chart = tmp("bench_chart.svg");
    std::fs::write(&chart, "keep me").unwrap();
    let c = chart.to_string_lossy().into_owned();
    let o = mucc(&["bench", &lora, "--all", "--svg", &c]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(
        err,
        format!("error: {c} exists; pass --force to overwrite it\n")
    );
    assert!(out.is_empty(), "{out}");
    assert_eq!(std::fs::read_to_string(&chart).unwrap(), "keep me");

    let missing = tmp("no-such-dir").join("chart.svg");
    let _ = std::fs::remove_dir_all(missing.parent().unwrap());
    let m = missing.to_string_lossy().into_owned();
    let o = mucc(&["bench", &lora, "--svg", &m, "--force"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "cannot write {m}: the directory {} does not exist",
            missing.parent().unwrap().display()
        )),
        "{err}"
    );

    let o = mucc(&["bench", &lora, "--svg", &lora, "--force"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("mucc never writes over its input"), "{err}");

    let both = tmp("bench_both.out").to_string_lossy().into_owned();
    let o = mucc(&["bench", &lora, "--json-out", &both, "--svg", &both]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("are the same file"), "{err}");
}

#[test]
fn an_edited_source_replaces_one_graph_of_one_gpu_only() {
    // Refused before the GPU is opened, so these hold with or without one.
    let lora = corpus("lora.json");
    let src = tmp("edited.cu");
    std::fs::write(&src, "// edited\n").unwrap();
    let s = src.to_string_lossy().into_owned();
    for cmd in ["run", "bench"] {
        let o = mucc(&[cmd, &lora, "--all", "--source", &s]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{cmd}: {err}");
        assert_eq!(
            err,
            "error: --source replaces one graph's generated code: select one graph (--graph N) \
             of one GPU (4 selected)\n",
            "{cmd}"
        );
        assert!(out.is_empty(), "{cmd}: {out}");
    }
    let o = mucc(&["tune", &lora, "--graph", "1", "--source", &s]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--source (one edited kernel source) does not apply"),
        "{err}"
    );
}

/// Runs mucc with stderr on a new pseudo-terminal (stdout stays a pipe); returns the exit code,
/// stdout, and what reached the terminal.
#[cfg(target_os = "linux")]
fn mucc_on_a_terminal(args: &[&str]) -> (Option<i32>, String, String) {
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut master, mut slave) = (-1, -1);
    let size = libc::winsize {
        ws_row: 40,
        ws_col: 160,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty stores two new descriptors in `master` and `slave`, owned below.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are open and owned by nothing else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let child = {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mucc"));
        cmd.args(args)
            .env(
                "MUCC_CACHE_DIR",
                std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(slave));
        cmd.spawn().expect("run mucc")
        // `cmd`, and with it this process's copy of the terminal's slave side, is dropped here,
        // so reading the master side ends when mucc exits.
    };
    let reader = std::thread::spawn(move || {
        let mut f = std::fs::File::from(master);
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        // Linux answers EIO once the slave side is closed.
        while let Ok(n) = f.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&seen).into_owned()
    });
    let o = child.wait_with_output().expect("wait for mucc");
    let terminal = reader.join().expect("read the terminal");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        terminal,
    )
}

#[cfg(target_os = "linux")]
#[test]
fn eval_all_draws_a_progress_bar_only_on_a_terminal_and_keeps_stdout_clean() {
    let args = ["eval", &corpus("lora.json"), "--all", "--seed", "3"];
    let (code, out, terminal) = mucc_on_a_terminal(&args);
    assert_eq!(code, Some(0), "{terminal}");
    // The bar (4 graphs, the current one named) was drawn on the terminal and cleared.
    assert!(terminal.contains("/4 graphs"), "{terminal:?}");
    assert!(terminal.contains("graph "), "{terminal:?}");
    // stdout has exactly the lines of a run without a terminal.
    let piped = mucc(&args);
    let (plain, err) = text(&piped);
    assert!(err.is_empty(), "{err:?}");
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| l.split(" (").next().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(strip(&out), strip(&plain));
    assert_eq!(
        out.matches("output 0: shape [16, 4096]").count(),
        4,
        "{out}"
    );
}

#[test]
fn build_writes_a_shared_library_and_its_header_and_never_overwrites() {
    if std::env::var_os("MUCC_SKIP_CUDA").is_some_and(|v| v == "1") {
        return;
    }
    let home = std::env::var_os("MUCC_CUDA_HOME").map(PathBuf::from).expect(
        "MUCC_CUDA_HOME is not set: run `source scripts/cuda-toolchain.sh` first (or set MUCC_SKIP_CUDA=1)",
    );
    let nvcc = home.join("bin/nvcc").to_string_lossy().into_owned();
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("golden/threadblock/matmul_3x50x13_bf16.json")
        .to_string_lossy()
        .into_owned();
    let so = tmp("libmm_cli.so");
    let h = so.with_extension("h");
    let _ = std::fs::remove_file(&so);
    let _ = std::fs::remove_file(&h);
    let so_s = so.to_string_lossy().into_owned();
    let args = [
        "build", &golden, "--graph", "0", "--arch", "sm_80", "-o", &so_s, "--nvcc", &nvcc,
    ];
    let o = mucc(&args);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    let header = std::fs::read_to_string(&h).unwrap();
    assert!(header.contains("int mucc_execute(const void* const* inputs, void* const* outputs, void* workspace, void* stream);"));
    assert!(
        header.contains(
            "input 1: bf16 [100, 26], element strides [26, 1], a buffer of 2600 elements"
        ),
        "{header}"
    );
    assert!(header.contains("#define MUCC_NUM_OUTPUTS 1"));
    let bytes = std::fs::read(&so).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF");
    // The entry point is exported.
    let nm = Command::new("nm").arg("-D").arg(&so).output().expect("nm");
    assert!(String::from_utf8_lossy(&nm.stdout).contains(" T mucc_execute"));
    // A second build without --force refuses and leaves the library alone.
    let o = mucc(&args);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("exists; pass --force"), "{err}");
    assert_eq!(std::fs::read(&so).unwrap(), bytes);
}

/// A file name cannot inject code: newlines, a lone `\r`, `*/` and backslashes in the input's
/// name reach the generated source and the library header only as `%XX` escapes, inside one
/// comment line (issue 12, defect 1).
#[test]
fn hostile_file_names_do_not_reach_the_code() {
    if std::env::var_os("MUCC_SKIP_CUDA").is_some_and(|v| v == "1") {
        return;
    }
    let home = std::env::var_os("MUCC_CUDA_HOME").map(PathBuf::from).expect(
        "MUCC_CUDA_HOME is not set: run `source scripts/cuda-toolchain.sh` first (or set MUCC_SKIP_CUDA=1)",
    );
    let nvcc = home.join("bin/nvcc").to_string_lossy().into_owned();
    let dir = tmp("hostile");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("golden/threadblock/matmul_3x50x13_bf16.json");
    let names = [
        "pwn\n__attribute__((constructor)) static void pwn(void){ __builtin_trap(); }\n#define JUNK .json",
        "pwn\r__attribute__((constructor)) static void pwn(void){ __builtin_trap(); }\r#define JUNK .json",
        // A directory named `x *`: the path holds `*/`, which would end a `/* */` comment.
        "x */__attribute__((constructor)) static void pwn(void){}.json",
        "x \\",
    ];
    std::fs::create_dir_all(dir.join("x *")).unwrap();
    for (n, name) in names.iter().enumerate() {
        let input = dir.join(name);
        std::fs::copy(&golden, &input).unwrap();
        let input_s = input.to_string_lossy().into_owned();
        let cu = dir.join(format!("out{n}.cu"));
        let o = mucc(&["transpile", &input_s, "-o", cu.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
        let so = dir.join(format!("libhostile{n}.so"));
        let o = mucc(&[
            "build",
            &input_s,
            "--graph",
            "0",
            "--arch",
            "sm_80",
            "-o",
            so.to_str().unwrap(),
            "--nvcc",
            &nvcc,
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
        let header = std::fs::read_to_string(so.with_extension("h")).unwrap();
        let source = std::fs::read_to_string(&cu).unwrap();
        for (what, text) in [("header", &header), ("source", &source)] {
            for line in text.split(['\n', '\r']) {
                let l = line.trim_start();
                assert!(
                    !l.starts_with("__attribute__") && !l.starts_with("#define JUNK"),
                    "{what} of name {n} has a line the name started: {line}"
                );
                // Only the file-name comment mentions the payload, and it stays a comment.
                if line.contains("constructor") {
                    assert!(l.starts_with("//") || l.starts_with("/*"), "{what}: {line}");
                    assert!(!line.contains("*/ __attribute__"), "{what}: {line}");
                }
                assert!(!line.ends_with('\\'), "{what}: a line continues: {line}");
            }
        }
        let nm = Command::new("nm").arg("-D").arg(&so).output().expect("nm");
        assert!(!String::from_utf8_lossy(&nm.stdout).contains("pwn"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `transpile` and `explain` plan with the tuned variant the cache holds for the graph and
/// architecture (and say so); `--no-tune`, or an explicit `--path`, ignores it.
#[test]
fn tuned_variant_from_the_cache_is_used_and_said() {
    use mucc::cuda::tune::{TuneCache, TuneEntry, Variant, VariantPath, VariantResult, graph_hash};
    let cache_dir = tmp("tune-cache");
    let _ = std::fs::remove_dir_all(&cache_dir);
    let file = corpus("single_gated_mlp.json");
    let g = mucc::read_file(std::path::Path::new(&file), &Default::default()).unwrap();
    let hash = graph_hash(&g.graphs[0].graph).unwrap();
    let ampere = Variant {
        path: VariantPath::Ampere,
        cluster_split: false,
        ..Variant::DEFAULT
    };
    TuneCache::at(cache_dir.join("tune"))
        .store(&TuneEntry {
            mucc_version: mucc::cuda::tune::PLANNER.into(),
            gpu: "NVIDIA H200".into(),
            arch: mucc::target::Arch::Sm90a,
            graph_hash: hash,
            best: ampere,
            results: vec![VariantResult {
                variant: ampere,
                us: Some(1.0),
                note: None,
            }],
            source: "test".into(),
        })
        .unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "transpile",
            file.as_str(),
            "--graph",
            "0",
            "--arch",
            "sm_90a",
        ];
        args.extend_from_slice(extra);
        let o = Command::new(env!("CARGO_BIN_EXE_mucc"))
            .args(&args)
            .env("MUCC_CACHE_DIR", &cache_dir)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
        text(&o)
    };
    let (tuned, note) = run(&[]);
    assert!(
        note.contains(
            "graph 0: tuned variant path=ampere (mucc tune on NVIDIA H200; --no-tune ignores it)"
        ),
        "{note}"
    );
    // The Ampere path: no TMA, no cluster.
    assert!(!tuned.contains("mucc/arch/sm90.h"), "{tuned}");
    let (default, note) = run(&["--no-tune"]);
    assert!(!note.contains("tuned variant"), "{note}");
    assert!(default.contains("mucc/arch/sm90.h"));
    assert_ne!(tuned, default);
    // An explicit path wins over the cache.
    let (_, note) = run(&["--path", "ampere"]);
    assert!(!note.contains("tuned variant"), "{note}");
    // explain says which variant planned it.
    let o = Command::new(env!("CARGO_BIN_EXE_mucc"))
        .args(["explain", &file, "--graph", "0", "--arch", "sm_90a"])
        .env("MUCC_CACHE_DIR", &cache_dir)
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(err.contains("tuned variant path=ampere"), "{err}");
    assert!(out.contains("cluster split: none (Ampere path)"), "{out}");
    let _ = std::fs::remove_dir_all(&cache_dir);

    // tune tries every variant itself: the options that pick one are refused, not ignored.
    for extra in [
        &["--path", "ampere"][..],
        &["--dependent-launch"],
        &["--no-tune"],
        &["--warps", "8"],
    ] {
        let mut args = vec!["tune", file.as_str()];
        args.extend_from_slice(extra);
        let o = mucc(&args);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        assert!(err.contains("do not apply to it"), "{err}");
    }
}

/// A tensor-parallel graph (2 GPUs, recorded as `mucc_gpu_dim`): `eval` interprets every rank on
/// its shard and prints the gathered outputs (`--gpus` replaces the recorded count);
/// `transpile` generates a host entry that takes an NCCL communicator; the commands that run
/// one GPU refuse it, and `run --gpus 2` on a machine without GPUs says so.
#[test]
fn multi_gpu_graphs_are_interpreted_transpiled_and_refused_where_unsupported() {
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/multi_gpu/tp_mlp_2gpu.json"
    );
    let o = mucc(&["eval", file]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("graph 0: 2 GPUs (mesh (2, 1, 1)): every rank interpreted on its shard"),
        "{out}"
    );
    // The JSON holds per-GPU shapes: the second output is partitioned (2 × 32 columns).
    assert!(out.contains("graph 0: output 1: shape [4, 64]"), "{out}");
    let o = mucc(&["eval", file, "--gpus", "1"]);
    let (out, _) = text(&o);
    assert!(out.contains("graph 0: output 1: shape [4, 32]") && !out.contains("GPUs (mesh"));
    let o = mucc(&["eval", file, "--gpus", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("`0` is not a GPU count"));
    let o = mucc(&["transpile", file]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.contains("#include \"mucc/nccl.h\""), "{out}");
    assert!(
        out.contains("ncclComm_t comm, cudaStream_t stream) {"),
        "{out}"
    );
    assert!(
        out.contains("MUCC_CHECK_NCCL(ncclAllReduce(buf.ws(0), buf.out(0, 0), 64, ncclFloat16, ncclSum, comm, stream));"),
        "{out}"
    );
    // On one GPU the same file is the single-GPU program (the all-reduce is a copy).
    let o = mucc(&["transpile", file, "--gpus", "1"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        !out.contains("nccl") && out.contains("k5_allreduce"),
        "{out}"
    );
    let o = mucc(&["explain", file]);
    let (out, _) = text(&o);
    assert!(
        out.contains("GPUs: 2 (mesh (2, 1, 1)): every GPU runs this plan on its own shards")
            && out.contains("kernel op 5 (kn_allreduce_op): NCCL all-reduce (sum) over 2 GPUs of the 64-element span"),
        "{out}"
    );
    let o = mucc(&["inspect", file]);
    let (out, _) = text(&o);
    assert!(
        out.contains("allreduce; on 2 GPUs (shapes per GPU); valid"),
        "{out}"
    );
    let o = mucc(&["tune", file]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "graph 0 runs on 2 GPUs (its mesh); mucc tune runs graphs on one GPU only so far (`mucc run --gpus 2` runs and checks it)"
        ),
        "{err}"
    );
    let o = mucc(&["bench", file, "--json"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--json, --json-out and --svg describe one-GPU runs"),
        "{err}"
    );
    let o = mucc(&["bench", file]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.starts_with("error: no CUDA driver found"), "{err}");
    // No GPU here (as in the test above): a clean error before anything else.
    let o = mucc(&["run", file, "--check"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.starts_with("error: no CUDA driver found"), "{err}");
}

/// `--no-tma` keeps every streamed tile on `cp.async` on the Hopper path: `explain` names each
/// input and the option, and the transpiled kernel issues no bulk tensor load and encodes no
/// tensor map, while the cluster split stays.
#[test]
fn no_tma_keeps_streamed_tiles_on_cp_async() {
    let f = corpus("single_gated_mlp.json");
    let o = mucc(&["explain", &f, "--arch", "sm_90a"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.contains("op1 input -> s1 by tensor map tm1"), "{out}");
    let o = mucc(&["explain", &f, "--arch", "sm_90a", "--no-tma"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.contains("  TMA loads: none\n"), "{out}");
    for op in 0..3 {
        assert!(
            out.contains(&format!(
                "op{op} input keeps cp.async: TMA is turned off (--no-tma)"
            )),
            "{out}"
        );
    }
    assert!(out.contains("cluster split: 2 CTAs per block"), "{out}");
    let o = mucc(&["explain", &f, "--arch", "sm_90a", "--path", "ampere"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        out.contains("  TMA loads: none (the Ampere path)\n"),
        "{out}"
    );
    let transpile = |extra: &[&str], name: &str| {
        let cu = tmp(name);
        let _ = std::fs::remove_file(&cu);
        let mut args = vec!["transpile", f.as_str(), "--arch", "sm_90a", "-o"];
        args.push(cu.to_str().unwrap());
        args.extend_from_slice(extra);
        let o = mucc(&args);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o).1);
        std::fs::read_to_string(&cu).unwrap()
    };
    let with = transpile(&[], "sgm_tma.cu");
    assert!(with.contains("mucc::sm90::tma_load("));
    let without = transpile(&["--no-tma"], "sgm_no_tma.cu");
    assert!(!without.contains("tma_load") && !without.contains("tensor_map"));
    assert!(without.contains("__cluster_dims__(2, 1, 1)"));
}
