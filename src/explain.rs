//! `mucc explain`: the plan as stable text. This module only reads a [`GraphPlan`]; every line
//! it prints is a field of the plan that the generated code follows, plus warnings where an
//! intermediate stays materialised although a single operator reads it.

use std::fmt::Write;

use crate::graph::arena::Handle;
use crate::graph::kernel::{KernelGraph, KnOpKind};
use crate::graph::mirage_json::names;
use crate::graph::threadblock::TbGraph;
use crate::layout::solve::SolveMethod;
use crate::sched::exchange::AllReduceForm;
use crate::sched::kernel_level::{ElementwiseOp, KnOpPlan, Reduce};
use crate::sched::memory;
use crate::sched::ops::{
    AccumStorage, Copy, CopyEngine, MatmulInstr, MatmulWalks, OpPlan, RowSplit,
};
use crate::sched::order::Step;
use crate::sched::plan::{
    Combine, DependentLaunch, Gather, GraphPlan, KernelPlan, MatmulLowering, PipeDecision,
    Placement, Sink, Split,
};

/// The plan as stable text (what `mucc explain` prints).
pub fn explain(g: &KernelGraph, p: &GraphPlan) -> String {
    let mut s = String::new();
    let _ = write!(s, "target {}", p.target.arch);
    let full = crate::target::Target::new(p.target.arch).max_pipeline_stages;
    if p.target.max_pipeline_stages < full {
        let _ = write!(
            s,
            " (pipeline rings of at most {} stages: --max-stages or a tuned variant)",
            p.target.max_pipeline_stages
        );
    }
    let _ = writeln!(s);
    let headers = p.runtime_headers();
    if !headers.is_empty() {
        let names: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
        let _ = writeln!(s, "runtime beyond the base: {}", names.join(", "));
    }
    for f in &p.rewrite.fused {
        let _ = writeln!(
            s,
            "rewrite: kernel op {} (matmul, k = {}) computed per tile inside kernel op {}: its \
             threadblock op {} (input of the product) becomes loads of A {} and B {} and a \
             threadblock matmul; the kernel ops below are numbered as in the rewritten graph \
             (--no-fuse-matmuls keeps the matmul)",
            f.matmul, f.k, f.consumer, f.input_op, f.tiles[0], f.tiles[1]
        );
    }
    for (m, why) in &p.rewrite.kept {
        let _ = writeln!(s, "matmul: kernel op {m} stays a separate step ({why})");
    }
    let matmuls_fused = !p.rewrite.fused.is_empty();
    let numbering = if matmuls_fused {
        "kernel ops numbered as after the matmul fusion"
    } else {
        "kernel ops numbered as in the file"
    };
    for a in &p.rewrite.softmax.applied {
        let replaced: Vec<String> = a.replaced.iter().map(|r| r.to_string()).collect();
        let ops = format!(
            "kernel op{} {}",
            if replaced.len() == 1 { "" } else { "s" },
            replaced.join(", ")
        );
        let what = match a.combine {
            Some(c) => format!(
                "it also writes l and m per split, and kernel op {c} (softmax_combine) sums the \
                 partials times exp(m - max m) and divides, in place of {ops}"
            ),
            None => format!("it divides O by l itself, in place of {ops}"),
        };
        let _ = writeln!(
            s,
            "online softmax: kernel op {} ({} key split{}) keeps a running row max m, \
             exponentiates S - m and rescales its sums; {what} ({numbering}; the ops below are \
             numbered as in the rewritten graph; --online-softmax off keeps the graph's form)",
            a.kernel,
            a.splits,
            if a.splits == 1 { "" } else { "s" },
        );
        if a.splits > 1 {
            let _ = writeln!(s, "key splits: kernel op {}: {}", a.kernel, a.fold);
        }
    }
    let shift = &p.rewrite.shift;
    for (k, why) in &p.rewrite.softmax.declined {
        if shift.shifts(*k).is_some() {
            continue;
        }
        let _ = writeln!(
            s,
            "softmax: kernel op {k} exponentiates a matmul product as the graph writes it, \
             without a running max ({why}; {numbering})"
        );
    }
    for h in shift.hoisted.iter().filter(|h| h.in_block) {
        let _ = writeln!(
            s,
            "softmax: kernel op {} exponentiates a tile it computes into its output {} less the \
             max of each row of the tile, which it computes itself (its tile holds whole groups \
             of the keys the divisions sum over; {numbering})",
            h.kernel, h.output
        );
    }
    for h in shift.hoisted.iter().filter(|h| !h.in_block) {
        let _ = writeln!(
            s,
            "softmax: kernel op {} exponentiates a tile it computes into its output {}: the exp \
             moves after it (it writes the exponent as %{}, which a kernel-level exp reads) so \
             that the exponent can be shifted ({numbering})",
            h.kernel, h.output, h.scores
        );
    }
    for a in &shift.applied {
        let readers: Vec<String> = a.readers.iter().map(|r| r.to_string()).collect();
        let moved = shift
            .hoisted
            .iter()
            .any(|h| h.in_block && h.scores == a.scores);
        match a.folded_into {
            Some(_) if moved => continue,
            Some(w) => {
                let _ = writeln!(
                    s,
                    "softmax: the exp{} of kernel op{} {} (of the scores kernel op {w} writes) \
                     move{} into kernel op {w}, which takes each tile less the max of its rows, \
                     computed itself (its tile holds whole {} of the keys the divisions sum \
                     over; {numbering})",
                    if readers.len() == 1 { "" } else { "s" },
                    if readers.len() == 1 { "" } else { "s" },
                    readers.join(", "),
                    if readers.len() == 1 { "s" } else { "" },
                    if a.groups == 1 { "rows" } else { "groups" },
                );
                continue;
            }
            None => {}
        }
        let (max, cancels) = if a.groups == 1 {
            (
                "their row max".to_string(),
                "the factor exp(-max) of each row cancels in the division by its sum over every \
                 key"
                .to_string(),
            )
        } else {
            (
                format!(
                    "the max of each of the {} groups of keys per row that one block holds",
                    a.groups
                ),
                "the factor exp(-max) of each group cancels in the block's division by its sum \
                 over the group"
                    .to_string(),
            )
        };
        let computed = match a.row_max {
            Some(r) => {
                format!(
                    "computed once by a row_max operator (kernel op {r} of the rewritten graph)"
                )
            }
            None => format!(
                "computed in each block (its tiles hold whole {})",
                if a.groups == 1 { "rows" } else { "groups" }
            ),
        };
        let _ = writeln!(
            s,
            "softmax: kernel op{} {} exponentiate{} the loaded scores %{} less {max}, \
             {computed}; {cancels} ({numbering}; the ops below are numbered as in the \
             rewritten graph; --online-softmax off keeps the graph's form)",
            if readers.len() == 1 { "" } else { "s" },
            readers.join(", "),
            if readers.len() == 1 { "s" } else { "" },
            a.scores,
        );
    }
    for (k, why) in &shift.declined {
        let _ = writeln!(
            s,
            "softmax: kernel op {k} exponentiates loaded scores as the graph writes them \
             ({why}; {numbering})"
        );
    }
    let loops = &p.rewrite.loops;
    for r in &loops.refined {
        let by = match r.rule {
            Some(why) => format!("{why}; --refine-loops 1 keeps the loop"),
            None => loops.scale.option().to_string(),
        };
        let _ = writeln!(
            s,
            "loop: kernel op {} {}: {} iterations over tiles of {} along the loop \
             instead of {} over {} ({by}; {numbering})",
            r.kernel, loops.scale, r.forloop[1], r.tile[1], r.forloop[0], r.tile[0]
        );
    }
    if loops.scale.changes() {
        for (k, why) in &loops.kept {
            // Under the rule, reasons that hold for every kernel of the graph go unsaid.
            use crate::sched::refine::{NotRefined, RuleKept};
            if loops.rule
                && matches!(
                    why,
                    NotRefined::Once | NotRefined::Rule(RuleKept::AmperePath | RuleKept::CtaAsked)
                )
            {
                continue;
            }
            let not = loops.scale.participle();
            let _ = writeln!(s, "loop: kernel op {k} not {not} ({why})");
        }
    }
    let g = p.graph(g);
    if p.gpus > 1 {
        let _ = writeln!(
            s,
            "GPUs: {} (mesh {}): every GPU runs this plan on its own shards; the host entry \
             takes the rank's NCCL communicator",
            p.gpus,
            g.sharding.mesh_or_single()
        );
        if p.exchange_bytes > 0 {
            let _ = writeln!(
                s,
                "exchange buffers: {} bytes per GPU, which every GPU addresses (the host entry \
                 takes them; run and bench allocate them with peer access)",
                p.exchange_bytes
            );
        }
    }
    if !p.symbols.is_default() {
        let _ = writeln!(
            s,
            "symbols: kernels {}k<op>_…, host entry {}",
            p.symbols.kernel_prefix(),
            p.symbols.entry()
        );
    }
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
        if let KnOpKind::Customized(tb) = &g.ops[Handle::from_index(k)].kind {
            kernel(&mut s, p, k, tb, kp);
        }
    }
    kernel_ops(&mut s, g, p);
    let _ = writeln!(
        s,
        "workspace: {} B (lower bound {} B; {})",
        p.workspace_packing.peak, p.workspace_packing.lower_bound, p.workspace_packing.heuristic
    );
    s.push_str(&memory::dump(&p.workspace, &p.workspace_packing, 0));
    if p.split_bytes > 0 {
        let at = p.splits_at();
        let _ = writeln!(
            s,
            "  [{at:>7}, {:>7})  {:>7} B  partial slots of the grid splits",
            at + p.split_bytes,
            p.split_bytes,
        );
    }
    if p.counter_bytes > 0 {
        let at = p.counters_at();
        let _ = writeln!(
            s,
            "  [{at:>7}, {:>7})  {:>7} B  arrival counters (last-block combines, grid splits; \
             zero before the first call, left zero by every call; {} B of workspace in all)",
            at + p.counter_bytes,
            p.counter_bytes,
            p.workspace_bytes()
        );
    }
    for u in &p.unfused {
        let _ = writeln!(
            s,
            "warning: %{} makes a round trip through the workspace to kernel op {} ({}), its only reader: mucc runs every kernel-level operator as a kernel of its own",
            u.tensor.index(),
            u.consumer.index(),
            names::kn_name(&g.ops[u.consumer].kind)
        );
    }
    s
}

fn rows(r: &RowSplit) -> String {
    format!(
        "{} rows of {}, {} threads per row",
        r.rows, r.len, r.threads_per_row
    )
}

fn op_name(tb: &TbGraph, o: Handle<crate::graph::threadblock::TbOp>) -> String {
    format!("op{} {}", o.index(), tb.ops[o].kind.name())
}

/// The cluster split of a kernel's for-loop (sm_90a), or why there is none.
fn split(s: &mut String, tb: &TbGraph, kp: &KernelPlan) {
    match &kp.split {
        Split::Off(why) => {
            let _ = writeln!(s, "  cluster split: none ({why})");
            if let Some(c) = &kp.cluster_combine {
                let _ = writeln!(s, "  cluster combine: {c}");
            }
            if let Some(c) = &kp.last_block_combine {
                let _ = writeln!(s, "  last-block combine: {c}");
            }
        }
        Split::Cluster(c) => {
            let g = kp.launch_grid();
            let _ = writeln!(
                s,
                "  cluster split: {} CTAs per block along x (launch grid ({}, {}, {}), \
                 __cluster_dims__({}, 1, 1)), {} of {} iterations each; {} CTA(s) per SM fit \
                 (at {} registers per thread)",
                c.ctas,
                g[0],
                g[1],
                g[2],
                c.ctas,
                c.iters,
                tb.forloop_range,
                c.resident_per_sm,
                c.regs_per_thread
            );
            let parts = partial_list(tb, &c.partials);
            match &c.gather {
                Gather::Push(p) => {
                    let slots: Vec<String> = c
                        .partials
                        .iter()
                        .zip(p.slots.iter().zip(&p.strides))
                        .map(|(part, (o, st))| format!("s{} at byte {o} every {st} B", part.tile))
                        .collect();
                    let (who, leave) = match c.ctas {
                        2 => ("CTA 1 pushes its".to_string(), "leaves"),
                        n => (format!("CTAs 1..{} push their", n - 1), "leave"),
                    };
                    let _ = writeln!(
                        s,
                        "    after the loop {who} partials into slots of CTA 0's shared memory \
                         ({}: st.async, {} bytes completing on the push mbarrier at byte {}; {} B \
                         of shared memory added) and {leave}; CTA 0 folds them and alone runs the \
                         post-loop operators: {}{}",
                        slots.join(", "),
                        p.bytes,
                        p.barrier,
                        p.added,
                        parts.join(", "),
                        p.resident_before.map_or(String::new(), |r| format!(
                            "; the slots take the room of CTAs: {} per SM fit instead of the {r} \
                             the split counted on, its clusters still in one wave",
                            c.resident_per_sm
                        ))
                    );
                }
                Gather::Fold(why) => {
                    let _ = writeln!(
                        s,
                        "    after the loop CTA 0 combines the partials through distributed shared \
                         memory and alone runs the post-loop operators (not pushed: {why}): {}",
                        parts.join(", ")
                    );
                }
            }
            if let Some(i) = kp.barriers.after_rescaled_folds {
                let _ = writeln!(
                    s,
                    "    CTA 0 folds s{} behind a barrier: the rescaled folds before it read its max tile",
                    c.partials[i].tile
                );
            }
        }
        Split::Grid(g) => {
            let lg = kp.launch_grid();
            let _ = writeln!(
                s,
                "  grid split ({}): {} CTAs per block along x (launch grid ({}, {}, {}), no \
                 clusters), {} of {} iterations each; {} CTA(s) per SM counted on (at {} \
                 registers per thread)",
                if g.asked {
                    "--grid-split"
                } else {
                    "the planner's rule: the Ampere path's grid leaves SMs idle"
                },
                g.ctas,
                lg[0],
                lg[1],
                lg[2],
                g.iters,
                tb.forloop_range,
                g.resident_per_sm,
                g.regs_per_thread
            );
            let slots: Vec<String> = g
                .partials
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    format!(
                        "s{} at workspace +{} ({} × {} B per slot)",
                        p.tile,
                        g.slots_at + g.slot_offsets[i],
                        g.slot_elems[i],
                        g.elem_bytes[i]
                    )
                })
                .collect();
            let _ = writeln!(
                s,
                "    after the loop every CTA stores its partials into its slots ({}; block b's CTA \
                 r at slot b·{} + r) and arrives on its block's counter (u32 at workspace +{} + \
                 b); the last to arrive folds the {} slots in CTA order and alone runs the \
                 post-loop operators: {}",
                slots.join(", "),
                g.ctas,
                g.counters_at,
                g.ctas,
                partial_list(tb, &g.partials).join(", ")
            );
        }
    }
    if let Some(none) = &kp.grid_split_off {
        let _ = writeln!(s, "  {none}");
    }
}

/// Each partial accumulator of a split: its operator, tile and how the CTAs' partials combine.
fn partial_list(tb: &TbGraph, partials: &[crate::sched::plan::Partial]) -> Vec<String> {
    partials
        .iter()
        .map(|p| {
            let how = match p.combine {
                Combine::Sum => "sum".to_string(),
                Combine::Max => "max".to_string(),
                Combine::Rescaled { max_tile } => {
                    format!("rows rescaled to the largest max of s{max_tile}, summed")
                }
            };
            format!("{} s{} ({how})", op_name(tb, p.accum), p.tile)
        })
        .collect()
}

fn list<T: ToString>(v: &[T]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The bulk tensor loads of a kernel's pipelined inputs (sm_90a), and why other inputs have
/// none.
fn tma(s: &mut String, tb: &TbGraph, kp: &KernelPlan) {
    let t = &kp.tma;
    if t.loads.is_empty() && t.off.is_empty() {
        let why = if matches!(
            kp.split,
            crate::sched::plan::Split::Off(crate::sched::plan::SplitOff::Ampere)
        ) {
            "the Ampere path"
        } else {
            "no pipelined input"
        };
        let _ = writeln!(s, "  TMA loads: none ({why})");
        return;
    }
    if t.loads.is_empty() {
        let _ = writeln!(s, "  TMA loads: none");
    } else {
        let _ = writeln!(
            s,
            "  TMA loads: {} B per stage, issued by thread 0, completing on the stages' mbarriers at \
             byte {} of shared memory",
            t.bytes_per_stage(),
            t.barriers
        );
    }
    for l in &t.loads {
        let coords: Vec<String> = l
            .coords
            .iter()
            .map(|c| {
                let mut terms: Vec<String> = c
                    .per_block
                    .iter()
                    .map(|(a, n)| format!("{}·{n}", crate::graph::ops::AXIS_NAMES[*a]))
                    .collect();
                if c.per_iter > 0 {
                    terms.push(format!("it·{}", c.per_iter));
                }
                if terms.is_empty() {
                    "0".into()
                } else {
                    terms.join(" + ")
                }
            })
            .collect();
        let maps: Vec<String> = l.maps().iter().map(|(m, _)| format!("tm{m}")).collect();
        let _ = writeln!(
            s,
            "    {} -> s{} by tensor map{} {}: {} [{}] (byte strides [{}]), box [{}], swizzle {}, \
             coordinates ({}){}",
            op_name(tb, Handle::from_index(l.op)),
            l.tile,
            if maps.len() > 1 { "s" } else { "" },
            maps.join(", "),
            l.dtype,
            list(&l.dims),
            list(&l.strides),
            list(&l.boxes),
            l.swizzle,
            coords.join(", "),
            slabs(l)
        );
    }
    for (op, why) in &t.off {
        let _ = writeln!(
            s,
            "    {} keeps cp.async: {why}",
            op_name(tb, Handle::from_index(*op))
        );
    }
}

/// A split TMA load's slabs (`; in N slabs of box dim D: …`), empty for a whole box.
fn slabs(l: &crate::sched::tma::TmaLoad) -> String {
    let Some(d) = l.split else {
        return String::new();
    };
    let parts: Vec<String> = l
        .copies
        .iter()
        .map(|c| format!("[{}, {}) by tm{}", c.offset, c.offset + c.extent, c.map))
        .collect();
    format!(
        "; box dim {d} (over TMA's {}) in {} slabs: {}",
        crate::sched::tma::TMA_MAX_BOX,
        l.copies.len(),
        parts.join(", ")
    )
}

/// The loop's ring of pipeline stages ([`crate::sched::plan::Ring`]) and its protocol.
fn ring(s: &mut String, tb: &TbGraph, kp: &KernelPlan) {
    use crate::sched::plan::Prefetch;
    let Some(r) = kp.ring() else {
        return;
    };
    let names = |ops: &[usize], how: &str| -> Vec<String> {
        ops.iter()
            .map(|&o| format!("{} by {how}", op_name(tb, Handle::from_index(o))))
            .collect()
    };
    let mut inputs = names(&r.cp_async, "cp.async");
    inputs.extend(names(&r.tma, "TMA"));
    let mut waits = Vec::new();
    if !r.cp_async.is_empty() {
        waits.push(format!(
            "for its cp.async group ({} newer pending)",
            r.pending_groups()
        ));
    }
    if !r.tma.is_empty() {
        waits.push("on its slot's mbarrier".to_string());
    }
    let refill = match kp.barriers.prefetch {
        Prefetch::AfterFirstBarrier => "after the body's first barrier",
        Prefetch::EndOfBody => "behind a barrier of its own at the end of the body",
        Prefetch::None => "never (the plan has no refill)",
    };
    use crate::sched::plan::RingStart;
    let start = match kp.ring_start {
        RingStart::BeforePreLoop | RingStart::AfterPreLoop { .. } | RingStart::CpAsyncOnly => {
            format!(" ({})", kp.ring_start)
        }
        RingStart::NoRing | RingStart::AtLoop => String::new(),
    };
    let _ = writeln!(
        s,
        "  ring: {} stages of {}; {} iteration(s) loaded before the loop{start}; each iteration \
         waits {}, and refills the slot read one iteration before with iteration it + {} {refill}",
        r.stages,
        inputs.join(", "),
        r.prologue(),
        waits.join(" and "),
        r.refill_distance()
    );
}

/// One customized operator's plan.
fn kernel(s: &mut String, p: &GraphPlan, k: usize, tb: &TbGraph, kp: &KernelPlan) {
    let cta = &kp.cta;
    let _ = writeln!(
        s,
        "kernel op {k} (customized): grid ({}, {}, {}), {} threads, forloop {}",
        cta.grid[0], cta.grid[1], cta.grid[2], cta.threads, tb.forloop_range
    );
    let clusters = kp.cluster_dims().map_or(String::new(), |[x, y, z]| {
        format!("; launched in clusters of ({x}, {y}, {z})")
    });
    let _ = writeln!(
        s,
        "  CTA: {} warps ({}; the µGraph's block has {} threads){clusters}",
        cta.threads.div_ceil(32),
        cta.source,
        tb.num_threads()
    );
    let features: Vec<String> = kp.features().iter().map(|f| f.to_string()).collect();
    let features = if features.is_empty() {
        "plain loads and stores".to_string()
    } else {
        features.join(", ")
    };
    // The launch bounds promise what shared memory holds of the blocks wanted.
    let mut held = if cta.min_blocks_per_sm < cta.resident_blocks {
        format!(" (shared memory holds {})", cta.min_blocks_per_sm)
    } else {
        String::new()
    };
    if cta.resident_asked {
        held.push_str(" (asked: --resident-blocks)");
    }
    let _ = writeln!(
        s,
        "  code path: {} (uses {features}); launch bounds ({}, {}); {} resident block(s) per SM budgeted{held}",
        kp.path, cta.threads, cta.min_blocks_per_sm, cta.resident_blocks
    );
    if p.target.has_tma_wgmma {
        split(s, tb, kp);
        tma(s, tb, kp);
    } else if kp.split.grid().is_some() {
        split(s, tb, kp);
    } else if let Some(none) = &kp.grid_split_off {
        // Without clusters, the grid split alone is considered.
        let _ = writeln!(s, "  {none}");
    }
    ring(s, tb, kp);
    if p.target.has_tma_wgmma {
        let launch = match (&kp.dependent, kp.l2_prefetch) {
            (DependentLaunch::Off(why), _) => format!("plain ({why})"),
            (DependentLaunch::Programmatic, None) => {
                "programmatic (griddepcontrol.wait before anything else)".into()
            }
            (DependentLaunch::Programmatic, Some(p)) => format!(
                "programmatic ({p}, then griddepcontrol.wait before anything else: a prefetch \
                 reads nothing stale)"
            ),
        };
        let trigger = match (kp.triggers_next, kp.rows()) {
            (false, _) => String::new(),
            (true, None) => "; triggers the next launch after its for-loop".to_string(),
            (true, Some(r)) => format!(
                "; triggers the next launch before {} (every input read)",
                op_name(tb, Handle::from_index(r.first_output))
            ),
        };
        let _ = writeln!(s, "  dependent launch: {launch}{trigger}");
        if kp.uniform_warp {
            let _ = writeln!(
                s,
                "  warp index: through a warp shuffle in the loop, provably uniform (it issues \
                 wgmma, which ptxas serialises on a path it considers divergent)"
            );
        }
        if kp.rows().is_none() {
            let _ = writeln!(s, "  loop thread index: {}", kp.loop_indices);
        }
    }
    if let Some(r) = kp.rows() {
        let _ = writeln!(s, "  body: {r}");
        let _ = writeln!(s, "  operators:");
        for (h, op) in tb.ops.iter() {
            let at = r.offsets_of(h.index()).map_or(String::new(), |o| {
                let region = kp.regions[h.index()]
                    .as_ref()
                    .map_or("0".to_string(), |r| r.to_string());
                format!(": block region at element {region}, rows at {}", list(o))
            });
            let _ = writeln!(s, "    op{} {}{at}", h.index(), op.kind.name());
        }
        return;
    }
    if let crate::sched::plan::Body::Tiles(why) = &kp.body {
        let _ = writeln!(s, "  body: shared-memory tiles (register rows: {why})");
    }
    if let Some(x) = &kp.exchange {
        let _ = writeln!(
            s,
            "  all-reduce op {} fused: op{} output's stores also go, as (value, flag) words, to \
             this GPU's slot in all {} GPUs' exchange buffers (region at byte {}, {} B per slot, \
             2 parities); the last {} of the {} blocks to count themselves on each GPU sum the \
             {} GPUs' {} elements in rank order into the all-reduce's output, each a share, \
             re-reading a word until it carries the execution's flag (no fences)",
            x.all_reduce,
            x.output_op,
            x.gpus,
            x.region,
            x.slot_bytes,
            x.helpers,
            x.blocks,
            x.gpus,
            x.count,
        );
    }
    for line in kp.fusion.dump(tb).lines() {
        let _ = writeln!(s, "  {line}");
    }
    let _ = writeln!(s, "  chains:");
    for (c, chain) in kp.fusion.chains.iter().enumerate() {
        let cp = &kp.chains[c];
        let names: Vec<String> = chain.ops.iter().map(|&o| op_name(tb, o)).collect();
        let sink = match cp.sink {
            Sink::Tile(t) => format!("stored to s{}", t.index()),
            Sink::Global(o) => format!("stored to the device tensor by op{}", o.index()),
            Sink::Accum(a) => format!("accumulated into op{}", a.index()),
            Sink::Copy => "copied".into(),
        };
        let _ = writeln!(
            s,
            "    {}: {sink}, walks dims {:?}{}{}{}{}",
            names.join(" -> "),
            cp.order,
            match (&cp.scalar, cp.vector) {
                (Some(why), _) => format!(", one element per thread step ({why})"),
                (None, v) if v > 1 && cp.broadcast_reads.is_empty() => {
                    format!(", {v} consecutive elements per thread step")
                }
                (None, v) if v > 1 => format!(
                    ", {v} consecutive elements per thread step ({} read once per step: \
                     broadcast along it)",
                    cp.broadcast_reads
                        .iter()
                        .map(|t| format!("s{t}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                _ => String::new(),
            },
            cp.matmul.map_or(String::new(), |l| format!(", {l}")),
            cp.approx_exp.map_or(String::new(), |a| format!(
                ", exp by {a} (its value is rounded to 16 bits right after)"
            )),
            if cp.approx_logistic {
                ", silu/sigmoid by ex2.approx.ftz and rcp.approx.ftz (its value reaches a 16-bit \
                 store through products only)"
            } else {
                ""
            }
        );
    }
    pipes(s, tb, kp);
    schedule(s, tb, kp);
    let _ = writeln!(s, "  operators:");
    for (h, op) in tb.ops.iter() {
        let plan = op_plan(p, k, kp, h);
        let region = kp.regions[h.index()]
            .as_ref()
            .map_or(String::new(), |r| format!("; block region at element {r}"));
        let _ = writeln!(s, "    op{} {}: {plan}{region}", h.index(), op.kind.name());
    }
    tiles(s, tb, kp);
    let sm = &kp.smem;
    let opt_in = if sm.opt_in() {
        "; the limit raised before the first launch: over the 48 KB default"
    } else {
        ""
    };
    let pushed = match kp.split.cluster().and_then(|c| c.gather.push()) {
        Some(p) => format!(" + cluster push slots {} B", p.added),
        None => String::new(),
    };
    let _ = writeln!(
        s,
        "  shared memory: {} B (zero page {} B + peak {} B{pushed}; lower bound {} B; {}{opt_in})",
        sm.total, sm.base, sm.packing.peak, sm.packing.lower_bound, sm.packing.heuristic
    );
    s.push_str(&memory::dump(&sm.buffers, &sm.packing, sm.base));
    for u in &kp.unfused {
        let _ = writeln!(
            s,
            "  warning: s{} of {} stays in shared memory for {}, its only reader: {}",
            u.tile.index(),
            op_name(tb, u.producer),
            op_name(tb, u.consumer),
            u.reason
        );
    }
}

/// Products of one tensor-core matmul that another takes as A: kept in registers, or why not.
fn pipes(s: &mut String, tb: &TbGraph, kp: &KernelPlan) {
    for d in &kp.pipes {
        match d {
            PipeDecision::On(p) => {
                let producer = kp.fusion.chains[p.producer].leader();
                let sums: Vec<String> = p.row_sums.iter().map(|&r| op_name(tb, r)).collect();
                let sums = if sums.is_empty() {
                    String::new()
                } else {
                    let verb = if sums.len() == 1 { "sums" } else { "sum" };
                    format!(", {} {verb} its rows by warp shuffles", sums.join(", "))
                };
                let grid = if p.keys > 1 {
                    format!(
                        "the keys (the product's {}'s K) split over {} warps: {} on 1 x {} warps, \
                         {} on each warp's keys into its own fragment",
                        op_name(tb, p.matmul),
                        p.keys,
                        op_name(tb, producer),
                        p.keys,
                        op_name(tb, p.matmul)
                    )
                } else {
                    format!("both matmuls on {} x 1 warps", p.warps)
                };
                let _ = writeln!(
                    s,
                    "  register pipe: s{} ({}'s chain) stays in registers: {} takes it as A{sums}; \
                     {grid}, run at one level without a barrier",
                    p.tile,
                    op_name(tb, producer),
                    op_name(tb, p.matmul),
                );
                if let Some(o) = &p.online
                    && p.keys > 1
                {
                    let _ = writeln!(
                        s,
                        "  online softmax in the pipe: with {}'s running max over each warp's \
                         keys (per row by warp shuffles, kept in registers), s{} is exp(S - m); \
                         each warp rescales the rows of its {} fragment and keeps its {} row \
                         sums in registers; after the loop the {} warps meet in a buffer of a \
                         slice per warp: the max of their maxima is {}, their sums and \
                         fragments are rescaled to it and added; tiles {:?} stay in registers",
                        op_name(tb, o.max),
                        p.tile,
                        op_name(tb, o.out_acc),
                        op_name(tb, o.sum_acc),
                        p.keys,
                        op_name(tb, o.max_acc),
                        o.registers
                    );
                } else if let Some(o) = &p.online {
                    let _ = writeln!(
                        s,
                        "  online softmax in the pipe: with {}'s running max (per row by warp \
                         shuffles, kept in registers), s{} is exp(S - m); {} rows are rescaled \
                         in the fragment, {} and {} are written per row by its first lane; \
                         tiles {:?} stay in registers",
                        op_name(tb, o.max),
                        p.tile,
                        op_name(tb, o.out_acc),
                        op_name(tb, o.sum_acc),
                        op_name(tb, o.max_acc),
                        o.registers
                    );
                }
            }
            PipeDecision::Off { tile, why } => {
                let _ = writeln!(s, "  register pipe: none for s{tile} ({why})");
            }
        }
    }
    for &(op, why) in &kp.no_wgmma {
        let _ = writeln!(s, "  wgmma: op{op} keeps mma.sync ({why})");
    }
}

/// The schedule's steps in the order the kernel runs them, with the body's own barriers
/// ([`crate::sched::plan::BodyBarriers`]) and the ring refill where they fall.
fn schedule(s: &mut String, tb: &TbGraph, kp: &KernelPlan) {
    use crate::sched::order::{BarrierReason, Phase};
    use crate::sched::plan::Prefetch;
    let _ = writeln!(s, "  schedule: {}", kp.schedule.compact(&kp.fusion));
    let b = &kp.barriers;
    let barrier = |s: &mut String, ph: Phase, why: BarrierReason| {
        let _ = writeln!(s, "    {:<9} barrier ({why})", ph.name());
    };
    let mut last = Phase::PreLoop;
    let mut refilled = b.prefetch == Prefetch::None;
    let wait = |s: &mut String, ph: Phase, i: usize| {
        if kp.copy_waits.before(ph, i) {
            let _ = writeln!(
                s,
                "    {:<9} wait for the phase's cp.async copies (cp.async.wait_all)",
                ph.name()
            );
        }
    };
    let steps_of = |ph: Phase| kp.schedule.phase(ph).len();
    let between = |s: &mut String, from: Phase, to: Phase| {
        if from == Phase::PreLoop && to != Phase::PreLoop {
            wait(s, Phase::PreLoop, steps_of(Phase::PreLoop));
            if b.after_initial_state {
                barrier(s, Phase::PreLoop, BarrierReason::InitialState);
            }
        }
        if from != Phase::PostLoop && to == Phase::PostLoop {
            if b.prefetch == Prefetch::EndOfBody {
                barrier(s, Phase::Loop, BarrierReason::BeforePrefetch);
                let _ = writeln!(
                    s,
                    "    {:<9} ring refill (the loads of a later stage)",
                    "loop"
                );
            }
            wait(s, Phase::Loop, steps_of(Phase::Loop));
            if b.before_write_back {
                barrier(s, Phase::PostLoop, BarrierReason::BeforeWriteBack);
            }
            for wb in &kp.write_backs {
                let _ = writeln!(
                    s,
                    "    {:<9} write-back: {}",
                    "post-loop",
                    write_back(tb, kp, wb)
                );
            }
            if b.before_finalize {
                barrier(s, Phase::PostLoop, BarrierReason::BeforeFinalize);
            }
        }
    };
    let mut index = 0;
    for (ph, st) in kp.schedule.steps() {
        between(s, last, ph);
        if ph != last {
            index = 0;
        }
        last = ph;
        let i = index;
        index += 1;
        match st {
            Step::Barrier(why) => {
                wait(s, ph, i);
                barrier(s, ph, *why);
                if ph == Phase::Loop && !refilled {
                    let _ = writeln!(
                        s,
                        "    {:<9} ring refill (the loads of a later stage)",
                        "loop"
                    );
                    refilled = true;
                }
            }
            Step::Run(c) => {
                let names: Vec<String> = kp.fusion.chains[*c]
                    .ops
                    .iter()
                    .map(|&o| op_name(tb, o))
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
    between(s, last, Phase::PostLoop);
    wait(s, Phase::PostLoop, steps_of(Phase::PostLoop));
}

/// What a write-back after the loop stores ([`crate::sched::plan::WriteBack`]).
fn write_back(tb: &TbGraph, kp: &KernelPlan, wb: &crate::sched::plan::WriteBack) -> String {
    use crate::sched::plan::WriteBack;
    let acc = Handle::from_index(wb.acc());
    let tile =
        |a: Handle<crate::graph::threadblock::TbOp>| format!("s{}", tb.ops[a].outputs[0].index());
    match *wb {
        WriteBack::Store { fragment_of, .. } => match fragment_of {
            Some(m) => format!(
                "{}, the fragment of {} stored to {}",
                op_name(tb, acc),
                op_name(tb, Handle::from_index(m)),
                tile(acc)
            ),
            None => format!(
                "{}, each thread's elements stored to {}",
                op_name(tb, acc),
                tile(acc)
            ),
        },
        WriteBack::KeySplit { warps, .. } => {
            match crate::sched::plan::key_split_of(&kp.pipes, acc) {
                Some((_, o)) => format!(
                    "{}, the {warps} warps' maxima, row sums and output fragments combined into {} ({}), {} ({}) and {}",
                    op_name(tb, acc),
                    tile(o.max_acc),
                    op_name(tb, o.max_acc),
                    tile(o.sum_acc),
                    op_name(tb, o.sum_acc),
                    tile(acc)
                ),
                None => format!("{}, a key split of {warps} warps", op_name(tb, acc)),
            }
        }
    }
}

/// The plan of operator `h` of kernel `k`.
fn op_plan(
    p: &GraphPlan,
    k: usize,
    kp: &KernelPlan,
    h: Handle<crate::graph::threadblock::TbOp>,
) -> String {
    match &kp.ops[h.index()] {
        OpPlan::Input {
            copy,
            engine,
            stages,
        } => {
            let engine = match engine {
                CopyEngine::Threads => "by the threads".to_string(),
                CopyEngine::CpAsync => format!("cp.async, pipelined x{stages}"),
                CopyEngine::CpAsyncWaited => {
                    "cp.async, waited for before the next barrier".to_string()
                }
                CopyEngine::Tma => format!("TMA, pipelined x{stages}"),
            };
            format!("{}, {engine}", copy_text(copy))
        }
        OpPlan::Output { copy: None } => "stored by its chain's leader".into(),
        OpPlan::Output { copy: Some(c) } => copy_text(c),
        OpPlan::Accum {
            storage,
            reduce,
            rows: split,
            divisor,
        } => {
            let storage = match storage {
                AccumStorage::Registers {
                    per_thread,
                    fragment_of: Some(m),
                } => format!(
                    "registers ({per_thread} per thread, the mma fragment of op{})",
                    m.index()
                ),
                AccumStorage::Registers { per_thread, .. } => {
                    format!("registers ({per_thread} per thread)")
                }
                AccumStorage::Shared => "shared memory".into(),
                AccumStorage::WrittenOnce => {
                    "shared memory, written once (one iteration: 0 + its input, no initial fill)"
                        .into()
                }
            };
            let piped = kp
                .pipe_into(kp.fusion.chain_of[h.index()])
                .filter(|p| p.row_sums.contains(&h))
                .map(|p| kp.fusion.chains[p.producer].leader().index());
            let split = match (split, piped) {
                (_, Some(op)) => format!(", rows summed by the warps of op{op}'s register pipe"),
                (Some(r), None) => format!(", {}", rows(r)),
                (None, None) => String::new(),
            };
            let divisor = divisor.map_or(String::new(), |d| {
                format!(", divided by {d} after the loop")
            });
            format!("{storage}, reduce {reduce:?}{split}{divisor}")
        }
        OpPlan::Matmul {
            warps,
            instr: instr @ (MatmulInstr::MmaSyncM16N8K16 { .. } | MatmulInstr::WgmmaM64K16 { .. }),
            loads,
            mma_per_warp,
            load_instrs,
            walks,
        } => format!(
            "{} x {} warps{}, {instr}, A by {}, B by {}, per warp {mma_per_warp} mma, {} {} (A), {} {} (B){}",
            warps.0,
            warps.1,
            kp.register_pipes()
                .find(|r| r.matmul == h && r.keys > 1)
                .map_or(String::new(), |r| format!(
                    " with K split over {} warps",
                    r.keys
                )),
            loads.0,
            loads.1,
            load_instrs.0,
            loads.0.instr_name(true),
            load_instrs.1,
            loads.1.instr_name(false),
            walk_text(walks, kp.chains[kp.fusion.chain_of[h.index()]].matmul)
        ),
        OpPlan::Matmul {
            instr: MatmulInstr::Fma,
            ..
        } => "fma.f32, a thread per element of the product".into(),
        OpPlan::RowReduce(r) => rows(r),
        OpPlan::RunningMax => "running max over the loop, a thread per output element".into(),
        OpPlan::Plain => match kp
            .fusion
            .is_leader(h)
            .then(|| p.layout.kernels[&k].iter_dim[h.index()])
            .flatten()
        {
            Some(d) => format!("threads along dim {d}"),
            None => "-".into(),
        },
    }
}

/// What a matmul's [`MatmulWalks`] say, for its `explain` line: which operands walk their
/// `ldmatrix` addresses over the whole k-steps, and a slice-by-slice product's slice width.
fn walk_text(w: &MatmulWalks, lowering: Option<MatmulLowering>) -> String {
    let walked = match (w.a, w.b) {
        (true, true) => "; A and B (n-tiles in .x4 pairs) walk their addresses over whole k-steps",
        (true, false) => "; A walks its addresses over whole k-steps",
        (false, true) => "; B (n-tiles in .x4 pairs) walks its addresses over whole k-steps",
        (false, false) => "",
    };
    let slices = if lowering == Some(MatmulLowering::SliceBySlice) {
        format!("; slices of {} n-tiles", w.slice_n_tiles)
    } else {
        String::new()
    };
    format!("{walked}{slices}")
}

fn tiles(s: &mut String, tb: &TbGraph, kp: &KernelPlan) {
    let _ = writeln!(s, "  tiles:");
    for (h, t) in tb.tensors.iter() {
        match &kp.tiles[h.index()] {
            Some(geo) => {
                let stored = if geo.dtype == t.dtype {
                    String::new()
                } else {
                    format!(" (stored as {})", geo.dtype)
                };
                let columns = geo.columns.map_or(String::new(), |c| {
                    format!(
                        " in columns of {} along dim {} ({} elements apart, for wgmma)",
                        c.width, c.dim, c.stride
                    )
                });
                let _ = writeln!(
                    s,
                    "    s{} {} {}{stored}: innermost {}{} strides {}{columns} swizzle {} ({} B)",
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
}

/// The plans of the kernel-level operators that run something.
fn kernel_ops(s: &mut String, g: &KernelGraph, p: &GraphPlan) {
    let mut lines = Vec::new();
    for (h, op) in g.ops.iter() {
        let text = match &p.kernel_ops[h.index()] {
            KnOpPlan::Nothing | KnOpPlan::Customized => continue,
            KnOpPlan::Elementwise {
                op: ew,
                vector,
                launch,
                ..
            } => {
                let what = match ew {
                    ElementwiseOp::Unary(u) => format!("element-wise {}", u.name()),
                    ElementwiseOp::Binary(b) => format!("element-wise {}", b.name()),
                    ElementwiseOp::ShiftedExp => "element-wise exp(x - m)".into(),
                    ElementwiseOp::Copy => "copy".into(),
                };
                format!(
                    "{what}, {vector}-element vectors, {} blocks x {} threads",
                    launch.blocks, launch.threads
                )
            }
            r @ KnOpPlan::Reduction { .. } => reduction_text(r),
            KnOpPlan::AllReduce {
                fused: AllReduceForm::Fused { kernel },
                count,
                gpus,
                ..
            } => format!(
                "all-reduce (sum) over {gpus} GPUs of the {count}-element span that input and \
                 output share, fused into kernel op {kernel} (no step of its own)"
            ),
            KnOpPlan::AllReduce {
                count,
                dtype,
                gpus,
                fused: AllReduceForm::Nccl(why),
                ..
            } => format!(
                "NCCL all-reduce (sum) over {gpus} GPUs of the {count}-element span ({}) that \
                 input and output share (padding included), on the graph's stream; not fused: \
                 {why}",
                dtype
            ),
            KnOpPlan::RmsNorm {
                rows,
                group,
                launch,
                ..
            } => format!(
                "rms_norm of {rows} groups of {group}, a warp per group, {} blocks x {} threads",
                launch.blocks, launch.threads
            ),
            KnOpPlan::SoftmaxCombine {
                rows,
                splits,
                d,
                form: crate::sched::combine::CombineForm::InCluster { kernel },
                ..
            } => format!(
                "softmax combination of {splits} key splits for {rows} rows of {d}, performed by \
                 kernel op {kernel}'s clusters (no launch of its own)"
            ),
            KnOpPlan::SoftmaxCombine {
                rows,
                splits,
                d,
                form: crate::sched::combine::CombineForm::LastBlock { kernel },
                ..
            } => {
                let (groups, at) = p
                    .kernels
                    .get(kernel)
                    .and_then(|k| k.last_block_combine.as_ref())
                    .map_or((0, 0), |c| (c.groups, c.counters));
                format!(
                    "softmax combination of {splits} key splits for {rows} rows of {d}, \
                     performed by the last block of each group of kernel op {kernel} to finish \
                     (no launch of its own; {groups} arrival counters at workspace +{at})"
                )
            }
            KnOpPlan::SoftmaxCombine {
                rows,
                splits,
                d,
                vector,
                group,
                split_lanes,
                launch,
                form: crate::sched::combine::CombineForm::Kernel(why),
                ..
            } => format!(
                "softmax combination of {splits} key splits for {rows} rows of {d}: {} threads \
                 per row ({group} along the outputs with {vector}-element vectors{}), weights \
                 exp(m - max m) in registers, no shared memory; {} blocks x {} threads; not \
                 folded into the attention kernel: {why}",
                group * split_lanes,
                if *split_lanes == 1 {
                    ", each summing every split".to_string()
                } else {
                    format!(" x {split_lanes} along the splits, summed by warp shuffles")
                },
                launch.blocks,
                launch.threads
            ),
            KnOpPlan::Parts {
                concat,
                parts,
                launch,
                ..
            } => {
                let v: Vec<usize> = parts.iter().map(|c| c.vector).collect();
                let at: Vec<usize> = parts.iter().map(|c| c.whole_offset).collect();
                format!(
                    "{} {} parts at elements {at:?} of the whole, vectors {v:?}, {} blocks x {} threads",
                    if *concat { "concat of" } else { "split into" },
                    parts.len(),
                    launch.blocks,
                    launch.threads
                )
            }
            KnOpPlan::Gemm { calls, transposed } => {
                let c = &calls[0];
                format!(
                    "cuBLAS, {} call(s){}: m {} n {} k {} batch {}, {} operands, {} accumulation",
                    calls.len(),
                    if *transposed {
                        " (row-major C: computed as Cᵀ = Bᵀ·Aᵀ)"
                    } else {
                        ""
                    },
                    c.m,
                    c.n,
                    c.k,
                    c.batch,
                    c.data_type,
                    c.compute_type
                )
            }
        };
        let trigger = if p.kernel_level_triggers.contains(&h.index()) {
            "; triggers the next launch first thing (griddepcontrol.launch_dependents)"
        } else {
            ""
        };
        lines.push(format!(
            "  kernel op {} ({}): {text}{trigger}",
            h.index(),
            names::kn_name(&op.kind)
        ));
    }
    if !lines.is_empty() {
        let _ = writeln!(s, "kernel-level operators:");
        for l in lines {
            let _ = writeln!(s, "{l}");
        }
    }
}

fn reduction_text(p: &KnOpPlan) -> String {
    let KnOpPlan::Reduction {
        of,
        to,
        k,
        warp_per_output,
        launch,
        ..
    } = p
    else {
        return String::new();
    };
    let groups = match of {
        Reduce::Sum => format!("{k} elements into each of {to} per row"),
        Reduce::Max => format!("each {k} contiguous elements of the last dim"),
    };
    format!(
        "{of} of {groups}, a {} per result, {} blocks x {} threads",
        if *warp_per_output { "warp" } else { "thread" },
        launch.blocks,
        launch.threads
    )
}

fn copy_text(c: &Copy) -> String {
    match c {
        Copy::Chunked {
            dim,
            chunk_elems,
            bytes,
            tile_bytes,
        } if tile_bytes != bytes => format!(
            "chunked copy ({chunk_elems} elements per {bytes} B along dim {dim}, read as \
             {tile_bytes} B of the tile's wider values and converted in registers)"
        ),
        Copy::Chunked {
            dim,
            chunk_elems,
            bytes,
            ..
        } => {
            format!("chunked copy ({chunk_elems} elements per {bytes} B along dim {dim})")
        }
        Copy::Elementwise { reason } => format!("element copy ({reason})"),
    }
}
