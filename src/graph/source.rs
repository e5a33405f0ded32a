//! Where a graph's operators came from, so that every later error can name the file, graph
//! index, JSON path, operator and tensor. Graphs built in Rust have no source map; their errors
//! name the operator by position instead.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::arena::Handle;
use super::error::{ErrorKind, GraphError, Location};
use super::kernel::{KernelGraph, KnOp};
use super::mirage_json::names;
use super::threadblock::{TbGraph, TbOp};

/// The JSON origin of one operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpOrigin {
    /// JSON path of the operator object, e.g. `[3][5].bgraph.operators[2]`.
    pub path: String,
    /// The `op_type` string as written in the file.
    pub op_type: String,
}

/// JSON origins of a graph's operators.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceMap {
    /// The file read, if any.
    pub file: Option<PathBuf>,
    /// Index of the graph among the file's candidates.
    pub graph: Option<usize>,
    /// JSON path of the graph (the array of its operators), e.g. `[3]`.
    pub graph_path: Option<String>,
    /// Origin of each kernel operator, by operator index.
    pub kn_ops: Vec<OpOrigin>,
    /// Origin of each threadblock operator, by kernel operator index then operator index.
    pub tb_ops: BTreeMap<usize, Vec<OpOrigin>>,
}

/// The part of an operator an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The operator as a whole.
    Op,
    /// Its k-th input tensor.
    Input(usize),
    /// Its k-th output tensor.
    Output(usize),
    /// The `dtensor` of a threadblock input or output operator.
    DTensor,
    /// One of its keys.
    Key(&'static str),
}

impl Slot {
    fn suffix(self) -> String {
        match self {
            Slot::Op => String::new(),
            Slot::Input(k) => format!(".input_tensors[{k}]"),
            Slot::Output(k) => format!(".output_tensors[{k}]"),
            Slot::DTensor => ".dtensor".into(),
            Slot::Key(k) => format!(".{k}"),
        }
    }
}

fn base(src: Option<&SourceMap>) -> Location {
    Location {
        file: src.and_then(|s| s.file.clone()),
        graph: src.and_then(|s| s.graph),
        ..Location::default()
    }
}

fn guid_text(kind: &str, guid: Option<i64>, index: usize) -> String {
    match guid {
        Some(g) => format!("{kind} guid {g}"),
        None => format!("{kind} #{index}"),
    }
}

/// Location of (a part of) kernel operator `op`.
pub fn kn_location(
    g: &KernelGraph,
    src: Option<&SourceMap>,
    op: Handle<KnOp>,
    slot: Slot,
) -> Location {
    let mut loc = base(src);
    let origin = src.and_then(|s| s.kn_ops.get(op.index()));
    let kn = g.ops.try_get(op);
    let name = origin
        .map(|o| o.op_type.clone())
        .or_else(|| kn.map(|k| names::kn_name(&k.kind)))
        .unwrap_or_else(|| "operator".into());
    loc.op = Some(format!("{name}, kernel op {}", op.index()));
    if let Some(o) = origin {
        loc.json_path = Some(format!("{}{}", o.path, slot.suffix()));
    }
    let t = match (kn, slot) {
        (Some(k), Slot::Input(i)) => k.inputs.get(i).copied(),
        (Some(k), Slot::Output(i)) => k.outputs.get(i).copied(),
        _ => None,
    };
    if let Some(t) = t.and_then(|t| g.tensors.try_get(t).map(|d| (t, d))) {
        loc.tensor = Some(format!(
            "{} {}",
            guid_text("DTensor", t.1.guid, t.0.index()),
            t.1.shape
        ));
    }
    loc
}

/// Location of (a part of) threadblock operator `tb_op` of customized operator `kn_op`.
pub fn tb_location(
    tb: &TbGraph,
    src: Option<&SourceMap>,
    kn_op: Handle<KnOp>,
    tb_op: Handle<TbOp>,
    slot: Slot,
) -> Location {
    let mut loc = base(src);
    let origin = src
        .and_then(|s| s.tb_ops.get(&kn_op.index()))
        .and_then(|v| v.get(tb_op.index()));
    let op = tb.ops.try_get(tb_op);
    let name = origin
        .map(|o| o.op_type.clone())
        .or_else(|| op.map(|o| names::tb_name(&o.kind, false)))
        .unwrap_or_else(|| "operator".into());
    loc.op = Some(format!(
        "{name}, operator {} of kernel op {}",
        tb_op.index(),
        kn_op.index()
    ));
    if let Some(o) = origin {
        loc.json_path = Some(format!("{}{}", o.path, slot.suffix()));
    }
    let t = match (op, slot) {
        (Some(o), Slot::Input(i)) => o.inputs.get(i).copied(),
        (Some(o), Slot::Output(i)) => o.outputs.get(i).copied(),
        _ => None,
    };
    if let Some(t) = t.and_then(|t| tb.tensors.try_get(t).map(|s| (t, s))) {
        loc.tensor = Some(format!(
            "{} {}",
            guid_text("STensor", t.1.guid, t.0.index()),
            t.1.shape
        ));
    }
    loc
}

/// Location of a customized operator's threadblock graph as a whole (grid, block, loop).
pub fn bgraph_location(
    g: &KernelGraph,
    src: Option<&SourceMap>,
    kn_op: Handle<KnOp>,
    key: &str,
) -> Location {
    let mut loc = kn_location(g, src, kn_op, Slot::Op);
    if let Some(p) = &mut loc.json_path {
        p.push_str(".bgraph.");
        p.push_str(key);
    }
    loc
}

/// Shorthand: an error at a location.
pub fn err_at(location: Location, kind: ErrorKind) -> GraphError {
    GraphError {
        location: Box::new(location),
        kind,
    }
}
