fn main() {
    let mut total = 0;
    for e in std::fs::read_dir("../shared/corpus/mirage-benchmarks").unwrap() {
        let p = e.unwrap().path();
        let t = std::time::Instant::now();
        match mucc::graph::mirage_json::read_file(&p, &Default::default()) {
            Ok(f) => {
                let mut bad = 0;
                for g in &f.graphs {
                    if let Err(e) = g.validate() {
                        bad += 1;
                        if bad < 3 {
                            println!("  {e}");
                        }
                    }
                }
                total += f.graphs.len();
                println!(
                    "{}: {} graphs, table {} ({}), {} invalid, {:?} warnings={:?}",
                    p.display(),
                    f.graphs.len(),
                    f.dtype_table,
                    f.dtype_table_reason,
                    bad,
                    t.elapsed(),
                    f.warnings
                );
            }
            Err(e) => println!("{}: ERROR {e}", p.display()),
        }
    }
    println!("total {total}");
}
