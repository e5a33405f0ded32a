//! C++ spelling, in one place: element and compute types, literals (finite and infinite),
//! operator calls, layout types; and [`Writer`], which writes lines at a typed indentation.

use std::fmt::Write as _;

use crate::graph::dtype::DType;
use crate::graph::ops::{BinaryOp, UnaryOp};
use crate::layout::swizzle::Swizzle;

/// The longest line of C++ the emitter writes.
pub const MAX_LINE: usize = 120;

/// C++ element type of a dtype.
pub fn ctype(d: DType) -> &'static str {
    match d {
        DType::F16 => "mucc::f16",
        DType::BF16 => "mucc::bf16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I8 => "mucc::i8",
        DType::U8 => "mucc::u8",
        DType::I16 => "mucc::i16",
        DType::U16 => "mucc::u16",
        DType::I32 => "mucc::i32",
        DType::U32 => "mucc::u32",
        DType::I64 => "mucc::i64",
        DType::U64 => "mucc::u64",
        // Validation rejects these.
        DType::F8 | DType::F4 | DType::I4 | DType::U4 => "void",
    }
}

/// The C++ type arithmetic on `d` runs in (`mucc::Compute<T>`): float for 16-bit floats and
/// fp32, double otherwise.
pub fn compute_ctype(d: DType) -> &'static str {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => "float",
        _ => "double",
    }
}

/// A value of compute type `c` (`float` or `double`) equal to `x`: a literal that reads back as
/// exactly `x`, or the runtime's infinity and NaN helpers.
pub fn number(x: f64, c: &str) -> String {
    if x.is_nan() {
        format!("mucc::nan<{c}>()")
    } else if x == f64::INFINITY {
        format!("mucc::inf<{c}>()")
    } else if x == f64::NEG_INFINITY {
        format!("mucc::neg_inf<{c}>()")
    } else {
        let s = format!("{x:?}");
        let lit = if s.contains('.') || s.contains('e') {
            s
        } else {
            format!("{s}.0")
        };
        format!("{c}({lit})")
    }
}

/// `u(v)` in compute type `c`.
pub fn unary(u: &UnaryOp, v: &str, c: &str) -> String {
    match *u {
        UnaryOp::Exp => format!("mucc::op::exp({v})"),
        UnaryOp::Square => format!("mucc::op::square({v})"),
        UnaryOp::Sqrt => format!("mucc::op::sqrt({v})"),
        UnaryOp::Silu => format!("mucc::op::silu({v})"),
        UnaryOp::Sigmoid => format!("mucc::op::sigmoid({v})"),
        UnaryOp::Gelu => format!("mucc::op::gelu({v})"),
        UnaryOp::Relu => format!("mucc::op::relu({v})"),
        UnaryOp::Log => format!("mucc::op::log({v})"),
        UnaryOp::Clamp { min, max } => {
            format!(
                "mucc::op::clamp({v}, {}, {})",
                number(min, c),
                number(max, c)
            )
        }
        UnaryOp::MulScalar(s) => format!("mucc::op::mul({v}, {})", number(s, c)),
    }
}

/// `b(x, y)`.
pub fn binary(b: BinaryOp, x: &str, y: &str) -> String {
    let f = match b {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
        BinaryOp::Pow => "pow",
    };
    format!("mucc::op::{f}({x}, {y})")
}

/// `a, b, c`.
pub fn list<T: std::fmt::Display>(v: &[T]) -> String {
    let mut s = String::new();
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{x}");
    }
    s
}

/// A compile-time layout type: extents and strides (slowest dim first), optionally XOR-swizzled
/// (other swizzles are in the strides already).
pub fn layout(dims: &[usize], strides: &[usize], swizzle: Option<Swizzle>) -> String {
    let base = format!(
        "mucc::Layout<mucc::Shape<{}>, mucc::Stride<{}>>",
        list(dims),
        list(strides)
    );
    match swizzle {
        Some(Swizzle::Xor { b, m, s }) => {
            format!("mucc::SwizzledLayout<{base}, mucc::Swizzle<{b}, {m}, {s}>>")
        }
        _ => base,
    }
}

/// Lines of C++ at an indentation level (two spaces per level).
#[derive(Debug, Default)]
pub struct Writer {
    out: String,
    level: usize,
}

impl Writer {
    /// An empty writer at level 0.
    pub fn new() -> Writer {
        Writer::default()
    }

    /// A writer whose lines start at `level`.
    pub fn at(level: usize) -> Writer {
        Writer {
            out: String::new(),
            level,
        }
    }

    /// One line.
    pub fn line(&mut self, text: impl AsRef<str>) {
        let text = text.as_ref();
        if text.is_empty() {
            self.out.push('\n');
            return;
        }
        for _ in 0..self.level {
            self.out.push_str("  ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    /// `head {`, then one level deeper.
    pub fn open(&mut self, head: impl AsRef<str>) {
        let head = head.as_ref();
        if head.is_empty() {
            self.line("{");
        } else {
            self.line(format!("{head} {{"));
        }
        self.level += 1;
    }

    /// One level up, then `}` followed by `tail` (`;`, `);`, `  // …`).
    pub fn close(&mut self, tail: impl AsRef<str>) {
        self.level = self.level.saturating_sub(1);
        self.line(format!("}}{}", tail.as_ref()));
    }

    /// `head {`, the lines `body` writes one level deeper, `}` + `tail`.
    pub fn block(&mut self, head: impl AsRef<str>, tail: &str, body: impl FnOnce(&mut Writer)) {
        self.open(head);
        body(self);
        self.close(tail);
    }

    /// The lines `body` writes, one level deeper, without braces (continuation lines).
    pub fn indented(&mut self, body: impl FnOnce(&mut Writer)) {
        self.level += 1;
        body(self);
        self.level -= 1;
    }

    /// The lines written so far.
    pub fn finish(self) -> String {
        self.out
    }

    /// The current level.
    pub fn level(&self) -> usize {
        self.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_back_exactly_and_infinities_are_c_plus_plus() {
        assert_eq!(number(2.0, "float"), "float(2.0)");
        assert_eq!(number(0.1, "double"), "double(0.1)");
        assert_eq!(number(1e-30, "float"), "float(1e-30)");
        assert_eq!(number(f64::NEG_INFINITY, "float"), "mucc::neg_inf<float>()");
        assert_eq!(number(f64::INFINITY, "double"), "mucc::inf<double>()");
        assert_eq!(number(f64::NAN, "float"), "mucc::nan<float>()");
        let clamp = UnaryOp::Clamp {
            min: f64::NEG_INFINITY,
            max: 6.0,
        };
        assert_eq!(
            unary(&clamp, "v", "float"),
            "mucc::op::clamp(v, mucc::neg_inf<float>(), float(6.0))"
        );
    }

    #[test]
    fn writer_indents_blocks() {
        let mut w = Writer::new();
        w.block("for (int i = 0; i < 4; ++i)", "", |w| {
            w.line("f(i);");
            w.block("", "", |w| w.line("g();"));
        });
        assert_eq!(
            w.finish(),
            "for (int i = 0; i < 4; ++i) {\n  f(i);\n  {\n    g();\n  }\n}\n"
        );
    }
}
