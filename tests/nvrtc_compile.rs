//! `mucc::cuda::compile`: NVRTC to cubin in process, the disk cache, embedded runtime headers,
//! and the errors a user sees.
//!
//! Needs the CUDA 13.0 NVRTC of `scripts/cuda-toolchain.sh` (as `tests/cuda_compile.rs` does);
//! `MUCC_SKIP_CUDA=1` skips.

use std::path::{Path, PathBuf};

use mucc::cuda::{CompileError, Compiler, CompilerOptions, Source};
use mucc::target::Arch;

fn skip() -> bool {
    if std::env::var_os("MUCC_SKIP_CUDA").is_some_and(|v| v == "1") {
        eprintln!("MUCC_SKIP_CUDA=1: skipping the NVRTC tests");
        return true;
    }
    assert!(
        mucc::cuda::compile::nvrtc_available(),
        "libnvrtc.so.13 is not loadable: run `source scripts/cuda-toolchain.sh` (or set MUCC_SKIP_CUDA=1)"
    );
    false
}

/// A fresh, empty folder under the system temp folder, removed on drop.
struct TempDir(PathBuf);
impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("mucc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn golden(name: &str) -> (String, String) {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(name);
    (
        p.display().to_string(),
        std::fs::read_to_string(&p).unwrap(),
    )
}

#[test]
fn second_compile_is_a_cache_hit_with_the_same_cubin_and_damaged_entries_are_rebuilt() {
    if skip() {
        return;
    }
    let cache = TempDir::new("nvrtc-cache");
    let compiler = Compiler::new(CompilerOptions {
        cache_dir: Some(cache.0.clone()),
        ..Default::default()
    })
    .unwrap();
    // The embedded headers were installed under the cache folder.
    assert!(compiler.runtime_headers().starts_with(&cache.0));
    assert!(
        compiler
            .runtime_headers()
            .join("mucc/threadblock/matmul.h")
            .is_file()
    );
    let (path, text) = golden("threadblock/matmul_3x50x13_bf16.sm_80.cu");
    for arch in [Arch::Sm80, Arch::Sm90a] {
        let src = Source {
            path: &path,
            text: &text,
            arch,
        };
        let first = compiler.compile(&src).unwrap();
        assert!(!first.cached, "{arch}: nothing was cached yet");
        assert_eq!(
            &first.bytes[..4],
            b"\x7fELF",
            "{arch}: a cubin is an ELF image"
        );
        let second = compiler.compile(&src).unwrap();
        assert!(second.cached, "{arch}: the second compile reads the cache");
        assert_eq!(first.bytes, second.bytes);
        assert_eq!(first.key, second.key);
        // A truncated entry, then a corrupted one: detected, compiled again, repaired.
        let entry = cache.0.join("nvrtc").join(format!("{}.entry", first.key));
        let good = std::fs::read(&entry).unwrap();
        std::fs::write(&entry, &good[..good.len() / 2]).unwrap();
        let again = compiler.compile(&src).unwrap();
        assert!(!again.cached, "{arch}: a truncated entry is not used");
        assert_eq!(again.bytes, first.bytes);
        assert_eq!(
            std::fs::read(&entry).unwrap(),
            good,
            "{arch}: the entry is rewritten"
        );
        let mut bad = good.clone();
        let n = bad.len();
        bad[n - 100] ^= 0xff;
        std::fs::write(&entry, &bad).unwrap();
        let again = compiler.compile(&src).unwrap();
        assert!(!again.cached, "{arch}: a corrupted entry is not used");
        assert_eq!(again.bytes, first.bytes);
        assert!(compiler.compile(&src).unwrap().cached);
        eprintln!(
            "{arch}: compiled in {:.2} s, cache hit in {:.4} s, {} bytes",
            first.seconds,
            second.seconds,
            first.bytes.len()
        );
    }
    // Another target, another source or other options: another key.
    let a = Source {
        path: &path,
        text: &text,
        arch: Arch::Sm80,
    };
    let b = Source {
        arch: Arch::Sm90a,
        ..a
    };
    let edited = format!("{text}\n// edited\n");
    let c = Source { text: &edited, ..a };
    let k = compiler.key(&a);
    assert_ne!(k, compiler.key(&b));
    assert_ne!(k, compiler.key(&c));
    let with_lineinfo = Compiler::new(CompilerOptions {
        cache_dir: Some(cache.0.clone()),
        extra_options: vec!["-lineinfo".into()],
        ..Default::default()
    })
    .unwrap();
    assert_ne!(k, with_lineinfo.key(&a));
}

#[test]
fn no_cache_compiles_every_time_and_many_compile_in_parallel() {
    if skip() {
        return;
    }
    let cache = TempDir::new("nvrtc-nocache");
    let compiler = Compiler::new(CompilerOptions {
        cache_dir: Some(cache.0.clone()),
        no_cache: true,
        ..Default::default()
    })
    .unwrap();
    let names = [
        "kernel/unary_chain_f16.sm_80.cu",
        "threadblock/tiles_7x13_f32.sm_80.cu",
        "threadblock/online_softmax_f16.sm_80.cu",
    ];
    let files: Vec<(String, String)> = names.iter().map(|n| golden(n)).collect();
    let srcs: Vec<Source> = files
        .iter()
        .map(|(p, t)| Source {
            path: p,
            text: t,
            arch: Arch::Sm90a,
        })
        .collect();
    for _ in 0..2 {
        for (r, n) in compiler.compile_all(&srcs).into_iter().zip(names) {
            let c = r.unwrap_or_else(|e| panic!("{n}: {e}"));
            assert!(!c.cached, "{n}: no_cache never reads the cache");
            assert_eq!(&c.bytes[..4], b"\x7fELF");
        }
    }
    assert!(!cache.0.join("nvrtc").exists(), "no_cache writes no cubin");
}

#[test]
fn errors_name_the_source_and_carry_the_log() {
    if skip() {
        return;
    }
    let cache = TempDir::new("nvrtc-errors");
    let compiler = Compiler::new(CompilerOptions {
        cache_dir: Some(cache.0.clone()),
        ..Default::default()
    })
    .unwrap();
    let text = "#include \"mucc/runtime.h\"\nextern \"C\" __global__ void k(float* x) { x[0] = undeclared_name; }\n";
    let err = compiler
        .compile(&Source {
            path: "/some/where/broken.cu",
            text,
            arch: Arch::Sm80,
        })
        .unwrap_err();
    assert!(matches!(err, CompileError::Failed { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with("/some/where/broken.cu: NVRTC failed to compile it for sm_80:"),
        "{msg}"
    );
    assert!(
        msg.contains("undeclared_name"),
        "the log names the problem: {msg}"
    );
    // Failures are not cached.
    assert!(
        std::fs::read_dir(cache.0.join("nvrtc")).map_or(true, |mut d| d.next().is_none()),
        "a failed compile leaves no cubin"
    );

    // A runtime-headers folder that is not one.
    let err = Compiler::new(CompilerOptions {
        cache_dir: Some(cache.0.clone()),
        runtime_headers: Some(cache.0.join("nowhere")),
        ..Default::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("mucc/runtime.h"), "{err}");

    // A CUDA include folder without the CUDA headers.
    let err = Compiler::new(CompilerOptions {
        cache_dir: Some(cache.0.clone()),
        cuda_include: Some(cache.0.clone()),
        ..Default::default()
    })
    .unwrap_err();
    assert!(matches!(err, CompileError::NoCudaHeaders(_)), "{err:?}");
    assert!(err.to_string().contains("MUCC_CUDA_INCLUDE"), "{err}");
}

/// The Hopper header compiles under NVRTC for sm_90a, every wrapper instantiated (the GPU checks
/// what they do: `scripts/gpu/sm90_selftest.cu`).
#[test]
fn the_hopper_header_compiles_under_nvrtc_for_sm90a() {
    if skip() {
        return;
    }
    let compiler = Compiler::new(CompilerOptions::default()).unwrap();
    let text = r#"
#include "mucc/arch/sm90.h"
using namespace mucc;
extern "C" __global__ void __launch_bounds__(256, 1) __cluster_dims__(2, 1, 1)
hopper(const __grid_constant__ sm90::TensorMap map, float* out) {
  __shared__ alignas(1024) float tile[16][32];
  __shared__ alignas(8) u64 bar[2];
  sm90::grid_dependency_wait();
  if (threadIdx.x == 0) {
    sm90::prefetch_tensormap(&map);
    sm90::mbar_init(&bar[0], 1);
    sm90::mbar_init(&bar[1], 1);
    sm90::fence_mbarrier_init();
  }
  sm90::cluster_sync();
  sm90::RingState<2> ring;
  if (threadIdx.x == 0) {
    sm90::mbar_arrive_expect_tx(&bar[0], sizeof tile);
    sm90::tma_load(tile, &map, &bar[0], 0);
    sm90::tma_load(tile, &map, &bar[0], 0, 1);
    sm90::tma_load(tile, &map, &bar[0], 0, 1, 2);
    sm90::tma_load(tile, &map, &bar[0], 0, 1, 2, 3);
    sm90::tma_load(tile, &map, &bar[0], 0, 1, 2, 3, 4);
    sm90::tma_load_multicast(tile, &map, &bar[0], 3, 0, 0);
    sm90::mbar_expect_tx(&bar[1], 4);
    sm90::mbar_arrive(&bar[1]);
  }
  sm90::mbar_wait(&bar[ring.stage], ring.parity);
  ring.advance();
  if (threadIdx.x < 128) sm90::regs_shrink<40>(); else sm90::regs_grow<232>();
  unsigned peer = sm90::map_rank(&tile[0][0], sm90::cluster_rank() ^ 1u);
  float v = sm90::ld_cluster_f32(peer) + (float)sm90::ld_cluster_u32(peer) + (float)sm90::cluster_size();
  sm90::st_cluster_f32(peer, v);
  sm90::cluster_arrive();
  sm90::cluster_wait();
  sm90::fence_proxy_async();
  if (threadIdx.x == 0) {
    sm90::tma_store(&map, tile, 0, 0);
    sm90::bulk_commit();
    sm90::bulk_wait_read<0>();
    sm90::bulk_wait<0>();
  }
  sm90::launch_dependents();
  out[threadIdx.x] = v;
}
"#;
    let cubin = compiler
        .compile(&Source {
            path: "hopper.cu",
            text,
            arch: Arch::Sm90a,
        })
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(cubin.bytes.starts_with(b"\x7fELF"), "not a cubin");
    assert!(cubin.log.trim().is_empty(), "NVRTC warned: {}", cubin.log);
}
