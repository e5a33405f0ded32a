//! The Rust bindings [`super::Kernels::compile`] writes: for each graph a module with its
//! buffers, workspace size, the `extern "C"` host entries (one per architecture) and a safe
//! `launch` over cudarc device buffers. The text goes into the user's crate through
//! `include!`, so it has no inner attributes and names every outside item by its full path
//! (`::cudarc`, `::half`, `::core`).

use std::fmt::Write;

use super::CompiledGraph;
use crate::emit::launch::TensorDirective;
use crate::graph::dtype::DType;
use crate::target::Arch;

/// The Rust element type of `dt` in the bindings, or `None` when it has none.
pub fn rust_type(dt: DType) -> Option<&'static str> {
    match dt {
        DType::F16 => Some("::half::f16"),
        DType::BF16 => Some("::half::bf16"),
        // No Rust type holds one element of these.
        DType::F8 | DType::F4 | DType::I4 | DType::U4 => None,
        // The primitive types are spelled as mucc names the dtypes.
        DType::F32
        | DType::F64
        | DType::I8
        | DType::U8
        | DType::I16
        | DType::U16
        | DType::I32
        | DType::U32
        | DType::I64
        | DType::U64 => Some(dt.name()),
    }
}

/// The compute capabilities whose kernels `arch` provides, as a Rust pattern over
/// `(major, minor)`.
fn capability_pattern(arch: Arch) -> &'static str {
    match arch {
        // sm_90a code runs on compute capability 9.0 only.
        Arch::Sm90a => "(9, 0)",
        // sm_80 plans assume the A100's shared memory (164 KiB per SM); 8.6 and 8.9 parts
        // have less, so they are refused (Error::Unsupported) rather than failing to launch.
        Arch::Sm80 => "(8, 0)",
    }
}

/// The items every bindings file starts with: the buffer description and the error type.
const PRELUDE: &str = r#"/// A buffer of a graph: element type, logical shape, element strides and the elements a device
/// buffer must hold at least.
#[allow(dead_code)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Element type (`f16`, `bf16`, `f32`, …).
    pub dtype: &'static str,
    /// Logical shape.
    pub shape: &'static [usize],
    /// Element strides of the shape's dims.
    pub strides: &'static [usize],
    /// Elements the device buffer must hold at least.
    pub elems: usize,
}

/// Why a graph did not run.
#[allow(dead_code)]
#[derive(Debug)]
pub enum Error {
    /// A buffer holds fewer elements than the graph needs.
    TooSmall {
        /// The graph.
        graph: &'static str,
        /// Which buffer (`input 0`, `workspace`).
        buffer: &'static str,
        /// Elements needed.
        needed: usize,
        /// Elements it holds.
        len: usize,
    },
    /// A buffer's address is not aligned as the kernels need.
    Misaligned {
        /// The graph.
        graph: &'static str,
        /// Which buffer.
        buffer: &'static str,
        /// The alignment needed, in bytes.
        align: usize,
    },
    /// A buffer belongs to another CUDA context than the stream.
    Context {
        /// The graph.
        graph: &'static str,
        /// Which buffer.
        buffer: &'static str,
    },
    /// The device's compute capability has no compiled kernels.
    Unsupported {
        /// The graph.
        graph: &'static str,
        /// Compute capability.
        major: i32,
        /// Compute capability.
        minor: i32,
        /// The architectures compiled.
        compiled: &'static [&'static str],
    },
    /// The CUDA driver failed (binding the context, querying the device).
    Driver(::cudarc::driver::DriverError),
    /// The graph's host entry returned a `cudaError_t`.
    Cuda {
        /// The graph.
        graph: &'static str,
        /// The error code.
        code: i32,
    },
    /// The graph's host entry returned a `cublasStatus_t`.
    Cublas {
        /// The graph.
        graph: &'static str,
        /// The status.
        status: i32,
    },
}

impl ::core::fmt::Display for Error {
    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
        match self {
            Error::TooSmall { graph, buffer, needed, len } => write!(
                f,
                "{graph}: {buffer} holds {len} elements; the graph needs {needed}"
            ),
            Error::Misaligned { graph, buffer, align } => {
                write!(f, "{graph}: {buffer} is not {align}-byte aligned")
            }
            Error::Context { graph, buffer } => {
                write!(f, "{graph}: {buffer} belongs to another CUDA context than the stream")
            }
            Error::Unsupported { graph, major, minor, compiled } => write!(
                f,
                "{graph}: no kernels for compute capability {major}.{minor} (compiled: {})",
                compiled.join(", ")
            ),
            Error::Driver(e) => write!(f, "CUDA driver: {e}"),
            Error::Cuda { graph, code } => write!(f, "{graph}: CUDA error {code}"),
            Error::Cublas { graph, status } => write!(f, "{graph}: cuBLAS status {status}"),
        }
    }
}

impl ::std::error::Error for Error {}

impl ::core::convert::From<::cudarc::driver::DriverError> for Error {
    fn from(e: ::cudarc::driver::DriverError) -> Error {
        Error::Driver(e)
    }
}

/// Checks a buffer's length and context before a launch.
#[allow(dead_code)]
fn check_buffer<T, B: ::cudarc::driver::DeviceSlice<T> + ?Sized>(
    graph: &'static str,
    buffer: &'static str,
    needed: usize,
    b: &B,
    stream: &::cudarc::driver::CudaStream,
) -> ::core::result::Result<(), Error> {
    if b.len() < needed {
        return Err(Error::TooSmall { graph, buffer, needed, len: b.len() });
    }
    if b.stream().context().cu_ctx() != stream.context().cu_ctx() {
        return Err(Error::Context { graph, buffer });
    }
    Ok(())
}

/// Checks a device address's alignment.
#[allow(dead_code)]
fn check_align(
    graph: &'static str,
    buffer: &'static str,
    ptr: ::cudarc::driver::sys::CUdeviceptr,
    align: usize,
) -> ::core::result::Result<(), Error> {
    // `align` is a power of two.
    if (ptr as usize) & (align - 1) != 0 {
        return Err(Error::Misaligned { graph, buffer, align });
    }
    Ok(())
}

/// The result of a host entry's return value.
#[allow(dead_code)]
fn status(graph: &'static str, code: i32) -> ::core::result::Result<(), Error> {
    match code {
        0 => Ok(()),
        c if c >= CUBLAS_ERROR_BASE => Err(Error::Cublas { graph, status: c - CUBLAS_ERROR_BASE }),
        c => Err(Error::Cuda { graph, code: c }),
    }
}
"#;

fn list(v: &[usize]) -> String {
    let s: Vec<String> = v.iter().map(usize::to_string).collect();
    format!("&[{}]", s.join(", "))
}

fn buffer_const(d: &TensorDirective) -> String {
    format!(
        "super::Buffer {{ dtype: \"{}\", shape: {}, strides: {}, elems: {} }}",
        d.dtype,
        list(&d.shape),
        list(&d.strides),
        d.alloc_elems
    )
}

/// The bindings file of library `lib` holding `graphs` (each compiled for one or more
/// architectures whose buffers agree); an error names a buffer whose element type has no Rust
/// type.
pub fn render(lib: &str, graphs: &[CompiledGraph]) -> Result<String, String> {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "// Generated by mucc {} (mucc::buildscript) for the library `{lib}`. Do not edit.",
        env!("CARGO_PKG_VERSION")
    );
    let _ = writeln!(
        s,
        "// Include it in a module: mod kernels {{ include!(concat!(env!(\"OUT_DIR\"), \"/{lib}.rs\")); }}"
    );
    s.push('\n');
    let _ = writeln!(
        s,
        "/// Value a host entry adds to a `cublasStatus_t` it returns.\n#[allow(dead_code)]\nconst CUBLAS_ERROR_BASE: i32 = {};\n",
        crate::emit::host::CUBLAS_ERROR_BASE
    );
    s.push_str(PRELUDE);
    for g in graphs {
        graph_module(&mut s, g)?;
    }
    Ok(s)
}

fn graph_module(s: &mut String, g: &CompiledGraph) -> Result<(), String> {
    let first = &g.files[0].launch;
    let source = format!("{}, graph {}", g.file.display(), g.index);
    let workspace = g
        .files
        .iter()
        .map(|f| f.launch.workspace_bytes)
        .max()
        .unwrap_or(0);
    let archs: Vec<String> = g.files.iter().map(|f| format!("\"{}\"", f.arch)).collect();
    let ty = |kind: &str, i: usize, d: &TensorDirective| {
        rust_type(d.dtype).ok_or_else(|| {
            format!(
                "{source} (`{}`): {kind} {i} is {}, which has no Rust type",
                g.name, d.dtype
            )
        })
    };
    let _ = writeln!(s, "\n/// `{}`: {source}.", g.name);
    let _ = writeln!(s, "#[allow(dead_code)]\npub mod {} {{", g.name);
    let _ = writeln!(
        s,
        "    /// The graph's name.\n    pub const NAME: &str = \"{}\";",
        g.name
    );
    let _ = writeln!(
        s,
        "    /// The graph file, as the build script named it.\n    pub const FILE: &str = {:?};",
        g.file.display().to_string()
    );
    let _ = writeln!(
        s,
        "    /// The graph's index in the file.\n    pub const GRAPH: usize = {};",
        g.index
    );
    let _ = writeln!(
        s,
        "    /// The architectures compiled.\n    pub const ARCHS: [&str; {}] = [{}];",
        archs.len(),
        archs.join(", ")
    );
    let _ = writeln!(
        s,
        "    /// Device workspace `launch` needs, in bytes (128-byte aligned; the most over the\n    /// architectures).\n    pub const WORKSPACE_BYTES: usize = {workspace};"
    );
    for (kind, name, ds) in [
        ("inputs", "INPUTS", &first.inputs),
        ("outputs", "OUTPUTS", &first.outputs),
    ] {
        let _ = writeln!(
            s,
            "    /// The graph's {kind}, in order.\n    pub const {name}: [super::Buffer; {}] = [",
            ds.len()
        );
        for d in ds.iter() {
            let _ = writeln!(s, "        {},", buffer_const(d));
        }
        let _ = writeln!(s, "    ];");
    }
    let _ = writeln!(s, "\n    unsafe extern \"C\" {{");
    for f in &g.files {
        let _ = writeln!(
            s,
            "        fn {}(\n            inputs: *const *const ::core::ffi::c_void,\n            outputs: *const *mut ::core::ffi::c_void,\n            workspace: *mut ::core::ffi::c_void,\n            stream: *mut ::core::ffi::c_void,\n        ) -> i32;",
            f.launch.entry
        );
    }
    let _ = writeln!(s, "    }}\n");

    // launch
    let _ = writeln!(
        s,
        "    /// Runs the graph on `stream` (asynchronously, like any launch on it): inputs, outputs\n    /// and workspace are device buffers of the stream's context laid out as [`INPUTS`],\n    /// [`OUTPUTS`] and [`WORKSPACE_BYTES`] say, 16-byte aligned (the workspace 128-byte).\n    /// Picks the kernels of the device's architecture among [`ARCHS`]."
    );
    let _ = writeln!(
        s,
        "    #[allow(clippy::too_many_arguments)]\n    pub fn launch("
    );
    let _ = writeln!(s, "        stream: &::cudarc::driver::CudaStream,");
    for (i, d) in first.inputs.iter().enumerate() {
        let _ = writeln!(
            s,
            "        input{i}: &impl ::cudarc::driver::DevicePtr<{}>,",
            ty("input", i, d)?
        );
    }
    for (j, d) in first.outputs.iter().enumerate() {
        let _ = writeln!(
            s,
            "        output{j}: &mut impl ::cudarc::driver::DevicePtrMut<{}>,",
            ty("output", j, d)?
        );
    }
    if workspace > 0 {
        let _ = writeln!(
            s,
            "        workspace: &mut impl ::cudarc::driver::DevicePtrMut<u8>,"
        );
    }
    let _ = writeln!(s, "    ) -> ::core::result::Result<(), super::Error> {{");
    let _ = writeln!(
        s,
        "        #[allow(unused_imports)]\n        use ::cudarc::driver::{{DevicePtr as _, DevicePtrMut as _}};"
    );
    for (i, d) in first.inputs.iter().enumerate() {
        let _ = writeln!(
            s,
            "        super::check_buffer::<{}, _>(NAME, \"input {i}\", INPUTS[{i}].elems, input{i}, stream)?;",
            ty("input", i, d)?
        );
    }
    for (j, d) in first.outputs.iter().enumerate() {
        let _ = writeln!(
            s,
            "        super::check_buffer::<{}, _>(NAME, \"output {j}\", OUTPUTS[{j}].elems, output{j}, stream)?;",
            ty("output", j, d)?
        );
    }
    if workspace > 0 {
        let _ = writeln!(
            s,
            "        super::check_buffer::<u8, _>(NAME, \"workspace\", WORKSPACE_BYTES, workspace, stream)?;"
        );
    }
    let _ = writeln!(
        s,
        "        let ctx = stream.context();\n        ctx.bind_to_thread()?;\n        let (major, minor) = ctx.compute_capability()?;"
    );
    for i in 0..first.inputs.len() {
        let _ = writeln!(
            s,
            "        let (in{i}, _in{i}) = input{i}.device_ptr(stream);\n        super::check_align(NAME, \"input {i}\", in{i}, 16)?;"
        );
    }
    for j in 0..first.outputs.len() {
        let _ = writeln!(
            s,
            "        let (out{j}, _out{j}) = output{j}.device_ptr_mut(stream);\n        super::check_align(NAME, \"output {j}\", out{j}, 16)?;"
        );
    }
    if workspace > 0 {
        let _ = writeln!(
            s,
            "        let (ws, _ws) = workspace.device_ptr_mut(stream);\n        super::check_align(NAME, \"workspace\", ws, 128)?;\n        let ws = ws as usize as *mut ::core::ffi::c_void;"
        );
    } else {
        let _ = writeln!(
            s,
            "        let ws = ::core::ptr::null_mut::<::core::ffi::c_void>();"
        );
    }
    let ins: Vec<String> = (0..first.inputs.len())
        .map(|i| format!("in{i} as usize as *const ::core::ffi::c_void"))
        .collect();
    let outs: Vec<String> = (0..first.outputs.len())
        .map(|j| format!("out{j} as usize as *mut ::core::ffi::c_void"))
        .collect();
    let _ = writeln!(
        s,
        "        let inputs: [*const ::core::ffi::c_void; {}] = [{}];",
        ins.len(),
        ins.join(", ")
    );
    let _ = writeln!(
        s,
        "        let outputs: [*mut ::core::ffi::c_void; {}] = [{}];",
        outs.len(),
        outs.join(", ")
    );
    let _ = writeln!(
        s,
        "        let raw_stream = stream.cu_stream() as *mut ::core::ffi::c_void;"
    );
    let _ = writeln!(s, "        let code = match (major, minor) {{");
    for f in &g.files {
        let _ = writeln!(
            s,
            "            // SAFETY: the buffers were checked above (element type, length, alignment,\n            // context) and stay borrowed until the launch is enqueued; the entry reads the\n            // pointer arrays before it returns.\n            {} => unsafe {{\n                {}(inputs.as_ptr(), outputs.as_ptr(), ws, raw_stream)\n            }},",
            capability_pattern(f.arch),
            f.launch.entry
        );
    }
    let _ = writeln!(
        s,
        "            _ => {{\n                return Err(super::Error::Unsupported {{ graph: NAME, major, minor, compiled: &ARCHS }});\n            }}\n        }};"
    );
    let _ = writeln!(s, "        super::status(NAME, code)\n    }}\n}}");
    Ok(())
}
