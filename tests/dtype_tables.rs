//! Which `data_type` table a file is read with: detection, ambiguity warnings, the marker mucc
//! writes, and the explicit override.

use mucc::graph::mirage_json::{ExportOptions, graph_to_json};
use mucc::graph::{AccumKind, DType, DtypeTable, GraphBuilder, KernelGraph, TbGraphBuilder};
use mucc::{ImportOptions, MirageFile, parse_str};
use serde_json::Value;

/// A one-kernel graph with an accumulator (so that operator names carry a vintage).
fn graph(dtype: DType) -> KernelGraph {
    let mut g = GraphBuilder::new();
    let x = g.new_input(&[4, 64], dtype).unwrap();
    let mut tb = TbGraphBuilder::new([2, 1, 1], [128, 1, 1], 2);
    let t = tb.new_input(&g, x, [0, -1, -1], 1).unwrap();
    let a = tb.forloop_accum(t, AccumKind::RedLdSum).unwrap();
    tb.new_output(a, [0, -1, -1]).unwrap();
    let o = g.customized(tb).unwrap();
    g.mark_output(o[0]).unwrap();
    g.build().unwrap()
}

fn export(g: &KernelGraph, table: DtypeTable, legacy_names: bool, marker: bool) -> String {
    let mut v = graph_to_json(
        g,
        &ExportOptions {
            dtype_table: table,
            legacy_names,
        },
    )
    .unwrap();
    if !marker {
        let Value::Object(first) = &mut v[0] else {
            panic!()
        };
        first.remove("mucc_dtype_table").unwrap();
    }
    serde_json::to_string(&Value::Array(vec![v])).unwrap()
}

fn read(text: &str, table: Option<DtypeTable>) -> MirageFile {
    parse_str(
        text,
        None,
        &ImportOptions {
            dtype_table: table,
            ..Default::default()
        },
    )
    .unwrap()
}

fn dtype(f: &MirageFile) -> DType {
    f.graphs[0].graph.tensors.iter().next().unwrap().1.dtype
}

#[test]
fn files_mucc_writes_name_their_table() {
    for table in [DtypeTable::Mid, DtypeTable::Current] {
        for d in [DType::F16, DType::BF16] {
            let f = read(&export(&graph(d), table, false, true), None);
            assert_eq!(f.dtype_table, table);
            assert_eq!(dtype(&f), d);
            assert!(f.warnings.is_empty(), "{:?}", f.warnings);
        }
    }
}

#[test]
fn an_ambiguous_file_is_read_as_mid_with_a_warning_and_the_override_wins() {
    // fp16 under the current table is 940, which the mid table reads as bf16.
    let text = export(&graph(DType::F16), DtypeTable::Current, false, false);
    let f = read(&text, None);
    assert_eq!(f.dtype_table, DtypeTable::Mid);
    assert_eq!(dtype(&f), DType::BF16);
    assert_eq!(f.warnings.len(), 1);
    let w = &f.warnings[0];
    assert!(
        w.contains("ambiguous") && w.contains("940 = bf16") && w.contains("940 = f16"),
        "{w}"
    );
    assert!(f.dtype_table_reason.contains("(ambiguous)"));
    let f = read(&text, Some(DtypeTable::Current));
    assert_eq!(dtype(&f), DType::F16);
    assert!(f.warnings.is_empty());
}

#[test]
fn codes_that_mean_the_same_everywhere_are_not_ambiguous() {
    // f32 is 950 in both the mid and the current table.
    let f = read(
        &export(&graph(DType::F32), DtypeTable::Current, false, false),
        None,
    );
    assert_eq!(dtype(&f), DType::F32);
    assert!(f.warnings.is_empty(), "{:?}", f.warnings);
}

#[test]
fn codes_only_one_table_defines_decide() {
    // 955 (i32) exists only in the current table.
    let f = read(
        &export(&graph(DType::I32), DtypeTable::Current, false, false),
        None,
    );
    assert_eq!(f.dtype_table, DtypeTable::Current);
    assert_eq!(dtype(&f), DType::I32);
    // 921 (fp16) exists only in the legacy table.
    let f = read(
        &export(&graph(DType::F16), DtypeTable::Legacy, true, false),
        None,
    );
    assert_eq!(f.dtype_table, DtypeTable::Legacy);
    assert_eq!(dtype(&f), DType::F16);
}

#[test]
fn legacy_names_with_mid_codes_are_a_transition_file() {
    // Mirage wrote tb_accum_* names with mid codes between 2025-02-28 and 03-10: 941 is fp16
    // only in the mid table among those that allow legacy names.
    let f = read(
        &export(&graph(DType::F16), DtypeTable::Mid, true, false),
        None,
    );
    assert_eq!(f.dtype_table, DtypeTable::Mid);
    assert_eq!(dtype(&f), DType::F16);
    // 940 is f64 (legacy) or bf16 (mid): the usual storage type wins, with a warning.
    let f = read(
        &export(&graph(DType::BF16), DtypeTable::Mid, true, false),
        None,
    );
    assert_eq!(f.dtype_table, DtypeTable::Mid);
    assert_eq!(dtype(&f), DType::BF16);
    assert_eq!(f.warnings.len(), 1);
}
