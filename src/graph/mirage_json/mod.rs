//! Mirage's saved µGraph JSON: import ([`parse_str`], [`read_file`]) and export
//! ([`graph_to_json`], [`graphs_to_json`]). See `mirage-graph-format.md` for the format.

mod cursor;
mod export;
mod import;
pub mod names;
mod strict;

use std::path::PathBuf;

pub use export::{ExportOptions, graph_to_json, graphs_to_json};
pub(crate) use import::{ReadError, read_regular_file};
pub use import::{parse_str, read_file};

use super::dtype::DtypeTable;
use super::error::ValidationErrors;
use super::kernel::KernelGraph;
use super::sharding::GpuMesh;
use super::source::SourceMap;

/// The top-level shape of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileForm {
    /// A JSON array of candidate graphs (what Mirage's search saves).
    CandidateList,
    /// One graph (an array of operators), as `KNGraph.to_json` writes.
    SingleGraph,
    /// The May-2024 search checkpoint object; its `generated_graphs` are the candidates.
    LegacyCheckpoint,
}

impl FileForm {
    /// A short description.
    pub fn describe(self) -> &'static str {
        match self {
            FileForm::CandidateList => "list of candidate graphs",
            FileForm::SingleGraph => "single graph",
            FileForm::LegacyCheckpoint => "May-2024 checkpoint object (generated_graphs)",
        }
    }
}

/// The largest file [`read_file`] reads unless told otherwise: 64 MiB (35 times the largest
/// benchmark file; parsing takes at most about 20 times a file's size in memory — measured
/// 12–17 times on the costliest shapes: long arrays of numbers or of empty arrays, objects with
/// millions of keys, 100,000 small graphs).
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 64 << 20;

/// The most candidate graphs one file may hold unless told otherwise (500 times the largest
/// benchmark file). Each costs about a kilobyte of memory however small its JSON (`[]` is two
/// bytes), so the count is bounded on its own, while the file is parsed.
pub const DEFAULT_MAX_GRAPHS: usize = 100_000;

/// Options of the importer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportOptions {
    /// The dtype table to use; `None` detects it from the file.
    pub dtype_table: Option<DtypeTable>,
    /// The largest file [`read_file`] reads (bytes).
    pub max_input_bytes: u64,
    /// The most candidate graphs a file may hold (a larger file is an error, found while
    /// parsing).
    pub max_graphs: usize,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            dtype_table: None,
            max_input_bytes: DEFAULT_MAX_INPUT_BYTES,
            max_graphs: DEFAULT_MAX_GRAPHS,
        }
    }
}

/// One imported graph with the JSON origins of its operators.
#[derive(Clone, Debug)]
pub struct LoadedGraph {
    /// The graph.
    pub graph: KernelGraph,
    /// Where its operators came from.
    pub source: SourceMap,
}

impl LoadedGraph {
    /// Validates the graph, with errors naming JSON paths.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        super::validate::validate(&self.graph, Some(&self.source))
    }

    /// Sets the GPU mesh the graph runs on (Mirage's JSON does not record it; see
    /// [`crate::graph::sharding`]). Call before validating.
    pub fn set_gpu_mesh(&mut self, mesh: GpuMesh) {
        self.graph.sharding.mesh = Some(mesh);
    }
}

/// An imported file.
#[derive(Clone, Debug)]
pub struct MirageFile {
    /// The file read, if any.
    pub path: Option<PathBuf>,
    /// Its top-level form.
    pub form: FileForm,
    /// The dtype table used.
    pub dtype_table: DtypeTable,
    /// Why that table was used.
    pub dtype_table_reason: String,
    /// Things a user should know (ambiguous dtype table, implicit outputs, …).
    pub warnings: Vec<String>,
    /// The candidate graphs, in file order.
    pub graphs: Vec<LoadedGraph>,
}

impl MirageFile {
    /// Sets the GPU mesh of every graph (the caller's GPU count, e.g. a `--gpus N` option:
    /// `GpuMesh::line(N)`). It replaces a mesh read from mucc's `mucc_gpu_dim` key. Call before
    /// validating.
    pub fn set_gpu_mesh(&mut self, mesh: GpuMesh) {
        for g in &mut self.graphs {
            g.set_gpu_mesh(mesh);
        }
        // The count is known now: the warning about all-reduces of unknown reach is moot.
        self.warnings.retain(|w| !w.contains(import::UNKNOWN_MESH));
    }
}
