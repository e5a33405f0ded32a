//! `mucc build`: one graph to a shared library (nvcc) exposing `mucc_execute`, with a C header
//! describing its inputs, outputs and workspace.

use std::path::PathBuf;

use clap::Args;
use mucc::cuda::nvcc::{NvccOptions, Stage, build_library, prepare};
use mucc::emit::header::header;
use mucc::target::Arch;

use super::{Failure, GraphSelection, InputArgs, load, print_warnings};

/// Arguments of `mucc build`.
#[derive(Args, Debug)]
pub struct BuildArgs {
    #[command(flatten)]
    input: InputArgs,
    #[command(flatten)]
    select: GraphSelection,
    /// Target architecture of the library's kernels.
    #[arg(long, default_value = "sm_90a", value_parser = |s: &str| s.parse::<Arch>())]
    arch: Arch,
    #[command(flatten)]
    path: super::PathArg,
    /// The shared library to write (`libNAME.so`); the header goes beside it (`libNAME.h`).
    #[arg(long, short = 'o', value_name = "libNAME.so")]
    output: PathBuf,
    /// Overwrite existing files.
    #[arg(long)]
    force: bool,
    /// The nvcc to use (default: `$MUCC_NVCC`, `$MUCC_CUDA_HOME/bin/nvcc`,
    /// `$CUDA_HOME/bin/nvcc`, then `nvcc` on PATH).
    #[arg(long, value_name = "PATH")]
    nvcc: Option<PathBuf>,
    /// Runtime headers folder (default: the copy embedded in mucc).
    #[arg(long, value_name = "DIR")]
    runtime_headers: Option<PathBuf>,
}

/// Runs `mucc build`.
pub fn run(a: BuildArgs) -> Result<(), Failure> {
    let file = load(&a.input)?;
    print_warnings(&file);
    let indices = a.select.indices(&file, false)?;
    if a.select.all || indices.len() != 1 {
        return Err(Failure::User(
            "mucc build makes one library from one graph: give --graph N".into(),
        ));
    }
    let i = indices[0];
    let out = &a.output;
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Failure::User(format!("{}: not a file name", super::shown(out))))?;
    if out.extension().is_none_or(|e| e != "so") {
        return Err(Failure::User(format!(
            "{}: the output of mucc build is a shared library; name it lib<NAME>.so",
            super::shown(out)
        )));
    }
    let header_path = out.with_extension("h");
    super::out::check(
        &[out.clone(), header_path.clone()],
        &[a.input.file.as_path()],
        a.force,
    )?;
    let lg = &file.graphs[i];
    // The source name in the code (escaped there as generated code needs), and in messages.
    let name = a.input.file.display().to_string();
    let shown = super::shown(&a.input.file);
    let opts = a.path.options(&lg.graph, a.arch, &format!("graph {i}"));
    let emitted = prepare(lg, &format!("{name}, graph {i}"), &opts).map_err(|(stage, e)| {
        Failure::User(match stage {
            Stage::Validate => format!("graph {i} is invalid:\n{e}"),
            _ => format!("{shown}: graph {i}: {e}"),
        })
    })?;

    let nvcc = NvccOptions {
        nvcc: a.nvcc.clone(),
        runtime_headers: a.runtime_headers.clone(),
    };
    build_library(
        &emitted.source,
        &emitted.launch,
        out,
        &nvcc,
        mucc::outputs::Existing::from_force(a.force),
    )
    .map_err(|e| Failure::User(format!("{shown}: graph {i}: {e}")))?;
    let guard = format!(
        "MUCC_{}_H",
        stem.to_ascii_uppercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect::<String>()
    );
    let h = header(&guard, &format!("{name}, graph {i}"), &emitted.launch);
    super::out::write(&header_path, h.as_bytes(), a.force)?;
    eprintln!(
        "wrote {} and {}",
        super::shown(out),
        super::shown(&header_path)
    );
    Ok(())
}
