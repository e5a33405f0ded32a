//! Compiling µGraphs into a Rust crate from its build script (feature `buildscript`, on by
//! default).
//!
//! ```no_run
//! // build.rs of a crate with `mucc` as a build-dependency
//! let built = mucc::buildscript::Kernels::new()
//!     .graph("kernels/gated_mlp.json", 0, "gated_mlp")
//!     .graph("kernels/rmsnorm.json", 0, "rmsnorm")
//!     .arch(mucc::target::Arch::Sm90a)
//!     .compile("mucc_kernels");
//! if let Err(e) = built {
//!     eprintln!("{e}");
//!     std::process::exit(1);
//! }
//! ```
//!
//! and in the crate, `mod kernels { include!(concat!(env!("OUT_DIR"), "/mucc_kernels.rs")); }`
//! then `kernels::gated_mlp::launch(&stream, &x, &w1, &w2, &mut out, &mut workspace)?`.
//!
//! [`Kernels::compile`] transpiles each graph for each architecture (each file with its own
//! symbols, [`crate::sched::plan::Symbols`], so that they link into one program), compiles the
//! files with nvcc through [`cc::Build::cuda`] with the flags `mucc build` uses
//! ([`crate::cuda::nvcc::compile_flags`]), one static library per file, prints the
//! `cargo:rerun-if-changed` and `cargo:rustc-link-*` lines, and writes the Rust bindings
//! ([`bindings`]) to `OUT_DIR/<lib>.rs`: per graph a module with its buffers' descriptions, the
//! workspace size, and a safe `launch` over cudarc device buffers that checks their types,
//! lengths, alignment and context, picks the kernels of the device's architecture, and returns
//! a `Result`. The crate needs `cudarc` 0.19 (feature `driver`) and, when a graph has f16 or
//! bf16 buffers, `half` 2 among its dependencies.

pub mod bindings;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use sha2::{Digest, Sha256};

pub use crate::cuda::nvcc::Stage;
use crate::cuda::nvcc::{self, NvccOptions};
use crate::emit::LaunchPlan;
use crate::graph::mirage_json::{ImportOptions, MirageFile};
use crate::sched::plan::{Options, PathChoice, Symbols};
use crate::target::{Arch, Target};

/// The longest library name [`Kernels::compile`] takes.
pub const MAX_LIB_NAME: usize = 24;
/// The longest graph name [`Kernels::graph`] takes.
pub const MAX_GRAPH_NAME: usize = 32;

/// A graph to compile.
#[derive(Clone, Debug)]
struct GraphSpec {
    file: PathBuf,
    index: usize,
    name: String,
}

/// The µGraphs of a crate and how to compile them; see the [module documentation](self).
#[derive(Clone, Debug)]
pub struct Kernels {
    graphs: Vec<GraphSpec>,
    archs: Vec<Arch>,
    path: PathChoice,
    nvcc: Option<PathBuf>,
    runtime_headers: Option<PathBuf>,
    out_dir: Option<PathBuf>,
    cargo_metadata: bool,
    import: ImportOptions,
    crate_id: Option<String>,
}

impl Default for Kernels {
    fn default() -> Kernels {
        Kernels::new()
    }
}

/// Why [`Kernels::compile`] failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The builder's settings are unusable (no graphs, a bad name, no output folder…).
    #[error("mucc::buildscript: {0}")]
    Config(String),
    /// A graph failed at `stage`.
    #[error("mucc::buildscript: {file}, graph {index} (`{name}`){arch}: {stage} failed: {message}")]
    Graph {
        /// The graph file.
        file: PathBuf,
        /// The graph's index in the file.
        index: usize,
        /// The name given to it.
        name: String,
        /// The architecture, when the failure is specific to one (`, sm_90a`).
        arch: String,
        /// What failed.
        stage: Stage,
        /// Why (nvcc's log for [`Stage::Compile`]).
        message: String,
    },
    /// The bindings could not be written.
    #[error("mucc::buildscript: cannot write {path}: {message}")]
    Bindings {
        /// The bindings file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

/// A compiled file: one graph for one architecture.
#[derive(Clone, Debug)]
pub struct CompiledFile {
    /// The architecture.
    pub arch: Arch,
    /// The generated CUDA file.
    pub source: PathBuf,
    /// The static library's name (`lib<name>.a` in [`Compiled::lib_dir`]).
    pub library: String,
    /// The launch plan (its `entry` is the file's host entry).
    pub launch: LaunchPlan,
}

/// A compiled graph.
#[derive(Clone, Debug)]
pub struct CompiledGraph {
    /// The name given to it (the bindings' module).
    pub name: String,
    /// The graph file.
    pub file: PathBuf,
    /// The graph's index in the file.
    pub index: usize,
    /// One file per architecture, in the order the architectures were given.
    pub files: Vec<CompiledFile>,
}

/// What [`Kernels::compile`] made.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The Rust bindings (`OUT_DIR/<lib>.rs`).
    pub bindings: PathBuf,
    /// Where the generated files and static libraries are.
    pub lib_dir: PathBuf,
    /// The graphs, in the order they were given.
    pub graphs: Vec<CompiledGraph>,
    /// The `cargo:` lines printed (or, without cargo metadata, that would have been).
    pub cargo_lines: Vec<String>,
}

/// Whether `s` makes a Rust module name and a part of C identifiers joined with `_`:
/// `[a-z][a-z0-9_]*` without `__` (C++ reserves such names) nor a trailing `_`, not a Rust
/// keyword.
fn is_module_name(s: &str) -> bool {
    const KEYWORDS: &[&str] = &[
        "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum",
        "extern", "false", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "match", "mod",
        "move", "mut", "pub", "ref", "return", "self", "static", "struct", "super", "trait",
        "true", "type", "unsafe", "use", "where", "while", "abstract", "become", "box", "do",
        "final", "macro", "override", "priv", "try", "typeof", "unsized", "virtual", "yield",
    ];
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
        && !s.contains("__")
        && !s.ends_with('_')
        && !KEYWORDS.contains(&s)
}

/// The host entry (also the static library's name) and kernel prefix of graph `name` of
/// library `lib` for architecture `tag` in crate `crate_id`. A digest of all four ends the
/// entry and is part of the prefix, so that two crates (or two versions of one) that embed
/// graphs under the same names link into one program; kernel names (profilers show them) keep
/// the graph name and architecture where they fit.
fn symbol_names(crate_id: &str, lib: &str, name: &str, tag: &str) -> (String, String) {
    let digest = Sha256::digest(format!("{crate_id}\0{lib}\0{name}\0{tag}").as_bytes());
    let hex: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
    let entry = format!("{lib}_{name}_{tag}_{}", &hex[..8]);
    let prefix = [
        format!("{name}_{tag}_{}_", &hex[..6]),
        format!("mucc_{hex}_"),
    ]
    .into_iter()
    .find(|p| p.len() <= Symbols::MAX_KERNEL_PREFIX)
    .unwrap_or_default();
    (entry, prefix)
}

/// Whether `p` may be written into cargo lines and the bindings' comments: UTF-8 without
/// control characters (a newline would start a line of its own there).
fn is_plain_path(p: &Path) -> bool {
    p.to_str().is_some_and(|s| !s.chars().any(char::is_control))
}

/// The short architecture name used in symbols (`sm90a`).
fn arch_tag(arch: Arch) -> String {
    arch.to_string().replace('_', "")
}

impl Kernels {
    /// No graphs yet; sm_90a unless [`Kernels::arch`] says otherwise; cargo metadata printed.
    pub fn new() -> Kernels {
        Kernels {
            graphs: Vec::new(),
            archs: Vec::new(),
            path: PathChoice::Auto,
            nvcc: None,
            runtime_headers: None,
            out_dir: None,
            cargo_metadata: true,
            import: ImportOptions::default(),
            crate_id: None,
        }
    }

    /// What sets this crate's symbols apart from another crate's in the same program that
    /// embeds graphs under the same library and graph names (default:
    /// `$CARGO_PKG_NAME $CARGO_PKG_VERSION`, which cargo sets for build scripts). A digest of
    /// it, the library, graph name and architecture ends every host entry and static library
    /// name and is part of every kernel name.
    pub fn crate_id(mut self, id: &str) -> Kernels {
        self.crate_id = Some(id.to_string());
        self
    }

    fn resolved_crate_id(&self) -> String {
        self.crate_id.clone().unwrap_or_else(|| {
            let var = |k: &str| std::env::var(k).unwrap_or_default();
            format!("{} {}", var("CARGO_PKG_NAME"), var("CARGO_PKG_VERSION"))
        })
    }

    /// Adds graph `index` of the Mirage JSON file `file` (relative paths are relative to the
    /// crate, where build scripts run) under `name`: the bindings' module, `[a-z_][a-z0-9_]*`,
    /// at most [`MAX_GRAPH_NAME`] characters.
    pub fn graph(mut self, file: impl AsRef<Path>, index: usize, name: &str) -> Kernels {
        self.graphs.push(GraphSpec {
            file: file.as_ref().to_path_buf(),
            index,
            name: name.to_string(),
        });
        self
    }

    /// Adds a target architecture (default: sm_90a alone). With several, `launch` picks the one
    /// of the stream's device (sm_90a on compute capability 9.0, sm_80 on 8.0; other devices
    /// get `Error::Unsupported`).
    pub fn arch(mut self, arch: Arch) -> Kernels {
        if !self.archs.contains(&arch) {
            self.archs.push(arch);
        }
        self
    }

    /// Which features the kernels may use (`mucc build --path`; default: all of the target's).
    pub fn path(mut self, path: PathChoice) -> Kernels {
        self.path = path;
        self
    }

    /// The nvcc to use (default: `$NVCC`, which cc reads, else `$MUCC_NVCC`,
    /// `$MUCC_CUDA_HOME/bin/nvcc`, `$CUDA_HOME/bin/nvcc`, then `nvcc` on PATH). Its file name
    /// must be `nvcc`.
    pub fn nvcc(mut self, nvcc: impl Into<PathBuf>) -> Kernels {
        self.nvcc = Some(nvcc.into());
        self
    }

    /// The runtime headers folder (default: the copy embedded in mucc, written under
    /// `OUT_DIR/mucc`).
    pub fn runtime_headers(mut self, dir: impl Into<PathBuf>) -> Kernels {
        self.runtime_headers = Some(dir.into());
        self
    }

    /// Where to write the generated files, libraries and bindings (default: `$OUT_DIR`).
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Kernels {
        self.out_dir = Some(dir.into());
        self
    }

    /// Whether to print the `cargo:` lines on stdout (default: yes; turn it off outside build
    /// scripts, e.g. in tests: [`Compiled::cargo_lines`] holds them either way).
    pub fn cargo_metadata(mut self, on: bool) -> Kernels {
        self.cargo_metadata = on;
        self
    }

    /// How graph files are imported (dtype table, size limit).
    pub fn import_options(mut self, import: ImportOptions) -> Kernels {
        self.import = import;
        self
    }

    fn emit_line(&self, lines: &mut Vec<String>, line: String) {
        if self.cargo_metadata {
            println!("{line}");
        }
        lines.push(line);
    }

    /// The nvcc to run and the PATH that makes cc find it, or an error when `$NVCC` names
    /// another one.
    fn resolve_nvcc(&self) -> Result<PathBuf, BuildError> {
        let from_env = std::env::var_os("NVCC").map(PathBuf::from);
        match (&self.nvcc, from_env) {
            (Some(given), Some(env)) if *given != env => Err(BuildError::Config(format!(
                "nvcc is set to {} but $NVCC (which the cc crate runs) is {}: unset one",
                given.display(),
                env.display()
            ))),
            (_, Some(env)) => Ok(env),
            (given, None) => {
                let nvcc = nvcc::find_nvcc(given.as_deref());
                if nvcc.file_name().is_none_or(|n| n != "nvcc") {
                    return Err(BuildError::Config(format!(
                        "{}: the cc crate runs `nvcc`; name the compiler nvcc or set $NVCC",
                        nvcc.display()
                    )));
                }
                Ok(nvcc)
            }
        }
    }

    /// Transpiles and compiles every graph for every architecture, prints the cargo lines and
    /// writes the bindings `OUT_DIR/<lib>.rs`. `lib` names the bindings file and prefixes the
    /// static libraries and host entries: `[a-z_][a-z0-9_]*`, at most [`MAX_LIB_NAME`]
    /// characters.
    pub fn compile(self, lib: &str) -> Result<Compiled, BuildError> {
        let mut cargo_lines = Vec::new();
        // Printed first, so that cargo reruns the script after a failure once a file changes.
        // (Paths that are not plain are refused below, and never printed.)
        for g in self.graphs.iter().filter(|g| is_plain_path(&g.file)) {
            self.emit_line(
                &mut cargo_lines,
                format!("cargo:rerun-if-changed={}", g.file.display()),
            );
        }
        if let Some(d) = self.runtime_headers.as_ref().filter(|d| is_plain_path(d)) {
            self.emit_line(
                &mut cargo_lines,
                format!("cargo:rerun-if-changed={}", d.display()),
            );
        }
        let nvcc = self.resolve_nvcc();
        // PATH matters only when nvcc is found there (it changes between shells).
        let on_path = nvcc.as_ref().is_ok_and(|p| p.components().count() == 1);
        for var in ["NVCC", "MUCC_NVCC", "MUCC_CUDA_HOME", "CUDA_HOME"]
            .into_iter()
            .chain(on_path.then_some("PATH"))
        {
            self.emit_line(
                &mut cargo_lines,
                format!("cargo:rerun-if-env-changed={var}"),
            );
        }
        let nvcc = nvcc?;
        self.check_config(lib)?;
        let out_dir = match &self.out_dir {
            Some(d) => d.clone(),
            None => std::env::var_os("OUT_DIR")
                .map(PathBuf::from)
                .ok_or_else(|| {
                    BuildError::Config(
                        "$OUT_DIR is not set (not in a build script?): call out_dir()".into(),
                    )
                })?,
        };
        let archs = if self.archs.is_empty() {
            vec![Arch::Sm90a]
        } else {
            self.archs.clone()
        };
        // The bundled headers go under OUT_DIR: a build script writes nowhere else.
        let headers = match &self.runtime_headers {
            Some(_) => nvcc::runtime_headers(&NvccOptions {
                nvcc: Some(nvcc.clone()),
                runtime_headers: self.runtime_headers.clone(),
            })
            .map_err(|e| e.to_string()),
            None => crate::cuda::compile::install_runtime_headers(Some(&out_dir.join("mucc")))
                .map_err(|e| e.to_string()),
        }
        .map_err(|e| BuildError::Config(format!("runtime headers: {e}")))?;
        let lib_dir = out_dir.join("mucc").join(lib);
        std::fs::create_dir_all(&lib_dir)
            .map_err(|e| BuildError::Config(format!("cannot create {}: {e}", lib_dir.display())))?;

        // Read each file once.
        let mut files: BTreeMap<PathBuf, Result<MirageFile, String>> = BTreeMap::new();
        for g in &self.graphs {
            files.entry(g.file.clone()).or_insert_with(|| {
                crate::read_file(&g.file, &self.import).map_err(|e| e.to_string())
            });
        }

        // Transpile every (graph, arch), in parallel.
        let jobs: Vec<(usize, Arch)> = (0..self.graphs.len())
            .flat_map(|gi| archs.iter().map(move |a| (gi, *a)))
            .collect();
        let transpiled: Vec<Result<CompiledFile, BuildError>> = jobs
            .par_iter()
            .map(|&(gi, arch)| self.transpile_one(lib, gi, arch, &files, &lib_dir))
            .collect();
        let mut per_graph: Vec<Vec<CompiledFile>> = vec![Vec::new(); self.graphs.len()];
        for (r, &(gi, _)) in transpiled.into_iter().zip(&jobs) {
            per_graph[gi].push(r?);
        }
        // The bindings describe the buffers once: they must agree across architectures.
        for (g, fs) in self.graphs.iter().zip(&per_graph) {
            check_same_buffers(g, fs)?;
        }

        // Compile every file, in parallel.
        let compiled: Vec<Result<Vec<String>, BuildError>> = per_graph
            .par_iter()
            .zip(&self.graphs)
            .flat_map(|(fs, g)| fs.par_iter().map(move |f| (g, f)))
            .map(|(g, f)| self.compile_one(g, f, &nvcc, &headers, &lib_dir))
            .collect();
        for r in compiled {
            for line in r? {
                self.emit_line(&mut cargo_lines, line);
            }
        }
        self.emit_line(
            &mut cargo_lines,
            "cargo:rustc-link-lib=cudart_static".into(),
        );
        for dir in nvcc::library_dirs(&nvcc) {
            self.emit_line(
                &mut cargo_lines,
                format!("cargo:rustc-link-search=native={}", dir.display()),
            );
        }
        if per_graph.iter().flatten().any(|f| f.launch.uses_cublas()) {
            self.emit_line(&mut cargo_lines, "cargo:rustc-link-lib=cublas".into());
        }
        for sys in ["stdc++", "dl", "rt", "pthread"] {
            self.emit_line(&mut cargo_lines, format!("cargo:rustc-link-lib={sys}"));
        }

        let graphs: Vec<CompiledGraph> = self
            .graphs
            .iter()
            .zip(per_graph)
            .map(|(g, files)| CompiledGraph {
                name: g.name.clone(),
                file: g.file.clone(),
                index: g.index,
                files,
            })
            .collect();
        let text = bindings::render(lib, &graphs).map_err(BuildError::Config)?;
        let bindings = out_dir.join(format!("{lib}.rs"));
        write_if_changed(&bindings, &text).map_err(|message| BuildError::Bindings {
            path: bindings.clone(),
            message,
        })?;
        Ok(Compiled {
            bindings,
            lib_dir,
            graphs,
            cargo_lines,
        })
    }

    fn check_config(&self, lib: &str) -> Result<(), BuildError> {
        if !is_module_name(lib) || lib.len() > MAX_LIB_NAME {
            return Err(BuildError::Config(format!(
                "library name `{lib}` must be [a-z][a-z0-9_]* without `__` or a trailing `_`, not a Rust keyword, at most {MAX_LIB_NAME} characters"
            )));
        }
        if self.graphs.is_empty() {
            return Err(BuildError::Config(
                "no graphs: add some with Kernels::graph(file, index, name)".into(),
            ));
        }
        for p in self
            .graphs
            .iter()
            .map(|g| g.file.as_path())
            .chain(self.runtime_headers.as_deref())
        {
            if !is_plain_path(p) {
                return Err(BuildError::Config(format!(
                    "path {p:?} must be UTF-8 without control characters (it is written into cargo lines and the bindings)"
                )));
            }
        }
        let mut seen = BTreeMap::new();
        for g in &self.graphs {
            if !is_module_name(&g.name) || g.name.len() > MAX_GRAPH_NAME {
                return Err(BuildError::Config(format!(
                    "{}, graph {}: name `{}` must be [a-z][a-z0-9_]* without `__` or a trailing `_`, not a Rust keyword, at most {MAX_GRAPH_NAME} characters",
                    g.file.display(),
                    g.index,
                    g.name
                )));
            }
            if let Some(prev) = seen.insert(g.name.as_str(), g) {
                return Err(BuildError::Config(format!(
                    "two graphs are named `{}`: {}, graph {} and {}, graph {}",
                    g.name,
                    prev.file.display(),
                    prev.index,
                    g.file.display(),
                    g.index
                )));
            }
        }
        Ok(())
    }

    fn transpile_one(
        &self,
        lib: &str,
        gi: usize,
        arch: Arch,
        files: &BTreeMap<PathBuf, Result<MirageFile, String>>,
        lib_dir: &Path,
    ) -> Result<CompiledFile, BuildError> {
        let g = &self.graphs[gi];
        let err = |stage: Stage, arch: Option<Arch>, message: String| BuildError::Graph {
            file: g.file.clone(),
            index: g.index,
            name: g.name.clone(),
            arch: arch.map(|a| format!(", {a}")).unwrap_or_default(),
            stage,
            message,
        };
        let file = files[&g.file]
            .as_ref()
            .map_err(|e| err(Stage::Read, None, e.clone()))?;
        let lg = file.graphs.get(g.index).ok_or_else(|| {
            err(
                Stage::Read,
                None,
                format!("the file has {} graph(s)", file.graphs.len()),
            )
        })?;
        let gpus = lg.graph.sharding.num_gpus();
        if gpus > 1 {
            return Err(err(
                Stage::Transpile,
                None,
                format!(
                    "the graph runs on {gpus} GPUs (its mesh); the build-script bindings launch \
                     graphs on one GPU only so far (`mucc build` makes a library whose entry \
                     takes an NCCL communicator)"
                ),
            ));
        }
        let tag = arch_tag(arch);
        let (entry, prefix) = symbol_names(&self.resolved_crate_id(), lib, &g.name, &tag);
        let symbols =
            Symbols::new(&prefix, &entry).map_err(|e| err(Stage::Transpile, Some(arch), e))?;
        let opts = Options {
            symbols,
            path: self.path,
            ..Options::for_target(Target::new(arch))
        };
        let source = format!("{}, graph {}", g.file.display(), g.index);
        let emitted = nvcc::prepare(lg, &source, &opts).map_err(|(stage, message)| {
            err(stage, (stage != Stage::Validate).then_some(arch), message)
        })?;
        // The bindings document the workspace as scratch: a plan that needs it zeroed before
        // the first call (arrival counters) is refused, never run wrong.
        if emitted.launch.counter_bytes > 0 {
            return Err(err(
                Stage::Transpile,
                Some(arch),
                "the plan keeps arrival counters in its workspace, which the bindings do not \
                 zero"
                    .to_string(),
            ));
        }
        let path = lib_dir.join(format!("{}_{tag}.cu", g.name));
        write_if_changed(&path, &emitted.source).map_err(|e| err(Stage::Write, Some(arch), e))?;
        Ok(CompiledFile {
            arch,
            source: path,
            library: entry,
            launch: emitted.launch,
        })
    }

    fn compile_one(
        &self,
        g: &GraphSpec,
        f: &CompiledFile,
        nvcc: &Path,
        headers: &Path,
        lib_dir: &Path,
    ) -> Result<Vec<String>, BuildError> {
        nvcc::compile_static(&f.source, f.arch, &f.library, lib_dir, nvcc, headers).map_err(
            |message| BuildError::Graph {
                file: g.file.clone(),
                index: g.index,
                name: g.name.clone(),
                arch: format!(", {}", f.arch),
                stage: Stage::Compile,
                message,
            },
        )?;
        Ok(vec![
            format!("cargo:rustc-link-search=native={}", lib_dir.display()),
            format!("cargo:rustc-link-lib=static={}", f.library),
        ])
    }
}

/// Errors when a graph's buffers differ between its architectures' plans.
fn check_same_buffers(g: &GraphSpec, fs: &[CompiledFile]) -> Result<(), BuildError> {
    let Some(first) = fs.first() else {
        return Ok(());
    };
    for f in &fs[1..] {
        for (kind, a, b) in [
            ("inputs", &first.launch.inputs, &f.launch.inputs),
            ("outputs", &first.launch.outputs, &f.launch.outputs),
        ] {
            if a != b {
                return Err(BuildError::Graph {
                    file: g.file.clone(),
                    index: g.index,
                    name: g.name.clone(),
                    arch: String::new(),
                    stage: Stage::Transpile,
                    message: format!(
                        "the {kind} are laid out differently for {} and {}; build one architecture per crate feature",
                        first.arch, f.arch
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Writes `text` to `path` unless it already holds it (so that an unchanged graph keeps its
/// file's time).
fn write_if_changed(path: &Path, text: &str) -> Result<(), String> {
    if std::fs::read(path).is_ok_and(|old| old == text.as_bytes()) {
        return Ok(());
    }
    crate::outputs::write(path, text.as_bytes(), crate::outputs::Existing::Replace)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names() {
        for ok in ["gated_mlp", "x", "a1", "rms_norm_2"] {
            assert!(is_module_name(ok), "{ok}");
        }
        for bad in [
            "",
            "_",
            "_x",
            "a__b",
            "a_",
            "1a",
            "Gated",
            "gated-mlp",
            "fn",
            "self",
            "a b",
            "é",
        ] {
            assert!(!is_module_name(bad), "{bad}");
        }
        assert!(crate::sched::plan::is_c_identifier(
            "mucc_kernels_gated_mlp_sm90a"
        ));
        assert!(!crate::sched::plan::is_c_identifier("mucc__x"));
    }

    #[test]
    fn symbols_differ_between_crates_and_fit() {
        let (e1, p1) = symbol_names("app 0.1.0", "mucc_kernels", "gated_mlp", "sm90a");
        let (e2, p2) = symbol_names("dep 2.0.0", "mucc_kernels", "gated_mlp", "sm90a");
        let (e3, p3) = symbol_names("app 0.1.0", "mucc_kernels", "gated_mlp", "sm80");
        assert!(e1.starts_with("mucc_kernels_gated_mlp_sm90a_"), "{e1}");
        assert!(p1.starts_with("gated_mlp_sm90a_"), "{p1}");
        assert_eq!(
            symbol_names("app 0.1.0", "mucc_kernels", "gated_mlp", "sm90a"),
            (e1.clone(), p1.clone())
        );
        for (a, b) in [(&e1, &e2), (&e1, &e3), (&p1, &p2), (&p1, &p3)] {
            assert_ne!(a, b);
        }
        // The longest names still make symbols: the prefix falls back to the digest alone.
        let lib = "l".repeat(MAX_LIB_NAME);
        let name = "g".repeat(MAX_GRAPH_NAME);
        let (e, p) = symbol_names("x", &lib, &name, "sm90a");
        assert!(p.starts_with("mucc_"), "{p}");
        assert!(Symbols::new(&p, &e).is_ok(), "{e} {p}");
    }

    #[test]
    fn config_errors_name_the_problem() {
        let e = Kernels::new()
            .out_dir("/nonexistent")
            .cargo_metadata(false)
            .compile("k")
            .unwrap_err();
        assert!(e.to_string().contains("no graphs"), "{e}");
        let e = Kernels::new()
            .graph("a.json", 0, "x")
            .graph("b.json", 1, "x")
            .cargo_metadata(false)
            .compile("k")
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("two graphs are named `x`: a.json, graph 0 and b.json, graph 1"),
            "{e}"
        );
        let e = Kernels::new()
            .graph("a.json", 0, "Bad")
            .cargo_metadata(false)
            .compile("k")
            .unwrap_err();
        assert!(e.to_string().contains("a.json, graph 0: name `Bad`"), "{e}");
        let e = Kernels::new()
            .graph("a.json", 0, "x")
            .cargo_metadata(false)
            .compile("Mucc-Kernels")
            .unwrap_err();
        assert!(e.to_string().contains("library name `Mucc-Kernels`"), "{e}");
        // A path that would start a cargo line of its own is refused (and never printed).
        let compiled = Kernels::new()
            .graph("a.json\ncargo:rustc-link-lib=evil", 0, "x")
            .cargo_metadata(false)
            .compile("k");
        let e = compiled.unwrap_err();
        assert!(
            e.to_string()
                .contains("must be UTF-8 without control characters"),
            "{e}"
        );
    }
}
