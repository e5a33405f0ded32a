//! `mucc export`.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use mucc::graph::DtypeTable;
use mucc::graph::mirage_json::{ExportOptions, graph_to_json, graphs_to_json};

use super::{Failure, GraphSelection, InputArgs, load, print_warnings, stdout};

/// Arguments of `mucc export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    #[command(flatten)]
    input: InputArgs,
    #[command(flatten)]
    select: GraphSelection,
    /// Write to this file instead of stdout (refuses to overwrite without --force).
    #[arg(long, short = 'o', value_name = "OUT")]
    output: Option<PathBuf>,
    /// Overwrite OUT if it exists.
    #[arg(long)]
    force: bool,
    /// Dtype code table of the written file.
    #[arg(long, value_name = "TABLE", default_value = "current", value_parser = |s: &str| s.parse::<DtypeTable>())]
    to_dtype_table: DtypeTable,
    /// Write the pre-2025-03 accumulator names (`tb_accum_*`).
    #[arg(long)]
    legacy_names: bool,
    /// Indent the JSON.
    #[arg(long)]
    pretty: bool,
}

/// Runs `mucc export`: a candidate list by default, a single graph with `--graph N`.
pub fn run(a: ExportArgs) -> Result<(), Failure> {
    let file = load(&a.input)?;
    print_warnings(&file);
    let indices = a.select.indices(&file, true)?;
    for &i in &indices {
        if let Err(e) = file.graphs[i].validate() {
            return Err(Failure::User(format!("graph {i} is invalid:\n{e}")));
        }
    }
    let opts = ExportOptions {
        dtype_table: a.to_dtype_table,
        legacy_names: a.legacy_names,
    };
    let value = if a.select.graph.is_some() {
        graph_to_json(&file.graphs[indices[0]].graph, &opts)
    } else {
        graphs_to_json(indices.iter().map(|&i| &file.graphs[i].graph), &opts)
    }
    .map_err(|e| Failure::User(e.to_string()))?;
    let text = if a.pretty {
        serde_json::to_string_pretty(&value)
    } else {
        serde_json::to_string(&value)
    }
    .map_err(|e| Failure::User(e.to_string()))?;
    match &a.output {
        Some(path) => {
            super::out::check(
                std::slice::from_ref(path),
                &[a.input.file.as_path()],
                a.force,
            )?;
            super::out::write(path, text + "\n", a.force)?;
        }
        None => writeln!(stdout(), "{text}")?,
    }
    Ok(())
}
