//! `mucc explain`: the plan as stable text. This module only reads a [`GraphPlan`]; every line
//! it prints is a field of the plan that the generated code follows.

use std::fmt::Write;

use crate::graph::arena::Handle;
use crate::graph::kernel::{KernelGraph, KnOpKind};
use crate::layout::solve::SolveMethod;
use crate::sched::memory;
use crate::sched::ops::{AccumStorage, Copy, OpPlan};
use crate::sched::order::Step;
use crate::sched::plan::{GraphPlan, Placement};

/// The plan as stable text (what `mucc explain` prints).
pub fn explain(g: &KernelGraph, p: &GraphPlan) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "target {}", p.target.arch);
    let method = match &p.layout.report.method {
        SolveMethod::Z3 => "z3 optimum".to_string(),
        SolveMethod::Fallback { reason } => format!("fallback search (z3: {reason})"),
    };
    let _ = writeln!(
        s,
        "layout: {method}, cost {}, {} variables, {} constraints",
        p.layout.cost, p.layout.report.variables, p.layout.report.constraints
    );
    let _ = writeln!(s, "dtensors:");
    for (h, d) in g.tensors.iter() {
        let geo = &p.dtensors[h.index()];
        let place = match geo.placement {
            Placement::Input(i) => format!("input {i}"),
            Placement::Output(j) => format!("output {j}"),
            Placement::Workspace(o) => format!("workspace +{o}"),
        };
        let _ = writeln!(
            s,
            "  %{} {} {}: innermost {} strides {} ({} elements), {place}",
            h.index(),
            d.shape,
            d.dtype,
            geo.innermost,
            geo.strides,
            geo.phys_elems
        );
    }
    for (&k, kp) in &p.kernels {
        let KnOpKind::Customized(tb) = &g.ops[Handle::from_index(k)].kind else {
            continue;
        };
        let _ = writeln!(
            s,
            "kernel op {k} (customized): grid ({}, {}, {}), {} threads, forloop {}",
            tb.grid[0],
            tb.grid[1],
            tb.grid[2],
            tb.num_threads(),
            tb.forloop_range
        );
        for line in kp.fusion.dump(tb).lines() {
            let _ = writeln!(s, "  {line}");
        }
        let _ = writeln!(s, "  schedule: {}", kp.schedule.compact(&kp.fusion));
        for (ph, st) in kp.schedule.steps() {
            match st {
                Step::Barrier(why) => {
                    let _ = writeln!(s, "    {:<9} barrier ({why})", ph.name());
                }
                Step::Run(c) => {
                    let chain = &kp.fusion.chains[*c];
                    let names: Vec<String> = chain
                        .ops
                        .iter()
                        .map(|&o| format!("op{} {}", o.index(), tb.ops[o].kind.name()))
                        .collect();
                    let _ = writeln!(
                        s,
                        "    {:<9} level {}: {}",
                        ph.name(),
                        kp.schedule.level[*c],
                        names.join(" -> ")
                    );
                }
            }
        }
        let _ = writeln!(s, "  operators:");
        for (h, op) in tb.ops.iter() {
            let plan = match &kp.ops[h.index()] {
                OpPlan::Input { copy, stages, .. } => format!(
                    "{}{}",
                    copy_text(copy),
                    if *stages > 1 {
                        format!(", pipelined x{stages}")
                    } else {
                        String::new()
                    }
                ),
                OpPlan::Output { copy: None } => "stored by its chain's leader".into(),
                OpPlan::Output { copy: Some(c) } => copy_text(c),
                OpPlan::Accum {
                    storage, reduce, ..
                } => format!(
                    "{}, reduce {:?}",
                    match storage {
                        AccumStorage::Registers { per_thread, .. } =>
                            format!("registers ({per_thread} per thread)"),
                        AccumStorage::Shared => "shared memory".into(),
                    },
                    reduce
                ),
                OpPlan::Matmul {
                    warps,
                    instr,
                    mma_per_warp,
                    loads_per_warp,
                } => format!(
                    "{} x {} warps, {instr}, {mma_per_warp} mma + {loads_per_warp} ldmatrix per warp",
                    warps.0, warps.1
                ),
                OpPlan::RowReduce(r) => {
                    format!(
                        "{} rows of {}, {} threads per row",
                        r.rows, r.len, r.threads_per_row
                    )
                }
                OpPlan::Plain => match kp
                    .fusion
                    .is_leader(h)
                    .then(|| p.layout.kernels[&k].iter_dim[h.index()])
                    .flatten()
                {
                    Some(d) => format!("threads along dim {d}"),
                    None => "-".into(),
                },
            };
            let _ = writeln!(s, "    op{} {}: {plan}", h.index(), op.kind.name());
        }
        let _ = writeln!(s, "  tiles:");
        for (h, t) in tb.tensors.iter() {
            match &kp.tiles[h.index()] {
                Some(geo) => {
                    let _ = writeln!(
                        s,
                        "    s{} {} {}: innermost {}{} strides {} swizzle {} ({} B)",
                        h.index(),
                        t.shape,
                        t.dtype,
                        geo.layout.innermost,
                        geo.layout
                            .swizzled
                            .map_or(String::new(), |d| format!(" swizzled {d}")),
                        geo.strides,
                        geo.swizzle,
                        geo.bytes
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "    s{} {} {}: in registers (fused)",
                        h.index(),
                        t.shape,
                        t.dtype
                    );
                }
            }
        }
        let sm = &kp.smem;
        let _ = writeln!(
            s,
            "  shared memory: {} B (zero page {} B + peak {} B; lower bound {} B; {})",
            sm.total, sm.base, sm.packing.peak, sm.packing.lower_bound, sm.packing.heuristic
        );
        s.push_str(&memory::dump(&sm.buffers, &sm.packing, sm.base));
    }
    let _ = writeln!(
        s,
        "workspace: {} B (lower bound {} B; {})",
        p.workspace_packing.peak, p.workspace_packing.lower_bound, p.workspace_packing.heuristic
    );
    s.push_str(&memory::dump(&p.workspace, &p.workspace_packing, 0));
    s
}

fn copy_text(c: &Copy) -> String {
    match c {
        Copy::Chunked { dim, chunk_elems } => {
            format!("chunked copy ({chunk_elems} elements per 16 B along dim {dim})")
        }
        Copy::Elementwise { reason } => format!("element copy ({reason})"),
    }
}
