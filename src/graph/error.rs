//! Errors of the graph stage (loading, building, validating, interpreting), each with the place
//! it concerns: file, graph index, JSON path, operator and tensor.

use std::fmt;
use std::path::PathBuf;

use super::dtype::DType;
use super::shape::Shape;

/// Where an error was found. Every field is optional: a graph built in Rust has no file or JSON
/// path, a syntax error has no operator.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Location {
    /// The file read.
    pub file: Option<PathBuf>,
    /// Index of the candidate graph in the file.
    pub graph: Option<usize>,
    /// Path inside the JSON document, e.g. `[3][5].bgraph.operators[2].input_tensors[0]`.
    pub json_path: Option<String>,
    /// The operator, e.g. `tb_matmul_op (operator 4 of kernel op 3)`.
    pub op: Option<String>,
    /// The tensor, e.g. `STensor guid 20443395`.
    pub tensor: Option<String>,
}

impl Location {
    /// Whether nothing is known.
    pub fn is_empty(&self) -> bool {
        *self == Location::default()
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if let Some(file) = &self.file {
            parts.push(escape_path(file));
        }
        if let Some(g) = self.graph {
            parts.push(format!("graph {g}"));
        }
        if let Some(p) = &self.json_path {
            parts.push(format!("at {p}"));
        }
        let mut what: Vec<&str> = Vec::new();
        if let Some(op) = &self.op {
            what.push(op);
        }
        if let Some(t) = &self.tensor {
            what.push(t);
        }
        let mut s = parts.join(", ");
        if !what.is_empty() {
            if !s.is_empty() {
                s.push(' ');
            }
            s.push('(');
            s.push_str(&what.join(", "));
            s.push(')');
        }
        f.write_str(&s)
    }
}

pub use crate::text::{clip, escape, escape_path};

/// What went wrong.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The file could not be read.
    #[error("cannot read file: {0}")]
    Io(String),
    /// The text is not JSON (syntax error, truncated file, trailing garbage).
    #[error("invalid JSON at line {line}, column {column}: {message}")]
    Json {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// serde_json's description.
        message: String,
    },
    /// A JSON value has the wrong type.
    #[error("expected {expected}, found {found}")]
    WrongType {
        /// What was expected.
        expected: &'static str,
        /// What the value is.
        found: &'static str,
    },
    /// A required key is absent.
    #[error("missing key `{0}`")]
    MissingKey(String),
    /// A value is out of its allowed range.
    #[error("{0}")]
    BadValue(String),
    /// An `op_type` string that is not a Mirage operator of this level.
    #[error("unknown {level} operator type `{name}`")]
    UnknownOp {
        /// `kernel` or `threadblock`.
        level: &'static str,
        /// The string found.
        name: String,
    },
    /// A known operator that mucc does not accept at this place.
    #[error("{0}")]
    Unsupported(String),
    /// A `data_type` code the dtype table does not define.
    #[error("unknown data_type code {code} in the {table} dtype table")]
    UnknownDtypeCode {
        /// The code.
        code: i64,
        /// The table in use.
        table: String,
    },
    /// An element type mucc cannot store.
    #[error(
        "unsupported element type {0}: mucc stores f16, bf16, f32, f64 and 8/16/32/64-bit integers"
    )]
    UnsupportedDtype(DType),
    /// Operands or results of one operator have different element types.
    #[error("element type mismatch: expected {expected}, found {found}")]
    DtypeMismatch {
        /// The type of the first operand.
        expected: DType,
        /// The type found.
        found: DType,
    },
    /// A guid that no earlier operator defines.
    #[error("dangling guid {0}: no earlier operator of this graph defines it")]
    DanglingGuid(i64),
    /// A guid defined twice in one scope.
    #[error("duplicate guid {guid}: already defined at {first}")]
    DuplicateGuid {
        /// The guid.
        guid: i64,
        /// Where it was defined first.
        first: String,
    },
    /// A consumer's copy of a tensor disagrees with its producer.
    #[error("{what} recorded here ({here}) differs from the producer's ({producer})")]
    CopyMismatch {
        /// Which field.
        what: &'static str,
        /// Value in the consumer's copy.
        here: String,
        /// Value at the producer.
        producer: String,
    },
    /// The recorded shape of a result differs from the shape the operator computes.
    #[error("shape mismatch: recorded {recorded}, but the operator produces {inferred}")]
    ShapeMismatch {
        /// Recorded shape.
        recorded: Shape,
        /// Inferred shape.
        inferred: Shape,
    },
    /// The recorded `after_accum` flag differs from the inferred one.
    #[error("after_accum mismatch: recorded {recorded}, inferred {inferred}")]
    AfterAccumMismatch {
        /// Recorded flag.
        recorded: bool,
        /// Inferred flag.
        inferred: bool,
    },
    /// Operands an operator cannot combine.
    #[error("invalid operands: {0}")]
    Operands(String),
    /// Wrong number of inputs or outputs.
    #[error("expected {expected} {what}, found {found}")]
    Arity {
        /// `inputs` or `outputs`.
        what: &'static str,
        /// Expected count.
        expected: String,
        /// Actual count.
        found: usize,
    },
    /// A partition that does not divide the extent.
    #[error("{what}: extent {extent} of dim {dim} is not divisible by {by}")]
    NotDivisible {
        /// What is partitioned.
        what: String,
        /// The dim.
        dim: usize,
        /// Its extent.
        extent: usize,
        /// The divisor.
        by: usize,
    },
    /// A grid axis with more than one block that an output map leaves unmapped: blocks along it
    /// would write the same region.
    #[error(
        "grid axis {axis} has {size} blocks but the output map does not map it (blocks would overwrite each other)"
    )]
    UnmappedGridAxis {
        /// Axis name.
        axis: &'static str,
        /// Blocks along it.
        size: usize,
    },
    /// Two grid axes partition the same dim.
    #[error("grid axes {a} and {b} both partition dim {dim}")]
    AxesShareDim {
        /// First axis.
        a: &'static str,
        /// Second axis.
        b: &'static str,
        /// The dim.
        dim: usize,
    },
    /// Two GPU mesh axes partition the same dim of a graph input or output.
    #[error("GPU mesh axes {a} and {b} both partition dim {dim}")]
    MeshAxesShareDim {
        /// First axis.
        a: &'static str,
        /// Second axis.
        b: &'static str,
        /// The dim.
        dim: usize,
    },
    /// A graph partitions tensors across GPUs, but nobody said how many GPUs it runs on.
    #[error("{0}")]
    GpuCountUnknown(String),
    /// An operator mixing in-loop and after-loop inputs.
    #[error("inputs mix in-loop and after-loop (after_accum) tiles")]
    MixedAfterAccum,
    /// Strides that are malformed or alias elements.
    #[error("bad strides {strides}: {reason}")]
    BadStrides {
        /// The strides.
        strides: String,
        /// Why they are bad.
        reason: String,
    },
    /// A grid or block over the CUDA limits.
    #[error("{0}")]
    LaunchLimit(String),
    /// Anything else that makes the graph invalid.
    #[error("{0}")]
    Invalid(String),
}

/// An error with its location.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphError {
    /// Where (boxed: errors travel through `Result`s on hot paths).
    pub location: Box<Location>,
    /// What.
    pub kind: ErrorKind,
}

impl GraphError {
    /// An error with an empty location.
    pub fn new(kind: ErrorKind) -> Self {
        GraphError {
            location: Box::default(),
            kind,
        }
    }

    /// Sets the file.
    pub fn in_file(mut self, file: impl Into<PathBuf>) -> Self {
        self.location.file = Some(file.into());
        self
    }
}

impl fmt::Display for GraphError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.location.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}: {}", self.location, self.kind)
        }
    }
}

impl std::error::Error for GraphError {}

/// All errors validation found in one graph (never empty).
#[derive(Clone, Debug, PartialEq)]
pub struct ValidationErrors(pub Vec<GraphError>);

impl ValidationErrors {
    /// The first error.
    pub fn first(&self) -> &GraphError {
        &self.0[0]
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationErrors {}

impl From<GraphError> for ValidationErrors {
    fn from(e: GraphError) -> Self {
        ValidationErrors(vec![e])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_name_is_shown_escaped() {
        let loc = Location {
            file: Some(PathBuf::from("a\nerror: b.json")),
            graph: Some(2),
            ..Location::default()
        };
        assert_eq!(loc.to_string(), "a\\nerror: b.json, graph 2");
    }
}
