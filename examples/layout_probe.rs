use mucc::graph::KnOpKind;
use mucc::graph::fusion::fuse;
use mucc::layout::{SolveOptions, resolve};
use std::collections::BTreeMap;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let f = mucc::read_file(std::path::Path::new(&args[1]), &Default::default()).unwrap();
    let mut times = vec![];
    for (i, lg) in f.graphs.iter().enumerate() {
        let g = &lg.graph;
        let mut fus = BTreeMap::new();
        for (h, op) in g.ops.iter() {
            if let KnOpKind::Customized(tb) = &op.kind {
                fus.insert(h.index(), fuse(tb));
            }
        }
        let t = std::time::Instant::now();
        let p = resolve(g, &fus, &SolveOptions::default());
        let el = t.elapsed();
        times.push(el);
        match p {
            Ok(p) => {
                if i < 2 || args.len() > 2 {
                    println!(
                        "graph {i}: cost {} {:?} vars {} cons {} {:?} d={:?} k={:?}",
                        p.cost,
                        p.report.method,
                        p.report.variables,
                        p.report.constraints,
                        el,
                        p.dtensors,
                        p.kernels
                    );
                }
            }
            Err(e) => println!("graph {i}: ERROR {e}"),
        }
    }
    times.sort();
    println!(
        "median {:?} max {:?}",
        times[times.len() / 2],
        times.last().unwrap()
    );
}
