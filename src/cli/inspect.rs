//! `mucc inspect`.

use std::io::Write;

use clap::Args;
use mucc::graph::display;

use super::{Failure, GraphSelection, InputArgs, load, print_warnings, stdout};

/// Arguments of `mucc inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    input: InputArgs,
    #[command(flatten)]
    select: GraphSelection,
}

/// One line describing a graph: inputs, outputs, kernels.
/// Runs `mucc inspect`.
pub fn run(a: InspectArgs) -> Result<(), Failure> {
    let file = load(&a.input)?;
    print_warnings(&file);
    let detailed = a.select.graph.is_some();
    let indices = a.select.indices(&file, true)?;
    let mut out = stdout();
    writeln!(out, "file: {}", super::shown(&a.input.file))?;
    writeln!(
        out,
        "form: {}, {} graph{}",
        file.form.describe(),
        file.graphs.len(),
        if file.graphs.len() == 1 { "" } else { "s" }
    )?;
    writeln!(
        out,
        "dtype table: {} ({})",
        file.dtype_table, file.dtype_table_reason
    )?;
    let mut invalid = 0;
    for &i in &indices {
        let lg = &file.graphs[i];
        let verdict = lg.validate();
        if detailed {
            writeln!(out, "graph {i}: {}", display::summary(&lg.graph))?;
            for line in display::dump(&lg.graph).lines() {
                writeln!(out, "  {line}")?;
            }
            match &verdict {
                Ok(()) => writeln!(out, "validation: ok")?,
                Err(errs) => {
                    writeln!(
                        out,
                        "validation: {} error{}",
                        errs.0.len(),
                        if errs.0.len() == 1 { "" } else { "s" }
                    )?;
                    for e in &errs.0 {
                        writeln!(out, "  {e}")?;
                    }
                }
            }
        } else {
            let v = match &verdict {
                Ok(()) => "valid".to_string(),
                Err(errs) => format!("INVALID: {}", errs.first()),
            };
            writeln!(out, "graph {i}: {}; {v}", display::summary(&lg.graph))?;
        }
        if verdict.is_err() {
            invalid += 1;
        }
    }
    if !detailed {
        writeln!(
            out,
            "{} of {} graphs valid",
            indices.len() - invalid,
            indices.len()
        )?;
    }
    if invalid > 0 {
        Err(Failure::Quiet)
    } else {
        Ok(())
    }
}
