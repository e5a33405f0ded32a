//! Malformed input: every test takes a real corpus file (or plain text), breaks one thing, and
//! checks that mucc rejects it with the right error kind at the right place (graph index and
//! JSON path). Structural faults are import errors ([`parse_str`]); semantic faults are
//! validation errors ([`LoadedGraph::validate`]).

use std::path::Path;

use mucc::graph::{DType, DtypeTable, ErrorKind};
use mucc::{GraphError, ImportOptions, LoadedGraph, MirageFile, parse_str, read_file};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Helpers

/// A corpus file as a JSON value.
fn corpus(name: &str) -> Value {
    let path = format!(
        "{}/../shared/corpus/mirage-benchmarks/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("corpus files are JSON")
}

/// `single_gated_mlp.json`: one candidate; `[0][3]` is the customized operator (grid 128×1×1,
/// F = 64), `[0][4]` a `kn_mul_op`, `[0][5]` the output.
fn gated() -> Value {
    corpus("single_gated_mlp.json")
}

/// Path of the gated MLP's threadblock operator `k`.
fn tb(k: usize) -> String {
    format!("[0][3].bgraph.operators[{k}]")
}

/// The value at `path`, written the way mucc writes JSON paths (`[0][3].bgraph.operators[1]`).
fn at<'a>(v: &'a mut Value, path: &str) -> &'a mut Value {
    let mut cur = v;
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').expect("closing bracket");
            let i: usize = r[..end].parse().expect("array index");
            cur = cur
                .get_mut(i)
                .unwrap_or_else(|| panic!("no element {i} at {path}"));
            rest = &r[end + 1..];
        } else {
            let r = rest.strip_prefix('.').unwrap_or(rest);
            let end = r.find(['.', '[']).unwrap_or(r.len());
            cur = cur
                .get_mut(&r[..end])
                .unwrap_or_else(|| panic!("no key {} at {path}", &r[..end]));
            rest = &r[end..];
        }
    }
    cur
}

/// Replaces the value at `path`.
fn set(doc: &mut Value, path: &str, v: Value) {
    *at(doc, path) = v;
}

/// A copy of the value at `path`.
fn get(doc: &mut Value, path: &str) -> Value {
    at(doc, path).clone()
}

/// Removes `key` from the object at `path`.
fn remove(doc: &mut Value, path: &str, key: &str) {
    at(doc, path)
        .as_object_mut()
        .expect("an object")
        .remove(key)
        .unwrap_or_else(|| panic!("no key {key} at {path}"));
}

fn parse_with(doc: &Value, opts: &ImportOptions) -> Result<MirageFile, GraphError> {
    parse_str(&doc.to_string(), None, opts)
}

/// The import error of a document that must not import.
fn import_err(doc: &Value) -> GraphError {
    import_err_with(doc, &ImportOptions::default())
}

fn import_err_with(doc: &Value, opts: &ImportOptions) -> GraphError {
    match parse_with(doc, opts) {
        Ok(_) => panic!("the document imported"),
        Err(e) => e,
    }
}

/// The import error of a text that must not import.
fn text_err(text: &str) -> GraphError {
    match parse_str(text, None, &ImportOptions::default()) {
        Ok(_) => panic!("the text imported"),
        Err(e) => e,
    }
}

/// All validation errors of a document that imports, graph by graph.
fn validation_errors_with(doc: &Value, opts: &ImportOptions) -> Vec<GraphError> {
    let file = parse_with(doc, opts).unwrap_or_else(|e| panic!("import failed: {e}"));
    let errors: Vec<GraphError> = file
        .graphs
        .iter()
        .filter_map(|g: &LoadedGraph| g.validate().err())
        .flat_map(|e| e.0)
        .collect();
    assert!(!errors.is_empty(), "the document validated");
    errors
}

/// The first validation error of a document that imports but must not validate.
fn invalid(doc: &Value) -> GraphError {
    invalid_with(doc, &ImportOptions::default())
}

fn invalid_with(doc: &Value, opts: &ImportOptions) -> GraphError {
    validation_errors_with(doc, opts).swap_remove(0)
}

/// Checks graph index and JSON path, and that the printed error names both.
#[track_caller]
fn assert_at(e: &GraphError, graph: Option<usize>, path: &str) {
    assert_eq!(e.location.graph, graph, "graph index of: {e}");
    assert_eq!(
        e.location.json_path.as_deref(),
        Some(path),
        "JSON path of: {e}"
    );
    let shown = e.to_string();
    assert!(shown.contains(&format!("at {path}")), "{shown}");
    if let Some(g) = graph {
        assert!(shown.contains(&format!("graph {g}")), "{shown}");
    }
}

/// Checks that the printed error contains `needle`.
#[track_caller]
fn assert_msg(e: &GraphError, needle: &str) {
    let shown = e.to_string();
    assert!(shown.contains(needle), "`{needle}` not in: {shown}");
}

// ---------------------------------------------------------------------------------------------
// Not JSON, or not a µGraph document

#[test]
fn truncated_file_is_a_json_error_that_says_truncated() {
    let text = gated().to_string();
    let e = text_err(&text[..text.len() / 2]);
    assert!(matches!(e.kind, ErrorKind::Json { line: 1, .. }), "{e}");
    assert_eq!(e.location.json_path, None);
    assert_msg(&e, "the file is truncated");
}

#[test]
fn trailing_garbage_is_a_json_error() {
    let text = format!("{}\n]]", gated());
    let e = text_err(&text);
    assert!(
        matches!(
            e.kind,
            ErrorKind::Json {
                line: 2,
                column: 1,
                ..
            }
        ),
        "{e}"
    );
    assert_msg(&e, "garbage after the end of the JSON document");
}

#[test]
fn text_that_is_not_json_at_all() {
    let e = text_err("kn_input_op -> kn_output_op\n");
    assert!(
        matches!(
            e.kind,
            ErrorKind::Json {
                line: 1,
                column: 1,
                ..
            }
        ),
        "{e}"
    );
    assert_msg(&e, "invalid JSON at line 1, column 1");
}

#[test]
fn empty_text_is_a_truncated_json_error() {
    let e = text_err("");
    assert!(matches!(e.kind, ErrorKind::Json { .. }), "{e}");
    assert_msg(&e, "truncated");
}

#[test]
fn deeply_nested_arrays_are_rejected_without_overflowing_the_stack() {
    let text = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let e = text_err(&text);
    assert!(matches!(e.kind, ErrorKind::Json { .. }), "{e}");
    assert_msg(&e, "recursion limit exceeded");
}

#[test]
fn empty_array_holds_no_graphs() {
    let e = text_err("[]");
    assert_at(&e, None, "(document root)");
    assert!(matches!(e.kind, ErrorKind::Invalid(_)), "{e}");
    assert_msg(&e, "the file holds no graphs");
}

#[test]
fn top_level_scalar_is_not_a_document() {
    let e = text_err("42");
    assert_at(&e, None, "(document root)");
    assert!(
        matches!(
            e.kind,
            ErrorKind::WrongType {
                found: "a scalar",
                ..
            }
        ),
        "{e}"
    );
    assert_msg(&e, "expected an array of graphs");
}

#[test]
fn top_level_object_without_generated_graphs() {
    let e = text_err(r#"{"graphs": []}"#);
    assert_at(&e, None, "(document root)");
    assert!(
        matches!(
            e.kind,
            ErrorKind::WrongType {
                found: "an object without generated_graphs",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn checkpoint_whose_generated_graphs_is_not_an_array() {
    let mut doc = corpus("legacy_checkpoint_lora.json");
    set(&mut doc, "generated_graphs", json!({"0": []}));
    let e = import_err(&doc);
    assert_at(&e, None, "generated_graphs");
    assert!(
        matches!(
            e.kind,
            ErrorKind::WrongType {
                expected: "an array",
                found: "an object"
            }
        ),
        "{e}"
    );
}

#[test]
fn checkpoint_with_no_generated_graphs() {
    let mut doc = corpus("legacy_checkpoint_lora.json");
    set(&mut doc, "generated_graphs", json!([]));
    let e = import_err(&doc);
    assert_at(&e, None, "(document root)");
    assert_msg(&e, "the file holds no graphs");
}

#[test]
fn operator_that_is_not_an_object() {
    let mut doc = gated();
    set(&mut doc, "[0][2]", json!([1, 2]));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][2]");
    assert!(
        matches!(
            e.kind,
            ErrorKind::WrongType {
                expected: "an object",
                found: "an array"
            }
        ),
        "{e}"
    );
}

/// A scratch file under the system temp dir, removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, bytes: &[u8]) -> TempFile {
        let path =
            std::env::temp_dir().join(format!("mucc-malformed-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn missing_file_is_an_io_error_naming_the_file() {
    let path = std::env::temp_dir().join("mucc-malformed-does-not-exist.json");
    let e = read_file(&path, &ImportOptions::default()).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Io(_)), "{e}");
    assert_eq!(e.location.file.as_deref(), Some(path.as_path()));
    assert_msg(&e, "cannot read file");
}

#[test]
fn file_that_is_not_utf8_is_rejected_naming_the_file() {
    let f = TempFile::new("latin1.json", b"[[{\"op_type\": \"kn_input_op\xe9\"}]]");
    let e = read_file(&f.0, &ImportOptions::default()).unwrap_err();
    assert!(
        matches!(
            e.kind,
            ErrorKind::Json {
                line: 1,
                column: 27,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.location.file.as_deref(), Some(f.0.as_path()));
    assert_msg(&e, "UTF-8");
}

#[test]
fn read_file_errors_carry_the_file_graph_and_path() {
    let mut doc = gated();
    set(&mut doc, "[0][4].input_tensors[1].guid", json!(999));
    let f = TempFile::new("dangling.json", doc.to_string().as_bytes());
    let e = read_file(&f.0, &ImportOptions::default()).unwrap_err();
    assert_eq!(e.location.file.as_deref(), Some(f.0.as_path()));
    assert_at(&e, Some(0), "[0][4].input_tensors[1].guid");
    assert!(e.to_string().starts_with(&f.0.display().to_string()), "{e}");
}

#[test]
fn the_file_name_is_part_of_the_location() {
    let mut doc = gated();
    set(&mut doc, "[0][4].op_type", json!("kn_nope_op"));
    let file = Path::new("graphs/broken.json");
    let e = parse_str(&doc.to_string(), Some(file), &ImportOptions::default()).unwrap_err();
    assert_eq!(e.location.file.as_deref(), Some(file));
    assert!(
        e.to_string()
            .starts_with("graphs/broken.json, graph 0, at [0][4].op_type"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// Operator names

#[test]
fn unknown_kernel_operator_name() {
    let mut doc = gated();
    set(&mut doc, "[0][4].op_type", json!("kn_frobnicate_op"));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][4].op_type");
    assert!(
        matches!(&e.kind, ErrorKind::UnknownOp { level: "kernel", name } if name == "kn_frobnicate_op"),
        "{e}"
    );
    assert_eq!(
        e.location.op.as_deref(),
        Some("kn_frobnicate_op, kernel op 4")
    );
}

#[test]
fn unknown_threadblock_operator_name() {
    let mut doc = gated();
    set(
        &mut doc,
        &format!("{}.op_type", tb(7)),
        json!("tb_frobnicate_op"),
    );
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.op_type", tb(7)));
    assert!(
        matches!(&e.kind, ErrorKind::UnknownOp { level: "threadblock", name } if name == "tb_frobnicate_op"),
        "{e}"
    );
}

#[test]
fn kernel_operator_name_inside_a_threadblock_graph() {
    let mut doc = gated();
    set(&mut doc, &format!("{}.op_type", tb(7)), json!("kn_silu_op"));
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.op_type", tb(7)));
    assert!(
        matches!(&e.kind, ErrorKind::UnknownOp { level: "threadblock", name } if name == "kn_silu_op"),
        "{e}"
    );
}

#[test]
fn threadblock_split_operator_is_unsupported() {
    let mut doc = gated();
    set(
        &mut doc,
        &format!("{}.op_type", tb(7)),
        json!("tb_split_0_op"),
    );
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.op_type", tb(7)));
    assert!(matches!(e.kind, ErrorKind::Unsupported(_)), "{e}");
    assert_msg(&e, "split");
}

#[test]
fn op_type_that_is_not_a_string() {
    let mut doc = gated();
    set(&mut doc, "[0][4].op_type", json!(1201));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][4].op_type");
    assert!(
        matches!(
            e.kind,
            ErrorKind::WrongType {
                expected: "a string",
                found: "an integer"
            }
        ),
        "{e}"
    );
}

#[test]
fn kernel_operator_without_op_type() {
    let mut doc = gated();
    remove(&mut doc, "[0][2]", "op_type");
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][2].op_type");
    assert_eq!(e.kind, ErrorKind::MissingKey("op_type".into()));
}

// ---------------------------------------------------------------------------------------------
// guids and copies

#[test]
fn dangling_dtensor_guid() {
    let mut doc = gated();
    set(&mut doc, "[0][4].input_tensors[1].guid", json!(999));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][4].input_tensors[1].guid");
    assert_eq!(e.kind, ErrorKind::DanglingGuid(999));
}

#[test]
fn kernel_operator_reading_a_tensor_defined_later_is_dangling() {
    // The mul reads its own output: the guid exists, but not before the operator.
    let mut doc = gated();
    set(&mut doc, "[0][4].input_tensors[0].guid", json!(10135474));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][4].input_tensors[0].guid");
    assert_eq!(e.kind, ErrorKind::DanglingGuid(10135474));
}

#[test]
fn dangling_stensor_guid() {
    let mut doc = gated();
    set(
        &mut doc,
        &format!("{}.input_tensors[0].guid", tb(7)),
        json!(123),
    );
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.input_tensors[0].guid", tb(7)));
    assert_eq!(e.kind, ErrorKind::DanglingGuid(123));
}

#[test]
fn stensor_guids_are_scoped_to_their_threadblock_graph() {
    // A DTensor guid does not resolve as an STensor guid.
    let mut doc = gated();
    set(
        &mut doc,
        &format!("{}.input_tensors[0].guid", tb(7)),
        json!(10133602),
    );
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.input_tensors[0].guid", tb(7)));
    assert_eq!(e.kind, ErrorKind::DanglingGuid(10133602));
}

#[test]
fn duplicate_dtensor_guid() {
    let mut doc = gated();
    set(&mut doc, "[0][1].output_tensors[0].guid", json!(10133602));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][1].output_tensors[0].guid");
    assert!(
        matches!(&e.kind, ErrorKind::DuplicateGuid { guid: 10133602, first } if first == "[0][0].output_tensors[0]"),
        "{e}"
    );
}

#[test]
fn duplicate_stensor_guid() {
    let mut doc = gated();
    set(
        &mut doc,
        &format!("{}.output_tensors[0].guid", tb(1)),
        json!(20443395),
    );
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.output_tensors[0].guid", tb(1)));
    let first = format!("{}.output_tensors[0]", tb(0));
    assert!(
        matches!(&e.kind, ErrorKind::DuplicateGuid { guid: 20443395, first: f } if *f == first),
        "{e}"
    );
}

#[test]
fn consumer_copy_with_other_dims_than_the_producer() {
    let mut doc = gated();
    set(&mut doc, "[0][4].input_tensors[0].dim[1]", json!(2048));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][4].input_tensors[0].dim");
    assert!(
        matches!(&e.kind, ErrorKind::CopyMismatch { what: "shape", here, producer }
            if here == "[8, 2048]" && producer == "[8, 4096]"),
        "{e}"
    );
}

#[test]
fn consumer_copy_with_another_data_type_than_the_producer() {
    let mut doc = gated();
    // 930 is f32 in the legacy table that code 921 selects.
    set(&mut doc, "[0][4].input_tensors[0].data_type", json!(930));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][4].input_tensors[0].data_type");
    assert!(
        matches!(&e.kind, ErrorKind::CopyMismatch { what: "data_type", here, producer }
            if here == "f32" && producer == "f16"),
        "{e}"
    );
}

#[test]
fn stensor_copy_with_another_after_accum_than_the_producer() {
    let mut doc = gated();
    let p = format!("{}.input_tensors[0].after_accum", tb(7));
    set(&mut doc, &p, json!(false));
    let e = import_err(&doc);
    assert_at(&e, Some(0), &p);
    assert!(
        matches!(
            e.kind,
            ErrorKind::CopyMismatch {
                what: "after_accum",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn stensor_copy_with_other_dims_than_the_producer() {
    let mut doc = gated();
    set(
        &mut doc,
        &format!("{}.input_tensors[1].dim[0]", tb(3)),
        json!(32),
    );
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.input_tensors[1].dim", tb(3)));
    assert!(
        matches!(&e.kind, ErrorKind::CopyMismatch { what: "shape", here, producer }
            if here == "[32, 32]" && producer == "[64, 32]"),
        "{e}"
    );
}

#[test]
fn tb_input_op_bound_to_the_wrong_dtensor_guid() {
    // The second tb_input_op must read the customized op's second input (10133603).
    let mut doc = gated();
    set(
        &mut doc,
        &format!("{}.dtensor.guid", tb(1)),
        json!(10133604),
    );
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.dtensor.guid", tb(1)));
    assert!(matches!(e.kind, ErrorKind::Invalid(_)), "{e}");
    assert_msg(
        &e,
        "tb_input_op number 2 names DTensor guid 10133604, but input 1 of the customized operator is guid 10133603",
    );
}

#[test]
fn tb_output_op_bound_to_the_wrong_dtensor_guid() {
    let mut doc = gated();
    set(
        &mut doc,
        &format!("{}.dtensor.guid", tb(8)),
        json!(10134539),
    );
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.dtensor.guid", tb(8)));
    assert_msg(
        &e,
        "tb_output_op number 1 names DTensor guid 10134539, but output 0 of the customized operator is guid 10134538",
    );
}

#[test]
fn tb_input_op_dtensor_copy_with_other_dims() {
    let mut doc = gated();
    set(&mut doc, &format!("{}.dtensor.dim[0]", tb(0)), json!(16));
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.dtensor.dim", tb(0)));
    assert!(
        matches!(&e.kind, ErrorKind::CopyMismatch { what: "shape", here, .. } if here == "[16, 4096]"),
        "{e}"
    );
}

#[test]
fn more_tb_input_ops_than_customized_inputs() {
    let mut doc = gated();
    let extra = get(&mut doc, &tb(2));
    at(&mut doc, "[0][3].bgraph.operators")
        .as_array_mut()
        .unwrap()
        .insert(3, extra);
    let e = import_err(&doc);
    assert_at(&e, Some(0), &tb(3));
    assert!(matches!(e.kind, ErrorKind::Invalid(_)), "{e}");
    assert_msg(
        &e,
        "tb_input_op number 4 but the customized operator has only 3 inputs",
    );
}

#[test]
fn customized_input_that_no_tb_input_op_reads() {
    // A fourth customized input without a fourth tb_input_op.
    let mut doc = gated();
    let extra = get(&mut doc, "[0][3].input_tensors[0]");
    at(&mut doc, "[0][3].input_tensors")
        .as_array_mut()
        .unwrap()
        .push(extra);
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][3].input_tensors[3]");
    assert_msg(&e, "customized input 3 is read by 0 tb_input_ops");
}

#[test]
fn customized_output_that_no_tb_output_op_writes() {
    let mut doc = gated();
    let mut extra = get(&mut doc, "[0][3].output_tensors[1]");
    extra["guid"] = json!(10134540);
    at(&mut doc, "[0][3].output_tensors")
        .as_array_mut()
        .unwrap()
        .push(extra);
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][3].output_tensors[2]");
    assert_msg(&e, "customized output 2 is written by 0 tb_output_ops");
}

#[test]
fn tb_output_op_with_two_output_tiles() {
    let mut doc = gated();
    let t = get(&mut doc, &format!("{}.output_tensors[0]", tb(5)));
    set(
        &mut doc,
        &format!("{}.output_tensors", tb(8)),
        json!([t, t]),
    );
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.output_tensors", tb(8)));
    assert!(
        matches!(
            e.kind,
            ErrorKind::Arity {
                what: "outputs",
                found: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn tb_output_op_with_an_output_tile_outside_the_may_2024_schema() {
    // The output op stores the in-loop matmul tile and carries an after_accum output tile of
    // its own, as May-2024 output operators did. This file uses forloop accumulators (tb_accum_*),
    // so the tile is not part of its schema, and the in-loop input must be rejected.
    let mut doc = gated();
    let mut tile = get(&mut doc, &format!("{}.output_tensors[0]", tb(3)));
    set(
        &mut doc,
        &format!("{}.input_tensors[0]", tb(8)),
        tile.clone(),
    );
    tile["guid"] = json!(20449999);
    tile["after_accum"] = json!(true);
    set(
        &mut doc,
        &format!("{}.output_tensors", tb(8)),
        json!([tile]),
    );
    let e = match parse_with(&doc, &ImportOptions::default()) {
        Err(e) => e,
        Ok(_) => invalid(&doc),
    };
    assert_eq!(e.location.graph, Some(0), "{e}");
    let path = e.location.json_path.clone().unwrap_or_default();
    assert!(path.starts_with(&tb(8)), "{e}");
}

#[test]
fn kernel_chunk_whose_outputs_lack_the_chunked_dim() {
    // gqa_bs1 graph 0 with current dtype codes (940 = f16), plus a kn_chunk_2_op that splits the
    // [2, 256, 64] result into two 2-dim tensors [2, 256].
    let g = corpus("gqa_bs1.json")[0].clone();
    let text = g
        .to_string()
        .replace("\"data_type\":921", "\"data_type\":940");
    let mut doc = json!([serde_json::from_str::<Value>(&text).unwrap()]);
    let x = get(&mut doc, "[0][5].input_tensors[0]");
    let mut part = x.clone();
    part["num_dims"] = json!(2);
    part["dim"] = json!([2, 256, 0, 0]);
    part["guid"] = json!(1);
    let mut part2 = part.clone();
    part2["guid"] = json!(2);
    let chunk = json!({
        "op_type": "kn_chunk_2_op",
        "chunk_dim": 2,
        "chunk_size": 2,
        "input_tensors": [x],
        "output_tensors": [part, part2],
    });
    at(&mut doc, "[0]").as_array_mut().unwrap().insert(5, chunk);
    let opts = ImportOptions {
        dtype_table: Some(DtypeTable::Current),
        ..Default::default()
    };
    let e = invalid_with(&doc, &opts);
    assert_at(&e, Some(0), "[0][5]");
    assert_msg(&e, "[2, 256]");
}

// ---------------------------------------------------------------------------------------------
// Tensor fields and JSON types

#[test]
fn num_dims_five() {
    let mut doc = gated();
    set(&mut doc, "[0][0].output_tensors[0].num_dims", json!(5));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][0].output_tensors[0].num_dims");
    assert!(matches!(e.kind, ErrorKind::BadValue(_)), "{e}");
    assert_msg(&e, "num_dims 5 is outside 1..=4");
}

#[test]
fn num_dims_zero() {
    let mut doc = gated();
    set(&mut doc, "[0][0].output_tensors[0].num_dims", json!(0));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][0].output_tensors[0].num_dims");
    assert_msg(&e, "num_dims 0 is outside 1..=4");
}

#[test]
fn negative_dim() {
    let mut doc = gated();
    set(&mut doc, "[0][0].output_tensors[0].dim[0]", json!(-8));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][0].output_tensors[0].dim[0]");
    assert!(matches!(e.kind, ErrorKind::BadValue(_)), "{e}");
    assert_msg(&e, "extent -8 is outside 0..=");
}

#[test]
fn dim_list_shorter_than_num_dims() {
    let mut doc = gated();
    set(&mut doc, "[0][0].output_tensors[0].dim", json!([8]));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][0].output_tensors[0].dim");
    assert_msg(&e, "dim has 1 entries but num_dims is 2");
}

#[test]
fn zero_extent_is_rejected_by_validation() {
    // Import takes the zero; validation rejects the empty tensor where it is defined.
    let mut doc = gated();
    for p in [
        "[0][0].output_tensors[0].dim[0]",
        "[0][3].input_tensors[0].dim[0]",
        "[0][3].bgraph.operators[0].dtensor.dim[0]",
    ] {
        set(&mut doc, p, json!(0));
    }
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][0].output_tensors[0]");
    assert!(matches!(e.kind, ErrorKind::BadValue(_)), "{e}");
    assert_msg(&e, "dim 0 of shape [0, 4096] is 0");
}

#[test]
fn string_where_an_integer_is_expected() {
    let mut doc = gated();
    set(&mut doc, "[0][3].bgraph.forloop_range", json!("64"));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][3].bgraph.forloop_range");
    assert_eq!(
        e.kind,
        ErrorKind::WrongType {
            expected: "an integer",
            found: "a string"
        }
    );
}

#[test]
fn fractional_guid() {
    let mut doc = gated();
    set(&mut doc, "[0][4].input_tensors[0].guid", json!(10134538.5));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][4].input_tensors[0].guid");
    assert_eq!(
        e.kind,
        ErrorKind::WrongType {
            expected: "an integer",
            found: "a floating-point number"
        }
    );
}

#[test]
fn guid_beyond_i64_says_out_of_range() {
    let mut doc = gated();
    set(
        &mut doc,
        "[0][4].input_tensors[0].guid",
        json!(18446744073709551615u64),
    );
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][4].input_tensors[0].guid");
    let shown = e.to_string();
    assert!(
        !shown.contains("expected an integer, found an integer"),
        "{shown}"
    );
    assert_msg(&e, "18446744073709551615");
}

#[test]
fn boolean_where_an_array_is_expected() {
    let mut doc = gated();
    set(&mut doc, "[0][4].input_tensors", json!(true));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][4].input_tensors");
    assert_eq!(
        e.kind,
        ErrorKind::WrongType {
            expected: "an array",
            found: "a boolean"
        }
    );
}

#[test]
fn missing_forloop_dim() {
    let mut doc = gated();
    remove(&mut doc, &tb(0), "forloop_dim");
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.forloop_dim", tb(0)));
    assert_eq!(e.kind, ErrorKind::MissingKey("forloop_dim".into()));
    assert_msg(&e, "missing key `forloop_dim`");
}

#[test]
fn missing_bgraph() {
    let mut doc = gated();
    remove(&mut doc, "[0][3]", "bgraph");
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][3].bgraph");
    assert_eq!(e.kind, ErrorKind::MissingKey("bgraph".into()));
}

#[test]
fn missing_grid_axis() {
    let mut doc = gated();
    remove(&mut doc, "[0][3].bgraph.grid_dim", "z");
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][3].bgraph.grid_dim.z");
    assert_eq!(e.kind, ErrorKind::MissingKey("z".into()));
}

#[test]
fn forloop_dim_that_is_not_a_dim_index() {
    let mut doc = gated();
    set(&mut doc, &format!("{}.forloop_dim", tb(0)), json!(4));
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.forloop_dim", tb(0)));
    assert_msg(&e, "forloop_dim 4 is outside -1..=3");
}

#[test]
fn forloop_dim_beyond_the_tensor_rank() {
    // 2 is a dim index, but the input is 2-dim.
    let mut doc = gated();
    set(&mut doc, &format!("{}.forloop_dim", tb(0)), json!(2));
    let e = invalid(&doc);
    assert_at(&e, Some(0), &format!("{}.forloop_dim", tb(0)));
    assert!(matches!(e.kind, ErrorKind::BadValue(_)), "{e}");
    assert_msg(
        &e,
        "forloop_dim 2 is out of range for a 2-dim tensor [8, 4096]",
    );
}

#[test]
fn input_map_entry_that_is_not_a_dim_index() {
    let mut doc = gated();
    set(&mut doc, &format!("{}.input_map.x", tb(1)), json!(7));
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.input_map.x", tb(1)));
    assert_msg(&e, "map entry 7 is not a dim index");
}

#[test]
fn negative_grid_dimension() {
    let mut doc = gated();
    set(&mut doc, "[0][3].bgraph.grid_dim.y", json!(-2));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][3].bgraph.grid_dim.y");
    assert!(matches!(e.kind, ErrorKind::BadValue(_)), "{e}");
    assert_msg(&e, "grid_dim y = -2 is negative");
}

#[test]
fn integral_float_where_an_integer_is_expected() {
    let mut doc = gated();
    set(&mut doc, "[0][3].bgraph.forloop_range", json!(64.0));
    // Either accept the value or reject it without calling 64.0 a non-integer.
    if let Err(e) = parse_with(&doc, &ImportOptions::default()) {
        assert_at(&e, Some(0), "[0][3].bgraph.forloop_range");
        let shown = e.to_string();
        assert!(!shown.contains("non-integer"), "{shown}");
    }
}

// ---------------------------------------------------------------------------------------------
// Element types

#[test]
fn unknown_dtype_code_with_an_explicit_table() {
    let mut doc = gated();
    set(&mut doc, "[0][1].output_tensors[0].data_type", json!(12345));
    let opts = ImportOptions {
        dtype_table: Some(DtypeTable::Legacy),
        ..Default::default()
    };
    let e = import_err_with(&doc, &opts);
    assert_at(&e, Some(0), "[0][1].output_tensors[0].data_type");
    assert!(
        matches!(&e.kind, ErrorKind::UnknownDtypeCode { code: 12345, table } if table == "legacy"),
        "{e}"
    );
}

#[test]
fn unknown_dtype_code_with_table_detection_is_rejected() {
    let mut doc = gated();
    set(&mut doc, "[0][1].output_tensors[0].data_type", json!(12345));
    let e = import_err(&doc);
    assert!(matches!(e.kind, ErrorKind::BadValue(_)), "{e}");
    assert_msg(
        &e,
        "no dtype table defines all data_type codes used (921, 12345)",
    );
}

#[test]
fn unknown_dtype_code_with_table_detection_names_where() {
    let mut doc = gated();
    set(&mut doc, "[0][1].output_tensors[0].data_type", json!(12345));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][1].output_tensors[0].data_type");
    assert_msg(&e, "12345");
}

#[test]
fn fp8_is_recognised_but_unsupported_under_the_current_table() {
    // Code 930 is FLOAT8 in the current table.
    let text = gated()
        .to_string()
        .replace("\"data_type\":921", "\"data_type\":930");
    let doc: Value = serde_json::from_str(&text).unwrap();
    let opts = ImportOptions {
        dtype_table: Some(DtypeTable::Current),
        ..Default::default()
    };
    let e = invalid_with(&doc, &opts);
    assert_at(&e, Some(0), "[0][0].output_tensors[0]");
    assert_eq!(e.kind, ErrorKind::UnsupportedDtype(DType::F8));
    assert_msg(&e, "unsupported element type f8");
}

#[test]
fn legacy_fp16_code_under_the_current_table_is_unknown() {
    let opts = ImportOptions {
        dtype_table: Some(DtypeTable::Current),
        ..Default::default()
    };
    let e = import_err_with(&gated(), &opts);
    assert_at(&e, Some(0), "[0][0].output_tensors[0].data_type");
    assert!(
        matches!(&e.kind, ErrorKind::UnknownDtypeCode { code: 921, table } if table == "current"),
        "{e}"
    );
}

#[test]
fn dtype_mismatch_between_operands() {
    // The second input becomes f32 (legacy code 930), consistently in every copy.
    let mut doc = gated();
    for p in [
        "[0][1].output_tensors[0].data_type",
        "[0][3].input_tensors[1].data_type",
        "[0][3].bgraph.operators[1].dtensor.data_type",
    ] {
        set(&mut doc, p, json!(930));
    }
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][3].input_tensors[1]");
    assert_eq!(
        e.kind,
        ErrorKind::DtypeMismatch {
            expected: DType::F16,
            found: DType::F32
        }
    );
}

#[test]
fn dtype_mismatch_between_operand_and_result() {
    let mut doc = gated();
    for p in [
        "[0][4].output_tensors[0].data_type",
        "[0][5].input_tensors[0].data_type",
    ] {
        set(&mut doc, p, json!(930));
    }
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][4].output_tensors[0]");
    assert_msg(&e, "element type mismatch: expected f16, found f32");
}

// ---------------------------------------------------------------------------------------------
// Operator parameters

#[test]
fn mul_scalar_without_scalar() {
    let mut doc = gated();
    set(
        &mut doc,
        &format!("{}.op_type", tb(7)),
        json!("tb_mul_scalar_op"),
    );
    let e = import_err(&doc);
    assert_at(&e, Some(0), &tb(7));
    assert!(matches!(e.kind, ErrorKind::Unsupported(_)), "{e}");
    assert_msg(&e, "mul_scalar without `scalar`");
}

#[test]
fn mul_scalar_with_a_string_scalar() {
    let mut doc = gated();
    set(
        &mut doc,
        &format!("{}.op_type", tb(7)),
        json!("tb_mul_scalar_op"),
    );
    at(&mut doc, &tb(7))["scalar"] = json!("0.5");
    let e = import_err(&doc);
    assert_at(&e, Some(0), &format!("{}.scalar", tb(7)));
    assert_eq!(
        e.kind,
        ErrorKind::WrongType {
            expected: "a number",
            found: "a string"
        }
    );
}

#[test]
fn clamp_without_bounds() {
    let mut doc = gated();
    set(
        &mut doc,
        &format!("{}.op_type", tb(7)),
        json!("tb_clamp_op"),
    );
    at(&mut doc, &tb(7))["min_val"] = json!(0.0);
    let e = import_err(&doc);
    assert_at(&e, Some(0), &tb(7));
    assert!(matches!(e.kind, ErrorKind::Unsupported(_)), "{e}");
    assert_msg(&e, "clamp without `min_val`/`max_val`");
}

#[test]
fn clamp_with_empty_bounds() {
    let mut doc = gated();
    set(
        &mut doc,
        &format!("{}.op_type", tb(7)),
        json!("tb_clamp_op"),
    );
    at(&mut doc, &tb(7))["min_val"] = json!(1.0);
    at(&mut doc, &tb(7))["max_val"] = json!(-1.0);
    let e = invalid(&doc);
    assert_at(&e, Some(0), &tb(7));
    assert!(matches!(e.kind, ErrorKind::BadValue(_)), "{e}");
    assert_msg(&e, "clamp bounds [1, -1] are empty");
}

#[test]
fn kernel_rms_norm_without_normalized_dims() {
    let mut doc = gated();
    set(&mut doc, "[0][4].op_type", json!("kn_rms_norm_op"));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][4]");
    assert!(matches!(e.kind, ErrorKind::Unsupported(_)), "{e}");
    assert_msg(&e, "kn_rms_norm_op without `normalized_dims`");
}

#[test]
fn concat_dim_that_disagrees_with_the_operator_name() {
    let mut doc = corpus("legacy_checkpoint_lora.json");
    let p = "generated_graphs[1][4].bgraph.operators[6]";
    at(&mut doc, p)["concat_dim"] = json!(1);
    let e = import_err(&doc);
    assert_at(&e, Some(1), &format!("{p}.concat_dim"));
    assert_msg(&e, "concat_dim 1 disagrees with the operator name (dim 0)");
}

/// A partitioned input imports (the map is kept), but without a GPU count it does not validate:
/// Mirage's JSON does not record gpu_dim. More multi-GPU cases are in `tests/multi_gpu.rs`.
#[test]
fn multi_gpu_input_map_without_a_gpu_count() {
    let mut doc = gated();
    set(
        &mut doc,
        "[0][0].input_map",
        json!({"x": 0, "y": -1, "z": -1}),
    );
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][0].input_map");
    assert!(matches!(e.kind, ErrorKind::GpuCountUnknown(_)), "{e}");
    assert_msg(
        &e,
        "input_map (0, -1, -1) partitions the tensor across GPUs, but the graph's GPU count is unknown",
    );
}

#[test]
fn multi_gpu_output_map_without_a_gpu_count() {
    let mut doc = gated();
    set(&mut doc, "[0][5].output_map.y", json!(1));
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][5].output_map");
    assert!(matches!(e.kind, ErrorKind::GpuCountUnknown(_)), "{e}");
    assert_msg(&e, "(kn_output_op, kernel op 5");
}

// ---------------------------------------------------------------------------------------------
// Shapes and partitions (validation)

#[test]
fn recorded_kernel_shape_differs_from_the_operator_result() {
    // The mul's output (and the output operator's copy of it) claims [8, 2048].
    let mut doc = gated();
    for p in [
        "[0][4].output_tensors[0].dim[1]",
        "[0][5].input_tensors[0].dim[1]",
    ] {
        set(&mut doc, p, json!(2048));
    }
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][4].output_tensors[0]");
    assert_msg(
        &e,
        "shape mismatch: recorded [8, 2048], but the operator produces [8, 4096]",
    );
    assert_eq!(e.location.op.as_deref(), Some("kn_mul_op, kernel op 4"));
}

#[test]
fn kernel_binary_operands_that_do_not_broadcast() {
    let mut doc = corpus("legacy_checkpoint_lora.json");
    // Graph 0: the add reads [16, 4096] and [16, 4096]; make it read [16, 256].
    let x = get(&mut doc, "generated_graphs[0][0].output_tensors[0]");
    set(&mut doc, "generated_graphs[0][7].input_tensors[1]", x);
    let e = invalid(&doc);
    assert_at(&e, Some(0), "generated_graphs[0][7]");
    assert!(matches!(e.kind, ErrorKind::Operands(_)), "{e}");
    assert_msg(&e, "shapes [16, 4096] and [16, 256] do not broadcast");
}

#[test]
fn kernel_matmul_inner_extents_differ() {
    let mut doc = corpus("legacy_checkpoint_lora.json");
    // Graph 0, op 6: [16, 256] @ [256, 4096]; make B [16, 4096].
    let b = get(&mut doc, "generated_graphs[0][3].output_tensors[0]");
    set(&mut doc, "generated_graphs[0][6].input_tensors[1]", b);
    let e = invalid(&doc);
    assert_at(&e, Some(0), "generated_graphs[0][6]");
    assert_msg(&e, "matmul inner extents differ");
}

#[test]
fn threadblock_tile_shape_differs_from_the_partition() {
    // The x tile is recorded as [8, 32] but grid × for-loop give [8, 64].
    let mut doc = gated();
    for p in [
        "[0][3].bgraph.operators[0].output_tensors[0].dim[1]",
        "[0][3].bgraph.operators[3].input_tensors[0].dim[1]",
        "[0][3].bgraph.operators[4].input_tensors[0].dim[1]",
    ] {
        set(&mut doc, p, json!(32));
    }
    let e = invalid(&doc);
    assert_at(&e, Some(0), &format!("{}.output_tensors[0]", tb(0)));
    assert_eq!(
        e.location.op.as_deref(),
        Some("tb_input_op, operator 0 of kernel op 3")
    );
    assert_msg(
        &e,
        "shape mismatch: recorded [8, 32], but the operator produces [8, 64]",
    );
}

#[test]
fn threadblock_result_shape_differs_from_the_operator() {
    // The first matmul's result is recorded as [8, 16] instead of [8, 32].
    let mut doc = gated();
    for p in [
        "[0][3].bgraph.operators[3].output_tensors[0].dim[1]",
        "[0][3].bgraph.operators[5].input_tensors[0].dim[1]",
    ] {
        set(&mut doc, p, json!(16));
    }
    let e = invalid(&doc);
    assert_at(&e, Some(0), &format!("{}.output_tensors[0]", tb(3)));
    assert!(matches!(e.kind, ErrorKind::ShapeMismatch { .. }), "{e}");
}

#[test]
fn output_dtensor_shape_differs_from_the_tiles() {
    // Tiles [8, 32] on 128 blocks along dim 1 give [8, 4096], not [8, 2048].
    let mut doc = gated();
    for p in [
        "[0][3].output_tensors[0].dim[1]",
        "[0][3].bgraph.operators[8].dtensor.dim[1]",
        "[0][4].input_tensors[0].dim[1]",
    ] {
        set(&mut doc, p, json!(2048));
    }
    let errors = validation_errors_with(&doc, &ImportOptions::default());
    let e = &errors[0];
    assert_at(e, Some(0), &format!("{}.dtensor", tb(8)));
    assert_msg(
        e,
        "shape mismatch: recorded [8, 2048], but the operator produces [8, 4096]",
    );
}

#[test]
fn grid_partition_that_does_not_divide() {
    // 96 blocks along dim 1 (4096) of the weights.
    let mut doc = gated();
    set(&mut doc, "[0][3].bgraph.grid_dim.x", json!(96));
    let e = invalid(&doc);
    assert_at(&e, Some(0), &format!("{}.input_map", tb(1)));
    assert!(
        matches!(
            e.kind,
            ErrorKind::NotDivisible {
                dim: 1,
                extent: 4096,
                by: 96,
                ..
            }
        ),
        "{e}"
    );
    assert_msg(&e, "grid axis x (96 blocks) partitions");
}

#[test]
fn forloop_partition_that_does_not_divide() {
    // 48 iterations over dim 1 (4096) of x.
    let mut doc = gated();
    set(&mut doc, "[0][3].bgraph.forloop_range", json!(48));
    let e = invalid(&doc);
    assert_at(&e, Some(0), &format!("{}.forloop_dim", tb(0)));
    assert!(
        matches!(
            e.kind,
            ErrorKind::NotDivisible {
                dim: 1,
                extent: 4096,
                by: 48,
                ..
            }
        ),
        "{e}"
    );
    assert_msg(&e, "the for-loop (48 iterations)");
}

#[test]
fn forloop_partition_of_the_per_block_extent_that_does_not_divide() {
    // The weights' dim 0 (4096) is split by the for-loop only; give x's dim 1 a grid split too
    // so that its per-block extent 4096 / 128 = 32 is not divisible by F = 64.
    let mut doc = gated();
    set(&mut doc, &format!("{}.input_map.x", tb(0)), json!(1));
    let e = invalid(&doc);
    assert_at(&e, Some(0), &format!("{}.forloop_dim", tb(0)));
    assert!(
        matches!(
            e.kind,
            ErrorKind::NotDivisible {
                dim: 1,
                extent: 32,
                by: 64,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn grid_axis_not_mapped_by_an_output_map() {
    let mut doc = gated();
    set(&mut doc, &format!("{}.output_map.x", tb(8)), json!(-1));
    let e = invalid(&doc);
    assert_at(&e, Some(0), &format!("{}.output_map", tb(8)));
    assert_eq!(
        e.kind,
        ErrorKind::UnmappedGridAxis {
            axis: "x",
            size: 128
        }
    );
    assert_msg(&e, "blocks would overwrite each other");
}

#[test]
fn two_grid_axes_on_one_dim_in_an_input_map() {
    let mut doc = gated();
    set(&mut doc, "[0][3].bgraph.grid_dim.y", json!(2));
    set(&mut doc, &format!("{}.input_map.y", tb(1)), json!(1));
    let e = invalid(&doc);
    assert_at(&e, Some(0), &format!("{}.input_map", tb(1)));
    assert_eq!(
        e.kind,
        ErrorKind::AxesShareDim {
            a: "x",
            b: "y",
            dim: 1
        }
    );
}

#[test]
fn two_grid_axes_on_one_dim_in_an_output_map() {
    let mut doc = gated();
    set(&mut doc, "[0][3].bgraph.grid_dim.z", json!(2));
    set(&mut doc, &format!("{}.output_map.z", tb(8)), json!(1));
    let e = invalid(&doc);
    assert_at(&e, Some(0), &format!("{}.output_map", tb(8)));
    assert_eq!(
        e.kind,
        ErrorKind::AxesShareDim {
            a: "x",
            b: "z",
            dim: 1
        }
    );
}

#[test]
fn redtox_over_an_extent_that_is_not_a_multiple_of_reduction_dimx() {
    // gqa_bs1, graph 1 of a two-graph file: the redtox input's last dim 512 with dimx 100.
    let g = corpus("gqa_bs1.json")[0].clone();
    let mut doc = json!([g.clone(), g]);
    set(&mut doc, "[1][4].bgraph.reduction_dimx", json!(100));
    let e = invalid(&doc);
    assert_at(&e, Some(1), "[1][4].bgraph.operators[3]");
    assert!(
        matches!(
            e.kind,
            ErrorKind::NotDivisible {
                dim: 2,
                extent: 512,
                by: 100,
                ..
            }
        ),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// after_accum

#[test]
fn operator_mixing_in_loop_and_after_loop_inputs() {
    // The epilogue silu becomes an add of the accumulated tile and an in-loop tile.
    let mut doc = gated();
    let in_loop = get(&mut doc, &format!("{}.output_tensors[0]", tb(3)));
    set(&mut doc, &format!("{}.op_type", tb(7)), json!("tb_add_op"));
    at(&mut doc, &format!("{}.input_tensors", tb(7)))
        .as_array_mut()
        .unwrap()
        .push(in_loop);
    let e = invalid(&doc);
    assert_at(&e, Some(0), &tb(7));
    assert_eq!(e.kind, ErrorKind::MixedAfterAccum);
}

#[test]
fn after_accum_flag_that_contradicts_the_inputs() {
    // The silu of an accumulated tile is recorded as in-loop (and so is its consumer's copy).
    let mut doc = gated();
    for p in [
        "[0][3].bgraph.operators[7].output_tensors[0].after_accum",
        "[0][3].bgraph.operators[9].input_tensors[0].after_accum",
    ] {
        set(&mut doc, p, json!(false));
    }
    let e = invalid(&doc);
    assert_at(&e, Some(0), &format!("{}.output_tensors[0]", tb(7)));
    assert_eq!(
        e.kind,
        ErrorKind::AfterAccumMismatch {
            recorded: false,
            inferred: true
        }
    );
}

#[test]
fn accumulator_output_recorded_as_in_loop() {
    let mut doc = gated();
    for p in [
        "[0][3].bgraph.operators[6].output_tensors[0].after_accum",
        "[0][3].bgraph.operators[8].input_tensors[0].after_accum",
    ] {
        set(&mut doc, p, json!(false));
    }
    let e = invalid(&doc);
    assert_at(&e, Some(0), &format!("{}.output_tensors[0]", tb(6)));
    assert_msg(&e, "after_accum mismatch: recorded false, inferred true");
}

#[test]
fn output_operator_storing_an_in_loop_tile() {
    // The first tb_output_op stores the matmul's tile directly, bypassing the accumulator.
    let mut doc = gated();
    let in_loop = get(&mut doc, &format!("{}.output_tensors[0]", tb(3)));
    set(&mut doc, &format!("{}.input_tensors[0]", tb(8)), in_loop);
    let e = invalid(&doc);
    assert_at(&e, Some(0), &format!("{}.input_tensors[0]", tb(8)));
    assert!(matches!(e.kind, ErrorKind::Invalid(_)), "{e}");
    assert_msg(&e, "an output must store an after-loop tile");
}

#[test]
fn accumulator_of_an_after_loop_tile() {
    // The second accumulator reads the first accumulator's result.
    let mut doc = gated();
    let acc = get(&mut doc, &format!("{}.output_tensors[0]", tb(5)));
    set(&mut doc, &format!("{}.input_tensors[0]", tb(6)), acc);
    let e = invalid(&doc);
    assert_at(&e, Some(0), &format!("{}.input_tensors[0]", tb(6)));
    assert_msg(&e, "a for-loop accumulator's inputs must be in-loop tiles");
}

// ---------------------------------------------------------------------------------------------
// Strides

#[test]
fn input_strides_with_the_wrong_count() {
    let mut doc = gated();
    set(&mut doc, "[0][0].input_strides", json!([4096]));
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][0].input_strides");
    assert!(
        matches!(&e.kind, ErrorKind::BadStrides { strides, .. } if strides == "[4096]"),
        "{e}"
    );
    assert_msg(&e, "1 strides for a 2-dim tensor [8, 4096]");
}

#[test]
fn input_strides_that_overlap() {
    // Rows of 4096 elements 2048 apart.
    let mut doc = gated();
    set(&mut doc, "[0][0].input_strides", json!([2048, 1]));
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][0].input_strides");
    assert!(matches!(e.kind, ErrorKind::BadStrides { .. }), "{e}");
    assert_msg(&e, "two elements of [8, 4096] would share an address");
}

#[test]
fn zero_input_stride_overlaps() {
    let mut doc = gated();
    set(&mut doc, "[0][1].input_strides", json!([0, 1]));
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][1].input_strides");
    assert!(matches!(e.kind, ErrorKind::BadStrides { .. }), "{e}");
}

#[test]
fn negative_input_stride() {
    let mut doc = gated();
    set(&mut doc, "[0][0].input_strides[0]", json!(-4096));
    let e = import_err(&doc);
    assert_at(&e, Some(0), "[0][0].input_strides[0]");
    assert_msg(&e, "stride -4096 is outside 0..=");
}

#[test]
fn output_strides_that_overlap() {
    let mut doc = gated();
    set(&mut doc, "[0][5].output_strides", json!([1, 1]));
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][5].output_strides");
    assert!(matches!(e.kind, ErrorKind::BadStrides { .. }), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Launch configuration

#[test]
fn grid_y_over_the_cuda_limit() {
    let mut doc = gated();
    set(&mut doc, "[0][3].bgraph.grid_dim.y", json!(70000));
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][3].bgraph.grid_dim.y");
    assert!(matches!(e.kind, ErrorKind::LaunchLimit(_)), "{e}");
    assert_msg(&e, "grid_dim y = 70000 is outside 1..=65535");
}

#[test]
fn zero_grid_dimension() {
    let mut doc = gated();
    set(&mut doc, "[0][3].bgraph.grid_dim.x", json!(0));
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][3].bgraph.grid_dim.x");
    assert_msg(&e, "grid_dim x = 0 is outside 1..=");
}

#[test]
fn block_with_more_than_1024_threads() {
    let mut doc = gated();
    set(
        &mut doc,
        "[0][3].bgraph.block_dim",
        json!({"x": 512, "y": 4, "z": 1}),
    );
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][3].bgraph.block_dim");
    assert!(matches!(e.kind, ErrorKind::LaunchLimit(_)), "{e}");
    assert_msg(&e, "block_dim has 2048 threads; CUDA allows at most 1024");
}

#[test]
fn block_z_over_the_cuda_limit() {
    let mut doc = gated();
    set(
        &mut doc,
        "[0][3].bgraph.block_dim",
        json!({"x": 1, "y": 1, "z": 65}),
    );
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][3].bgraph.block_dim.z");
    assert_msg(&e, "block_dim z = 65 is outside 1..=64");
}

#[test]
fn block_whose_thread_count_overflows() {
    // Each axis is within the importer's 2^40 bound; their product is 2^64.
    let mut doc = gated();
    set(
        &mut doc,
        "[0][3].bgraph.block_dim",
        json!({"x": 1u64 << 32, "y": 1u64 << 32, "z": 1}),
    );
    let errors = validation_errors_with(&doc, &ImportOptions::default());
    let e = &errors[0];
    assert_at(e, Some(0), "[0][3].bgraph.block_dim.x");
    assert!(matches!(e.kind, ErrorKind::LaunchLimit(_)), "{e}");
    assert_msg(e, "block_dim x = 4294967296 is outside 1..=1024");
    // The thread count is exact, not wrapped.
    let total = errors
        .iter()
        .find(|e| e.location.json_path.as_deref() == Some("[0][3].bgraph.block_dim"))
        .expect("a thread-count error");
    assert_msg(total, "block_dim has 18446744073709551616 threads");
}

#[test]
fn forloop_range_zero() {
    let mut doc = gated();
    set(&mut doc, "[0][3].bgraph.forloop_range", json!(0));
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0][3].bgraph.forloop_range");
    assert!(matches!(e.kind, ErrorKind::BadValue(_)), "{e}");
    assert_msg(&e, "forloop_range must be at least 1");
}

// ---------------------------------------------------------------------------------------------
// Whole graphs and candidate lists

#[test]
fn graph_without_outputs() {
    let mut doc = gated();
    at(&mut doc, "[0]").as_array_mut().unwrap().pop();
    let e = invalid(&doc);
    assert_eq!(e.location.graph, Some(0));
    assert!(matches!(e.kind, ErrorKind::Invalid(_)), "{e}");
    assert_msg(&e, "graph 0");
    assert_msg(&e, "the graph has no outputs");
}

#[test]
fn graph_without_outputs_names_the_graph_json_path() {
    let mut doc = gated();
    at(&mut doc, "[0]").as_array_mut().unwrap().pop();
    let e = invalid(&doc);
    assert_at(&e, Some(0), "[0]");
}

#[test]
fn error_in_a_later_candidate_names_its_graph_index() {
    let mut doc = corpus("gqa_bs1.json");
    let n = doc.as_array().unwrap().len();
    assert!(n > 20);
    set(&mut doc, "[20][4].input_tensors[0].guid", json!(77));
    let e = import_err(&doc);
    assert_at(&e, Some(20), "[20][4].input_tensors[0].guid");
    assert_eq!(e.kind, ErrorKind::DanglingGuid(77));
}

#[test]
fn validation_error_in_a_later_candidate_names_its_graph_index() {
    let g = gated()[0].clone();
    let mut doc = json!([g.clone(), g.clone(), g]);
    set(&mut doc, "[2][3].bgraph.grid_dim.x", json!(96));
    let file = parse_with(&doc, &ImportOptions::default()).unwrap();
    assert!(file.graphs[0].validate().is_ok());
    assert!(file.graphs[1].validate().is_ok());
    let e = file.graphs[2].validate().unwrap_err().0.swap_remove(0);
    assert_at(&e, Some(2), "[2][3].bgraph.operators[1].input_map");
    assert!(matches!(e.kind, ErrorKind::NotDivisible { .. }), "{e}");
}

#[test]
fn dangling_guid_in_a_legacy_checkpoint_graph() {
    let mut doc = corpus("legacy_checkpoint_lora.json");
    let p = "generated_graphs[2][4].bgraph.operators[5].input_tensors[0].guid";
    set(&mut doc, p, json!(25544));
    let e = import_err(&doc);
    assert_at(&e, Some(2), p);
    assert_eq!(e.kind, ErrorKind::DanglingGuid(25544));
}

#[test]
fn legacy_concat_with_a_wrong_recorded_shape() {
    let mut doc = corpus("legacy_checkpoint_lora.json");
    for p in [
        "generated_graphs[1][4].bgraph.operators[6].output_tensors[0].dim[0]",
        "generated_graphs[1][4].bgraph.operators[7].input_tensors[1].dim[0]",
    ] {
        set(&mut doc, p, json!(273));
    }
    let errors = validation_errors_with(&doc, &ImportOptions::default());
    let e = &errors[0];
    assert_at(
        e,
        Some(1),
        "generated_graphs[1][4].bgraph.operators[6].output_tensors[0]",
    );
    assert_msg(
        e,
        "shape mismatch: recorded [273, 32], but the operator produces [272, 32]",
    );
}
