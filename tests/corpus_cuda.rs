//! Every graph of the corpus transpiles for sm_80 and sm_90a, and every generated file compiles:
//! with nvcc (host and device code, for its target) and with NVRTC (device code, for its
//! target), with no error, no warning and no register spill.
//!
//! To fit the CI budget (2 cores), nvcc compiles the files in batches: a batch is one
//! translation unit that includes up to `BATCH` generated files verbatim, each inside its own
//! namespace, with the preprocessor renaming its `extern "C"` symbols (`mucc_execute` and the
//! kernels) so they cannot collide; nvcc's per-invocation cost (host preprocessing, header
//! parsing) is then paid once per batch. NVRTC compiles the same batches (host code is left out
//! under `__CUDACC_RTC__`). Results are cached by
//! content (SHA-256 of the source, the runtime headers, the compiler and its flags) under
//! `$MUCC_CACHE_DIR` (default `~/.cache/mucc`)/`corpus-cuda`, so an unchanged file is not
//! compiled again; `MUCC_NO_CACHE=1` ignores the cache.
//!
//! The test prints the transpile-time and compile-time distributions. It needs the CUDA 13.0
//! toolchain of `scripts/cuda-toolchain.sh` (see `tests/cuda_compile.rs`); `MUCC_SKIP_CUDA=1`
//! skips the compiles (the transpile check still runs).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use mucc::ImportOptions;
use mucc::emit::launch::Step;
use mucc::sched::Options;
use mucc::target::{Arch, Target};
use rayon::prelude::*;

/// Files per nvcc invocation.
const BATCH: usize = 24;

/// One generated file.
struct Unit {
    /// `file.gN.sm_XX`.
    name: String,
    arch: Arch,
    source: String,
    /// The `extern "C"` kernel names.
    kernels: Vec<String>,
    transpile_secs: f64,
}

/// What a compile found.
#[derive(Clone, Debug, Default)]
struct Outcome {
    secs: f64,
    kernels: usize,
    max_registers: u32,
    spill_bytes: u32,
}

impl Outcome {
    fn to_line(&self) -> String {
        format!(
            "{} {} {} {}",
            self.secs, self.kernels, self.max_registers, self.spill_bytes
        )
    }
    fn from_line(s: &str) -> Option<Outcome> {
        let v: Vec<&str> = s.split_whitespace().collect();
        Some(Outcome {
            secs: v.first()?.parse().ok()?,
            kernels: v.get(1)?.parse().ok()?,
            max_registers: v.get(2)?.parse().ok()?,
            spill_bytes: v.get(3)?.parse().ok()?,
        })
    }
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn arch_name(a: Arch) -> &'static str {
    match a {
        Arch::Sm80 => "sm_80",
        Arch::Sm90a => "sm_90a",
    }
}

fn transpile_corpus() -> Vec<Unit> {
    let mut jobs = Vec::new();
    for p in common::corpus_files() {
        let f = mucc::read_file(&p, &ImportOptions::default()).unwrap();
        let stem = p.file_stem().unwrap().to_string_lossy().to_string();
        for (i, g) in f.graphs.into_iter().enumerate() {
            for arch in [Arch::Sm80, Arch::Sm90a] {
                jobs.push((stem.clone(), i, arch, g.graph.clone()));
            }
        }
    }
    let results: Vec<Result<Unit, String>> = jobs
        .into_par_iter()
        .map(|(stem, i, arch, g)| {
            let opts = Options {
                target: Target::new(arch),
                solve: Default::default(),
                path: Default::default(),
                dependent_launch: false,
                symbols: Default::default(),
                cluster_split: true,
                cluster_push: true,
                cluster_combine: false,
                last_block_combine: false,
                grid_split: Default::default(),
                cta: Default::default(),
                register_pipes: true,
                register_rows: true,
                wgmma: true,
                tma: true,
                fuse_matmuls: true,
                online_softmax: Default::default(),
                fold_key_splits: Default::default(),
                all_reduce: Default::default(),
                max_stages: None,
                resident_blocks: None,
                refine_loops: Default::default(),
            };
            let name = format!("{stem}.g{i}.{}", arch_name(arch));
            let t = Instant::now();
            let (_, e) = mucc::transpile::transpile(&g, &opts, &format!("{stem}.json, graph {i}"))
                .map_err(|e| format!("{name}: {e}"))?;
            let transpile_secs = t.elapsed().as_secs_f64();
            let kernels = e
                .launch
                .steps
                .iter()
                .filter_map(|s| match s {
                    Step::Kernel(k) => Some(k.name.clone()),
                    _ => None,
                })
                .collect();
            Ok(Unit {
                name,
                arch,
                source: e.source,
                kernels,
                transpile_secs,
            })
        })
        .collect();
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{} graphs failed to transpile:\n{failures:#?}",
        failures.len()
    );
    results.into_iter().map(Result::unwrap).collect()
}

/// Median and maximum.
fn distribution(mut v: Vec<f64>) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() - 1])
}

/// The toolchain root, or `None` when the compiles are skipped.
fn cuda_home() -> Option<PathBuf> {
    if std::env::var_os("MUCC_SKIP_CUDA").is_some_and(|v| v == "1") {
        eprintln!("MUCC_SKIP_CUDA=1: skipping the corpus compiles");
        return None;
    }
    let home = std::env::var_os("MUCC_CUDA_HOME").map(PathBuf::from).expect(
        "MUCC_CUDA_HOME is not set: run `source scripts/cuda-toolchain.sh` first (or set MUCC_SKIP_CUDA=1)",
    );
    assert!(
        home.join("bin/nvcc").exists(),
        "no nvcc under {}",
        home.display()
    );
    Some(home)
}

/// The outcomes cached in `corpus-cuda`.
struct Cache(common::compile_cache::CompileCache);

impl Cache {
    fn new() -> Cache {
        Cache(common::compile_cache::CompileCache::new("corpus-cuda"))
    }
    fn get(&self, key: &str) -> Option<Outcome> {
        Outcome::from_line(&self.0.get(key)?)
    }
    fn put(&self, key: &str, o: &Outcome) {
        self.0.put(key, &o.to_line());
    }
}

fn key(kind: &str, tool: &str, headers: &str, arch: Arch, source: &str) -> String {
    common::compile_cache::key(&[kind, tool, headers, arch_name(arch), source])
}

/// ptxas figures per kernel of a `-Xptxas -v` log: (kernel, registers, spill bytes).
fn ptxas_figures(log: &str) -> Vec<(String, u32, u32)> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut spill = 0u32;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            current = rest.split('\'').next().unwrap_or("").to_string();
            spill = 0;
        }
        if line.contains("spill stores") {
            for part in line.split(',') {
                let words: Vec<&str> = part.split_whitespace().collect();
                if let [n, "bytes", "spill", ..] = words.as_slice() {
                    spill += n.parse::<u32>().unwrap_or(0);
                }
            }
        }
        if let Some(rest) = line.split("Used ").nth(1)
            && let Some(n) = rest.split(' ').next().and_then(|n| n.parse::<u32>().ok())
        {
            out.push((current.clone(), n, spill));
        }
    }
    out
}

fn nvcc_flags(arch: Arch) -> Vec<String> {
    let code = match arch {
        Arch::Sm80 => "-gencode=arch=compute_80,code=sm_80",
        Arch::Sm90a => "-gencode=arch=compute_90a,code=sm_90a",
    };
    vec![
        "-c".into(),
        "-std=c++17".into(),
        code.into(),
        "-Xptxas".into(),
        "-v".into(),
    ]
}

/// Writes the units' files and one translation unit that includes them all, each in its own
/// namespace with its `extern "C"` symbols renamed; returns the translation unit's path.
fn batch_source(dir: &Path, tag: &str, units: &[&Unit]) -> PathBuf {
    let mut tu = String::from(
        "// A batch of generated files (tests/corpus_cuda.rs).\n#include \"mucc/runtime.h\"\n",
    );
    // Every runtime header a unit may include, included here first, outside the namespaces
    // (`#pragma once` skips the units' own includes).
    if units[0].arch == Arch::Sm90a {
        tu.push_str("#include \"mucc/threadblock/cluster.h\"\n");
    }
    for (i, u) in units.iter().enumerate() {
        let path = dir.join(format!("{}.cu", u.name));
        std::fs::write(&path, &u.source).unwrap();
        let symbols: Vec<&str> = std::iter::once("mucc_execute")
            .chain(u.kernels.iter().map(String::as_str))
            .collect();
        for s in &symbols {
            tu.push_str(&format!("#define {s} b{i}_{s}\n"));
        }
        tu.push_str(&format!(
            "namespace b{i} {{\n#include \"{}\"\n}}\n",
            path.display()
        ));
        for s in &symbols {
            tu.push_str(&format!("#undef {s}\n"));
        }
    }
    let src = dir.join(format!("{tag}.{}.cu", arch_name(units[0].arch)));
    std::fs::write(&src, tu).unwrap();
    src
}

/// Compiles one batch with nvcc; per unit outcomes (the batch time shared evenly) or an error.
fn nvcc_batch(
    home: &Path,
    dir: &Path,
    batch_id: usize,
    units: &[&Unit],
) -> Result<Vec<Outcome>, String> {
    let arch = units[0].arch;
    let src = batch_source(dir, &format!("nvcc{batch_id}"), units);
    let obj = src.with_extension("o");
    let t = Instant::now();
    let o = Command::new(home.join("bin/nvcc"))
        .args(nvcc_flags(arch))
        .arg("-I")
        .arg(crate_dir().join("runtime-headers"))
        .arg("-o")
        .arg(&obj)
        .arg(&src)
        .output()
        .map_err(|e| format!("cannot run nvcc: {e}"))?;
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&obj);
    let log = String::from_utf8_lossy(&o.stderr).to_string() + &String::from_utf8_lossy(&o.stdout);
    let names: Vec<&str> = units.iter().map(|u| u.name.as_str()).collect();
    if !o.status.success() {
        return Err(format!("nvcc failed on the batch {names:?}:\n{log}"));
    }
    if let Some(w) = log
        .lines()
        .find(|l| l.contains("warning") || l.contains("error"))
    {
        return Err(format!("nvcc reported on the batch {names:?}: {w}"));
    }
    let figures = ptxas_figures(&log);
    let mut out = Vec::new();
    for (i, u) in units.iter().enumerate() {
        let mine: Vec<&(String, u32, u32)> = figures
            .iter()
            .filter(|(k, _, _)| u.kernels.iter().any(|n| *k == format!("b{i}_{n}")))
            .collect();
        if mine.len() != u.kernels.len() {
            return Err(format!(
                "{}: ptxas reported {} of its {} kernels",
                u.name,
                mine.len(),
                u.kernels.len()
            ));
        }
        out.push(Outcome {
            secs: secs / units.len() as f64,
            kernels: mine.len(),
            max_registers: mine.iter().map(|f| f.1).max().unwrap_or(0),
            spill_bytes: mine.iter().map(|f| f.2).sum(),
        });
    }
    Ok(out)
}

/// Compiles one batch with NVRTC (the same batched translation unit; host code is left out
/// under `__CUDACC_RTC__`); per unit outcomes or an error. NVRTC serialises compiles within a
/// process, so each batch runs in a child process (this test binary, running
/// `nvrtc_worker` with the job in its environment).
fn nvrtc_batch(dir: &Path, batch_id: usize, units: &[&Unit]) -> Result<Vec<Outcome>, String> {
    let arch = units[0].arch;
    let src = batch_source(dir, &format!("nvrtc{batch_id}"), units);
    let out = src.with_extension("ptx");
    let t = Instant::now();
    let o = Command::new(std::env::current_exe().unwrap())
        .args([
            "nvrtc_worker",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("MUCC_NVRTC_JOB_SRC", &src)
        .env("MUCC_NVRTC_JOB_ARCH", arch_name(arch))
        .env("MUCC_NVRTC_JOB_OUT", &out)
        .output()
        .map_err(|e| format!("cannot run the NVRTC worker: {e}"))?;
    let secs = t.elapsed().as_secs_f64();
    let names: Vec<&str> = units.iter().map(|u| u.name.as_str()).collect();
    let text = std::fs::read_to_string(&out).map_err(|_| {
        format!(
            "NVRTC failed on the batch {names:?}:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })?;
    let mut outs = Vec::new();
    for (i, u) in units.iter().enumerate() {
        let entries = u
            .kernels
            .iter()
            .filter(|k| text.contains(&format!(".entry b{i}_{k}(")))
            .count();
        if entries != u.kernels.len() {
            return Err(format!(
                "{}: the PTX has {entries} of its {} kernels",
                u.name,
                u.kernels.len()
            ));
        }
        outs.push(Outcome {
            secs: secs / units.len() as f64,
            kernels: entries,
            ..Default::default()
        });
    }
    Ok(outs)
}

/// The child side of `nvrtc_batch`: compiles `$MUCC_NVRTC_JOB_SRC` for `$MUCC_NVRTC_JOB_ARCH`
/// and writes the PTX to `$MUCC_NVRTC_JOB_OUT` (nothing on failure, the log on stderr). Ignored:
/// only `nvrtc_batch` runs it, with `--ignored` and the job in its environment.
#[test]
#[ignore = "a worker process of the corpus check (nvrtc_batch runs it with --ignored)"]
fn nvrtc_worker() {
    let (Some(src), Some(arch), Some(out)) = (
        std::env::var_os("MUCC_NVRTC_JOB_SRC"),
        std::env::var("MUCC_NVRTC_JOB_ARCH").ok(),
        std::env::var_os("MUCC_NVRTC_JOB_OUT"),
    ) else {
        return;
    };
    let home = PathBuf::from(std::env::var_os("MUCC_CUDA_HOME").expect("MUCC_CUDA_HOME"));
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(Box::leak(arch.into_boxed_str())),
        include_paths: vec![
            crate_dir()
                .join("runtime-headers")
                .to_string_lossy()
                .into_owned(),
            home.join("include").to_string_lossy().into_owned(),
        ],
        options: vec!["-std=c++17".into()],
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(std::fs::read_to_string(&src).unwrap(), opts) {
        Ok(ptx) => std::fs::write(&out, ptx.to_src()).unwrap(),
        Err(e) => eprintln!("{e:?}"),
    }
}

/// What compiling one batch gives: an outcome per unit, or the compiler's failure message.
type BatchResult = Result<Vec<Outcome>, String>;

/// Compiles a batch (batch number, units) with one compiler.
type BatchCompiler<'a> = dyn Fn(usize, &[&Unit]) -> BatchResult + Sync + 'a;

/// Compiles, with `compile`, every unit whose outcome is not in the cache, in batches of one
/// target; returns the outcomes by unit index, the failures, and how many were compiled now.
fn compile_all(
    units: &[Unit],
    cache: &Cache,
    key_of: &(dyn Fn(&Unit) -> String + Sync),
    compile: &BatchCompiler<'_>,
) -> (BTreeMap<usize, Outcome>, Vec<String>, usize) {
    let mut done = BTreeMap::new();
    let mut todo: BTreeMap<&'static str, Vec<usize>> = BTreeMap::new();
    for (i, u) in units.iter().enumerate() {
        match cache.get(&key_of(u)) {
            Some(o) => {
                done.insert(i, o);
            }
            None => todo.entry(arch_name(u.arch)).or_default().push(i),
        }
    }
    let batches: Vec<Vec<usize>> = todo
        .values()
        .flat_map(|v| v.chunks(BATCH).map(<[usize]>::to_vec))
        .collect();
    let compiled = batches.iter().map(Vec::len).sum::<usize>();
    let results: Vec<(Vec<usize>, BatchResult)> = batches
        .into_par_iter()
        .enumerate()
        .map(|(b, idx)| {
            let us: Vec<&Unit> = idx.iter().map(|&i| &units[i]).collect();
            let r = compile(b, &us);
            (idx, r)
        })
        .collect();
    let mut failures = Vec::new();
    for (idx, r) in results {
        match r {
            Ok(outs) => {
                for (i, o) in idx.into_iter().zip(outs) {
                    cache.put(&key_of(&units[i]), &o);
                    done.insert(i, o);
                }
            }
            Err(e) => failures.push(e),
        }
    }
    (done, failures, compiled)
}

#[test]
fn every_corpus_graph_transpiles_and_compiles_for_sm80_and_sm90a() {
    let t0 = Instant::now();
    let units = transpile_corpus();
    let wall = t0.elapsed().as_secs_f64();
    assert_eq!(units.len(), 2 * 604, "604 corpus graphs × 2 targets");
    let (med, max) = distribution(units.iter().map(|u| u.transpile_secs).collect());
    eprintln!(
        "transpile: {} files in {wall:.1} s wall; per graph median {:.1} ms, max {:.1} ms",
        units.len(),
        med * 1e3,
        max * 1e3
    );
    let Some(home) = cuda_home() else { return };
    assert!(
        unsafe { cudarc::nvrtc::sys::is_culib_present() },
        "libnvrtc.so.13 is not loadable: run `source scripts/cuda-toolchain.sh` (it sets LD_LIBRARY_PATH)"
    );
    let nvcc_version = String::from_utf8_lossy(
        &Command::new(home.join("bin/nvcc"))
            .arg("--version")
            .output()
            .unwrap()
            .stdout,
    )
    .to_string();
    let headers = common::compile_cache::headers_digest();
    let cache = Cache::new();
    let dir = std::env::temp_dir().join(format!("mucc-corpus-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let t1 = Instant::now();
    let (nvcc, mut failures, compiled_nvcc) = compile_all(
        &units,
        &cache,
        &|u: &Unit| key("nvcc", &nvcc_version, &headers, u.arch, &u.source),
        &|b, us| nvcc_batch(&home, &dir, b, us),
    );
    let nvcc_wall = t1.elapsed().as_secs_f64();
    let t2 = Instant::now();
    let (nvrtc, nvrtc_failures, compiled_nvrtc) = compile_all(
        &units,
        &cache,
        &|u: &Unit| key("nvrtc", "libnvrtc.so.13", &headers, u.arch, &u.source),
        &|b, us| nvrtc_batch(&dir, b, us),
    );
    let nvrtc_wall = t2.elapsed().as_secs_f64();
    failures.extend(nvrtc_failures);
    let _ = std::fs::remove_dir_all(&dir);

    let spills: Vec<String> = nvcc
        .iter()
        .filter(|(_, o)| o.spill_bytes > 0)
        .map(|(i, o)| format!("{}: {} bytes of spills", units[*i].name, o.spill_bytes))
        .collect();
    let (nmed, nmax) = distribution(nvcc.values().map(|o| o.secs).collect());
    let (rmed, rmax) = distribution(nvrtc.values().map(|o| o.secs).collect());
    let max_regs = nvcc.values().map(|o| o.max_registers).max().unwrap_or(0);
    let kernels: usize = nvcc.values().map(|o| o.kernels).sum();
    eprintln!(
        "nvcc: {} files ({compiled_nvcc} compiled now, in batches of up to {BATCH}; the rest cached) in {nvcc_wall:.1} s wall; per file median {nmed:.2} s, max {nmax:.2} s (batch time shared); {kernels} kernels, at most {max_regs} registers",
        nvcc.len()
    );
    eprintln!(
        "nvrtc: {} files ({compiled_nvrtc} compiled now, in batches of up to {BATCH}; the rest cached) in {nvrtc_wall:.1} s wall; per file median {rmed:.2} s, max {rmax:.2} s (batch time shared)",
        nvrtc.len()
    );
    assert!(
        failures.is_empty(),
        "{} compile failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(nvcc.len(), units.len());
    assert_eq!(nvrtc.len(), units.len());
    assert!(spills.is_empty(), "register spills:\n{}", spills.join("\n"));
}
