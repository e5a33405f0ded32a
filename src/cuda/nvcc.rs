//! nvcc builds: a generated file into a shared library exposing `mucc_execute` (the C header
//! that describes its buffers is `emit::header`'s).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::emit::Emitted;
use crate::emit::launch::LaunchPlan;
use crate::graph::mirage_json::LoadedGraph;
use crate::sched::Options;
use crate::target::Arch;

/// Where nvcc and the runtime headers come from.
#[derive(Clone, Debug, Default)]
pub struct NvccOptions {
    /// The nvcc to run (default: see [`find_nvcc`]).
    pub nvcc: Option<PathBuf>,
    /// Runtime headers folder (default: the embedded copy, installed in the cache).
    pub runtime_headers: Option<PathBuf>,
}

/// Why a library could not be built.
#[derive(Debug, thiserror::Error)]
pub enum NvccError {
    /// nvcc could not be started.
    #[error("cannot run {nvcc} ({error}): install the CUDA toolkit or pass --nvcc")]
    NotFound {
        /// The nvcc tried.
        nvcc: PathBuf,
        /// Why it did not start.
        error: std::io::Error,
    },
    /// nvcc rejected the source.
    #[error("nvcc failed ({command}):\n{log}")]
    Failed {
        /// The command line.
        command: String,
        /// Its output.
        log: String,
    },
    /// A file could not be written or the runtime headers could not be installed.
    #[error("{0}")]
    Io(String),
}

/// The nvcc to use: `given`, else `$MUCC_NVCC`, `$MUCC_CUDA_HOME/bin/nvcc`,
/// `$CUDA_HOME/bin/nvcc`, then `nvcc` on PATH.
pub fn find_nvcc(given: Option<&Path>) -> PathBuf {
    if let Some(p) = given {
        return p.to_path_buf();
    }
    if let Some(p) = std::env::var_os("MUCC_NVCC") {
        return PathBuf::from(p);
    }
    for var in ["MUCC_CUDA_HOME", "CUDA_HOME"] {
        if let Some(h) = std::env::var_os(var) {
            let p = PathBuf::from(h).join("bin/nvcc");
            if p.is_file() {
                return p;
            }
        }
    }
    PathBuf::from("nvcc")
}

/// nvcc's `-gencode` for `arch`.
pub fn gencode(arch: Arch) -> String {
    let (virt, real) = match arch {
        Arch::Sm80 => ("compute_80", "sm_80"),
        Arch::Sm90a => ("compute_90a", "sm_90a"),
    };
    format!("-gencode=arch={virt},code={real}")
}

/// A step of an nvcc build of a graph (`mucc build`, [`crate::buildscript`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Reading and importing the graph file.
    Read,
    /// Validating the graph.
    Validate,
    /// Planning and emitting it.
    Transpile,
    /// Writing the generated file.
    Write,
    /// Compiling it with nvcc.
    Compile,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Read => "reading",
            Stage::Validate => "validating",
            Stage::Transpile => "transpiling",
            Stage::Write => "writing the generated file",
            Stage::Compile => "compiling with nvcc",
        })
    }
}

/// The first part of every nvcc build of a graph: validates `lg` (errors name JSON paths) and
/// transpiles it with `opts`; `source` (file and graph) goes into the generated file's header.
/// The error says which step failed and why.
pub fn prepare(lg: &LoadedGraph, source: &str, opts: &Options) -> Result<Emitted, (Stage, String)> {
    lg.validate()
        .map_err(|e| (Stage::Validate, e.to_string()))?;
    let (_, emitted) = crate::transpile::transpile(&lg.graph, opts, source)
        .map_err(|e| (Stage::Transpile, e.to_string()))?;
    Ok(emitted)
}

/// Compiles the generated file `source` for `arch` into the static library `lib<library>.a` in
/// `out_dir` through the `cc` crate (`cc::Build::cuda`, the flags of [`compile_flags`] and
/// [`OPT_LEVEL`], device debug off, no cargo lines: the caller prints its own), with the nvcc
/// `nvcc`; the error holds nvcc's log. cc runs `$NVCC` when it is set, else `nvcc` from PATH,
/// where `nvcc`'s folder is put first.
#[cfg(feature = "buildscript")]
pub fn compile_static(
    source: &Path,
    arch: Arch,
    library: &str,
    out_dir: &Path,
    nvcc: &Path,
    headers: &Path,
) -> Result<(), String> {
    let mut build = cc::Build::new();
    build
        .cuda(true)
        .cudart("none")
        .debug(false)
        .opt_level(OPT_LEVEL)
        .cargo_metadata(false)
        .warnings(false)
        .out_dir(out_dir)
        .file(source);
    for flag in compile_flags(arch, headers) {
        build.flag(flag);
    }
    let dir = nvcc.parent().filter(|d| !d.as_os_str().is_empty());
    if let (None, Some(dir)) = (std::env::var_os("NVCC"), dir) {
        let mut path = vec![dir.to_path_buf()];
        if let Some(p) = std::env::var_os("PATH") {
            path.extend(std::env::split_paths(&p));
        }
        if let Ok(joined) = std::env::join_paths(path) {
            build.env("PATH", joined);
        }
    }
    // Outside build scripts cc needs the target and host.
    if std::env::var_os("TARGET").is_none() {
        build.target(HOST_TARGET).host(HOST_TARGET);
    }
    build.try_compile(library).map_err(|e| {
        // cc's error holds the command line, not nvcc's output: compile once more, directly, to
        // attach it.
        let nvcc = std::env::var_os("NVCC").map_or_else(|| nvcc.to_path_buf(), PathBuf::from);
        let log = Command::new(&nvcc)
            .arg(format!("-O{OPT_LEVEL}"))
            .args(compile_flags(arch, headers))
            .arg("-c")
            .arg(source)
            .arg("-o")
            .arg(out_dir.join(format!("{library}.check.o")))
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_else(|err| format!("(cannot run {}: {err})", nvcc.display()));
        format!("{e}\nnvcc's output:\n{}", log.trim_end())
    })
}

/// The target triple of this build of mucc, for cc outside build scripts.
#[cfg(feature = "buildscript")]
const HOST_TARGET: &str = if cfg!(all(target_arch = "x86_64", target_os = "linux")) {
    "x86_64-unknown-linux-gnu"
} else if cfg!(all(target_arch = "aarch64", target_os = "linux")) {
    "aarch64-unknown-linux-gnu"
} else {
    "unknown"
};

/// A temporary directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// nvcc's flags for a generated file for `arch` (besides the optimisation level,
/// [`OPT_LEVEL`]): C++17, the target's `-gencode`, the runtime headers `headers` on the include
/// path. `mucc build` and the build-script API ([`crate::buildscript`]) compile with these.
pub fn compile_flags(arch: Arch, headers: &Path) -> Vec<OsString> {
    vec![
        "-std=c++17".into(),
        gencode(arch).into(),
        "-I".into(),
        headers.as_os_str().to_owned(),
    ]
}

/// nvcc's optimisation level for generated files (host and device code).
pub const OPT_LEVEL: u32 = 3;

/// The library folders of the toolkit whose nvcc is `nvcc` (pip wheels keep their libraries in
/// `lib/`, where nvcc does not look; toolkits in `lib64/`), those that exist.
pub fn library_dirs(nvcc: &Path) -> Vec<PathBuf> {
    // A bare `nvcc` is found on PATH.
    let resolved = if nvcc.components().count() == 1 {
        std::env::var_os("PATH")
            .and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join(nvcc))
                    .find(|c| c.is_file())
            })
            .unwrap_or_else(|| nvcc.to_path_buf())
    } else {
        nvcc.to_path_buf()
    };
    let Some(top) = resolved.parent().and_then(Path::parent) else {
        return Vec::new();
    };
    ["lib", "lib64"]
        .iter()
        .map(|l| top.join(l))
        .filter(|d| d.is_dir())
        .collect()
}

/// The NCCL folder: `MUCC_NCCL_HOME`, else `NCCL_HOME` (holding `include/nccl.h` and
/// `lib/libnccl.so*`; pip's `nvidia-nccl-cu13` installs one as `site-packages/nvidia/nccl`),
/// else none (the compiler's default paths).
pub fn nccl_home() -> Option<PathBuf> {
    ["MUCC_NCCL_HOME", "NCCL_HOME"]
        .iter()
        .find_map(|v| std::env::var_os(v).filter(|s| !s.is_empty()))
        .map(PathBuf::from)
}

/// nvcc's flags for a graph on several GPUs: NCCL's include and library folders
/// ([`nccl_home`]) and the library (`libnccl.so`, or the versioned `libnccl.so.2` that pip's
/// wheel alone ships).
pub fn nccl_flags() -> Vec<OsString> {
    let mut flags: Vec<OsString> = Vec::new();
    let mut lib: OsString = "-lnccl".into();
    if let Some(home) = nccl_home() {
        flags.push("-I".into());
        flags.push(home.join("include").into_os_string());
        let dir = home.join("lib");
        if !dir.join("libnccl.so").exists() && dir.join("libnccl.so.2").exists() {
            lib = "-l:libnccl.so.2".into();
        }
        flags.push("-L".into());
        flags.push(dir.into_os_string());
    }
    flags.push(lib);
    flags
}

/// The runtime headers folder `opts` names, else the embedded copy installed in the cache.
pub fn runtime_headers(opts: &NvccOptions) -> Result<PathBuf, NvccError> {
    match &opts.runtime_headers {
        Some(d) => Ok(d.clone()),
        None => {
            super::compile::install_runtime_headers(None).map_err(|e| NvccError::Io(e.to_string()))
        }
    }
}

/// Compiles `source` (a generated file for `arch`) into the shared library `out`, linking cuBLAS
/// when `plan` calls it. The library is built in a temporary directory (removed afterwards,
/// whatever happens) and renamed into place, so `out` is never half-written.
pub fn build_library(
    source: &str,
    plan: &LaunchPlan,
    out: &Path,
    opts: &NvccOptions,
    existing: crate::outputs::Existing,
) -> Result<(), NvccError> {
    let headers = runtime_headers(opts)?;
    let work = super::compile::default_cache_dir()
        .join("build")
        .join(format!("{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&work)
        .map_err(|e| NvccError::Io(format!("cannot create {}: {e}", work.display())))?;
    let work = TempDir(work);
    let src = work.0.join("graph.cu");
    std::fs::write(&src, source)
        .map_err(|e| NvccError::Io(format!("cannot write {}: {e}", src.display())))?;
    let tmp_out = work.0.join("graph.so");
    let nvcc = find_nvcc(opts.nvcc.as_deref());
    let mut cmd = Command::new(&nvcc);
    cmd.arg(format!("-O{OPT_LEVEL}"))
        .args(["-shared", "-Xcompiler", "-fPIC"])
        .args(compile_flags(plan.arch, &headers))
        .arg(&src)
        .arg("-o")
        .arg(&tmp_out);
    for dir in library_dirs(&nvcc) {
        cmd.arg("-L").arg(dir);
    }
    if plan.uses_cublas() {
        cmd.arg("-lcublas");
    }
    if plan.uses_nccl() {
        cmd.args(nccl_flags());
    }
    let output = cmd.output().map_err(|error| NvccError::NotFound {
        nvcc: nvcc.clone(),
        error,
    })?;
    if !output.status.success() {
        let mut log = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if plan.uses_nccl() && log.contains("nccl") {
            log.push_str(
                "(the graph runs on several GPUs and needs NCCL: set MUCC_NCCL_HOME to a folder \
                 with include/nccl.h and lib/libnccl.so or lib/libnccl.so.2, e.g. pip's \
                 site-packages/nvidia/nccl)\n",
            );
        }
        return Err(NvccError::Failed {
            command: format!("{cmd:?}"),
            log,
        });
    }
    crate::outputs::install(&tmp_out, out, existing).map_err(|e| NvccError::Io(e.to_string()))
}

/// A name unique within this process.
fn unique() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
