//! The host entry `mucc_execute`, rendered from the typed [`LaunchPlan`] alone: each kernel
//! step becomes a `cudaLaunchKernel` through `mucc::host::launch` with the argument addresses
//! its bindings denote, each cuBLAS step a `cublasGemmStridedBatchedEx` call, each all-reduce
//! step (graphs on several GPUs) an `ncclAllReduce` on the caller's communicator. The runner of
//! `mucc run` interprets the same plan ([`LaunchPlan::resolve`] gives both the addresses).

use super::EmitError;
use super::cxx::{self, Writer};
use super::ir::{self, BufferMethod, Check, Expr, Func, Init, IntType, Stmt, Storage, Sym, Ty};
use super::launch::{
    AllReduceCall, Binding, BufferRef, GemmCall, KernelLaunch, LaunchPlan, Step, TensorMapSpec,
};

/// Value `mucc_execute` adds to a `cublasStatus_t` it returns (the runtime's
/// `MUCC_CUBLAS_ERROR_BASE`, and the generated library header's).
pub const CUBLAS_ERROR_BASE: i32 = 100_000;

/// Value `mucc_execute` adds to an `ncclResult_t` it returns (the runtime's
/// `MUCC_NCCL_ERROR_BASE`, and the generated library header's).
pub const NCCL_ERROR_BASE: i32 = 200_000;

/// A step of the host entry: a comment, its statements, and their lines (indented for the
/// entry's block of the step).
#[derive(Clone, Debug)]
pub struct HostStep {
    /// What the step does.
    pub comment: String,
    /// Its statements.
    pub body: Vec<Stmt>,
    /// Its C++ lines, indented.
    pub lines: Vec<String>,
}

impl HostStep {
    fn new(comment: String, body: Vec<Stmt>) -> HostStep {
        // The entry's body is at level 1 and each step a block inside it.
        let mut w = Writer::at(2);
        ir::print(&mut w, &body);
        let lines = w.finish().lines().map(str::to_string).collect();
        HostStep {
            comment,
            body,
            lines,
        }
    }
}

/// The device address a binding denotes, as a `void*` expression over `buf`
/// (a `mucc::host::Buffers`); `None` when the plan has no such buffer.
fn address(plan: &LaunchPlan, b: Binding) -> Option<Expr> {
    let at = |m, v: Vec<Expr>| Expr::Buffer(m, v);
    Some(match plan.resolve(b)? {
        (BufferRef::Input(i), off) => at(
            BufferMethod::Input,
            vec![Expr::int(i as i128), Expr::int(off as i128)],
        ),
        (BufferRef::Output(j), off) => at(
            BufferMethod::Output,
            vec![Expr::int(j as i128), Expr::int(off as i128)],
        ),
        (BufferRef::Workspace, off) => at(BufferMethod::Workspace, vec![Expr::int(off as i128)]),
        (BufferRef::Exchange(r), _) => Expr::Index(
            Box::new(Expr::var("exchange")),
            Box::new(Expr::int(r as i128)),
        ),
        (BufferRef::Rank, _) => Expr::Call(Func::ValueArg, vec![Expr::var("rank")]),
    })
}

/// [`address`] of a binding of step `step` (`what` names it), or the internal error.
fn bound(plan: &LaunchPlan, step: usize, what: &str, b: Binding) -> Result<Expr, EmitError> {
    address(plan, b).ok_or_else(|| EmitError::Unresolved {
        step,
        what: what.to_string(),
        binding: b,
    })
}

fn dim3(d: [u32; 3]) -> Expr {
    Expr::Call(Func::Dim3, d.iter().map(|&x| Expr::int(x)).collect())
}

fn kernel_step(plan: &LaunchPlan, n: usize, k: &KernelLaunch) -> Result<Vec<Stmt>, EmitError> {
    let addr = |b: Binding| bound(plan, n, &k.name, b);
    let mut body = vec![Stmt::local(
        Ty::ConstVoidPtr,
        "kernel",
        Expr::Call(Func::CastToConstVoidPtr, vec![Expr::var(&k.name).addr()]),
    )];
    if k.needs_smem_opt_in() {
        // Once per device, safe from several host threads (mucc::host::max_dynamic_smem).
        body.push(Stmt::Decl {
            storage: Storage::Static,
            ty: Ty::AtomicU64,
            name: "smem_set".into(),
            init: Init::Brace(Expr::int(0)),
        });
        body.push(Stmt::Checked(
            Check::Cuda,
            Expr::Call(
                Func::MaxDynamicSmem,
                vec![
                    Expr::var("kernel"),
                    Expr::int(k.dynamic_smem as i128),
                    Expr::var("smem_set"),
                ],
            ),
        ));
    }
    body.push(Stmt::Decl {
        storage: Storage::Auto,
        ty: Ty::VoidPtrConst,
        name: "args".into(),
        init: Init::Array(k.args.iter().map(|b| addr(*b)).collect::<Result<_, _>>()?),
    });
    let f = if k.programmatic {
        Func::LaunchProgrammatic
    } else {
        Func::Launch
    };
    let mut args = vec![
        Expr::var("kernel"),
        dim3(k.grid),
        dim3(k.block),
        Expr::int(k.dynamic_smem as i128),
        Expr::var("stream"),
        Expr::var("args"),
    ];
    if !k.tensor_maps.is_empty() {
        let mut maps = Vec::new();
        for (i, m) in k.tensor_maps.iter().enumerate() {
            body.extend(tensor_map(m, i, addr(m.binding)?));
            maps.push(Expr::Field(Box::new(Expr::var(format!("tm{i}"))), "map").addr());
        }
        body.push(Stmt::Decl {
            storage: Storage::Auto,
            ty: Ty::ConstTensorMapPtrConst,
            name: "maps".into(),
            init: Init::Array(maps),
        });
        args.push(Expr::var("maps"));
    }
    body.push(Stmt::Checked(Check::Cuda, Expr::Call(f, args)));
    Ok(body)
}

/// Statements encoding tensor map `i` of a launch (cached per call site and host thread,
/// encoded again when the buffer's address changes).
fn tensor_map(m: &TensorMapSpec, i: usize, address: Expr) -> Vec<Stmt> {
    let array = |ty, name: &str, v: Vec<Expr>| Stmt::Decl {
        storage: Storage::Auto,
        ty,
        name: name.into(),
        init: Init::Array(v),
    };
    let ull = |x: u64| Expr::Int(x as i128, IntType::UnsignedLongLong);
    let name = format!("tm{i}");
    let strides = if m.strides.is_empty() {
        Stmt::local(Ty::ConstU64PtrConst, "strides", Expr::Sym(Sym::Null))
    } else {
        array(
            Ty::ConstU64,
            "strides",
            m.strides.iter().map(|&s| ull(s)).collect(),
        )
    };
    vec![
        Stmt::Decl {
            storage: Storage::StaticThreadLocal,
            ty: Ty::CachedTensorMap,
            name: name.clone(),
            init: Init::None,
        },
        Stmt::Block(vec![
            array(
                Ty::ConstU64,
                "dims",
                m.dims.iter().map(|&d| ull(d)).collect(),
            ),
            strides,
            array(
                Ty::ConstU32,
                "box",
                m.boxes
                    .iter()
                    .map(|&b| Expr::Int(b as i128, IntType::Unsigned))
                    .collect(),
            ),
            Stmt::Checked(
                Check::Cuda,
                Expr::Call(
                    Func::TensorMap,
                    vec![
                        Expr::var(name),
                        Expr::Sym(Sym::TensorMapDataType(m.data_type)),
                        address,
                        Expr::var("dims"),
                        Expr::var("strides"),
                        Expr::var("box"),
                        Expr::Sym(Sym::TensorMapSwizzle(m.swizzle)),
                    ],
                ),
            ),
        ]),
    ]
}

fn gemm_step(plan: &LaunchPlan, n: usize, c: &GemmCall) -> Result<Vec<Stmt>, EmitError> {
    let dt = Expr::Sym(Sym::CudaDataType(c.data_type));
    let operand = |b: Binding, ld: i32, stride: i64| -> Result<Vec<Expr>, EmitError> {
        Ok(vec![
            bound(plan, n, "cuBLAS", b)?,
            dt.clone(),
            Expr::int(ld),
            Expr::Int(stride as i128, IntType::LongLong),
        ])
    };
    let mut b = operand(c.b, c.ldb, c.stride_b)?;
    b.push(Expr::var("beta").addr());
    let args = vec![
        vec![
            Expr::var("handle"),
            Expr::Sym(Sym::CublasOp(c.trans_a)),
            Expr::Sym(Sym::CublasOp(c.trans_b)),
            Expr::int(c.m),
            Expr::int(c.n),
            Expr::int(c.k),
            Expr::var("alpha").addr(),
        ],
        operand(c.a, c.lda, c.stride_a)?,
        b,
        operand(c.c, c.ldc, c.stride_c)?,
        vec![
            Expr::int(c.batch),
            Expr::Sym(Sym::CublasCompute(c.compute_type)),
            Expr::Sym(Sym::CublasGemmDefault),
        ],
    ];
    Ok(vec![
        Stmt::Decl {
            storage: Storage::Auto,
            ty: Ty::CublasHandle,
            name: "handle".into(),
            init: Init::None,
        },
        Stmt::Checked(
            Check::Cublas,
            Expr::Call(Func::CublasHandle, vec![Expr::var("handle").addr()]),
        ),
        Stmt::Checked(
            Check::Cublas,
            Expr::Call(
                Func::CublasSetStream,
                vec![Expr::var("handle"), Expr::var("stream")],
            ),
        ),
        Stmt::DeclMany {
            ty: Ty::ConstCublasScalar(c.compute_type),
            vars: vec![
                ("alpha".into(), Expr::int(1)),
                ("beta".into(), Expr::int(0)),
            ],
        },
        Stmt::Checked(
            Check::Cublas,
            Expr::GroupedCall(Func::CublasGemmStridedBatched, args),
        ),
    ])
}

fn all_reduce_step(plan: &LaunchPlan, n: usize, c: &AllReduceCall) -> Result<Vec<Stmt>, EmitError> {
    Ok(vec![Stmt::Checked(
        Check::Nccl,
        Expr::Call(
            Func::NcclAllReduce,
            vec![
                bound(plan, n, "NCCL", c.send)?,
                bound(plan, n, "NCCL", c.recv)?,
                Expr::int(c.count as i128),
                Expr::Sym(Sym::NcclDataType(c.dtype)),
                Expr::Sym(Sym::NcclSum),
                Expr::var("comm"),
                Expr::var("stream"),
            ],
        ),
    )])
}

/// The steps of the host entry, one per launch-plan step (first this GPU's rank, when a
/// kernel performs an all-reduce); an internal error when a step binds a buffer the plan does
/// not have.
pub fn steps(plan: &LaunchPlan) -> Result<Vec<HostStep>, EmitError> {
    let rank = plan.uses_exchange().then(|| {
        HostStep::new(
            "this GPU's rank (kernels that all-reduce exchange tiles with the others)".into(),
            vec![
                Stmt::local(Ty::Int, "r", Expr::int(0)),
                Stmt::Checked(
                    Check::Nccl,
                    Expr::Call(
                        Func::NcclCommUserRank,
                        vec![Expr::var("comm"), Expr::var("r").addr()],
                    ),
                ),
                Stmt::Assign(
                    Expr::var("rank"),
                    Expr::Call(Func::CastToU64, vec![Expr::var("r")]),
                ),
            ],
        )
    });
    let mut steps: Vec<HostStep> = rank.into_iter().collect();
    for (n, s) in plan.steps.iter().enumerate() {
        steps.push(match s {
            Step::Kernel(k) => {
                HostStep::new(format!("launch {}", k.name), kernel_step(plan, n, k)?)
            }
            Step::Gemm(c) => HostStep::new(
                format!(
                    "cuBLAS: {} product(s) of {}x{} by {}x{}",
                    c.batch, c.m, c.k, c.k, c.n
                ),
                gemm_step(plan, n, c)?,
            ),
            Step::AllReduce(c) => HostStep::new(
                format!(
                    "NCCL: sum of {} {} elements over the {} GPUs",
                    c.count,
                    cxx::nccl_data_type(c.dtype),
                    plan.gpus
                ),
                all_reduce_step(plan, n, c)?,
            ),
        });
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::DType;
    use crate::target::Arch;

    fn plan(args: Vec<Binding>) -> LaunchPlan {
        LaunchPlan {
            arch: Arch::Sm80,
            inputs: vec![super::super::launch::TensorDirective {
                shape: vec![8],
                strides: vec![1],
                alloc_elems: 8,
                dtype: DType::F16,
            }],
            outputs: Vec::new(),
            workspace_bytes: 0,
            steps: vec![Step::Kernel(KernelLaunch {
                name: "k0".into(),
                grid: [2, 1, 1],
                block: [64, 1, 1],
                dynamic_smem: 0,
                args,
                tensor_maps: Vec::new(),
                programmatic: false,
            })],
            gpus: 1,
            exchange_bytes: 0,
            counter_bytes: 0,
            entry: "mucc_execute".into(),
        }
    }

    #[test]
    fn a_binding_the_plan_cannot_resolve_is_an_internal_error() {
        let input = |index| Binding::Input {
            index,
            elem_offset: 4,
        };
        let ok = steps(&plan(vec![input(0)])).unwrap();
        assert_eq!(ok.len(), 1);
        assert!(
            ok[0].lines.iter().any(|l| l.contains("buf.in(0, 8)")),
            "{:?}",
            ok[0].lines
        );
        // Input 1 does not exist; an exchange buffer without exchange bytes neither.
        for bad in [input(1), Binding::Exchange { rank: 0 }] {
            let err = steps(&plan(vec![input(0), bad])).unwrap_err();
            assert_eq!(
                err,
                EmitError::Unresolved {
                    step: 0,
                    what: "k0".into(),
                    binding: bad
                }
            );
            assert!(
                err.to_string().starts_with("internal: step 0 (k0) binds"),
                "{err}"
            );
        }
    }
}
