//! Regression tests of the second hardening round (issue 33), one or more per item; each failed
//! before its fix. Items 3–6 (output files) are tested with the output code.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use mucc::graph::ops::AccumKind;
use mucc::graph::{DType, GpuMesh, GraphBuilder, TbGraphBuilder};

use super::{dir, mucc, mucc_rss, stderr, write_graph};

/// Runs mucc with the stack of its main thread limited to `bytes` (as `ulimit -s` does).
fn mucc_with_stack(args: &[&str], bytes: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(env!("CARGO_BIN_EXE_mucc"));
    c.args(args);
    // SAFETY: the closure runs in the forked child before exec and calls only getrlimit and
    // setrlimit, which are async-signal-safe.
    unsafe {
        c.pre_exec(move || {
            let mut l: libc::rlimit = std::mem::zeroed();
            if libc::getrlimit(libc::RLIMIT_STACK, &mut l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            l.rlim_cur = bytes.min(l.rlim_max);
            if libc::setrlimit(libc::RLIMIT_STACK, &l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c.output().expect("run mucc")
}

/// Item 7: a chain of 16,000 kernel-level element-wise operators (unary and binary) plans on
/// a 1 MB stack (the layout solver's fallback search recursed once per variable and checked
/// every constraint at each step: a stack overflow here, and 15 s for 30,000 operators).
#[test]
fn long_kernel_level_chains_plan_on_a_small_stack() {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[16, 64], DType::F16).unwrap();
    let (mut prev, mut cur) = (x, x);
    for i in 0..16_000 {
        let next = match i % 4 {
            0 => g.add(cur, prev).unwrap(),
            1 => g.exp(cur).unwrap(),
            2 => g.mul(cur, prev).unwrap(),
            _ => g.silu(cur).unwrap(),
        };
        (prev, cur) = (cur, next);
    }
    g.mark_output(cur).unwrap();
    let d = dir("long-chain");
    let f = d.join("chain.json");
    write_graph(&f, &g.build().unwrap());
    let f = f.to_str().unwrap();
    for cmd in ["transpile", "explain"] {
        let t = Instant::now();
        let o = mucc_with_stack(&[cmd, f], 1 << 20);
        assert_eq!(o.status.code(), Some(0), "{cmd}: {}", stderr(&o));
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{cmd}: {:?}",
            t.elapsed()
        );
    }
}

/// Item 7, threadblock level: a customized operator whose threadblock graph is a chain of
/// 50,000 element-wise operators plans in about a second (every tile's producer was found by
/// a walk over all operators: 10 s); a chain of 12,000 binary and unary tile operators that
/// cannot fit shared memory gets the shared-memory error on a 1 MB stack (it overflowed it).
#[test]
fn long_threadblock_chains_plan_in_linear_time() {
    let d = dir("long-tb-chain");
    let chain = |n: usize, binary: bool| {
        let mut g = GraphBuilder::new();
        let x = g.new_input(&[16, 64], DType::F16).unwrap();
        let mut tb = TbGraphBuilder::new([1, 1, 1], [128, 1, 1], 1);
        let tx = tb.new_input(&g, x, [-1, -1, -1], -1).unwrap();
        let (mut prev, mut cur) = (tx, tx);
        for i in 0..n {
            let next = if binary && i % 2 == 1 {
                tb.add(cur, prev).unwrap()
            } else {
                tb.exp(cur).unwrap()
            };
            (prev, cur) = (cur, next);
        }
        let acc = tb.forloop_accum(cur, AccumKind::Nored).unwrap();
        tb.new_output(acc, [-1, -1, -1]).unwrap();
        let out = g.customized(tb).unwrap();
        g.mark_output(out[0]).unwrap();
        let f = d.join(format!("tb{n}-{binary}.json"));
        write_graph(&f, &g.build().unwrap());
        f
    };
    let unary = chain(50_000, false);
    let t = Instant::now();
    let o = mucc_with_stack(&["transpile", unary.to_str().unwrap()], 1 << 20);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let mixed = chain(12_000, true);
    let o = mucc_with_stack(&["transpile", mixed.to_str().unwrap()], 1 << 20);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("bytes of shared memory"),
        "{}",
        stderr(&o)
    );
}

/// Runs mucc, killing it after `limit`: `None` if it ran that long.
fn mucc_within(args: &[&str], limit: Duration) -> Option<Output> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mucc"));
    c.args(args);
    run_within(c, limit)
}

/// Runs `c` with its output captured, killing it after `limit`: `None` if it ran that long.
fn run_within(mut c: Command, limit: Duration) -> Option<Output> {
    let mut child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run mucc");
    let t = Instant::now();
    while t.elapsed() < limit {
        if child.try_wait().expect("wait for mucc").is_some() {
            return Some(child.wait_with_output().expect("read mucc's output"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Items 1 and 2: `eval --gpus N` (and the references of `run`/`bench --check --gpus`) count
/// the memory and work of every rank, the global inputs and the gathered outputs, and refuse
/// at once what exceeds the limits (they counted one rank: 584 MB under `--max-memory 100M`,
/// an 8-rank product past `--max-work`, and an abort allocating 2 TB for a graph whose
/// per-GPU estimate fitted).
#[test]
fn multi_gpu_references_are_budgeted_over_every_rank() {
    let d = dir("gpus-budget");
    // Replicated 2048×2048 inputs on 16 GPUs: 32 MiB per tensor per rank.
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[2048, 2048], DType::F16).unwrap();
    let y = g.exp(x).unwrap();
    g.mark_output(y).unwrap();
    let big = d.join("replicated.json");
    write_graph(&big, &g.build().unwrap());
    let big = big.to_str().unwrap();
    let o = mucc_within(
        &["eval", big, "--gpus", "16", "--max-memory", "100M"],
        Duration::from_secs(10),
    )
    .expect("refused at once");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("on 16 GPUs") && err.contains("GiB") && err.contains("limit of 100 MiB"),
        "{err}"
    );
    // The same graph on one GPU fits.
    let o = mucc(&["eval", big, "--max-memory", "100M"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Work: a 1024³ product per rank fits 5e9 operations; eight of them do not.
    let mut g = GraphBuilder::new();
    let a = g.new_input(&[1024, 1024], DType::F32).unwrap();
    let b = g.new_input(&[1024, 1024], DType::F32).unwrap();
    let c = g.matmul(a, b).unwrap();
    g.mark_output(c).unwrap();
    let mm = d.join("matmul.json");
    write_graph(&mm, &g.build().unwrap());
    let o = mucc_within(
        &[
            "eval",
            mm.to_str().unwrap(),
            "--gpus",
            "8",
            "--max-work",
            "5e9",
        ],
        Duration::from_secs(10),
    )
    .expect("refused at once");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("operations on 8 GPUs") && stderr(&o).contains("--max-work"),
        "{}",
        stderr(&o)
    );
    // Item 2: a per-GPU input of 1,048,576 × 256 partitioned over 1023 GPUs (validates; a
    // 2 TiB global input).
    let mut g = GraphBuilder::new();
    g.set_gpu_mesh(GpuMesh::line(1023)).unwrap();
    let x = g
        .new_input_sharded(&[1_048_576 * 1023, 256], DType::BF16, [0, -1, -1])
        .unwrap();
    let y = g.exp(x).unwrap();
    g.mark_output_sharded(y, [0, -1, -1]).unwrap();
    let g = g.build().unwrap();
    let sharded = d.join("sharded.json");
    write_graph(&sharded, &g);
    for limit in ["1G", "8G", "100G"] {
        let o = mucc_within(
            &["eval", sharded.to_str().unwrap(), "--max-memory", limit],
            Duration::from_secs(10),
        )
        .expect("refused at once");
        assert_eq!(o.status.code(), Some(1), "{limit}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("on 1023 GPUs") && err.contains("the global %0 [1072693248, 256] bf16"),
            "{err}"
        );
    }
    // `run`/`bench --check --gpus` draw their reference through the same estimate.
    let e = mucc::cuda::session::inputs_and_reference(&g, 0, 1.0, &Default::default())
        .err()
        .expect("refused");
    assert!(e.contains("on 1023 GPUs"), "{e}");
}

/// Item 8: the candidates of a file are counted while it is parsed, so a few megabytes of
/// empty candidates (`[[],[],…]`) are refused at once in little memory (every candidate cost
/// about 370 bytes: 125 times the file, 8 GB for 64 MB).
#[test]
fn candidate_lists_are_bounded_while_parsing() {
    let d = dir("candidates");
    let n = (4 << 20) / 3;
    let f = d.join("empty.json");
    std::fs::write(&f, format!("[{}]", vec!["[]"; n].join(","))).unwrap();
    let (o, rss) = mucc_rss(&["inspect", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("more than 100000 candidate graphs")
            && err.contains("--max-graphs")
            && err.contains("line 1, column 300004"),
        "{err}"
    );
    assert!(rss < 100 << 20, "{rss} bytes");
    // The limit is an option, and counts a checkpoint's generated_graphs too.
    let few = d.join("few.json");
    std::fs::write(&few, "[[], [], []]").unwrap();
    let o = mucc(&["inspect", few.to_str().unwrap(), "--max-graphs", "2"]);
    assert!(
        stderr(&o).contains("more than 2 candidate graphs"),
        "{}",
        stderr(&o)
    );
    let o = mucc(&["inspect", few.to_str().unwrap(), "--max-graphs", "3"]);
    assert!(!stderr(&o).contains("candidate graphs"), "{}", stderr(&o));
    let checkpoint = d.join("checkpoint.json");
    std::fs::write(&checkpoint, r#"{"generated_graphs": [[], [], []]}"#).unwrap();
    let o = mucc(&["inspect", checkpoint.to_str().unwrap(), "--max-graphs", "2"]);
    assert!(
        stderr(&o).contains("more than 2 candidate graphs"),
        "{}",
        stderr(&o)
    );
}

/// Item 10: `--max-input-bytes` of 2⁶⁴ − 1 reads the file (the limit + 1 wrapped to 0 and
/// every file was "truncated").
#[test]
fn the_largest_input_limit_reads_files() {
    let lora = super::corpus("lora.json");
    let o = mucc(&[
        "inspect",
        &lora,
        "--max-input-bytes",
        "18446744073709551615",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// Runs `mucc transpile FILE --graph 0 --arch sm_90a` with `cache` as `MUCC_CACHE_DIR` (and
/// `HOME` and `XDG_CACHE_HOME` as given), killing it after 20 s (`None`).
fn transpile_with_cache(file: &str, env: &[(&str, &std::ffi::OsStr)]) -> Option<Output> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mucc"));
    c.args(["transpile", file, "--graph", "0", "--arch", "sm_90a"])
        .env_remove("XDG_CACHE_HOME");
    for (k, v) in env {
        c.env(k, v);
    }
    run_within(c, Duration::from_secs(20))
}

/// Item 9: tuning-cache entries are read like input files and checked before they plan
/// anything; an entry that fails is ignored with a warning (warps 0 gave code that did not
/// compile, 1000 gave 32,000-thread CTAs, 2³² made transpile spin, a FIFO blocked it forever
/// and a symbolic link to /dev/zero was read up to 2 GB). Item 10: `MUCC_CACHE_DIR=""` counts
/// as unset (it put the cache in the current directory), and a GPU name with a newline is
/// printed escaped.
#[test]
fn tuning_cache_entries_are_checked() {
    use mucc::cuda::tune::{PLANNER, TuneCache, TuneEntry, Variant, VariantResult, graph_hash};
    let d = dir("tune-cache");
    let file = super::corpus("single_gated_mlp.json");
    let g = mucc::read_file(std::path::Path::new(&file), &Default::default()).unwrap();
    let hash = graph_hash(&g.graphs[0].graph).unwrap();
    let cache = d.join("cache");
    let entry = |warps: usize, gpu: &str| {
        let v = Variant {
            warps: Some(warps),
            ..Variant::DEFAULT
        };
        TuneEntry {
            mucc_version: PLANNER.into(),
            gpu: gpu.into(),
            arch: mucc::target::Arch::Sm90a,
            graph_hash: hash.clone(),
            best: v,
            results: vec![VariantResult {
                variant: v,
                us: Some(1.0),
                note: None,
            }],
            source: "test".into(),
        }
    };
    let store = |e: &TuneEntry| TuneCache::at(cache.join("tune")).store(e).unwrap();
    let run = || {
        transpile_with_cache(&file, &[("MUCC_CACHE_DIR", cache.as_os_str())])
            .expect("transpile finishes")
    };
    // A sound entry plans the graph.
    let path = store(&entry(4, "NVIDIA H200"));
    let o = run();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("tuned variant path=auto split=on pdl=off warps=4"),
        "{}",
        stderr(&o)
    );
    let tuned = o.stdout;
    // Warp counts no CTA can have.
    for (warps, json) in [(0u64, "0"), (1000, "1000"), (1 << 32, "4294967296")] {
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        v["best"]["warps"] = serde_json::json!(warps);
        v["results"][0]["variant"]["warps"] = serde_json::json!(warps);
        std::fs::write(&path, v.to_string()).unwrap();
        let o = run();
        assert_eq!(o.status.code(), Some(0), "{warps}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("warning: tuning cache entry")
                && err.contains(&format!("{json} warps per CTA"))
                && !err.contains("tuned variant"),
            "{warps}: {err}"
        );
        assert!(o.stdout != tuned, "{warps}: planned with the tuned variant");
    }
    // Not regular files: a FIFO, and a symbolic link to /dev/zero.
    std::fs::remove_file(&path).unwrap();
    let fifo = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path it is given.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let o = run();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
    let o = run();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
    std::fs::remove_file(&path).unwrap();
    // A GPU name with a newline cannot forge an error line.
    store(&entry(8, "NVIDIA H200\nerror: forged"));
    let o = run();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("NVIDIA H200\\nerror: forged"), "{err}");
    assert!(!err.lines().any(|l| l.starts_with("error:")), "{err}");
    // MUCC_CACHE_DIR="" is unset: the cache is found under $HOME/.cache/mucc.
    let home = d.join("home");
    TuneCache::at(home.join(".cache/mucc/tune"))
        .store(&entry(16, "NVIDIA H200"))
        .unwrap();
    let o = transpile_with_cache(
        &file,
        &[
            ("MUCC_CACHE_DIR", std::ffi::OsStr::new("")),
            ("HOME", home.as_os_str()),
        ],
    )
    .expect("transpile finishes");
    assert!(stderr(&o).contains("warps=16"), "{}", stderr(&o));
}

/// Whether `text` holds a line that starts like one of mucc's own (`error:`, `warning:`), or a
/// character that acts on a terminal (escape, carriage return, C1 control, bidi override).
fn forged(text: &str) -> bool {
    text.lines()
        .any(|l| l.starts_with("error: forged") || l.starts_with("warning: forged"))
        || text
            .chars()
            .any(|c| (c.is_control() && c != '\n') || ('\u{202a}'..='\u{202e}').contains(&c))
}

/// Item 10: text from files and file names reaches messages escaped (`\n`, `\x1b`), so it can
/// neither forge an `error:` line nor send escape sequences: a hostile `op_type`, dtype-table
/// name and file name, and a hostile command-line value that clap quotes.
#[test]
fn user_text_reaches_the_terminal_escaped() {
    let d = dir("escapes");
    let payload = "x\nerror: forged\u{1b}[2J\r\u{9b}1m\u{202e}";
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[4, 8], DType::F16).unwrap();
    let y = g.exp(x).unwrap();
    g.mark_output(y).unwrap();
    let g = g.build().unwrap();
    let doc = mucc::graph::mirage_json::graph_to_json(&g, &Default::default()).unwrap();
    // A hostile op_type and dtype table name.
    let mut bad_op = doc.clone();
    bad_op[1]["op_type"] = serde_json::Value::String(payload.into());
    let mut bad_table = doc.clone();
    bad_table[0]["mucc_dtype_table"] = serde_json::Value::String(payload.into());
    for (n, v) in [bad_op, bad_table].iter().enumerate() {
        let f = d.join(format!("bad{n}.json"));
        std::fs::write(&f, v.to_string()).unwrap();
        let o = mucc(&["inspect", f.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("x\\nerror: forged\\x1b[2J\\r\\u{9b}1m\\u{202e}"),
            "{err:?}"
        );
        assert!(!forged(&err), "{err:?}");
    }
    // A hostile file name: in errors (no graph 3) and on stdout (inspect's `file:` line).
    let f = d.join(format!("{payload}.json"));
    std::fs::write(&f, doc.to_string()).unwrap();
    let name = f.to_str().unwrap();
    for args in [
        vec!["inspect", name],
        vec!["inspect", name, "--graph", "3"],
        vec!["explain", name],
        vec!["transpile", name, "--graph", "3"],
        vec!["eval", name, "--max-memory", "1K"],
    ] {
        let o = mucc(&args);
        let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), stderr(&o));
        assert!(!forged(&err), "{args:?}: {err:?}");
        assert!(!forged(&out), "{args:?}: {out:?}");
    }
    // clap quotes a bad value as given.
    let o = mucc(&["eval", name, &format!("--scale={payload}")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(!forged(&stderr(&o)), "{:?}", stderr(&o));
    assert!(stderr(&o).contains("x\\nerror: forged"), "{:?}", stderr(&o));
}

/// Item 10: `eval` says when `--scale` overflows an input's dtype (every output was non-finite
/// without a word at 70000 on f16), prints scale bounds compactly (1e300 had 301 digits) and
/// sizes with a unit that shows them (the memory limit read "needs 0.0 GB … limit of 0.0 GB").
#[test]
fn eval_messages_read_well() {
    let d = dir("eval-messages");
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[8, 16], DType::F16).unwrap();
    let y = g.exp(x).unwrap();
    g.mark_output(y).unwrap();
    let f = d.join("f16.json");
    write_graph(&f, &g.build().unwrap());
    let f = f.to_str().unwrap();
    let o = mucc(&["eval", f, "--scale", "70000"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("values of input 0 (f16) are infinite: --scale 70000"),
        "{}",
        stderr(&o)
    );
    let o = mucc(&["eval", f, "--scale", "60000"]);
    assert!(!stderr(&o).contains("are infinite"), "{}", stderr(&o));
    let o = mucc(&["eval", f, "--scale", "1e300"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains("uniform in [-1e300, 1e300)"), "{out}");
    let o = mucc(&["eval", f, "--max-memory", "1K"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("needs about 3 KiB of host memory")
            && stderr(&o).contains("limit of 1 KiB"),
        "{}",
        stderr(&o)
    );
}
