//! Regression tests of the second hardening round (issue 33), one or more per item; each failed
//! before its fix. Items 3–6 (output files) are tested with the output code.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use mucc::graph::ops::AccumKind;
use mucc::graph::{DType, GraphBuilder, TbGraphBuilder};

use super::{dir, mucc, stderr, write_graph};

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
