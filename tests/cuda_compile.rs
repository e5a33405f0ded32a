//! Every golden `.cu` (kernel-level and threadblock) compiles with nvcc for sm_80 and sm_90a
//! (host code included), with no error, no warning and no register spill, and through NVRTC for
//! both targets — except `*.sm_90a.cu` goldens (Hopper features), compiled for sm_90a only.
//!
//! Needs the CUDA 13.0 toolchain of `scripts/cuda-toolchain.sh` (which `scripts/test.sh`
//! sources): nvcc from `$MUCC_CUDA_HOME/bin` and `libnvrtc.so.13` on `LD_LIBRARY_PATH`. Without
//! it the tests fail, naming the script, unless `MUCC_SKIP_CUDA=1`.
//!
//! Successful compiles are cached by content (`tests/common/compile_cache.rs`, folder
//! `golden-cuda`): a golden, runtime header or compiler that changes is compiled again;
//! `MUCC_NO_CACHE=1` compiles everything.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rayon::prelude::*;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The toolchain root, or `None` when the tests are explicitly skipped.
fn cuda_home() -> Option<PathBuf> {
    if std::env::var_os("MUCC_SKIP_CUDA").is_some_and(|v| v == "1") {
        eprintln!("MUCC_SKIP_CUDA=1: skipping the CUDA compile checks");
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

fn golden_sources() -> Vec<PathBuf> {
    let mut all = Vec::new();
    for (dir, at_least) in [("golden/kernel", 12), ("golden/threadblock", 18)] {
        let mut v: Vec<PathBuf> = std::fs::read_dir(crate_dir().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "cu"))
            .collect();
        v.sort();
        assert!(
            v.len() >= at_least,
            "at least {at_least} golden files in {dir}"
        );
        all.extend(v);
    }
    all
}

/// The targets a golden compiles for: sm_90a alone for code written for sm_90a (it may use
/// Hopper features), both otherwise.
fn archs_of(src: &Path) -> &'static [&'static str] {
    if src.to_string_lossy().ends_with(".sm_90a.cu") {
        &["sm_90a"]
    } else {
        &["sm_80", "sm_90a"]
    }
}

/// ptxas figures of one compile.
#[derive(Debug, Default)]
struct Figures {
    max_registers: u32,
    spill_bytes: u32,
    kernels: usize,
}

fn ptxas_figures(log: &str) -> Figures {
    let mut f = Figures::default();
    for line in log.lines() {
        if let Some(rest) = line.split("Used ").nth(1)
            && let Some(n) = rest.split(' ').next().and_then(|n| n.parse::<u32>().ok())
        {
            f.max_registers = f.max_registers.max(n);
            f.kernels += 1;
        }
        if line.contains("spill stores") {
            for part in line.split(',') {
                let words: Vec<&str> = part.split_whitespace().collect();
                if let [n, "bytes", "spill", ..] = words.as_slice() {
                    f.spill_bytes += n.parse::<u32>().unwrap_or(0);
                }
            }
        }
    }
    f
}

/// The figures and seconds of a compile, or why it failed.
type Compiled = Result<(Figures, f64), String>;

/// The cache of this file's compiles, and what every key includes: nvcc's version and the
/// runtime headers' digest.
fn cache() -> &'static (common::compile_cache::CompileCache, String, String) {
    static CACHE: std::sync::OnceLock<(common::compile_cache::CompileCache, String, String)> =
        std::sync::OnceLock::new();
    CACHE.get_or_init(|| {
        let home = std::env::var_os("MUCC_CUDA_HOME").map(PathBuf::from);
        let version = home
            .and_then(|h| {
                Command::new(h.join("bin/nvcc"))
                    .arg("--version")
                    .output()
                    .ok()
            })
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        (
            common::compile_cache::CompileCache::new("golden-cuda"),
            version,
            common::compile_cache::headers_digest(),
        )
    })
}

/// [`nvcc`] through the cache: a hit returns the figures of the first compile (no spills, or
/// it would not have been stored) and 0 seconds.
fn nvcc_cached(home: &Path, src: &Path) -> Compiled {
    let (cache, version, headers) = cache();
    let text = std::fs::read_to_string(src).map_err(|e| format!("{}: {e}", src.display()))?;
    let nccl = std::env::var("MUCC_NCCL_HOME").unwrap_or_default();
    let archs = archs_of(src).join(",");
    let key = common::compile_cache::key(&["golden-nvcc", version, headers, &archs, &nccl, &text]);
    if let Some(line) = cache.get(&key) {
        let v: Vec<&str> = line.split_whitespace().collect();
        if let [kernels, regs] = v.as_slice()
            && let (Ok(kernels), Ok(max_registers)) = (kernels.parse(), regs.parse())
        {
            let f = Figures {
                max_registers,
                spill_bytes: 0,
                kernels,
            };
            return Ok((f, 0.0));
        }
    }
    let r = nvcc(home, src)?;
    cache.put(&key, &format!("{} {}", r.0.kernels, r.0.max_registers));
    Ok(r)
}

/// [`nvrtc`] through the cache (0 seconds on a hit).
fn nvrtc_cached(home: &Path, src: &str, arch: &'static str) -> Result<f64, String> {
    let (cache, _, headers) = cache();
    let key = common::compile_cache::key(&["golden-nvrtc", "libnvrtc.so.13", headers, arch, src]);
    if cache.get(&key).is_some() {
        return Ok(0.0);
    }
    let secs = nvrtc(home, src, arch)?;
    cache.put(&key, "ok");
    Ok(secs)
}

/// Compiles `src` (host and device code) for both targets.
fn nvcc(home: &Path, src: &Path) -> Compiled {
    let out = std::env::temp_dir().join(format!(
        "mucc-nvcc-{}-{}.o",
        std::process::id(),
        src.file_stem().unwrap().to_string_lossy()
    ));
    // Multi-GPU graphs include NCCL's header (scripts/cuda-toolchain.sh installs it).
    let mut nccl = Vec::new();
    if std::fs::read_to_string(src).is_ok_and(|s| s.contains("#include \"mucc/nccl.h\"")) {
        let Some(dir) = std::env::var_os("MUCC_NCCL_HOME") else {
            return Err(format!(
                "{}: includes nccl.h but MUCC_NCCL_HOME is not set (source scripts/cuda-toolchain.sh)",
                src.display()
            ));
        };
        nccl.push("-I".to_string());
        nccl.push(PathBuf::from(dir).join("include").display().to_string());
    }
    let t = Instant::now();
    let o = Command::new(home.join("bin/nvcc"))
        .args(&nccl)
        .arg("-c")
        .arg("-o")
        .arg(&out)
        .arg("-I")
        .arg(crate_dir().join("runtime-headers"))
        .arg("-std=c++17")
        .args(archs_of(src).iter().map(|a| {
            let n = a.trim_start_matches("sm_");
            format!("-gencode=arch=compute_{n},code=sm_{n}")
        }))
        .args(["-Xptxas", "-v"])
        .arg(src)
        .output()
        .map_err(|e| format!("cannot run nvcc: {e}"))?;
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&out);
    let log = String::from_utf8_lossy(&o.stderr).to_string() + &String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        return Err(format!("{}: nvcc failed:\n{log}", src.display()));
    }
    if let Some(w) = log
        .lines()
        .find(|l| l.contains("warning") || l.contains("error"))
    {
        return Err(format!("{}: nvcc reported: {w}\n{log}", src.display()));
    }
    let f = ptxas_figures(&log);
    if f.spill_bytes > 0 {
        return Err(format!(
            "{}: {} bytes of register spills\n{log}",
            src.display(),
            f.spill_bytes
        ));
    }
    Ok((f, secs))
}

#[test]
fn goldens_compile_with_nvcc_for_sm80_and_sm90a() {
    let Some(home) = cuda_home() else { return };
    let results: Vec<(PathBuf, Compiled)> = golden_sources()
        .into_par_iter()
        .map(|p| {
            let r = nvcc_cached(&home, &p);
            (p, r)
        })
        .collect();
    let mut failures = Vec::new();
    for (p, r) in &results {
        match r {
            Ok((f, secs)) => eprintln!(
                "nvcc {:<40} {:>5.2} s  {} kernels x {} target(s), max {} registers, 0 spills",
                p.file_name().unwrap().to_string_lossy(),
                secs,
                f.kernels / archs_of(p).len(),
                archs_of(p).len(),
                f.max_registers
            ),
            Err(e) => failures.push(e.clone()),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn goldens_compile_with_nvrtc() {
    let Some(home) = cuda_home() else { return };
    assert!(
        unsafe { cudarc::nvrtc::sys::is_culib_present() },
        "libnvrtc.so.13 is not loadable: run `source scripts/cuda-toolchain.sh` (it sets LD_LIBRARY_PATH)"
    );
    let mut failures = Vec::new();
    for p in golden_sources() {
        let src = std::fs::read_to_string(&p).unwrap();
        for &arch in archs_of(&p) {
            match nvrtc_cached(&home, &src, arch) {
                Ok(secs) => eprintln!(
                    "nvrtc {:<40} {arch:<6} {secs:>5.2} s",
                    p.file_name().unwrap().to_string_lossy(),
                ),
                Err(e) => failures.push(format!("{} ({arch}): {e}", p.display())),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Compiles `src` (device code) with NVRTC for `arch`: the seconds it took, or the error.
fn nvrtc(home: &Path, src: &str, arch: &'static str) -> Result<f64, String> {
    let t = Instant::now();
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
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
    cudarc::nvrtc::compile_ptx_with_opts(src, opts)
        .map(|_| t.elapsed().as_secs_f64())
        .map_err(|e| format!("{e:?}"))
}

/// Fused tensor-parallel workloads of the multi-GPU check (`mucc::graph::workloads::tp_graphs`,
/// 2 GPUs, Qwen2.5-7B sizes: cluster-split customized kernels and an NCCL all-reduce in the host
/// entry, or the all-reduce fused into the last kernel), emitted for sm_90a, compile with nvcc
/// (no warning, no spill) and NVRTC.
#[test]
fn fused_tensor_parallel_workloads_compile_for_sm90a() {
    use mucc::target::{Arch, Target};
    let Some(home) = cuda_home() else { return };
    assert!(
        unsafe { cudarc::nvrtc::sys::is_culib_present() },
        "libnvrtc.so.13 is not loadable: run `source scripts/cuda-toolchain.sh` (it sets LD_LIBRARY_PATH)"
    );
    // (name, the all-reduce fused into the kernel writing its input)
    let picked = [
        ("tp2_fmlp_m1_f16", false),
        ("tp2_fmlp_m8_bf16", false),
        ("tp2_fattn_m1_bf16", false),
        ("tp2_fattn_m8_f16", false),
        ("tp2_fmlp_m8_bf16", true),
        ("tp2_fattn_m1_f16", true),
    ];
    let dir = std::env::temp_dir().join(format!("mucc-tp-fused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let graphs = mucc::graph::workloads::tp_graphs(2).unwrap();
    let sources: Vec<(PathBuf, String)> = picked
        .iter()
        .map(|&(name, fused)| {
            let g = &graphs.iter().find(|(n, _)| n == name).unwrap().1;
            let mut opts = mucc::sched::Options::for_target(Target::new(Arch::Sm90a));
            if fused {
                opts.all_reduce = mucc::sched::exchange::AllReduceChoice::Fused;
            }
            let p = mucc::sched::plan(g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
            let e = mucc::emit::emit(g, &p, name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(e.source.contains("ncclAllReduce"), !fused, "{name}");
            assert_eq!(e.source.contains("arrive_and_sum"), fused, "{name}");
            let form = if fused { "fused." } else { "" };
            let path = dir.join(format!("{name}.{form}sm_90a.cu"));
            std::fs::write(&path, &e.source).unwrap();
            (path, e.source)
        })
        .collect();
    assert_eq!(sources.len(), picked.len());
    let failures: Vec<String> = sources
        .par_iter()
        .flat_map(|(path, src)| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let mut bad = Vec::new();
            match nvcc_cached(&home, path) {
                Ok((f, secs)) => eprintln!(
                    "nvcc {name:<40} {secs:>5.2} s  {} kernels, max {} registers, 0 spills",
                    f.kernels, f.max_registers
                ),
                Err(e) => bad.push(e),
            }
            match nvrtc_cached(&home, src, "sm_90a") {
                Ok(secs) => eprintln!("nvrtc {name:<40} sm_90a {secs:>5.2} s"),
                Err(e) => bad.push(format!("{name} (NVRTC): {e}")),
            }
            bad
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
