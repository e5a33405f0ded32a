//! The build-script API (`mucc::buildscript`): the bindings of two corpus graphs for sm_80 and
//! sm_90a (golden `golden/bindings/mucc_kernels.rs`, re-bless with `MUCC_BLESS=1`), their static
//! libraries (prefixed symbols only, so that they link together), errors that name the file,
//! graph and failing step (nvcc's log attached), and the example crate `examples/rust-embed`:
//! it builds and links with the pinned toolchain, and its build script reruns when a graph file
//! changes and only then.
//!
//! Needs the CUDA 13.0 toolchain of `scripts/cuda-toolchain.sh` (which `scripts/test.sh`
//! sources); without it the tests fail, naming the script, unless `MUCC_SKIP_CUDA=1`.

#![cfg(feature = "buildscript")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::golden;
use mucc::buildscript::{BuildError, Kernels, Stage};
use mucc::target::Arch;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether the toolchain is there (`false` only when the tests are explicitly skipped).
fn have_cuda() -> bool {
    if std::env::var_os("MUCC_SKIP_CUDA").is_some_and(|v| v == "1") {
        eprintln!("MUCC_SKIP_CUDA=1: skipping the build-script tests");
        return false;
    }
    let home = std::env::var_os("MUCC_CUDA_HOME").map(PathBuf::from).expect(
        "MUCC_CUDA_HOME is not set: run `source scripts/cuda-toolchain.sh` first (or set MUCC_SKIP_CUDA=1)",
    );
    assert!(
        home.join("bin/nvcc").exists(),
        "no nvcc under {}",
        home.display()
    );
    true
}

/// A fresh scratch folder under cargo's per-test temporary folder.
fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The corpus file `name`, as a path relative to the crate (tests run there), so that the
/// golden bindings do not depend on where the repository is.
fn corpus(name: &str) -> PathBuf {
    let p = Path::new("../shared/corpus/mirage-benchmarks").join(name);
    assert!(crate_dir().join(&p).is_file(), "{} is missing", p.display());
    p
}

#[test]
fn bindings_and_libraries_of_two_graphs_for_two_architectures() {
    if !have_cuda() {
        return;
    }
    let out = scratch("buildscript-two-graphs");
    let compiled = Kernels::new()
        .graph(corpus("single_gated_mlp.json"), 0, "gated_mlp")
        .graph(corpus("rmsnorm_bs1.json"), 0, "rmsnorm")
        .arch(Arch::Sm80)
        .arch(Arch::Sm90a)
        .out_dir(&out)
        .cargo_metadata(false)
        .crate_id("mucc-tests")
        .compile("mucc_kernels")
        .unwrap_or_else(|e| panic!("{e}"));

    // The bindings: names, element types, buffers, workspace constant, one entry per arch.
    let text = std::fs::read_to_string(&compiled.bindings).unwrap();
    assert_eq!(compiled.bindings, out.join("mucc_kernels.rs"));
    golden("bindings/mucc_kernels.rs", &text);
    for needle in [
        "pub mod gated_mlp {",
        "pub mod rmsnorm {",
        "pub const WORKSPACE_BYTES: usize = 131072;",
        "pub const WORKSPACE_BYTES: usize = 0;",
        "pub const ARCHS: [&str; 2] = [\"sm_80\", \"sm_90a\"];",
        "input0: &impl ::cudarc::driver::DevicePtr<::half::f16>,",
        "output0: &mut impl ::cudarc::driver::DevicePtrMut<::half::f16>,",
        "workspace: &mut impl ::cudarc::driver::DevicePtrMut<u8>,",
        "(9, 0) => unsafe {",
        "(8, 0) => unsafe {",
    ] {
        assert!(text.contains(needle), "bindings lack `{needle}`");
    }
    // One entry per graph and architecture, named after the library, graph and architecture
    // and ended by a digest that sets this crate apart.
    for g in &compiled.graphs {
        for f in &g.files {
            let tag = f.arch.to_string().replace('_', "");
            let entry = &f.launch.entry;
            assert!(
                entry.starts_with(&format!("mucc_kernels_{}_{tag}_", g.name)),
                "{entry}"
            );
            assert_eq!(&f.library, entry);
            assert!(
                text.contains(&format!("fn {entry}(")),
                "bindings lack {entry}"
            );
            let line = format!("cargo:rustc-link-lib=static={entry}");
            assert!(
                compiled.cargo_lines.contains(&line),
                "no `{line}` in {:#?}",
                compiled.cargo_lines
            );
        }
    }
    // The bundled runtime headers were written under the output folder, nowhere else.
    let headers = std::fs::read_dir(out.join("mucc/runtime-headers"))
        .unwrap()
        .map(|e| e.unwrap().path().join("mucc/host.h"))
        .filter(|p| p.is_file())
        .count();
    assert_eq!(headers, 1);
    // rmsnorm needs no workspace: its launch takes none.
    let rms = &text[text.find("pub mod rmsnorm").unwrap()..];
    assert!(!rms.contains("workspace: &mut"));

    // The cargo lines: rerun on each graph file, link each library, the CUDA runtime.
    for line in [
        "cargo:rerun-if-changed=../shared/corpus/mirage-benchmarks/single_gated_mlp.json",
        "cargo:rerun-if-changed=../shared/corpus/mirage-benchmarks/rmsnorm_bs1.json",
        "cargo:rustc-link-lib=cudart_static",
    ] {
        assert!(
            compiled.cargo_lines.iter().any(|l| l == line),
            "no `{line}` in {:#?}",
            compiled.cargo_lines
        );
    }
    assert!(!compiled.cargo_lines.iter().any(|l| l.contains("cublas")));

    // Every file has its own symbols; the generated lines stay within 120 characters.
    assert_eq!(compiled.graphs.len(), 2);
    let mut kernel_names = Vec::new();
    for g in &compiled.graphs {
        assert_eq!(g.files.len(), 2);
        for f in &g.files {
            let src = std::fs::read_to_string(&f.source).unwrap();
            assert!(!src.contains("mucc_execute"), "{}", f.source.display());
            assert!(src.contains(&format!("extern \"C\" int {}(", f.launch.entry)));
            for l in src.lines() {
                assert!(l.len() <= 120, "{}: {l}", f.source.display());
            }
            let lib = compiled.lib_dir.join(format!("lib{}.a", f.library));
            let bytes = std::fs::read(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
            let has = |s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
            assert!(
                has(&f.launch.entry),
                "{} lacks {}",
                lib.display(),
                f.launch.entry
            );
            for step in &f.launch.steps {
                if let mucc::emit::launch::Step::Kernel(k) = step {
                    // The graph's name, the architecture and the digest.
                    let tag = f.arch.to_string().replace('_', "");
                    assert!(
                        k.name.starts_with(&format!("{}_{tag}_", g.name)),
                        "{}",
                        k.name
                    );
                    assert!(has(&k.name), "{} lacks {}", lib.display(), k.name);
                    kernel_names.push(k.name.clone());
                }
            }
        }
    }
    let n = kernel_names.len();
    kernel_names.sort();
    kernel_names.dedup();
    assert_eq!(
        kernel_names.len(),
        n,
        "kernel symbols collide: {kernel_names:?}"
    );

    // A second run with nothing changed leaves the generated files alone.
    let before: Vec<_> = compiled
        .graphs
        .iter()
        .flat_map(|g| &g.files)
        .map(|f| std::fs::metadata(&f.source).unwrap().modified().unwrap())
        .collect();
    let again = Kernels::new()
        .graph(corpus("single_gated_mlp.json"), 0, "gated_mlp")
        .graph(corpus("rmsnorm_bs1.json"), 0, "rmsnorm")
        .arch(Arch::Sm80)
        .arch(Arch::Sm90a)
        .out_dir(&out)
        .cargo_metadata(false)
        .crate_id("mucc-tests")
        .compile("mucc_kernels")
        .unwrap();
    let after: Vec<_> = again
        .graphs
        .iter()
        .flat_map(|g| &g.files)
        .map(|f| std::fs::metadata(&f.source).unwrap().modified().unwrap())
        .collect();
    assert_eq!(before, after);
}

#[test]
fn errors_name_the_file_the_graph_and_the_step() {
    if !have_cuda() {
        return;
    }
    let out = scratch("buildscript-errors");
    let build = |k: Kernels| {
        k.out_dir(&out)
            .cargo_metadata(false)
            .compile("k")
            .unwrap_err()
    };

    let e = build(Kernels::new().graph("no/such.json", 0, "g"));
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            BuildError::Graph {
                stage: Stage::Read,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("no/such.json, graph 0 (`g`): reading failed"),
        "{msg}"
    );

    let e = build(Kernels::new().graph(corpus("single_gated_mlp.json"), 3, "g"));
    assert!(
        e.to_string().contains(
            "single_gated_mlp.json, graph 3 (`g`): reading failed: the file has 1 graph(s)"
        ),
        "{e}"
    );

    // A file that is not a µGraph: the importer's message, with the file.
    let bad = out.join("bad.json");
    std::fs::write(&bad, "{\"not\": \"a graph\"}").unwrap();
    let e = build(Kernels::new().graph(&bad, 0, "g"));
    assert!(
        matches!(
            e,
            BuildError::Graph {
                stage: Stage::Read,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("bad.json"), "{e}");

    // nvcc fails: its output comes with the error, which names the graph and architecture.
    let fake = out.join("fake-bin");
    std::fs::create_dir_all(&fake).unwrap();
    let nvcc = fake.join("nvcc");
    std::fs::write(&nvcc, "#!/bin/sh\necho 'fake nvcc: boom' >&2\nexit 1\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&nvcc, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    if std::env::var_os("NVCC").is_none() {
        let e = build(
            Kernels::new()
                .graph(corpus("rmsnorm_bs1.json"), 0, "rmsnorm")
                .nvcc(&nvcc),
        );
        let msg = e.to_string();
        assert!(
            matches!(
                e,
                BuildError::Graph {
                    stage: Stage::Compile,
                    ..
                }
            ),
            "{msg}"
        );
        assert!(
            msg.contains(
                "rmsnorm_bs1.json, graph 0 (`rmsnorm`), sm_90a: compiling with nvcc failed"
            ),
            "{msg}"
        );
        assert!(msg.contains("boom"), "nvcc's log is attached: {msg}");
    }

    // A compiler not named nvcc cannot be run by the cc crate: said before anything runs.
    let e = build(
        Kernels::new()
            .graph(corpus("rmsnorm_bs1.json"), 0, "rmsnorm")
            .nvcc("/usr/bin/false"),
    );
    if std::env::var_os("NVCC").is_none() {
        assert!(e.to_string().contains("name the compiler nvcc"), "{e}");
    }
}

/// `cargo build -v` of the example copy in `dir` (with `env` set); its status and stderr.
fn cargo_build(dir: &Path, target: &Path, env: &[(&str, &Path)]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO"));
    // `--locked`: the example's committed Cargo.lock must be up to date, or building it in a
    // checkout rewrites the file.
    cmd.args(["build", "-v", "--locked"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        // The test builds and links the example but never runs its interpreter: no
        // optimisation or debug info for mucc (25% of the test's build time on two cores), and
        // no incremental state (a copy of the example builds from scratch once).
        .env("CARGO_PROFILE_DEV_PACKAGE_MUCC_OPT_LEVEL", "0")
        .env("CARGO_PROFILE_DEV_DEBUG", "false")
        .env("CARGO_INCREMENTAL", "0")
        .env_remove("MUCC_EMBED_ARCHS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("cargo runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `cargo build -v` of the example copy in `dir`; returns whether its build script ran.
fn build_example(dir: &Path, target: &Path) -> bool {
    let (ok, log) = cargo_build(dir, target, &[]);
    assert!(
        ok || !log.contains("--locked"),
        "examples/rust-embed/Cargo.lock is out of date (mucc's dependencies changed): run \
         `cargo tree` in examples/rust-embed and commit the lock file it updates:\n{log}"
    );
    assert!(ok, "cargo build of the example failed:\n{log}");
    log.lines().any(|l| {
        l.contains("Running `")
            && l.contains("mucc-rust-embed-")
            && l.contains("build-script-build")
    })
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name == "target" {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(&name));
        } else {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

/// Where the example builds: kept between runs of the test, so that only the first compiles
/// its dependencies — under mucc's cache folder (`$MUCC_CACHE_DIR`, default `~/.cache/mucc`),
/// which outlives a checkout (CI's clean clones), or under cargo's per-test temporary folder
/// with `MUCC_NO_CACHE=1` or no home.
fn example_target_dir() -> PathBuf {
    common::compile_cache::cache_folder("rust-embed-target")
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rust-embed-target"))
}

#[test]
fn example_crate_builds_links_and_reruns_only_when_a_graph_changes() {
    if !have_cuda() {
        return;
    }
    // A copy, so that the test can edit a graph file; mucc by absolute path.
    let dir = scratch("rust-embed");
    copy_dir(&crate_dir().join("examples/rust-embed"), &dir);
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let root = crate_dir().display().to_string();
    let patched = text.replace("path = \"../..\"", &format!("path = {root:?}"));
    assert_ne!(patched, text);
    std::fs::write(&manifest, patched).unwrap();
    let target = example_target_dir();

    let bin = target.join("debug/mucc-rust-embed");
    build_example(&dir, &target);
    assert!(bin.is_file(), "the example links into {}", bin.display());
    assert!(
        !build_example(&dir, &target),
        "nothing changed: the build script must not rerun"
    );

    // A file of the crate that is no graph: no rerun.
    std::fs::write(dir.join("NOTES.txt"), "not a graph\n").unwrap();
    assert!(
        !build_example(&dir, &target),
        "a non-graph file changed: no rerun"
    );

    // A graph file changes (same graph, reformatted): the build script reruns.
    let graph = dir.join("kernels/rmsnorm_bs1.json");
    let json = std::fs::read_to_string(&graph).unwrap();
    // Cargo compares modification times at a one-second grain on some file systems.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    std::fs::write(&graph, format!("{json}\n")).unwrap();
    assert!(
        build_example(&dir, &target),
        "a graph file changed: the build script must rerun"
    );
    assert!(
        !build_example(&dir, &target),
        "nothing changed since: no rerun"
    );

    // nvcc fails (cc runs `$NVCC`): the build fails, naming the graph, the architecture and the
    // step, with nvcc's own output.
    let fake = dir.join("fake-bin/nvcc");
    std::fs::create_dir_all(fake.parent().unwrap()).unwrap();
    std::fs::write(&fake, "#!/bin/sh\necho 'fake nvcc: boom' >&2\nexit 1\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (ok, log) = cargo_build(&dir, &target, &[("NVCC", &fake)]);
    assert!(!ok, "a failing nvcc must fail the build:\n{log}");
    assert!(
        log.contains("(`gated_mlp`), sm_90a: compiling with nvcc failed")
            || log.contains("(`rmsnorm`), sm_90a: compiling with nvcc failed"),
        "{log}"
    );
    assert!(
        log.contains("fake nvcc: boom"),
        "nvcc's log is attached: {log}"
    );
}
