//! Mirage µGraph JSON → IR (`mirage-graph-format.md` §1–§3).
//!
//! The importer is structural: it resolves guids, binds customized operators' threadblock inputs
//! and outputs by position (verified by guid), decodes element types, normalises legacy
//! spellings and the May-2024 schema, and records every operator's JSON path. Shapes and flags
//! are taken as recorded; [`crate::graph::validate`] recomputes and checks them.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// What the warning about an all-reduce in a graph of unknown GPU count says (and how
/// [`super::MirageFile::set_gpu_mesh`] recognises it once the count is given).
pub(crate) const UNKNOWN_MESH: &str = "Mirage's JSON does not record the GPU count (gpu_dim)";

use serde_json::Value;

use super::cursor::{J, JResult, PathErr};
use super::names::{self, KnName, NameError, TbName, UnaryName};
use super::{FileForm, ImportOptions, LoadedGraph, MirageFile};
use crate::graph::arena::Handle;
use crate::graph::dtype::{DType, DtypeTable};
use crate::graph::error::{ErrorKind, GraphError, Location, clip};
use crate::graph::kernel::{DTensor, KernelGraph, KnOp, KnOpKind};
use crate::graph::ops::{AccumKind, DimMap, TbReduction, UnaryOp};
use crate::graph::shape::{MAX_DIMS, Shape, Strides};
use crate::graph::sharding::{GpuMesh, MAX_GPUS};
use crate::graph::source::{OpOrigin, SourceMap};
use crate::graph::threadblock::{STensor, TbGraph, TbOp, TbOpKind};

/// Largest extent, stride or launch dimension accepted from a file (2⁴⁰).
const MAX_EXTENT: usize = 1 << 40;

/// Parses a Mirage µGraph document. `file` is only used in error messages.
pub fn parse_str(
    text: &str,
    file: Option<&Path>,
    opts: &ImportOptions,
) -> Result<MirageFile, GraphError> {
    // A UTF-8 byte-order mark is not JSON, but editors write one; RFC 8259 lets readers skip it.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let file_buf = file.map(Path::to_path_buf);
    let with_file = |mut e: GraphError| {
        e.location.file = file_buf.clone();
        e
    };
    let doc: Value = super::strict::from_str(text, opts.max_graphs).map_err(|e| {
        with_file(GraphError::new(ErrorKind::Json {
            line: e.line(),
            column: e.column(),
            message: json_message(&e),
        }))
    })?;
    let root = J::root(&doc, "");
    let path_err = |e: Box<PathErr>| {
        with_file(GraphError {
            location: Box::new(Location {
                json_path: Some(if e.path.is_empty() {
                    "(document root)".into()
                } else {
                    e.path
                }),
                ..Location::default()
            }),
            kind: e.kind,
        })
    };

    // Top-level form.
    let (form, graph_values): (FileForm, Vec<J>) = match &doc {
        Value::Object(_) if root.has("generated_graphs") => (
            FileForm::LegacyCheckpoint,
            root.key("generated_graphs")
                .and_then(|g| g.items())
                .map_err(path_err)?,
        ),
        Value::Array(items) => {
            if items.is_empty() {
                return Err(path_err(root.err(ErrorKind::Invalid(
                    "the file holds no graphs (an empty array)".into(),
                ))));
            }
            if items[0].is_array() {
                (FileForm::CandidateList, root.items().map_err(path_err)?)
            } else {
                (FileForm::SingleGraph, vec![root.clone()])
            }
        }
        _ => {
            return Err(path_err(root.err(ErrorKind::WrongType {
                expected: "an array of graphs, a graph, or a checkpoint object with generated_graphs",
                found: match &doc {
                    Value::Object(_) => "an object without generated_graphs",
                    Value::Null => "null",
                    _ => "a scalar",
                },
            })));
        }
    };
    if graph_values.is_empty() {
        return Err(path_err(
            root.err(ErrorKind::Invalid("the file holds no graphs".into())),
        ));
    }

    let (table, table_reason, warning) = match opts.dtype_table {
        Some(t) => (t, "given explicitly".to_string(), None),
        None => detect_table(&doc, &graph_values, form).map_err(|(graph, e)| {
            let mut e = path_err(e);
            e.location.graph = graph;
            e
        })?,
    };
    let mut warnings: Vec<String> = warning.into_iter().collect();

    let mut graphs = Vec::with_capacity(graph_values.len());
    for (index, gv) in graph_values.iter().enumerate() {
        let mut imp = GraphImporter {
            table,
            legacy_schema: form == FileForm::LegacyCheckpoint,
            g: KernelGraph::new(),
            src: SourceMap {
                file: file_buf.clone(),
                graph: Some(index),
                graph_path: Some(if gv.path.is_empty() {
                    "(document root)".into()
                } else {
                    gv.path.clone()
                }),
                ..SourceMap::default()
            },
            dguids: HashMap::new(),
        };
        imp.graph(gv, &mut warnings)?;
        graphs.push(LoadedGraph {
            graph: imp.g,
            source: imp.src,
        });
    }
    Ok(MirageFile {
        path: file_buf,
        form,
        dtype_table: table,
        dtype_table_reason: table_reason,
        warnings,
        graphs,
    })
}

/// Why [`read_regular_file`] read nothing.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The file could not be opened or read.
    Io(std::io::Error),
    /// It is a directory, device, pipe or socket (after following symbolic links).
    NotRegular,
    /// It holds more than the limit (its length, or the limit + 1 if it grew while read).
    TooLarge(u64),
}

/// Reads a file that must be a regular file (symbolic links followed) of at most `max` bytes,
/// never waiting on a pipe or reading a device: the checks run before the file is opened, and
/// again on the opened file (opened non-blocking, so a pipe put in its place meanwhile is
/// refused, not waited on). Input files and cache entries are read this way.
pub(crate) fn read_regular_file(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let meta = std::fs::metadata(path).map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular);
    }
    if meta.len() > max {
        return Err(ReadError::TooLarge(meta.len()));
    }
    // Non-blocking, so that a FIFO swapped in after the check cannot make the open wait for a
    // writer (reads of a regular file are not affected).
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let f = opts.open(path).map_err(ReadError::Io)?;
    let meta = f.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular);
    }
    let mut bytes = Vec::with_capacity(meta.len().min(max) as usize);
    // One byte past the limit tells a file that grew since `metadata` from one that fits.
    std::io::Read::read_to_end(
        &mut std::io::Read::take(f, max.saturating_add(1)),
        &mut bytes,
    )
    .map_err(ReadError::Io)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Reads and parses a file.
pub fn read_file(path: &Path, opts: &ImportOptions) -> Result<MirageFile, GraphError> {
    let io = |msg: String| GraphError::new(ErrorKind::Io(msg)).in_file(path);
    let max = opts.max_input_bytes;
    let bytes = read_regular_file(path, max).map_err(|e| {
        match e {
        ReadError::Io(e) => io(e.to_string()),
        ReadError::NotRegular => io(
            "not a regular file (a directory, device, pipe or socket); mucc reads µGraph JSON files"
                .into(),
        ),
        ReadError::TooLarge(len) => io(format!(
            "the file has {len} bytes, more than the limit of {max} (--max-input-bytes raises it)"
        )),
    }
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let bad = e.utf8_error().valid_up_to();
        let before = &e.as_bytes()[..bad];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = bad
            - before
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |p| p + 1)
            + 1;
        GraphError::new(ErrorKind::Json {
            line,
            column,
            message: "the file is not UTF-8 text".into(),
        })
        .in_file(path)
    })?;
    parse_str(&text, Some(path), opts)
}

fn json_message(e: &serde_json::Error) -> String {
    let s = e.to_string();
    // serde_json appends " at line L column C"; we print those separately.
    let msg = match s.rfind(" at line ") {
        Some(i) => s[..i].to_string(),
        None => s,
    };
    match e.classify() {
        serde_json::error::Category::Eof => format!("{msg} (the file is truncated)"),
        _ if msg.starts_with("trailing characters") => {
            format!("{msg} (garbage after the end of the JSON document)")
        }
        _ => msg,
    }
}

/// The dtype table chosen for a file: (table, why, warning if ambiguous).
type TableChoice = (DtypeTable, String, Option<String>);

/// Chooses the dtype table from the document (§2.6.1 of the format reference).
fn detect_table(
    doc: &Value,
    graphs: &[J],
    form: FileForm,
) -> Result<TableChoice, (Option<usize>, Box<PathErr>)> {
    if let Some(t) = table_marker(doc).map_err(|kind| {
        let path = "[0][0].mucc_dtype_table".into();
        (
            Some(0),
            Box::new(PathErr {
                path,
                kind,
                op: None,
            }),
        )
    })? {
        // One file has one table: a candidate naming another is an error, not a silent misread.
        for (i, g) in graphs.iter().enumerate().skip(1) {
            let other = g.v.get(0).and_then(|op| op.get(super::export::TABLE_KEY));
            if let Some(Value::String(s)) = other
                && s.parse::<DtypeTable>().ok() != Some(t)
            {
                return Err((
                    Some(i),
                    Box::new(PathErr {
                        path: format!("{}[0].{}", g.path, super::export::TABLE_KEY),
                        kind: ErrorKind::BadValue(format!(
                            "this graph names dtype table `{}` but graph 0 names `{t}`; one file is read with one table (split the file, or give --dtype-table)",
                            clip(s)
                        )),
                        op: None,
                    }),
                ));
            }
        }
        return Ok((
            t,
            format!("named by `{}` (written by mucc)", super::export::TABLE_KEY),
            None,
        ));
    }
    let mut codes = BTreeSet::new();
    let mut legacy_names = form == FileForm::LegacyCheckpoint;
    let mut new_names = false;
    let mut head_ops = false;
    for g in graphs {
        scan(
            g.v,
            &mut codes,
            &mut legacy_names,
            &mut new_names,
            &mut head_ops,
        );
    }
    // Errors point at the first use of a code that the remaining tables cannot read.
    let located = |tables: &[DtypeTable], kind: ErrorKind| {
        let best = tables
            .iter()
            .max_by_key(|t| codes.iter().filter(|&&c| t.decode(c).is_some()).count());
        let code = codes
            .iter()
            .copied()
            .find(|&c| best.is_none_or(|t| t.decode(c).is_none()));
        let (graph, path) = code
            .and_then(|c| {
                graphs
                    .iter()
                    .enumerate()
                    .find_map(|(i, g)| find_code(g.v, c, g.path.clone()).map(|p| (Some(i), p)))
            })
            .unwrap_or_default();
        (
            graph,
            Box::new(PathErr {
                path,
                kind,
                op: None,
            }),
        )
    };
    let decodable = |t: DtypeTable| codes.iter().all(|&c| t.decode(c).is_some());
    let mut candidates: Vec<DtypeTable> = DtypeTable::ALL
        .into_iter()
        .filter(|&t| decodable(t))
        .collect();
    let codes_text = codes
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if candidates.is_empty() {
        return Err(located(
            &DtypeTable::ALL,
            ErrorKind::BadValue(format!(
                "no dtype table defines all data_type codes used ({codes_text}); pass --dtype-table to choose one"
            )),
        ));
    }
    let mut why = Vec::new();
    let mut allowed = DtypeTable::ALL.to_vec();
    if legacy_names {
        // Legacy accumulator names: legacy codes, or (Feb 28 – Mar 10, 2025) mid codes.
        allowed.retain(|&t| t != DtypeTable::Current);
        why.push("legacy operator names");
    } else if new_names {
        allowed.retain(|&t| t != DtypeTable::Legacy);
        why.push("current operator names");
    }
    if head_ops {
        allowed.retain(|&t| t == DtypeTable::Current);
        why.push("operators that only recent Mirage writes");
    }
    candidates.retain(|t| allowed.contains(t));
    if candidates.is_empty() {
        let kind = ErrorKind::BadValue(format!(
            "the data_type codes used ({codes_text}) do not fit the file's vintage ({}); pass --dtype-table to choose a table",
            why.join(", ")
        ));
        return Err(located(&allowed, kind));
    }
    let all_agree = |a: DtypeTable| {
        candidates
            .iter()
            .all(|&b| codes.iter().all(|&c| a.agrees_with(b, c)))
    };
    // When the file does not decide: prefer the reading under which more codes are the usual
    // storage types (f16, bf16, f32: legacy 940 is f64 and mid 940 is bf16, so a legacy-named
    // file with 940 is a Feb/Mar-2025 mid file); then legacy, whose unique codes already
    // excluded the others; then mid (the real-world files with 940/941 are the Qwen2.5 demo
    // caches, mid-era bf16); then current.
    let usual = |t: DtypeTable| {
        codes
            .iter()
            .filter(|&&c| matches!(t.decode(c), Some(DType::F16 | DType::BF16 | DType::F32)))
            .count()
    };
    let order = [DtypeTable::Legacy, DtypeTable::Mid, DtypeTable::Current];
    let pick = order
        .into_iter()
        .filter(|t| candidates.contains(t))
        .rev()
        .max_by_key(|&t| usual(t))
        .unwrap_or(DtypeTable::Current);
    let mut reason = if why.is_empty() {
        format!("data_type codes {codes_text}")
    } else {
        format!("{}; data_type codes {codes_text}", why.join(", "))
    };
    let warning = if candidates.len() > 1 && !all_agree(pick) {
        let alternatives: Vec<String> = candidates
            .iter()
            .filter(|&&t| t != pick)
            .map(|&t| {
                let meanings: Vec<String> = codes
                    .iter()
                    .filter(|&&c| !pick.agrees_with(t, c))
                    .map(|&c| {
                        format!(
                            "{c} = {}",
                            t.decode(c).map_or("?".into(), |d| d.to_string())
                        )
                    })
                    .collect();
                format!("under the {t} table {}", meanings.join(", "))
            })
            .collect();
        reason.push_str(" (ambiguous)");
        Some(format!(
            "the dtype table is ambiguous: reading codes with the {pick} table ({}), but {}; pass --dtype-table to choose",
            codes
                .iter()
                .map(|&c| format!(
                    "{c} = {}",
                    pick.decode(c).map_or("?".into(), |d| d.to_string())
                ))
                .collect::<Vec<_>>()
                .join(", "),
            alternatives.join("; ")
        ))
    } else {
        None
    };
    Ok((pick, reason, warning))
}

/// The JSON path of the first `data_type` equal to `code` under `v` (at `path`).
fn find_code(v: &Value, code: i64, path: String) -> Option<String> {
    match v {
        Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, x)| find_code(x, code, format!("{path}[{i}]"))),
        Value::Object(o) => o.iter().find_map(|(k, x)| {
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            if k == "data_type" && x.as_i64() == Some(code) {
                Some(p)
            } else {
                find_code(x, code, p)
            }
        }),
        _ => None,
    }
}

/// The table named by mucc's marker key on the first operator of the first graph, if any.
fn table_marker(doc: &Value) -> Result<Option<DtypeTable>, ErrorKind> {
    let first_graph = match doc {
        Value::Object(o) => o.get("generated_graphs").and_then(|g| g.get(0)),
        Value::Array(a) if a.first().is_some_and(Value::is_array) => a.first(),
        other => Some(other),
    };
    let marker = first_graph
        .and_then(|g| g.get(0))
        .and_then(|op| op.get(super::export::TABLE_KEY));
    match marker {
        None => Ok(None),
        Some(Value::String(s)) => s.parse().map(Some).map_err(ErrorKind::BadValue),
        Some(_) => Err(ErrorKind::BadValue(format!(
            "`{}` must be \"legacy\", \"mid\" or \"current\"",
            super::export::TABLE_KEY
        ))),
    }
}

fn scan(v: &Value, codes: &mut BTreeSet<i64>, legacy: &mut bool, new: &mut bool, head: &mut bool) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| scan(x, codes, legacy, new, head)),
        Value::Object(o) => {
            for (k, x) in o {
                match (k.as_str(), x) {
                    ("data_type", Value::Number(n)) => {
                        if let Some(c) = n.as_i64() {
                            codes.insert(c);
                        }
                    }
                    ("op_type", Value::String(s)) => {
                        if s.starts_with("tb_accum_") {
                            *legacy = true;
                        } else if s.starts_with("tb_forloop_accum_") {
                            *new = true;
                        } else if s.starts_with("kn_chunk_") || s == "kn_allreduce_op" {
                            *head = true;
                        }
                    }
                    _ => scan(x, codes, legacy, new, head),
                }
            }
        }
        _ => {}
    }
}

struct GraphImporter {
    table: DtypeTable,
    legacy_schema: bool,
    g: KernelGraph,
    src: SourceMap,
    /// DTensor guid → (tensor, JSON path of its definition).
    dguids: HashMap<i64, (Handle<DTensor>, String)>,
}

/// What an error is about, for the location.
#[derive(Clone, Default)]
struct Ctx {
    op: Option<String>,
}

/// Fields shared by DTensor and STensor objects.
struct TensorFields {
    shape: Shape,
    dtype: DType,
    guid: i64,
}

impl TensorFields {
    /// Checks a consumer's copy (these fields, read from `j`) against the tensor's definition.
    fn matches(&self, j: &J, shape: &Shape, dtype: DType) -> JResult<()> {
        if self.shape != *shape {
            return Err(j.key("dim")?.err(ErrorKind::CopyMismatch {
                what: "shape",
                here: self.shape.to_string(),
                producer: shape.to_string(),
            }));
        }
        if self.dtype != dtype {
            return Err(j.key("data_type")?.err(ErrorKind::CopyMismatch {
                what: "data_type",
                here: self.dtype.to_string(),
                producer: dtype.to_string(),
            }));
        }
        Ok(())
    }
}

/// Mirage's `DmemLayout` names (the field is not the memory layout; strides are elsewhere).
const DMEM_LAYOUTS: &[&str] = &["DmemRowMajor", "DmemColumnMajor", "DmemUnknownLayout"];
/// Mirage's `SmemLayout` names.
const SMEM_LAYOUTS: &[&str] = &[
    "SmemRowMajor",
    "SmemColumnMajor",
    "SmemRowMajorTensorOpMultiplicand_Crosswise16",
    "SmemRowMajorTensorOpMultiplicand_Crosswise32",
    "SmemRowMajorTensorOpMultiplicand_Crosswise64",
    "SmemColumnMajorTensorOpMultiplicand_Crosswise16",
    "SmemColumnMajorTensorOpMultiplicand_Crosswise32",
    "SmemColumnMajorTensorOpMultiplicand_Crosswise64",
    "SmemUnknownLayout",
];

fn parse_tensor_fields(j: &J, table: DtypeTable) -> JResult<TensorFields> {
    // A `layout`, when present, is one of Mirage's names (of either level: the same reader
    // serves DTensors and STensors, and mucc ignores the value, as Mirage's transpiler does).
    if let Some(lj) = j.opt_key("layout")? {
        let l = lj.str()?;
        if !DMEM_LAYOUTS.contains(&l) && !SMEM_LAYOUTS.contains(&l) {
            return Err(lj.err(ErrorKind::BadValue(format!(
                "unknown layout `{}` (Mirage writes DmemRowMajor, DmemColumnMajor, DmemUnknownLayout or an SmemLayout name)",
                clip(l)
            ))));
        }
    }
    let code_j = j.key("data_type")?;
    let code = code_j.int()?;
    let dtype = table.decode(code).ok_or_else(|| {
        code_j.err(ErrorKind::UnknownDtypeCode {
            code,
            table: table.name().into(),
        })
    })?;
    let nd_j = j.key("num_dims")?;
    let nd = nd_j.int_in(1, MAX_DIMS as i64, "num_dims")? as usize;
    let dim_j = j.key("dim")?;
    let dims = dim_j.items()?;
    if dims.len() > MAX_DIMS {
        return Err(dim_j.err(ErrorKind::BadValue(format!(
            "dim has {} entries; Mirage writes {MAX_DIMS} (MAX_TENSOR_DIMS)",
            dims.len()
        ))));
    }
    if dims.len() < nd {
        return Err(dim_j.err(ErrorKind::BadValue(format!(
            "dim has {} entries but num_dims is {nd}",
            dims.len()
        ))));
    }
    let mut ext = Vec::with_capacity(nd);
    for d in &dims[..nd] {
        ext.push(d.size(MAX_EXTENT, "extent")?);
    }
    for d in &dims[nd..] {
        d.int()?;
    }
    let shape =
        Shape::new(&ext).ok_or_else(|| dim_j.err(ErrorKind::BadValue("bad rank".into())))?;
    let guid = j.key("guid")?.int()?;
    Ok(TensorFields { shape, dtype, guid })
}

impl GraphImporter {
    fn error(&self, e: PathErr, ctx: &Ctx) -> GraphError {
        GraphError {
            location: Box::new(Location {
                file: self.src.file.clone(),
                graph: self.src.graph,
                json_path: Some(e.path),
                op: e.op.or_else(|| ctx.op.clone()),
                tensor: None,
            }),
            kind: e.kind,
        }
    }

    fn graph(&mut self, gj: &J, warnings: &mut Vec<String>) -> Result<(), GraphError> {
        let root_ctx = Ctx::default();
        let ops = gj.items().map_err(|e| self.error(*e, &root_ctx))?;
        if let Some(first) = ops.first() {
            let ctx = Ctx {
                op: Some("kernel op 0".into()),
            };
            self.g.sharding.mesh = gpu_dim_marker(first).map_err(|e| self.error(*e, &ctx))?;
        }
        for (i, oj) in ops.iter().enumerate() {
            let op_type = oj.key("op_type").and_then(|t| t.str()).map_err(|e| {
                self.error(
                    *e,
                    &Ctx {
                        op: Some(format!("kernel op {i}")),
                    },
                )
            })?;
            let ctx = Ctx {
                op: Some(format!("{}, kernel op {i}", clip(op_type))),
            };
            let name = names::parse_kn(op_type).map_err(|ne| {
                let t = oj.key("op_type").expect("checked above");
                self.error(
                    *t.err(match ne {
                        NameError::Unknown => ErrorKind::UnknownOp {
                            level: "kernel",
                            name: clip(op_type),
                        },
                        NameError::Unsupported(why) => ErrorKind::Unsupported(why.into()),
                    }),
                    &ctx,
                )
            })?;
            self.kn_op(oj, name).map_err(|e| self.error(*e, &ctx))?;
            self.src.kn_ops.push(OpOrigin {
                path: oj.path.clone(),
                op_type: op_type.to_string(),
            });
        }
        if self.legacy_schema && self.g.outputs().is_empty() {
            self.implicit_outputs(warnings);
        }
        let all_reduce = self
            .g
            .ops
            .iter()
            .any(|(_, op)| matches!(op.kind, KnOpKind::AllReduce { .. }));
        if all_reduce && self.g.sharding.mesh.is_none() {
            warnings.push(format!(
                "graph {}: kn_allreduce_op, but {UNKNOWN_MESH}; the graph is read as running on one GPU, where the all-reduce is the identity, unless the GPU mesh is given (--gpus N)",
                self.src.graph.unwrap_or(0)
            ));
        }
        Ok(())
    }

    /// May-2024 schema: no output operators; every tensor nobody reads is an output.
    fn implicit_outputs(&mut self, warnings: &mut Vec<String>) {
        let mut read = vec![false; self.g.tensors.len()];
        for (_, op) in self.g.ops.iter() {
            for &t in &op.inputs {
                read[t.index()] = true;
            }
        }
        let mut added = 0;
        let producers: Vec<(usize, Handle<DTensor>)> = self
            .g
            .ops
            .iter()
            .filter(|(_, op)| !matches!(op.kind, KnOpKind::Input { .. }))
            .flat_map(|(h, op)| op.outputs.iter().map(move |&t| (h.index(), t)))
            .collect();
        for (producer, t) in producers {
            if !read[t.index()] {
                self.g.ops.append(KnOp {
                    kind: KnOpKind::Output { strides: None },
                    inputs: vec![t],
                    outputs: vec![],
                });
                let path = self.src.kn_ops[producer].path.clone();
                self.src.kn_ops.push(OpOrigin {
                    path,
                    op_type: "kn_output_op (implicit, May-2024 schema)".into(),
                });
                added += 1;
            }
        }
        warnings.push(format!(
            "graph {}: May-2024 schema without kn_output_op; the {added} tensor(s) nobody reads are the outputs",
            self.src.graph.unwrap_or(0)
        ));
    }

    /// Resolves `input_tensors[k]` of a kernel op against earlier definitions.
    fn resolve_dtensor(&self, tj: &J) -> JResult<Handle<DTensor>> {
        let gj = tj.key("guid")?;
        let guid = gj.int()?;
        let &(h, _) = self
            .dguids
            .get(&guid)
            .ok_or_else(|| gj.err(ErrorKind::DanglingGuid(guid)))?;
        self.check_copy(tj, h)?;
        Ok(h)
    }

    /// Binds a `tb_input_op` or `tb_output_op` (`oj`, `what` "input" or "output") to the
    /// customized operator's port `pos` (`ports` as the file records them, `handles` as
    /// imported): its `dtensor` must name that port's guid (threadblock ports are bound by
    /// position) and copy its fields.
    fn bind_port(
        &self,
        oj: &J,
        what: &str,
        ports: &[J],
        handles: &[Handle<DTensor>],
        pos: usize,
    ) -> JResult<()> {
        let dj = oj.key("dtensor")?;
        let port = ports.get(pos).ok_or_else(|| {
            oj.err(ErrorKind::Invalid(format!(
                "tb_{what}_op number {} but the customized operator has only {} {what}s",
                pos + 1,
                ports.len()
            )))
        })?;
        let gj = dj.key("guid")?;
        let guid = gj.int()?;
        let want = port.key("guid")?.int()?;
        if guid != want {
            return Err(gj.err(ErrorKind::Invalid(format!(
                "tb_{what}_op number {} names DTensor guid {guid}, but {what} {pos} of the customized operator is guid {want} (threadblock {what}s are bound by position)",
                pos + 1
            ))));
        }
        self.check_copy(&dj, handles[pos])
    }

    /// Checks a consumer's copy of a DTensor against its definition.
    fn check_copy(&self, tj: &J, h: Handle<DTensor>) -> JResult<()> {
        let f = parse_tensor_fields(tj, self.table)?;
        let d = &self.g.tensors[h];
        f.matches(tj, &d.shape, d.dtype)
    }

    fn define_dtensor(&mut self, tj: &J) -> JResult<Handle<DTensor>> {
        let f = parse_tensor_fields(tj, self.table)?;
        if let Some((_, first)) = self.dguids.get(&f.guid) {
            return Err(tj.key("guid")?.err(ErrorKind::DuplicateGuid {
                guid: f.guid,
                first: first.clone(),
            }));
        }
        let h = self.g.tensors.append(DTensor {
            shape: f.shape,
            dtype: f.dtype,
            guid: Some(f.guid),
        });
        self.dguids.insert(f.guid, (h, tj.path.clone()));
        Ok(h)
    }

    fn kn_op(&mut self, oj: &J, name: KnName) -> JResult<()> {
        let ins_j = match oj.opt_key("input_tensors")? {
            Some(j) => j.items()?,
            None => Vec::new(),
        };
        let outs_j = match oj.opt_key("output_tensors")? {
            Some(j) => j.items()?,
            None => Vec::new(),
        };
        let mut inputs = Vec::with_capacity(ins_j.len());
        for tj in &ins_j {
            inputs.push(self.resolve_dtensor(tj)?);
        }
        let mut outputs = Vec::with_capacity(outs_j.len());
        for tj in &outs_j {
            outputs.push(self.define_dtensor(tj)?);
        }
        // The GPU partition of an input or output (Mirage's `input_map` / `output_map`).
        let mut gpu_map = DimMap::NONE;
        let kind = match name {
            KnName::Input => {
                gpu_map = opt_map(oj, "input_map")?;
                let strides = match oj.opt_key("input_strides")? {
                    Some(sj) => parse_strides(&sj)?,
                    // May-2024 schema: no strides, row-major.
                    None => match outputs.first() {
                        Some(&t) => self.g.tensors[t].shape.row_major_strides(),
                        None => Strides::default(),
                    },
                };
                KnOpKind::Input { strides }
            }
            KnName::Output => {
                gpu_map = opt_map(oj, "output_map")?;
                let strides = match oj.opt_key("output_strides")? {
                    Some(sj) => {
                        let s = parse_strides(&sj)?;
                        if s.0.is_empty() { None } else { Some(s) }
                    }
                    None => None,
                };
                KnOpKind::Output { strides }
            }
            KnName::Matmul => KnOpKind::Matmul,
            KnName::Unary(u) => KnOpKind::Unary(unary_op(oj, u)?),
            KnName::Binary(b) => KnOpKind::Binary(b),
            KnName::Reduction(dim) => KnOpKind::Reduction { dim },
            KnName::RmsNorm => {
                let nj = oj.opt_key("normalized_dims")?.ok_or_else(|| {
                    oj.err(ErrorKind::Unsupported(
                        "kn_rms_norm_op without `normalized_dims`: Mirage does not save how many trailing dims are normalised, so the operator's meaning is unknown".into(),
                    ))
                })?;
                KnOpKind::RmsNorm {
                    normalized_dims: nj.size(MAX_DIMS, "normalized_dims")?,
                }
            }
            KnName::Concat(dim) => {
                check_named_dim(oj, "concat_dim", dim)?;
                KnOpKind::Concat { dim }
            }
            KnName::Split(dim) => KnOpKind::Split { dim },
            KnName::Chunk(dim) => {
                check_named_dim(oj, "chunk_dim", dim)?;
                KnOpKind::Chunk {
                    dim,
                    chunk_size: oj.key("chunk_size")?.size(MAX_EXTENT, "chunk_size")?,
                }
            }
            KnName::AllReduce => KnOpKind::AllReduce {
                inplace: match oj.opt_key("inplace")? {
                    Some(j) => j.bool()?,
                    None => false,
                },
            },
            KnName::Customized => {
                let bj = oj.key("bgraph")?;
                let kn_index = self.g.ops.len();
                let (tb, origins) =
                    self.bgraph(&bj, &ins_j, &outs_j, &inputs, &outputs, kn_index)?;
                self.src.tb_ops.insert(kn_index, origins);
                KnOpKind::Customized(Box::new(tb))
            }
        };
        let h = self.g.ops.append(KnOp {
            kind,
            inputs,
            outputs,
        });
        self.g.sharding.set_map(h, gpu_map);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn bgraph(
        &mut self,
        bj: &J,
        kn_ins: &[J],
        kn_outs: &[J],
        inputs: &[Handle<DTensor>],
        outputs: &[Handle<DTensor>],
        kn_index: usize,
    ) -> JResult<(TbGraph, Vec<OpOrigin>)> {
        let launch = |key: &str| -> JResult<[usize; 3]> {
            let j = bj.key(key)?;
            let v = j.int3()?;
            let mut out = [0usize; 3];
            for (a, (&x, o)) in v.iter().zip(out.iter_mut()).enumerate() {
                if x < 0 || x as u64 > MAX_EXTENT as u64 {
                    return Err(j.key(["x", "y", "z"][a])?.err(ErrorKind::BadValue(format!(
                        "{key} {} = {x} is negative or absurdly large",
                        ["x", "y", "z"][a]
                    ))));
                }
                *o = x as usize;
            }
            Ok(out)
        };
        let grid = launch("grid_dim")?;
        let block = launch("block_dim")?;
        let forloop_range = bj.key("forloop_range")?.size(MAX_EXTENT, "forloop_range")?;
        let reduction_dimx = bj
            .key("reduction_dimx")?
            .size(MAX_EXTENT, "reduction_dimx")?;
        let mut tb = TbGraph::new(grid, block, forloop_range, reduction_dimx);
        let mut origins = Vec::new();
        let mut sguids: HashMap<i64, (Handle<STensor>, String)> = HashMap::new();
        let (mut in_pos, mut out_pos) = (0usize, 0usize);

        for (i, oj) in bj.key("operators")?.items()?.iter().enumerate() {
            let mut op_name = format!("threadblock operator {i} of kernel op {kn_index}");
            let mut one = || -> JResult<()> {
                let tj = oj.key("op_type")?;
                let op_type = tj.str()?;
                op_name = format!("{}, operator {i} of kernel op {kn_index}", clip(op_type));
                let name = names::parse_tb(op_type).map_err(|ne| {
                    tj.err(match ne {
                        NameError::Unknown => ErrorKind::UnknownOp {
                            level: "threadblock",
                            name: clip(op_type),
                        },
                        NameError::Unsupported(why) => ErrorKind::Unsupported(why.into()),
                    })
                })?;
                let ins_j = match oj.opt_key("input_tensors")? {
                    Some(j) => j.items()?,
                    None => Vec::new(),
                };
                let outs_j = match oj.opt_key("output_tensors")? {
                    Some(j) => j.items()?,
                    None => Vec::new(),
                };
                let mut ins = Vec::with_capacity(ins_j.len());
                for sj in &ins_j {
                    let gj = sj.key("guid")?;
                    let guid = gj.int()?;
                    let &(h, _) = sguids
                        .get(&guid)
                        .ok_or_else(|| gj.err(ErrorKind::DanglingGuid(guid)))?;
                    let s = &tb.tensors[h];
                    parse_tensor_fields(sj, self.table)?.matches(sj, &s.shape, s.dtype)?;
                    if let Some(aj) = sj.opt_key("after_accum")?
                        && aj.bool()? != s.after_accum
                    {
                        return Err(aj.err(ErrorKind::CopyMismatch {
                            what: "after_accum",
                            here: aj.bool()?.to_string(),
                            producer: s.after_accum.to_string(),
                        }));
                    }
                    ins.push(h);
                }
                let in_after = ins.iter().any(|&h| tb.tensors[h].after_accum);
                // Define the outputs; `after` is the flag to assume when the file records none.
                let mut define =
                    |tb: &mut TbGraph, sj: &J, after: bool| -> JResult<Handle<STensor>> {
                        let f = parse_tensor_fields(sj, self.table)?;
                        if let Some((_, first)) = sguids.get(&f.guid) {
                            return Err(sj.key("guid")?.err(ErrorKind::DuplicateGuid {
                                guid: f.guid,
                                first: first.clone(),
                            }));
                        }
                        let after_accum = match sj.opt_key("after_accum")? {
                            Some(aj) => aj.bool()?,
                            None => after,
                        };
                        let h = tb.tensors.append(STensor {
                            shape: f.shape,
                            dtype: f.dtype,
                            after_accum,
                            guid: Some(f.guid),
                        });
                        sguids.insert(f.guid, (h, sj.path.clone()));
                        Ok(h)
                    };
                let origin = OpOrigin {
                    path: oj.path.clone(),
                    op_type: op_type.to_string(),
                };
                let kind = match name {
                    TbName::Input => {
                        self.bind_port(oj, "input", kn_ins, inputs, in_pos)?;
                        let imap = parse_map(&oj.key("input_map")?)?;
                        let fj = oj.key("forloop_dim")?;
                        let f = fj.int_in(-1, MAX_DIMS as i64 - 1, "forloop_dim")?;
                        in_pos += 1;
                        TbOpKind::Input {
                            input: in_pos - 1,
                            imap,
                            forloop_dim: usize::try_from(f).ok(),
                        }
                    }
                    TbName::Output => {
                        self.bind_port(oj, "output", kn_outs, outputs, out_pos)?;
                        let omap = parse_map(&oj.key("output_map")?)?;
                        out_pos += 1;
                        if outs_j.len() > 1 {
                            return Err(oj.key("output_tensors")?.err(ErrorKind::Arity {
                                what: "outputs",
                                expected: "0 (or 1 in the May-2024 schema)".into(),
                                found: outs_j.len(),
                            }));
                        }
                        if let Some(sj) = outs_j.first() {
                            // May-2024 schema (tiles without `after_accum`): the output operator
                            // accumulates over the loop itself. Elsewhere it has no outputs.
                            let may_2024 = self.legacy_schema
                                || ins_j.first().is_some_and(|t| !t.has("after_accum"));
                            if !may_2024 {
                                return Err(oj.key("output_tensors")?.err(ErrorKind::Arity {
                                    what: "outputs",
                                    expected: "0 (an output tile is only allowed in the May-2024 schema, whose tiles record no after_accum)".into(),
                                    found: outs_j.len(),
                                }));
                            }
                            let acc = define(&mut tb, sj, true)?;
                            tb.ops.append(TbOp {
                                kind: TbOpKind::Accum(AccumKind::Nored),
                                inputs: ins.clone(),
                                outputs: vec![acc],
                            });
                            origins.push(OpOrigin {
                                path: oj.path.clone(),
                                op_type: format!("{op_type} (accumulating, May-2024 schema)"),
                            });
                            ins = vec![acc];
                        }
                        tb.ops.append(TbOp {
                            kind: TbOpKind::Output {
                                output: out_pos - 1,
                                omap,
                            },
                            inputs: ins,
                            outputs: vec![],
                        });
                        origins.push(origin);
                        return Ok(());
                    }
                    TbName::Matmul => TbOpKind::Matmul,
                    TbName::Unary(u) => TbOpKind::Unary(unary_op(oj, u)?),
                    TbName::Binary(b) => TbOpKind::Binary(b),
                    TbName::Reduction(dim, kind) => {
                        check_named_dim(oj, "reduce_dim", dim)?;
                        if let Some(rj) = oj.opt_key("reduce_size")? {
                            let want = match kind {
                                TbReduction::Sum => 1,
                                TbReduction::ToDimx => reduction_dimx as i64,
                                // No Mirage name parses as the plain max.
                                TbReduction::Max | TbReduction::PlainMax => -1,
                            };
                            let got = rj.int()?;
                            if got != want && !(kind == TbReduction::Max && got == 1) {
                                return Err(rj.err(ErrorKind::BadValue(format!(
                                    "reduce_size {got} does not match {op_type} (expected {want})"
                                ))));
                            }
                        }
                        TbOpKind::Reduction { dim, kind }
                    }
                    TbName::RmsNorm => TbOpKind::RmsNorm,
                    TbName::Concat(dim) => {
                        check_named_dim(oj, "concat_dim", dim)?;
                        TbOpKind::Concat { dim }
                    }
                    TbName::Accum(kind, _) => TbOpKind::Accum(kind),
                };
                let after = match kind {
                    TbOpKind::Input { .. } => false,
                    TbOpKind::Accum(_) => true,
                    _ => in_after,
                };
                let mut outs = Vec::with_capacity(outs_j.len());
                for sj in &outs_j {
                    outs.push(define(&mut tb, sj, after)?);
                }
                tb.ops.append(TbOp {
                    kind,
                    inputs: ins,
                    outputs: outs,
                });
                origins.push(origin);
                Ok(())
            };
            one().map_err(|mut e| {
                e.op.get_or_insert(op_name.clone());
                e
            })?;
        }
        Ok((tb, origins))
    }
}

/// A kernel input's or output's GPU map; absent (the May-2024 schema) means replicated.
fn opt_map(oj: &J, key: &str) -> JResult<DimMap> {
    match oj.opt_key(key)? {
        Some(mj) => parse_map(&mj),
        None => Ok(DimMap::NONE),
    }
}

/// The GPU mesh named by mucc's `mucc_gpu_dim` key on a graph's first operator, if any.
fn gpu_dim_marker(first_op: &J) -> JResult<Option<GpuMesh>> {
    let Some(mj) = first_op.opt_key(super::export::GPU_DIM_KEY)? else {
        return Ok(None);
    };
    let mut mesh = [1usize; 3];
    for (m, axis) in mesh.iter_mut().zip(["x", "y", "z"]) {
        let what = format!("GPU count along {axis}");
        *m = mj.key(axis)?.int_in(1, MAX_GPUS as i64, &what)? as usize;
    }
    let mesh = GpuMesh(mesh);
    mesh.check().map_err(|e| mj.err(e))?;
    Ok(Some(mesh))
}

fn check_named_dim(oj: &J, key: &str, dim: usize) -> JResult<()> {
    if let Some(j) = oj.opt_key(key)? {
        let v = j.int()?;
        if v != dim as i64 {
            return Err(j.err(ErrorKind::BadValue(format!(
                "{key} {v} disagrees with the operator name (dim {dim})"
            ))));
        }
    }
    Ok(())
}

fn parse_strides(sj: &J) -> JResult<Strides> {
    let mut v = Vec::new();
    for x in sj.items()? {
        v.push(x.size(MAX_EXTENT, "stride")?);
    }
    Ok(Strides(v))
}

fn parse_map(mj: &J) -> JResult<DimMap> {
    let m = mj.int3()?;
    for (a, &x) in m.iter().enumerate() {
        if !(-1..MAX_DIMS as i64).contains(&x) {
            return Err(mj.key(["x", "y", "z"][a])?.err(ErrorKind::BadValue(format!(
                "map entry {x} is not a dim index (−1 for none, 0..=3)"
            ))));
        }
    }
    DimMap::from_mirage(m).ok_or_else(|| mj.err(ErrorKind::BadValue("bad map".into())))
}

fn unary_op(oj: &J, u: UnaryName) -> JResult<UnaryOp> {
    Ok(match u {
        UnaryName::Plain(op) => op,
        UnaryName::MulScalar => {
            let sj = oj.opt_key("scalar")?.ok_or_else(|| {
                oj.err(ErrorKind::Unsupported(
                    "mul_scalar without `scalar`: Mirage does not save the scalar (its loader silently uses 0), so the operator's meaning is unknown; add \"scalar\": <number>".into(),
                ))
            })?;
            UnaryOp::MulScalar(sj.float()?)
        }
        UnaryName::Clamp => {
            let (lo, hi) = (oj.opt_key("min_val")?, oj.opt_key("max_val")?);
            match (lo, hi) {
                (Some(lo), Some(hi)) => UnaryOp::Clamp {
                    min: lo.extended_float()?,
                    max: hi.extended_float()?,
                },
                _ => {
                    return Err(oj.err(ErrorKind::Unsupported(
                        "clamp without `min_val`/`max_val`: Mirage does not save the bounds, so the operator's meaning is unknown; add \"min_val\" and \"max_val\"".into(),
                    )));
                }
            }
        }
    })
}

#[allow(dead_code)]
fn _assert_send(_: PathBuf) {}
