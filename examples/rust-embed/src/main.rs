//! Runs the two µGraphs that `build.rs` compiled into this crate through their generated
//! bindings (cudarc buffers, one stream) and checks every output against mucc's CPU reference
//! interpreter (`mucc::graph::interp`) on the same inputs. Exits non-zero on any mismatch.
//!
//! Needs a GPU of an architecture the build compiled (sm_90a by default: H100/H200). The graph
//! files are read again for the reference, from this crate's folder, or from the folder given
//! as the first argument when the binary runs elsewhere.

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::f16;
use mucc::cuda::data::compare;
use mucc::graph::interp::{self, HostTensor, InputSpec, gather};
use mucc::graph::shape::{Shape, Strides};

mod kernels {
    include!(concat!(env!("OUT_DIR"), "/mucc_kernels.rs"));
}

/// A graph's inputs (drawn by mucc's seeded generator) and the reference outputs.
struct Case {
    inputs: Vec<HostTensor>,
    reference: Vec<interp::Array>,
}

/// The folder the build script's graph paths are relative to.
fn crate_dir() -> PathBuf {
    std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

/// Loads graph `graph` of `file` (relative to this crate), draws its inputs and evaluates it.
fn case(file: &str, graph: usize) -> Result<Case, Box<dyn Error>> {
    let path = crate_dir().join(file);
    let loaded = mucc::read_file(&path, &Default::default())?;
    let g = &loaded.graphs[graph].graph;
    let inputs = interp::random_inputs(g, InputSpec::default());
    let reference = interp::evaluate(g, &inputs)?;
    Ok(Case { inputs, reference })
}

/// Uploads an input as f16, padded (NaN) to the elements the bindings ask for.
fn upload(
    stream: &Arc<CudaStream>,
    t: &HostTensor,
    b: &kernels::Buffer,
) -> Result<CudaSlice<f16>, Box<dyn Error>> {
    let mut host: Vec<f16> = t.data.iter().map(|&x| f16::from_f64(x)).collect();
    host.resize(host.len().max(b.elems), f16::NAN);
    Ok(stream.clone_htod(&host)?)
}

/// An output buffer poisoned with NaN (elements the graph never writes stay NaN).
fn output(stream: &Arc<CudaStream>, b: &kernels::Buffer) -> Result<CudaSlice<f16>, Box<dyn Error>> {
    Ok(stream.clone_htod(&vec![f16::NAN; b.elems])?)
}

/// Downloads output `j`, compares it with the reference and prints the line; `Ok(false)` on a
/// mismatch.
fn check(
    graph: &str,
    stream: &Arc<CudaStream>,
    out: &CudaSlice<f16>,
    b: &kernels::Buffer,
    reference: &interp::Array,
    j: usize,
) -> Result<bool, Box<dyn Error>> {
    let host: Vec<f64> = stream.clone_dtoh(out)?.iter().map(|x| x.to_f64()).collect();
    let shape = Shape::new(b.shape).ok_or("the bindings list an invalid shape")?;
    let got = gather(shape, &Strides(b.strides.to_vec()), &host);
    let c = compare(mucc::graph::dtype::DType::F16, &got, reference);
    let ok = c.passed();
    println!(
        "{graph}: output {j} {:?} {}: rel L2 err {:.3e} (bound {:.1e}), max abs err {:.3e}, non-finite {}, sum {:.6e} (reference {:.6e}): {}",
        b.shape,
        b.dtype,
        c.rel_l2,
        c.bound,
        c.max_abs,
        c.non_finite,
        got.data.iter().sum::<f64>(),
        reference.data.iter().sum::<f64>(),
        if ok { "match" } else { "MISMATCH" }
    );
    Ok(ok)
}

fn main() -> Result<(), Box<dyn Error>> {
    let ctx = CudaContext::new(0)?;
    let (major, minor) = ctx.compute_capability()?;
    println!(
        "device 0: {} (compute capability {major}.{minor})",
        ctx.name()?
    );
    let stream = ctx.default_stream();
    let mut all_ok = true;

    {
        use kernels::gated_mlp as k;
        let c = case(k::FILE, k::GRAPH)?;
        let x = upload(&stream, &c.inputs[0], &k::INPUTS[0])?;
        let w1 = upload(&stream, &c.inputs[1], &k::INPUTS[1])?;
        let w2 = upload(&stream, &c.inputs[2], &k::INPUTS[2])?;
        let mut out = output(&stream, &k::OUTPUTS[0])?;
        let mut workspace = stream.alloc_zeros::<u8>(k::WORKSPACE_BYTES)?;
        k::launch(&stream, &x, &w1, &w2, &mut out, &mut workspace)?;
        stream.synchronize()?;
        all_ok &= check(k::NAME, &stream, &out, &k::OUTPUTS[0], &c.reference[0], 0)?;
    }
    {
        use kernels::rmsnorm as k;
        let c = case(k::FILE, k::GRAPH)?;
        let x = upload(&stream, &c.inputs[0], &k::INPUTS[0])?;
        let w = upload(&stream, &c.inputs[1], &k::INPUTS[1])?;
        let mut out = output(&stream, &k::OUTPUTS[0])?;
        k::launch(&stream, &x, &w, &mut out)?;
        stream.synchronize()?;
        all_ok &= check(k::NAME, &stream, &out, &k::OUTPUTS[0], &c.reference[0], 0)?;
    }

    // The bindings refuse a buffer that is too small, before anything runs.
    {
        use kernels::rmsnorm as k;
        let small = stream.alloc_zeros::<f16>(1)?;
        let w = stream.alloc_zeros::<f16>(k::INPUTS[1].elems)?;
        let mut out = stream.alloc_zeros::<f16>(k::OUTPUTS[0].elems)?;
        match k::launch(&stream, &small, &w, &mut out) {
            Err(e @ kernels::Error::TooSmall { .. }) => {
                println!("rmsnorm with a 1-element input: {e}")
            }
            other => {
                println!("rmsnorm with a 1-element input: expected TooSmall, got {other:?}");
                all_ok = false;
            }
        }
    }

    if !all_ok {
        return Err("an output did not match the reference".into());
    }
    println!("both graphs match the reference");
    Ok(())
}
