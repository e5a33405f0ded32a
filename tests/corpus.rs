//! The external test set: every file of `../shared/corpus/mirage-benchmarks` loads, has the graph
//! count its README states, validates, and survives import → export → import unchanged.

mod common;

use std::collections::BTreeMap;
use std::time::Instant;

use common::{corpus_dir, corpus_files};
use mucc::graph::DtypeTable;
use mucc::graph::mirage_json::{ExportOptions, graph_to_json, graphs_to_json};
use mucc::{FileForm, ImportOptions, parse_str, read_file};

/// The graph counts of the corpus README's table.
fn readme_counts() -> BTreeMap<String, usize> {
    let readme = std::fs::read_to_string(corpus_dir().join("../README.md")).expect("corpus README");
    let mut counts = BTreeMap::new();
    for line in readme.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() >= 3 && cells[1].ends_with(".json") {
            counts.insert(cells[1].to_string(), cells[2].parse().expect("count"));
        }
    }
    counts
}

#[test]
fn every_file_loads_with_the_readme_counts_and_validates() {
    let expected = readme_counts();
    assert_eq!(expected.len(), 18, "the README lists 18 files");
    let files = corpus_files();
    assert_eq!(
        files.len(),
        expected.len(),
        "every corpus file is in the README and vice versa"
    );
    let t0 = Instant::now();
    let mut total = 0;
    let mut loaded = Vec::new();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let f = read_file(path, &ImportOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            Some(&f.graphs.len()),
            expected.get(&name),
            "{name}: graph count"
        );
        // All benchmark files are legacy: fp16 code 921 and tb_accum_* names.
        assert_eq!(f.dtype_table, DtypeTable::Legacy, "{name}");
        let form = if name == "legacy_checkpoint_lora.json" {
            FileForm::LegacyCheckpoint
        } else {
            FileForm::CandidateList
        };
        assert_eq!(f.form, form, "{name}");
        total += f.graphs.len();
        loaded.push(f);
    }
    let load_time = t0.elapsed();
    let t1 = Instant::now();
    let mut errors = Vec::new();
    for f in &loaded {
        for lg in &f.graphs {
            if let Err(e) = lg.validate() {
                errors.push(e.to_string());
            }
        }
    }
    let validate_time = t1.elapsed();
    assert!(
        errors.is_empty(),
        "validation errors:\n{}",
        errors.join("\n")
    );
    assert_eq!(total, 604);
    eprintln!(
        "corpus: {total} graphs in {} files loaded in {:.0} ms, validated in {:.0} ms",
        files.len(),
        load_time.as_secs_f64() * 1e3,
        validate_time.as_secs_f64() * 1e3
    );
}

#[test]
fn import_export_import_round_trips_every_graph() {
    let styles = [
        ExportOptions::default(),
        ExportOptions {
            dtype_table: DtypeTable::Legacy,
            legacy_names: true,
        },
        ExportOptions {
            dtype_table: DtypeTable::Mid,
            legacy_names: false,
        },
    ];
    let mut checked = 0;
    for path in corpus_files() {
        let f = read_file(&path, &ImportOptions::default()).unwrap();
        for opts in styles {
            // The whole file as a candidate list …
            let text = serde_json::to_string(
                &graphs_to_json(f.graphs.iter().map(|g| &g.graph), &opts).unwrap(),
            )
            .unwrap();
            let back = parse_str(
                &text,
                None,
                &ImportOptions {
                    dtype_table: Some(opts.dtype_table),
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{}: re-import failed: {e}", path.display()));
            assert_eq!(back.graphs.len(), f.graphs.len());
            for (i, (a, b)) in f.graphs.iter().zip(&back.graphs).enumerate() {
                assert_eq!(a.graph, b.graph, "{} graph {i} ({opts:?})", path.display());
                b.validate().unwrap();
                checked += 1;
            }
        }
        // … and one graph in the single-graph form, with automatic table detection.
        let one = serde_json::to_string(
            &graph_to_json(&f.graphs[0].graph, &ExportOptions::default()).unwrap(),
        )
        .unwrap();
        let back = parse_str(&one, None, &ImportOptions::default()).unwrap();
        assert_eq!(back.form, FileForm::SingleGraph);
        assert_eq!(
            back.dtype_table,
            DtypeTable::Current,
            "named by the marker key"
        );
        assert_eq!(back.graphs[0].graph, f.graphs[0].graph);
    }
    assert_eq!(checked, 3 * 604);
}

#[test]
fn legacy_checkpoint_becomes_current_ir() {
    let f = read_file(
        &corpus_dir().join("legacy_checkpoint_lora.json"),
        &ImportOptions::default(),
    )
    .unwrap();
    // No kn_output_op in the May-2024 schema: the unread tensor is the output.
    for lg in &f.graphs {
        assert_eq!(lg.graph.outputs().len(), 1);
        assert_eq!(lg.graph.inputs().len(), 4);
    }
    assert_eq!(f.warnings.len(), 3);
    // The accumulating tb_output_op becomes an explicit accum_nored + output.
    let dump = mucc::graph::display::dump(&f.graphs[1].graph);
    assert!(
        dump.contains("= accum_nored(s7) -> [16, 32] after-loop"),
        "{dump}"
    );
    assert!(dump.contains("output s8 -> %"), "{dump}");
}
