//! `mucc transpile`.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use mucc::target::Arch;

use super::{Failure, GraphSelection, InputArgs, load, out, print_warnings, stdout};

/// Arguments of `mucc transpile`.
#[derive(Args, Debug)]
pub struct TranspileArgs {
    #[command(flatten)]
    input: InputArgs,
    #[command(flatten)]
    select: GraphSelection,
    /// Target architecture.
    #[arg(long, default_value = "sm_80", value_parser = |s: &str| s.parse::<Arch>())]
    arch: Arch,
    #[command(flatten)]
    path: super::PathArg,
    /// Write the `.cu` file here (default: standard output).
    #[arg(long, short = 'o', value_name = "OUT", conflicts_with = "out_dir")]
    output: Option<PathBuf>,
    /// Write `<file>.g<N>.<arch>.cu` and its launch plan (`.plan.json`) into this directory for
    /// each selected graph.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// Write the launch plan (kernels, grids, arguments, cuBLAS calls, buffers) as JSON here.
    #[arg(long, value_name = "PLAN.json", conflicts_with = "out_dir")]
    plan: Option<PathBuf>,
    /// Overwrite existing files.
    #[arg(long)]
    force: bool,
}

/// Runs `mucc transpile`.
pub fn run(a: TranspileArgs) -> Result<(), Failure> {
    let file = load(&a.input)?;
    print_warnings(&file);
    let indices = a.select.indices(&file, false)?;
    if indices.len() > 1 && a.out_dir.is_none() {
        return Err(Failure::User(
            "--all writes one file per graph: give --out-dir DIR".into(),
        ));
    }
    let name = a
        .input
        .file
        .file_name()
        .map_or("input".into(), |s| s.to_string_lossy().into_owned());
    let stem = name.trim_end_matches(".json").to_string();
    if let Some(dir) = &a.out_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::User(format!("cannot create {}: {e}", super::shown(dir))))?;
    }
    // Every file this call writes, checked before the first is written.
    let base = |i: usize| format!("{stem}.g{i}.{}", a.arch);
    let paths: Vec<PathBuf> = match &a.out_dir {
        Some(dir) => indices
            .iter()
            .flat_map(|&i| {
                [
                    dir.join(format!("{}.cu", base(i))),
                    dir.join(format!("{}.plan.json", base(i))),
                ]
            })
            .collect(),
        None => a.output.iter().chain(&a.plan).cloned().collect(),
    };
    out::check(&paths, &[a.input.file.as_path()], a.force)?;
    let mut failed = 0;
    for &i in &indices {
        let lg = &file.graphs[i];
        let result = lg
            .validate()
            .map_err(|e| format!("graph {i} is invalid:\n{e}"))
            .and_then(|()| {
                let opts = a.path.options(&lg.graph, a.arch, &format!("graph {i}"));
                mucc::transpile::transpile(&lg.graph, &opts, &format!("{name}, graph {i}"))
                    .map_err(|e| format!("{}: graph {i}: {e}", super::shown(&a.input.file)))
            });
        let (_, emitted) = match result {
            Ok(x) => x,
            Err(msg) if indices.len() == 1 => return Err(Failure::User(msg)),
            Err(msg) => {
                eprintln!("error: {msg}");
                failed += 1;
                continue;
            }
        };
        let plan_json = serde_json::to_string_pretty(&emitted.launch)
            .map_err(|e| Failure::User(e.to_string()))?;
        if let Some(dir) = &a.out_dir {
            // A `.cu` and its launch plan always come from the same graph, also when another
            // process writes into the same folder.
            let plan_text = plan_json + "\n";
            out::write_group(
                &[
                    (
                        &dir.join(format!("{}.cu", base(i))),
                        emitted.source.as_bytes(),
                    ),
                    (
                        &dir.join(format!("{}.plan.json", base(i))),
                        plan_text.as_bytes(),
                    ),
                ],
                a.force,
            )?;
        } else {
            match &a.output {
                Some(p) => out::write(p, &emitted.source, a.force)?,
                None => write!(stdout(), "{}", emitted.source)?,
            }
            if let Some(p) = &a.plan {
                out::write(p, plan_json + "\n", a.force)?;
            }
        }
    }
    if failed > 0 {
        eprintln!(
            "{failed} of {} graphs could not be transpiled",
            indices.len()
        );
        return Err(Failure::Quiet);
    }
    Ok(())
}
