//! Generated-graph differential testing: the input picks a seed; the random valid graph of that
//! seed (mucc::graph::random) must validate, evaluate on the interpreter with finite outputs,
//! plan and emit for sm_80 and sm_90a, and round-trip through Mirage JSON. With
//! `MUCC_FUZZ_NVRTC=1` (and a CUDA toolkit), every emitted file is also compiled by NVRTC.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mucc::graph::interp::{self, InputSpec};
use mucc::graph::mirage_json::{ExportOptions, graph_to_json};
use mucc::graph::random::{GenConfig, graph};
use mucc::sched::Options;
use mucc::target::Target;
use mucc::{ImportOptions, parse_str};

fuzz_target!(|data: &[u8]| {
    let mut seed = [0u8; 8];
    for (i, b) in data.iter().take(8).enumerate() {
        seed[i] = *b;
    }
    let g = graph(u64::from_le_bytes(seed), &GenConfig::default());
    mucc::validate(&g, None).expect("generated graphs are valid");
    let outs = interp::evaluate_owned(&g, interp::random_inputs(&g, InputSpec { seed: 1, scale: 1.0 }))
        .expect("the interpreter runs generated graphs");
    for o in &outs {
        assert!(o.data.iter().all(|x| x.is_finite()), "non-finite reference");
    }
    let json = graph_to_json(&g, &ExportOptions::default()).unwrap().to_string();
    let back = parse_str(&json, None, &ImportOptions::default()).unwrap();
    back.graphs[0].validate().unwrap();
    let compile = std::env::var_os("MUCC_FUZZ_NVRTC").is_some_and(|v| v == "1");
    for target in Target::all() {
        let (_, e) = mucc::transpile::transpile(&g, &Options::for_target(target), "fuzz")
            .unwrap_or_else(|e| panic!("{}: {e}", target.arch));
        if compile {
            let c = mucc::cuda::Compiler::new(Default::default()).unwrap();
            c.compile(&mucc::cuda::Source {
                path: "fuzz.cu",
                text: &e.source,
                arch: target.arch,
            })
            .unwrap_or_else(|e| panic!("{}: {e}", target.arch));
        }
    }
});
