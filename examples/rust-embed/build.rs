//! Compiles two µGraphs with nvcc (through the `cc` crate) and writes their Rust bindings to
//! `$OUT_DIR/mucc_kernels.rs`. `MUCC_EMBED_ARCHS` (comma-separated, default `sm_90a`) picks the
//! architectures.

use mucc::buildscript::Kernels;
use mucc::target::Arch;

fn main() {
    println!("cargo:rerun-if-env-changed=MUCC_EMBED_ARCHS");
    let archs = std::env::var("MUCC_EMBED_ARCHS").unwrap_or_else(|_| "sm_90a".into());
    let mut kernels = Kernels::new()
        .graph("kernels/single_gated_mlp.json", 0, "gated_mlp")
        .graph("kernels/rmsnorm_bs1.json", 0, "rmsnorm");
    for a in archs.split(',') {
        match a.trim().parse::<Arch>() {
            Ok(arch) => kernels = kernels.arch(arch),
            Err(e) => {
                eprintln!("MUCC_EMBED_ARCHS: {e}");
                std::process::exit(1);
            }
        }
    }
    if let Err(e) = kernels.compile("mucc_kernels") {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
