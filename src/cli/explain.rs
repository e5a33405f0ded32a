//! `mucc explain`.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use mucc::graph::Handle;
use mucc::sched::memory;
use mucc::target::Arch;

use super::{Failure, InputArgs, load, print_warnings, stdout};

/// Arguments of `mucc explain`.
#[derive(Args, Debug)]
pub struct ExplainArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Index of the graph (candidate) in the file.
    #[arg(long, short = 'g', value_name = "N", default_value_t = 0)]
    graph: usize,
    /// Explain every graph of the file, one after the other (a graph that cannot be planned
    /// shows its error in its place; the command then fails at the end).
    #[arg(long, conflicts_with_all = ["graph", "svg"])]
    all: bool,
    /// Target architecture.
    #[arg(long, default_value = "sm_80", value_parser = |s: &str| s.parse::<Arch>())]
    arch: Arch,
    #[command(flatten)]
    path: super::PathArg,
    /// Also draw each kernel's shared-memory plan (x = schedule step, y = address) into this
    /// SVG file (one file; kernels after the first get `.kN` before the extension).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Overwrite the SVG file if it exists.
    #[arg(long)]
    force: bool,
}

/// The plan of graph `i` of `file` for `a`'s target and options.
fn plan_graph(
    a: &ExplainArgs,
    file: &mucc::MirageFile,
    i: usize,
) -> Result<mucc::sched::GraphPlan, Failure> {
    let lg = &file.graphs[i];
    lg.validate()
        .map_err(|e| Failure::User(format!("graph {i} is invalid:\n{e}")))?;
    let opts = a.path.options(&lg.graph, a.arch, &format!("graph {i}"));
    mucc::sched::plan(&lg.graph, &opts)
        .map_err(|e| Failure::User(format!("{}: graph {i}: {e}", super::shown(&a.input.file))))
}

/// Runs `mucc explain`.
pub fn run(a: ExplainArgs) -> Result<(), Failure> {
    let file = load(&a.input)?;
    print_warnings(&file);
    let n = file.graphs.len();
    if a.all {
        let mut out = stdout();
        let mut failed = 0;
        for i in 0..n {
            writeln!(out, "file: {}, graph {i}", super::shown(&a.input.file))?;
            match plan_graph(&a, &file, i) {
                Ok(plan) => write!(
                    out,
                    "{}",
                    mucc::explain::explain(&file.graphs[i].graph, &plan)
                )?,
                Err(Failure::User(e)) => {
                    failed += 1;
                    writeln!(out, "  error: {e}")?;
                }
                Err(e) => return Err(e),
            }
        }
        return if failed == 0 {
            Ok(())
        } else {
            Err(Failure::User(format!(
                "{failed} of {n} graph(s) could not be planned (their errors are shown in place)"
            )))
        };
    }
    let lg = file.graphs.get(a.graph).ok_or_else(|| {
        Failure::User(format!(
            "there is no graph {}; the file has {n} graph(s) (0..={})",
            a.graph,
            n - 1
        ))
    })?;
    let plan = plan_graph(&a, &file, a.graph)?;
    // The drawings: one per customized operator, all checked before the first is written.
    let svg_paths: Vec<PathBuf> = match &a.svg {
        None => Vec::new(),
        Some(svg) => plan
            .kernels
            .keys()
            .enumerate()
            .map(|(i, &k)| {
                if i == 0 {
                    svg.clone()
                } else {
                    let stem = svg
                        .file_stem()
                        .map_or("plan".into(), |s| s.to_string_lossy().into_owned());
                    let ext = svg
                        .extension()
                        .map_or("svg".into(), |s| s.to_string_lossy().into_owned());
                    svg.with_file_name(format!("{stem}.k{k}.{ext}"))
                }
            })
            .collect(),
    };
    super::out::check(&svg_paths, &[a.input.file.as_path()], a.force)?;
    let mut out = stdout();
    writeln!(
        out,
        "file: {}, graph {}",
        super::shown(&a.input.file),
        a.graph
    )?;
    write!(out, "{}", mucc::explain::explain(&lg.graph, &plan))?;
    if a.svg.is_some() {
        for (path, (&k, kp)) in svg_paths.iter().zip(&plan.kernels) {
            let title = format!(
                "{} graph {} kernel op {k} ({}, {})",
                super::shown(&a.input.file),
                a.graph,
                a.arch,
                lg.graph.ops[Handle::from_index(k)].kind.name()
            );
            super::out::write(
                path,
                memory::svg(&title, &kp.smem.buffers, &kp.smem.packing),
                a.force,
            )?;
            writeln!(out, "wrote {}", super::shown(path))?;
        }
    }
    Ok(())
}
