//! A typed form of generated C++: statements and expressions that the emitter builds and
//! [`print()`] writes, with every spelling (types, functions, enumerators, check macros) taken
//! from [`super::cxx`]. Tests compare what the emitter built by structure instead of grepping
//! its text.
//!
//! The host entry's steps ([`super::host`]) are built in this form.

use std::fmt::{self, Write as _};

use super::cxx::{self, Writer};

/// A C++ type the generated code declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    /// `const void*`.
    ConstVoidPtr,
    /// `void* const`.
    VoidPtrConst,
    /// `const CUtensorMap* const`.
    ConstTensorMapPtrConst,
    /// `const cuuint64_t`.
    ConstU64,
    /// `const cuuint64_t* const`.
    ConstU64PtrConst,
    /// `const cuuint32_t`.
    ConstU32,
    /// `std::atomic<unsigned long long>`.
    AtomicU64,
    /// `mucc::host::CachedTensorMap`.
    CachedTensorMap,
    /// `cublasHandle_t`.
    CublasHandle,
    /// `int`.
    Int,
    /// `const int`.
    ConstInt,
    /// A scalar of cuBLAS's compute type, `const`.
    ConstCublasScalar(crate::sched::gemm::CublasCompute),
}

/// Where a declared variable lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// A local.
    Auto,
    /// `static`.
    Static,
    /// `static thread_local`.
    StaticThreadLocal,
}

/// A function (or function-like construct) the generated code calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    /// `mucc::host::launch`: a kernel launch.
    Launch,
    /// `mucc::host::launch_programmatic`: a launch that may start before its predecessor ends.
    LaunchProgrammatic,
    /// `mucc::host::max_dynamic_smem`: the dynamic shared-memory opt-in, once per device.
    MaxDynamicSmem,
    /// `mucc::host::tensor_map`: encodes a cached tensor map.
    TensorMap,
    /// `mucc::host::value_arg`: a kernel argument passed by value.
    ValueArg,
    /// `mucc::host::cublas_handle`: the calling thread's cuBLAS handle.
    CublasHandle,
    /// `cublasSetStream`.
    CublasSetStream,
    /// `cublasGemmStridedBatchedEx`.
    CublasGemmStridedBatched,
    /// `ncclCommUserRank`.
    NcclCommUserRank,
    /// `ncclAllReduce`.
    NcclAllReduce,
    /// `dim3`.
    Dim3,
    /// `reinterpret_cast<const void*>`.
    CastToConstVoidPtr,
    /// `static_cast<unsigned long long>`.
    CastToU64,
    /// `mucc::kn::unary`: an element-wise kernel of one input.
    KnUnary,
    /// `mucc::kn::binary`: an element-wise kernel of two inputs.
    KnBinary,
    /// `mucc::kn::copy`: a copy between two views.
    KnCopy,
    /// `mucc::kn::reduce`: a sum or max over one dimension.
    KnReduce,
    /// `mucc::kn::rms_norm`: rows divided by their root mean square.
    KnRmsNorm,
    /// `mucc::kn::softmax_combine`: split attention's partial results combined.
    KnSoftmaxCombine,
    /// `static_cast<int>`.
    CastToInt,
    /// `static_cast<mucc::i64>`: 64-bit element offsets.
    CastToI64,
    /// `static_cast<unsigned>`.
    CastToUnsigned,
    /// `mucc::tb::copy_chunks`: a tile copied by 16-byte (or narrower) chunks.
    TbCopyChunks,
    /// `mucc::tb::cp_async_chunks`: the same by `cp.async`.
    TbCpAsyncChunks,
    /// `mucc::tb::copy_elems`: a tile copied element by element.
    TbCopyElems,
    /// `mucc::sm80::cp_async_commit`: closes a group of `cp.async` copies.
    CpAsyncCommit,
    /// `mucc::sm80::cp_async_wait`: waits until at most N groups are pending.
    CpAsyncWait,
    /// `mucc::sm90::mbar_arrive_expect_tx`: announces a stage's bytes on its mbarrier.
    MbarArriveExpectTx,
    /// `mucc::sm90::mbar_wait`: waits for an mbarrier's phase.
    MbarWait,
    /// `mucc::sm90::tma_load`: a bulk tensor load completing on an mbarrier.
    TmaLoad,
}

/// A template argument of a runtime call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TArg {
    /// An element type.
    Elem(crate::graph::DType),
    /// An integer.
    Int(i128),
    /// A boolean.
    Bool(bool),
    /// A type or value the generated code declares (a layout alias, a functor).
    Name(String),
}

impl TArg {
    /// An integer argument (a size, a count).
    pub fn int(v: usize) -> TArg {
        TArg::Int(v as i128)
    }
}

/// A method of `mucc::host::Buffers` (the host entry's `buf`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferMethod {
    /// `in(i, offset)`: the caller's input `i`.
    Input,
    /// `out(j, offset)`: the caller's output `j`.
    Output,
    /// `ws(offset)`: the workspace.
    Workspace,
}

/// An enumerator or named constant of CUDA, cuBLAS or NCCL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sym {
    /// `nullptr`.
    Null,
    /// `CUBLAS_OP_N` or (`true`) `CUBLAS_OP_T`.
    CublasOp(bool),
    /// `CUBLAS_GEMM_DEFAULT`.
    CublasGemmDefault,
    /// A `cudaDataType` enumerator.
    CudaDataType(crate::sched::gemm::CudaDataType),
    /// A `cublasComputeType_t` enumerator.
    CublasCompute(crate::sched::gemm::CublasCompute),
    /// A `CUtensorMapDataType` enumerator.
    TensorMapDataType(crate::sched::tma::TmaDataType),
    /// A `CUtensorMapSwizzle` enumerator.
    TensorMapSwizzle(crate::sched::tma::TmaSwizzle),
    /// An `ncclDataType_t` enumerator.
    NcclDataType(crate::sched::kernel_level::NcclDataType),
    /// `ncclSum`.
    NcclSum,
    /// `blockIdx.x`, `.y` or `.z` (grid axis 0, 1, 2).
    BlockIdx(usize),
}

/// The suffix of an integer literal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntType {
    /// `int` (no suffix).
    Int,
    /// `unsigned` (`u`).
    Unsigned,
    /// `long long` (`LL`).
    LongLong,
    /// `unsigned long long` (`ull`).
    UnsignedLongLong,
}

/// An expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// An integer literal.
    Int(i128, IntType),
    /// A variable or parameter of the generated code by name.
    Var(String),
    /// An enumerator or named constant.
    Sym(Sym),
    /// A call.
    Call(Func, Vec<Expr>),
    /// A call with template arguments.
    TemplateCall(Func, Vec<TArg>, Vec<Expr>),
    /// `a + b`.
    Add(Box<Expr>, Box<Expr>),
    /// `T{}`: a value-initialised object of a type the generated code declares.
    Object(String),
    /// A call whose arguments form groups (an operand's address, type, leading dimension and
    /// stride, say): as the expression of a statement it prints one group per line.
    GroupedCall(Func, Vec<Vec<Expr>>),
    /// A call of a method of the host entry's `buf`.
    Buffer(BufferMethod, Vec<Expr>),
    /// `base[index]`.
    Index(Box<Expr>, Box<Expr>),
    /// `base.field`.
    Field(Box<Expr>, &'static str),
    /// `&e`.
    AddrOf(Box<Expr>),
    /// `a - b`.
    Sub(Box<Expr>, Box<Expr>),
    /// `a * b`.
    Mul(Box<Expr>, Box<Expr>),
    /// `a / b`.
    Div(Box<Expr>, Box<Expr>),
    /// `a % b`.
    Rem(Box<Expr>, Box<Expr>),
    /// `a & b`.
    BitAnd(Box<Expr>, Box<Expr>),
    /// `a < b`.
    Lt(Box<Expr>, Box<Expr>),
    /// `a == b`.
    Eq(Box<Expr>, Box<Expr>),
    /// `(e)`: the printer adds no parentheses of its own, so the builder places them.
    Paren(Box<Expr>),
}

impl Expr {
    /// A variable.
    pub fn var(name: impl Into<String>) -> Expr {
        Expr::Var(name.into())
    }

    /// An `int` literal.
    pub fn int(v: impl Into<i128>) -> Expr {
        Expr::Int(v.into(), IntType::Int)
    }

    /// `&self`.
    pub fn addr(self) -> Expr {
        Expr::AddrOf(Box::new(self))
    }

    /// `self + b`.
    pub fn plus(self, b: Expr) -> Expr {
        Expr::Add(Box::new(self), Box::new(b))
    }

    /// `self - b`.
    pub fn minus(self, b: Expr) -> Expr {
        Expr::Sub(Box::new(self), Box::new(b))
    }

    /// `self * b`.
    pub fn times(self, b: Expr) -> Expr {
        Expr::Mul(Box::new(self), Box::new(b))
    }

    /// `self / b`.
    pub fn over(self, b: Expr) -> Expr {
        Expr::Div(Box::new(self), Box::new(b))
    }

    /// `self % b`.
    pub fn modulo(self, b: Expr) -> Expr {
        Expr::Rem(Box::new(self), Box::new(b))
    }

    /// `(self)`.
    pub fn paren(self) -> Expr {
        Expr::Paren(Box::new(self))
    }

    /// An unsuffixed literal of a size or count.
    pub fn size(v: usize) -> Expr {
        Expr::Int(v as i128, IntType::Int)
    }

    /// `self` with `terms` added in order (`self` alone without terms).
    pub fn sum(terms: Vec<Expr>) -> Option<Expr> {
        terms.into_iter().reduce(Expr::plus)
    }
}

/// How a failing call makes the host entry return (the runtime's checking macros).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// `MUCC_CHECK`: a `cudaError_t`.
    Cuda,
    /// `MUCC_CHECK_CUBLAS`: a `cublasStatus_t`.
    Cublas,
    /// `MUCC_CHECK_NCCL`: an `ncclResult_t`.
    Nccl,
}

/// How a declaration initialises its variable.
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    /// None.
    None,
    /// `= e`.
    Assign(Expr),
    /// `{e}`.
    Brace(Expr),
    /// An array: `name[] = {e, …}`, on one line when it fits, else one element per line.
    Array(Vec<Expr>),
}

/// A statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// A declaration.
    Decl {
        /// Static or automatic.
        storage: Storage,
        /// The type.
        ty: Ty,
        /// The name.
        name: String,
        /// The initialiser.
        init: Init,
    },
    /// Several declarations of one type sharing a statement: `ty a = x, b = y;`.
    DeclMany {
        /// The type.
        ty: Ty,
        /// Each name with its value.
        vars: Vec<(String, Expr)>,
    },
    /// `target = value;`.
    Assign(Expr, Expr),
    /// A call whose failure returns from the host entry.
    Checked(Check, Expr),
    /// `{ … }`.
    Block(Vec<Stmt>),
    /// An expression evaluated for its effect: `e;`.
    Eval(Expr),
    /// `using namespace name;`.
    UsingNamespace(String),
    /// `if (cond) { … }`.
    If(Expr, Vec<Stmt>),
    /// `// text`.
    Comment(String),
}

impl Stmt {
    /// A local declaration `ty name = init;`.
    pub fn local(ty: Ty, name: impl Into<String>, init: Expr) -> Stmt {
        Stmt::Decl {
            storage: Storage::Auto,
            ty,
            name: name.into(),
            init: Init::Assign(init),
        }
    }
}

/// Writes `stmts` at `w`'s level.
pub fn print(w: &mut Writer, stmts: &[Stmt]) {
    for s in stmts {
        print_stmt(w, s);
    }
}

fn print_stmt(w: &mut Writer, s: &Stmt) {
    match s {
        Stmt::Decl {
            storage,
            ty,
            name,
            init,
        } => {
            let head = format!("{}{} {name}", cxx::storage(*storage), cxx::ir_type(*ty));
            match init {
                Init::None => w.line(format!("{head};")),
                Init::Assign(e) => w.line(format!("{head} = {e};")),
                Init::Brace(e) => w.line(format!("{head}{{{e}}};")),
                Init::Array(items) => {
                    let items: Vec<String> = items.iter().map(Expr::to_string).collect();
                    let one = format!("{head}[] = {{{}}};", items.join(", "));
                    if 2 * w.level() + one.len() <= cxx::MAX_LINE {
                        w.line(one);
                    } else {
                        w.open(format!("{head}[] ="));
                        for (i, a) in items.iter().enumerate() {
                            let sep = if i + 1 < items.len() { "," } else { "" };
                            w.line(format!("{a}{sep}"));
                        }
                        w.close(";");
                    }
                }
            }
        }
        Stmt::DeclMany { ty, vars } => {
            let vars: Vec<String> = vars.iter().map(|(n, e)| format!("{n} = {e}")).collect();
            w.line(format!("{} {};", cxx::ir_type(*ty), vars.join(", ")));
        }
        Stmt::Assign(t, v) => w.line(format!("{t} = {v};")),
        Stmt::Checked(c, Expr::GroupedCall(f, groups)) => {
            w.line(format!("{}({}(", cxx::check_macro(*c), cxx::function(*f)));
            w.indented(|w| {
                for (i, g) in groups.iter().enumerate() {
                    let g: Vec<String> = g.iter().map(Expr::to_string).collect();
                    let end = if i + 1 < groups.len() { "," } else { "));" };
                    w.line(format!("{}{end}", g.join(", ")));
                }
            });
        }
        Stmt::Checked(c, e) => w.line(format!("{}({e});", cxx::check_macro(*c))),
        Stmt::Block(body) => w.block("", "", |w| print(w, body)),
        Stmt::Eval(e) => w.line(format!("{e};")),
        Stmt::UsingNamespace(n) => w.line(format!("using namespace {n};")),
        Stmt::If(cond, body) => w.block(format!("if ({cond})"), "", |w| print(w, body)),
        Stmt::Comment(text) => w.line(format!("// {text}")),
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args = |f: &mut fmt::Formatter<'_>, v: &[Expr]| -> fmt::Result {
            for (i, a) in v.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{a}")?;
            }
            Ok(())
        };
        match self {
            Expr::Int(v, t) => write!(f, "{v}{}", cxx::int_suffix(*t)),
            Expr::Var(n) => f.write_str(n),
            Expr::Sym(s) => f.write_str(cxx::symbol(*s)),
            Expr::Call(func, a) => {
                write!(f, "{}(", cxx::function(*func))?;
                args(f, a)?;
                f.write_char(')')
            }
            Expr::TemplateCall(func, targs, a) => {
                write!(f, "{}<", cxx::function(*func))?;
                for (i, t) in targs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    match t {
                        TArg::Elem(d) => f.write_str(cxx::ctype(*d))?,
                        TArg::Int(v) => write!(f, "{v}")?,
                        TArg::Bool(b) => write!(f, "{b}")?,
                        TArg::Name(n) => f.write_str(n)?,
                    }
                }
                f.write_str(">(")?;
                args(f, a)?;
                f.write_char(')')
            }
            Expr::Add(a, b) => write!(f, "{a} + {b}"),
            Expr::Object(t) => write!(f, "{t}{{}}"),
            Expr::GroupedCall(func, groups) => {
                write!(f, "{}(", cxx::function(*func))?;
                args(f, &groups.concat())?;
                f.write_char(')')
            }
            Expr::Buffer(m, a) => {
                write!(f, "buf.{}(", cxx::buffer_method(*m))?;
                args(f, a)?;
                f.write_char(')')
            }
            Expr::Index(b, i) => write!(f, "{b}[{i}]"),
            Expr::Field(b, name) => write!(f, "{b}.{name}"),
            Expr::AddrOf(e) => write!(f, "&{e}"),
            Expr::Sub(a, b) => write!(f, "{a} - {b}"),
            Expr::Mul(a, b) => write!(f, "{a} * {b}"),
            Expr::Div(a, b) => write!(f, "{a} / {b}"),
            Expr::Rem(a, b) => write!(f, "{a} % {b}"),
            Expr::BitAnd(a, b) => write!(f, "{a} & {b}"),
            Expr::Lt(a, b) => write!(f, "{a} < {b}"),
            Expr::Eq(a, b) => write!(f, "{a} == {b}"),
            Expr::Paren(e) => write!(f, "({e})"),
        }
    }
}

/// Calls of `func` anywhere in `stmts` (checked or not, nested in blocks and arguments), in
/// order, each as its arguments: what a test looks for instead of the call's spelling.
pub fn calls(stmts: &[Stmt], func: Func) -> Vec<Vec<&Expr>> {
    fn expr<'a>(e: &'a Expr, func: Func, out: &mut Vec<Vec<&'a Expr>>) {
        match e {
            Expr::Call(f, a) => {
                if *f == func {
                    out.push(a.iter().collect());
                }
                a.iter().for_each(|x| expr(x, func, out));
            }
            Expr::GroupedCall(f, groups) => {
                // The groups flattened: a call's arguments as one list.
                if *f == func {
                    out.push(groups.iter().flatten().collect());
                }
                groups.iter().flatten().for_each(|x| expr(x, func, out));
            }
            Expr::TemplateCall(f, _, a) => {
                if *f == func {
                    out.push(a.iter().collect());
                }
                a.iter().for_each(|x| expr(x, func, out));
            }
            Expr::Add(a, b)
            | Expr::Sub(a, b)
            | Expr::Mul(a, b)
            | Expr::Div(a, b)
            | Expr::Rem(a, b)
            | Expr::BitAnd(a, b)
            | Expr::Lt(a, b)
            | Expr::Eq(a, b) => {
                expr(a, func, out);
                expr(b, func, out);
            }
            Expr::Buffer(_, a) => a.iter().for_each(|x| expr(x, func, out)),
            Expr::Index(b, i) => {
                expr(b, func, out);
                expr(i, func, out);
            }
            Expr::Field(b, _) | Expr::AddrOf(b) | Expr::Paren(b) => expr(b, func, out),
            Expr::Int(..) | Expr::Var(_) | Expr::Sym(_) | Expr::Object(_) => {}
        }
    }
    fn stmt<'a>(s: &'a Stmt, func: Func, out: &mut Vec<Vec<&'a Expr>>) {
        match s {
            Stmt::Decl { init, .. } => match init {
                Init::None => {}
                Init::Assign(e) | Init::Brace(e) => expr(e, func, out),
                Init::Array(v) => v.iter().for_each(|x| expr(x, func, out)),
            },
            Stmt::DeclMany { vars, .. } => vars.iter().for_each(|(_, e)| expr(e, func, out)),
            Stmt::Assign(t, v) => {
                expr(t, func, out);
                expr(v, func, out);
            }
            Stmt::Checked(_, e) | Stmt::Eval(e) => expr(e, func, out),
            Stmt::Block(b) => b.iter().for_each(|x| stmt(x, func, out)),
            Stmt::If(c, b) => {
                expr(c, func, out);
                b.iter().for_each(|x| stmt(x, func, out));
            }
            Stmt::UsingNamespace(_) | Stmt::Comment(_) => {}
        }
    }
    let mut out = Vec::new();
    stmts.iter().for_each(|s| stmt(s, func, &mut out));
    out
}

/// The template arguments of every call of `func` with template arguments in `stmts` (not
/// nested in other calls), in order.
pub fn template_args(stmts: &[Stmt], func: Func) -> Vec<&[TArg]> {
    let mut out = Vec::new();
    for s in stmts {
        match s {
            Stmt::Eval(Expr::TemplateCall(f, t, _)) if *f == func => out.push(&t[..]),
            Stmt::Block(b) | Stmt::If(_, b) => out.extend(template_args(b, func)),
            _ => {}
        }
    }
    out
}

/// A kernel whose body was built as statements, by name.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelBody {
    /// The kernel's name.
    pub name: String,
    /// Its body.
    pub body: Vec<Stmt>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_print_with_the_spellings_of_cxx() {
        let mut w = Writer::at(1);
        print(
            &mut w,
            &[
                Stmt::Decl {
                    storage: Storage::Static,
                    ty: Ty::AtomicU64,
                    name: "s".into(),
                    init: Init::Brace(Expr::int(0)),
                },
                Stmt::Checked(
                    Check::Cublas,
                    Expr::Call(
                        Func::CublasSetStream,
                        vec![Expr::var("h"), Expr::var("stream")],
                    ),
                ),
                Stmt::Block(vec![Stmt::Decl {
                    storage: Storage::Auto,
                    ty: Ty::ConstU32,
                    name: "box".into(),
                    init: Init::Array(vec![
                        Expr::Int(64, IntType::Unsigned),
                        Expr::Int(8, IntType::Unsigned),
                    ]),
                }]),
                Stmt::Assign(
                    Expr::var("rank"),
                    Expr::Call(Func::CastToU64, vec![Expr::var("r")]),
                ),
            ],
        );
        assert_eq!(
            w.finish(),
            "  static std::atomic<unsigned long long> s{0};\n  \
             MUCC_CHECK_CUBLAS(cublasSetStream(h, stream));\n  {\n    \
             const cuuint32_t box[] = {64u, 8u};\n  }\n  \
             rank = static_cast<unsigned long long>(r);\n"
        );
    }

    #[test]
    fn a_long_array_takes_one_element_per_line() {
        let items: Vec<Expr> = (0..12)
            .map(|i| Expr::Buffer(BufferMethod::Input, vec![Expr::int(i), Expr::int(123456)]))
            .collect();
        let mut w = Writer::at(2);
        print(
            &mut w,
            &[Stmt::Decl {
                storage: Storage::Auto,
                ty: Ty::VoidPtrConst,
                name: "args".into(),
                init: Init::Array(items),
            }],
        );
        let text = w.finish();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "    void* const args[] = {");
        assert_eq!(lines[1], "      buf.in(0, 123456),");
        assert_eq!(lines[12], "      buf.in(11, 123456)");
        assert_eq!(lines[13], "    };");
        assert!(lines.iter().all(|l| l.len() <= cxx::MAX_LINE));
    }

    #[test]
    fn calls_are_found_inside_blocks_and_arguments() {
        let launch = Expr::Call(
            Func::Launch,
            vec![Expr::Call(
                Func::Dim3,
                vec![Expr::int(1), Expr::int(2), Expr::int(3)],
            )],
        );
        let stmts = [Stmt::Block(vec![Stmt::Checked(Check::Cuda, launch)])];
        assert_eq!(calls(&stmts, Func::Launch).len(), 1);
        let dims = calls(&stmts, Func::Dim3);
        assert_eq!(dims, [vec![&Expr::int(1), &Expr::int(2), &Expr::int(3)]]);
        assert!(calls(&stmts, Func::NcclAllReduce).is_empty());
    }
}
