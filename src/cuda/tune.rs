//! Verified autotuning (`mucc tune`): implementation variants of a graph (code path, cluster
//! split, programmatic dependent launch), each transpiled, compiled, checked against the
//! interpreter and timed; the fastest verified variant is kept in a persistent cache keyed by
//! (graph content, GPU name, mucc version), which `mucc run`, `bench`, `transpile` and `build`
//! read ([`TuneCache::lookup`], [`TuneCache::lookup_arch`]).
//!
//! A variant changes how the graph is implemented, never what it computes; every variant is
//! planned, emitted and checked like the default one.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::graph::KernelGraph;
use crate::graph::mirage_json::{ExportOptions, graph_to_json};
use crate::sched::plan::MAX_WARPS;
use crate::sched::{CtaChoice, Options, PathChoice};
use crate::target::Arch;

/// How a graph is implemented: the knobs of [`Options`] that a tuner may turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Variant {
    /// Code path of threadblock kernels (`auto`: every feature of the target; `ampere`).
    pub path: VariantPath,
    /// Whether the Hopper path may split for-loops over clusters.
    pub cluster_split: bool,
    /// Whether kernels launch programmatically after the previous one (Hopper path).
    pub dependent_launch: bool,
    /// Warps per CTA of threadblock kernels (`None`: the planner's cost model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warps: Option<usize>,
    /// Whether kernel-level matmuls may be fused into their reader (`sched::rewrite`; absent in
    /// caches written before the fusion existed: on).
    #[serde(default = "on", skip_serializing_if = "is_on")]
    pub fuse_matmuls: bool,
    /// The deepest pipeline ring threadblock kernels may get (`None`: the target's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stages: Option<usize>,
    /// Whether element-wise and row-norm blocks may keep their rows in registers
    /// (`sched::rows`; absent in caches written before register rows existed: on).
    #[serde(default = "on", skip_serializing_if = "is_on")]
    pub register_rows: bool,
    /// The factor customized operators' for-loops are refined by where their bodies allow
    /// (`sched::refine`; `None`: the planner's rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refine: Option<usize>,
    /// The factor customized operators' for-loops are coarsened by where their bodies allow
    /// (`sched::refine::LoopScale::Coarsen`; `None`: not asked; absent in caches written before
    /// coarsening existed). Never together with `refine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coarsen: Option<usize>,
    /// Whether split attention's key splits may fold into the kernel's loop by the planner's
    /// rule (`sched::softmax::KeyFold`; absent in caches written before the fold existed: on).
    #[serde(default = "on", skip_serializing_if = "is_on")]
    pub fold_splits: bool,
    /// Whether the Hopper path may load streamed tiles by TMA (`Options::tma`; absent in
    /// caches written before the knob existed: on).
    #[serde(default = "on", skip_serializing_if = "is_on")]
    pub tma: bool,
    /// Whether the Ampere path may split small grids' loops over CTAs by the planner's rule
    /// (`Options::grid_split`; absent in caches written before the rule existed: on).
    #[serde(default = "on", skip_serializing_if = "is_on")]
    pub grid_split: bool,
}

fn on() -> bool {
    true
}

fn is_on(b: &bool) -> bool {
    *b
}

/// The code path of a [`Variant`] (serialised as `auto` / `ampere`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VariantPath {
    /// Every feature of the target.
    Auto,
    /// Ampere features only.
    Ampere,
}

impl Variant {
    /// The planner's defaults.
    pub const DEFAULT: Variant = Variant {
        path: VariantPath::Auto,
        cluster_split: true,
        dependent_launch: false,
        warps: None,
        fuse_matmuls: true,
        stages: None,
        register_rows: true,
        refine: None,
        coarsen: None,
        fold_splits: true,
        tma: true,
        grid_split: true,
    };

    /// `base` with this variant's knobs.
    pub fn apply(&self, base: &Options) -> Options {
        Options {
            path: match self.path {
                VariantPath::Auto => PathChoice::Auto,
                VariantPath::Ampere => PathChoice::Ampere,
            },
            cluster_split: self.cluster_split,
            dependent_launch: self.dependent_launch,
            cta: match self.warps {
                Some(w) => CtaChoice::Warps(w),
                None => CtaChoice::Auto,
            },
            fuse_matmuls: self.fuse_matmuls,
            max_stages: self.stages,
            register_rows: self.register_rows,
            refine_loops: crate::sched::RefineChoice::asked(
                self.refine,
                self.coarsen,
                crate::sched::RefineChoice::Auto,
            ),
            fold_key_splits: if self.fold_splits {
                base.fold_key_splits
            } else {
                crate::sched::softmax::KeyFold::Off
            },
            tma: self.tma,
            grid_split: if self.grid_split {
                base.grid_split
            } else {
                crate::sched::GridSplitChoice::Off
            },
            ..base.clone()
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path {
            VariantPath::Ampere => f.write_str("path=ampere")?,
            VariantPath::Auto => write!(
                f,
                "path=auto split={} pdl={}",
                if self.cluster_split { "on" } else { "off" },
                if self.dependent_launch { "on" } else { "off" }
            )?,
        }
        if let Some(w) = self.warps {
            write!(f, " warps={w}")?;
        }
        if !self.fuse_matmuls {
            f.write_str(" fuse=off")?;
        }
        if let Some(s) = self.stages {
            write!(f, " stages={s}")?;
        }
        if !self.register_rows {
            f.write_str(" rows=off")?;
        }
        if let Some(r) = self.refine {
            write!(f, " refine={r}")?;
        }
        if let Some(c) = self.coarsen {
            write!(f, " coarsen={c}")?;
        }
        if !self.fold_splits {
            f.write_str(" fold=off")?;
        }
        if !self.tma {
            f.write_str(" tma=off")?;
        }
        if !self.grid_split {
            f.write_str(" gsplit=off")?;
        }
        Ok(())
    }
}

/// Warps per CTA tried besides the cost model's choice.
pub const TUNED_WARPS: [usize; 3] = [4, 8, 16];

/// Shallower pipeline rings tried (stages, warps): a ring of 4 stages leaves an SM room for
/// fewer CTAs than one of 2 or 3. Measured (NVIDIA H100, docs/benchmarks.md): decode_m8
/// 2048×22016 with 8 warps and 3 stages (clusters of 2) 34.6 µs against 37.3 with the default
/// plan (4 warps, 4 stages, clusters of 4).
pub const TUNED_STAGES: [(usize, Option<usize>); 3] = [(2, None), (3, None), (3, Some(8))];

/// Loop refinements tried (factor, stages; factor 1: none, where the planner's rule refines):
/// thinner iterations take less shared memory per stage, so that more CTAs stream at once.
/// Measured (NVIDIA H200, docs/benchmarks.md): mha_bs8 graph 25 87.35 µs, 77.09 refined by 2,
/// 73.30 refined by 2 with rings of 2 stages, 79.45 refined by 4; the decode linears and
/// gated_mlp slower refined.
pub const TUNED_REFINE: [(usize, Option<usize>); 4] =
    [(1, None), (2, None), (2, Some(2)), (4, None)];

/// Loop coarsenings tried (`sched::refine::LoopScale::Coarsen`): fewer, thicker iterations pay
/// each iteration's stage wait, barriers and refill once for more work. Measured before the
/// rewrite existed, on the builder's graph edited by hand (NVIDIA H100, docs/benchmarks.md "Not
/// adopted"): decode_m8_bf16_3584x4608 with 32 iterations of 112 rows 14.28 µs against 15.06
/// with the graph's 64 of 56; other decode shapes equal or slower.
pub const TUNED_COARSEN: [usize; 1] = [2];

/// Loop refinements tried with every streamed tile on `cp.async` (sm_90a; `Options::tma`
/// off). Measured (NVIDIA H100, docs/benchmarks.md "Streamed tiles by `cp.async`"):
/// decode_m1_bf16_11008x2048 16.79 µs refined by 2 on `cp.async` against 17.91 by the
/// default plan (TMA, unrefined; 17.49 refined by 2 by TMA in another run);
/// decode_m1_bf16_3584x4608 13.50 unrefined on `cp.async` against 13.79.
pub const TUNED_NO_TMA_REFINE: [Option<usize>; 2] = [None, Some(2)];

/// The variants worth trying for `arch`, the default first: the default with 4, 8 and 16 warps
/// per CTA (shared-memory tiles, as any asked CTA), without matmul fusion, without register
/// rows (tiles with the cost model's CTA), with the shallower rings of [`TUNED_STAGES`] and the
/// loop refinements of [`TUNED_REFINE`] and coarsenings of [`TUNED_COARSEN`]; on sm_90a
/// also the Hopper path with and without the cluster split and programmatic launches, the
/// default with split attention's key splits kept as blocks (no fold), streamed tiles on
/// `cp.async` (no TMA) with the refinements of [`TUNED_NO_TMA_REFINE`], and the Ampere path;
/// on sm_80 the default without the grid split of small grids (measured on an H100's Ampere
/// path, docs/benchmarks.md: gated_mlp g4 and g6 1.17x slower split, the decode linears and
/// rmsnorm faster). Variants that plan to the same code as an earlier one are measured once
/// (`mucc tune`).
pub fn variants(arch: Arch) -> Vec<Variant> {
    let mut v = vec![Variant::DEFAULT];
    for w in TUNED_WARPS {
        v.push(Variant {
            warps: Some(w),
            ..Variant::DEFAULT
        });
    }
    v.push(Variant {
        fuse_matmuls: false,
        ..Variant::DEFAULT
    });
    v.push(Variant {
        register_rows: false,
        ..Variant::DEFAULT
    });
    for (stages, warps) in TUNED_STAGES {
        v.push(Variant {
            stages: Some(stages),
            warps,
            ..Variant::DEFAULT
        });
    }
    for (refine, stages) in TUNED_REFINE {
        v.push(Variant {
            refine: Some(refine),
            stages,
            ..Variant::DEFAULT
        });
    }
    for coarsen in TUNED_COARSEN {
        v.push(Variant {
            coarsen: Some(coarsen),
            ..Variant::DEFAULT
        });
    }
    if arch == Arch::Sm80 {
        v.push(Variant {
            grid_split: false,
            ..Variant::DEFAULT
        });
    }
    if arch == Arch::Sm90a {
        for (cluster_split, dependent_launch) in [(true, true), (false, false), (false, true)] {
            v.push(Variant {
                path: VariantPath::Auto,
                cluster_split,
                dependent_launch,
                ..Variant::DEFAULT
            });
        }
        v.push(Variant {
            fold_splits: false,
            ..Variant::DEFAULT
        });
        for refine in TUNED_NO_TMA_REFINE {
            v.push(Variant {
                tma: false,
                refine,
                ..Variant::DEFAULT
            });
        }
        v.push(Variant {
            path: VariantPath::Ampere,
            cluster_split: false,
            dependent_launch: false,
            ..Variant::DEFAULT
        });
    }
    v
}

/// The content hash of a graph: SHA-256 of its canonical Mirage JSON (current spelling), so
/// that the same graph read from any file, or built with the builder, has the same key.
pub fn graph_hash(g: &KernelGraph) -> Result<String, String> {
    let json = graph_to_json(g, &ExportOptions::default()).map_err(|e| e.to_string())?;
    let text = serde_json::to_string(&json).map_err(|e| e.to_string())?;
    Ok(hex(&Sha256::digest(text.as_bytes())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One variant's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantResult {
    /// The variant.
    pub variant: Variant,
    /// Median µs per execution, when it ran and passed the check.
    pub us: Option<f64>,
    /// Why it has no time (failed check, compile error, same code as another variant…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A tuning result as the cache keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneEntry {
    /// The mucc that tuned, as [`PLANNER`] (version and planner fingerprint): a different one
    /// ignores the entry.
    pub mucc_version: String,
    /// The GPU's name.
    pub gpu: String,
    /// Its architecture.
    pub arch: Arch,
    /// [`graph_hash`] of the graph.
    pub graph_hash: String,
    /// The fastest verified variant.
    pub best: Variant,
    /// Every variant tried, in order.
    pub results: Vec<VariantResult>,
    /// Where the graph came from when it was tuned (for people reading the cache).
    pub source: String,
}

impl TuneEntry {
    /// µs of `v`, if it has a time.
    pub fn time_of(&self, v: Variant) -> Option<f64> {
        self.results
            .iter()
            .find(|r| r.variant == v)
            .and_then(|r| r.us)
    }

    /// The default variant's time over the best one's (≥ 1 when the best is faster).
    pub fn speedup(&self) -> Option<f64> {
        Some(self.time_of(Variant::DEFAULT)? / self.time_of(self.best)?)
    }
}

/// The fastest variant of `results` with a time, if any.
pub fn best_of(results: &[VariantResult]) -> Option<Variant> {
    results
        .iter()
        .filter_map(|r| r.us.map(|t| (r.variant, t)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(v, _)| v)
}

/// The mucc version and a fingerprint of its planner, emitter and runtime sources (computed by
/// the build script): tuning results are kept per planner, as a variant measured with other code
/// says nothing about this one.
pub const PLANNER: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "-",
    env!("MUCC_SOURCE_FINGERPRINT")
);

/// The tuning cache: `<dir>/<mucc version>-<planner fingerprint>/<graph hash>/<GPU name>.json`,
/// one entry per graph and GPU. A new mucc version or planner starts an empty folder (so its
/// results are never mixed with an older planner's); entries survive restarts.
#[derive(Clone, Debug)]
pub struct TuneCache {
    dir: PathBuf,
}

/// A GPU name as a file name.
fn slug(gpu: &str) -> String {
    gpu.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

impl TuneCache {
    /// The cache under `root` (`tune/` of mucc's cache directory by default, see
    /// [`TuneCache::default_location`]).
    pub fn at(root: impl Into<PathBuf>) -> TuneCache {
        TuneCache { dir: root.into() }
    }

    /// `tune/` under mucc's cache directory (`$MUCC_CACHE_DIR`, default `~/.cache/mucc`).
    pub fn default_location() -> TuneCache {
        TuneCache::at(super::compile::default_cache_dir().join("tune"))
    }

    /// The folder of this mucc version and planner ([`PLANNER`]).
    fn version_dir(&self) -> PathBuf {
        self.dir.join(PLANNER)
    }

    /// Where the entry of (`hash`, `gpu`) lives.
    pub fn path(&self, hash: &str, gpu: &str) -> PathBuf {
        self.version_dir()
            .join(hash)
            .join(format!("{}.json", slug(gpu)))
    }

    /// Stores `e` (replacing an older entry of the same graph and GPU).
    pub fn store(&self, e: &TuneEntry) -> Result<PathBuf, String> {
        let p = self.path(&e.graph_hash, &e.gpu);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).map_err(|err| format!("{}: {err}", d.display()))?;
        }
        let text = serde_json::to_string_pretty(e).map_err(|err| err.to_string())?;
        crate::outputs::write(
            &p,
            format!("{text}\n").as_bytes(),
            crate::outputs::Existing::Replace,
        )
        .map_err(|e| e.to_string())?;
        Ok(p)
    }

    /// The entry of (`hash`, `gpu`) made by this mucc version, if any. An entry that cannot be
    /// trusted ([`read_entry`]: not a regular file, too large, damaged, or with a field this
    /// mucc would not have written) counts as none, with a warning on stderr.
    pub fn lookup(&self, hash: &str, gpu: &str) -> Option<TuneEntry> {
        read_entry(&self.path(hash, gpu), hash, Some(gpu))
    }

    /// An entry of `hash` for `arch` from any GPU (for `transpile` and `build`, which run
    /// without one): the first by GPU name, so that the choice is deterministic.
    pub fn lookup_arch(&self, hash: &str, arch: Arch) -> Option<TuneEntry> {
        let dir = self.version_dir().join(hash);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        files
            .iter()
            .find_map(|p| read_entry(p, hash, None).filter(|e| e.arch == arch))
    }
}

/// The largest tuning-cache entry read (bytes); an entry mucc writes has about 2 KB.
pub const MAX_ENTRY_BYTES: u64 = 1 << 20;

/// The longest GPU name, source description or note an entry may hold (characters).
const MAX_ENTRY_TEXT: usize = 1024;

/// The entry at `p` for graph `hash` (and GPU `gpu`, when given), if there is one this mucc can
/// trust; else `None`, with a warning on stderr saying why unless there is simply no file.
pub fn read_entry(p: &Path, hash: &str, gpu: Option<&str>) -> Option<TuneEntry> {
    match load_entry(p, hash, gpu) {
        Ok(e) => e,
        Err(why) => {
            eprintln!(
                "warning: tuning cache entry {}: {why}; ignored (mucc tune --retune replaces it)",
                crate::graph::error::escape_path(p)
            );
            None
        }
    }
}

/// Reads the entry at `p` as input files are read (a regular file, symbolic links followed,
/// within [`MAX_ENTRY_BYTES`]; never a pipe or device) and checks it: `Ok(None)` if there is no
/// file, `Err(why)` if it cannot be used.
fn load_entry(p: &Path, hash: &str, gpu: Option<&str>) -> Result<Option<TuneEntry>, String> {
    use crate::graph::mirage_json::{ReadError, read_regular_file};
    let bytes = match read_regular_file(p, MAX_ENTRY_BYTES) {
        Ok(b) => b,
        Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(ReadError::Io(e)) => return Err(format!("cannot read it: {e}")),
        Err(ReadError::NotRegular) => {
            return Err("not a regular file (a directory, device, pipe or socket)".into());
        }
        Err(ReadError::TooLarge(n)) => {
            return Err(format!(
                "{n} bytes, more than the {MAX_ENTRY_BYTES} an entry may have"
            ));
        }
    };
    let text = String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())?;
    let e: TuneEntry = serde_json::from_str(&text).map_err(|e| format!("not an entry: {e}"))?;
    e.check(hash, gpu)?;
    Ok(Some(e))
}

impl Variant {
    /// Whether the variant can be planned: a CTA of 1 to [`MAX_WARPS`] warps, rings of 1 to 4
    /// stages, loops refined by 1 (none) to [`crate::sched::refine::MAX_REFINE`].
    fn check(&self) -> Result<(), String> {
        use crate::sched::refine::MAX_REFINE;
        if self.refine.is_some() && self.coarsen.is_some() {
            return Err("loops both refined and coarsened".into());
        }
        if let Some(c) = self.coarsen.filter(|c| !(1..=MAX_REFINE).contains(c)) {
            return Err(format!("loops coarsened by {c} (1 to {MAX_REFINE})"));
        }
        match (self.warps, self.stages, self.refine) {
            (Some(w), _, _) if !(1..=MAX_WARPS).contains(&w) => {
                Err(format!("{w} warps per CTA (a CTA has 1 to {MAX_WARPS})"))
            }
            (_, Some(s), _) if !(1..=4).contains(&s) => {
                Err(format!("rings of {s} stages (1 to 4)"))
            }
            (_, _, Some(r)) if !(1..=MAX_REFINE).contains(&r) => {
                Err(format!("loops refined by {r} (1 to {MAX_REFINE})"))
            }
            _ => Ok(()),
        }
    }
}

impl TuneEntry {
    /// Whether the entry is one this mucc wrote for graph `hash` (and GPU `gpu`): the same
    /// planner, graph and GPU, variants that can be planned (the best one timed), positive
    /// finite times, and texts of a sensible length.
    pub fn check(&self, hash: &str, gpu: Option<&str>) -> Result<(), String> {
        let clip = crate::graph::error::clip;
        if self.mucc_version != PLANNER {
            return Err(format!(
                "written by another mucc ({}, this is {PLANNER})",
                clip(&self.mucc_version)
            ));
        }
        if self.graph_hash != hash {
            return Err(format!("for another graph ({})", clip(&self.graph_hash)));
        }
        if let Some(g) = gpu
            && self.gpu != g
        {
            return Err(format!("for another GPU ({})", clip(&self.gpu)));
        }
        for (what, text) in [("GPU name", &self.gpu), ("source", &self.source)] {
            if text.chars().count() > MAX_ENTRY_TEXT {
                return Err(format!("a {what} of {} bytes", text.len()));
            }
        }
        self.best
            .check()
            .map_err(|e| format!("best variant: {e}"))?;
        for r in &self.results {
            r.variant
                .check()
                .map_err(|e| format!("variant {}: {e}", r.variant))?;
            if let Some(us) = r.us
                && !(us.is_finite() && us > 0.0)
            {
                return Err(format!("variant {}: a time of {us} µs", r.variant));
            }
            if r.note
                .as_ref()
                .is_some_and(|n| n.chars().count() > MAX_ENTRY_TEXT)
            {
                return Err(format!("variant {}: a note too long", r.variant));
            }
        }
        if self.time_of(self.best).is_none() {
            return Err(format!("the best variant ({}) has no time", self.best));
        }
        Ok(())
    }
}

/// The options to plan `g` with for `arch` (and the GPU `gpu` when there is one): `base` with
/// the cached best variant when `cache` has one (and the entry), else `base`.
pub fn tuned_options(
    cache: Option<&TuneCache>,
    g: &KernelGraph,
    gpu: Option<&str>,
    base: &Options,
) -> (Options, Option<TuneEntry>) {
    let Some(cache) = cache else {
        return (base.clone(), None);
    };
    // Nothing tuned by this mucc: no entry to find, and no need to hash the graph (an export of
    // the whole graph, 45% of transpiling a 50,000-operator one).
    if !cache.version_dir().is_dir() {
        return (base.clone(), None);
    }
    let Ok(hash) = graph_hash(g) else {
        return (base.clone(), None);
    };
    let entry = match gpu {
        Some(name) => cache.lookup(&hash, name),
        None => cache.lookup_arch(&hash, base.target.arch),
    };
    match entry {
        Some(e) if e.arch == base.target.arch => (e.best.apply(base), Some(e)),
        _ => (base.clone(), None),
    }
}

/// Whether a tuned variant may replace these choices: only the defaults (path auto, no
/// dependent launch, warps auto) are; options a user gave win.
pub fn replaceable(path: PathChoice, dependent_launch: bool, cta: CtaChoice) -> bool {
    path == PathChoice::Auto && !dependent_launch && cta == CtaChoice::Auto
}

/// The planning options for `arch` with code path `path`, `dependent_launch` and CTA shape
/// `cta`, and the tuned variant of `g` for `arch` from the default tuning cache applied when
/// `tune` is set and the options are the defaults a variant may replace (path auto, no
/// dependent launch, warps auto). Returns the
/// entry applied, if any. The CLI and the Python package both plan through this.
pub fn options_for(
    g: &KernelGraph,
    arch: Arch,
    path: PathChoice,
    dependent_launch: bool,
    cta: CtaChoice,
    tune: bool,
) -> (Options, Option<TuneEntry>) {
    let base = Options {
        path,
        dependent_launch,
        cta,
        ..Options::for_target(crate::target::Target::new(arch))
    };
    if !tune || !replaceable(path, dependent_launch, cta) {
        return (base, None);
    }
    tuned_options(Some(&TuneCache::default_location()), g, None, &base)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Target;

    fn entry(hash: &str, gpu: &str, arch: Arch, best: Variant) -> TuneEntry {
        TuneEntry {
            mucc_version: PLANNER.into(),
            gpu: gpu.into(),
            arch,
            graph_hash: hash.into(),
            best,
            results: vec![
                VariantResult {
                    variant: Variant::DEFAULT,
                    us: Some(10.0),
                    note: None,
                },
                VariantResult {
                    variant: best,
                    us: Some(8.0),
                    note: None,
                },
            ],
            source: "test".into(),
        }
    }

    #[test]
    fn options_for_applies_no_variant_to_explicit_choices() {
        let mut b = crate::graph::GraphBuilder::new();
        let x = b.new_input(&[16, 16], crate::graph::DType::F16).unwrap();
        let y = b.matmul(x, x).unwrap();
        b.mark_output(y).unwrap();
        let g = b.build().unwrap();
        let (o, e) = options_for(
            &g,
            Arch::Sm90a,
            PathChoice::Ampere,
            false,
            CtaChoice::Auto,
            true,
        );
        assert_eq!(
            (o.path, o.target.arch, o.dependent_launch),
            (PathChoice::Ampere, Arch::Sm90a, false)
        );
        assert!(e.is_none());
        let (o, e) = options_for(
            &g,
            Arch::Sm90a,
            PathChoice::Auto,
            true,
            CtaChoice::Auto,
            true,
        );
        assert!(o.dependent_launch && e.is_none());
        let (o, e) = options_for(
            &g,
            Arch::Sm80,
            PathChoice::Auto,
            false,
            CtaChoice::Auto,
            false,
        );
        assert_eq!((o.path, o.target.arch), (PathChoice::Auto, Arch::Sm80));
        assert!(e.is_none());
    }

    #[test]
    fn variants_start_with_the_default_and_are_distinct() {
        for arch in [Arch::Sm80, Arch::Sm90a] {
            let v = variants(arch);
            assert_eq!(v[0], Variant::DEFAULT);
            let mut d = v.clone();
            d.sort_by_key(|x| x.to_string());
            d.dedup();
            assert_eq!(d.len(), v.len(), "{arch}");
        }
        let n = TUNED_WARPS.len() + TUNED_STAGES.len() + TUNED_REFINE.len() + TUNED_COARSEN.len();
        // sm_80 adds the default without the grid split of small grids.
        assert_eq!(variants(Arch::Sm80).len(), 4 + n);
        assert_eq!(
            variants(Arch::Sm80).last().unwrap().to_string(),
            "path=auto split=on pdl=off gsplit=off"
        );
        let no_tma = TUNED_NO_TMA_REFINE.len();
        assert_eq!(variants(Arch::Sm90a).len(), 8 + n + no_tma);
        // One keeps split attention's key splits as blocks.
        let unfolded = variants(Arch::Sm90a)[7 + n - 1];
        assert_eq!(unfolded.to_string(), "path=auto split=on pdl=off fold=off");
        assert_eq!(
            unfolded
                .apply(&Options::for_target(Target::new(Arch::Sm90a)))
                .fold_key_splits,
            crate::sched::softmax::KeyFold::Off
        );
        assert!(
            !serde_json::to_string(&Variant::DEFAULT)
                .unwrap()
                .contains("fold")
        );
        // Two load every streamed tile by cp.async, one of them refined by 2.
        let cp_async: Vec<String> = variants(Arch::Sm90a)[7 + n..7 + n + no_tma]
            .iter()
            .map(|v| {
                assert!(!v.apply(&Options::for_target(Target::new(Arch::Sm90a))).tma);
                v.to_string()
            })
            .collect();
        assert_eq!(
            cp_async,
            [
                "path=auto split=on pdl=off tma=off",
                "path=auto split=on pdl=off refine=2 tma=off"
            ]
        );
        assert!(
            Variant::DEFAULT
                .apply(&Options::for_target(Target::new(Arch::Sm90a)))
                .tma
        );
        assert!(variants(Arch::Sm80).iter().all(|v| v.tma));
        let back: Variant = serde_json::from_str(
            r#"{"path":"auto","cluster_split":true,"dependent_launch":false}"#,
        )
        .unwrap();
        assert_eq!(
            back,
            Variant::DEFAULT,
            "a cache entry from before the knob reads as TMA on"
        );
        // The shallower rings follow the unfused and the tiles-only variants; one plans 8 warps.
        let shallow = variants(Arch::Sm90a)[3 + TUNED_WARPS.len() + 2];
        assert_eq!(
            shallow.to_string(),
            "path=auto split=on pdl=off warps=8 stages=3"
        );
        let opts = shallow.apply(&Options::for_target(Target::new(Arch::Sm90a)));
        assert_eq!(opts.max_stages, Some(3));
        assert_eq!(opts.with_stage_cap().target.max_pipeline_stages, 3);
        // One variant keeps every kernel-level matmul a step.
        let unfused = variants(Arch::Sm80)[1 + TUNED_WARPS.len()];
        assert_eq!(unfused.to_string(), "path=auto split=on pdl=off fuse=off");
        assert!(
            !unfused
                .apply(&Options::for_target(Target::new(Arch::Sm80)))
                .fuse_matmuls
        );
        // One variant plans shared-memory tiles where the default keeps rows in registers.
        let tiles = variants(Arch::Sm80)[2 + TUNED_WARPS.len()];
        assert_eq!(tiles.to_string(), "path=auto split=on pdl=off rows=off");
        assert!(
            !tiles
                .apply(&Options::for_target(Target::new(Arch::Sm80)))
                .register_rows
        );
        let json = serde_json::to_string(&Variant::DEFAULT).unwrap();
        assert!(!json.contains("register_rows"), "{json}");
        let back: Variant = serde_json::from_str(&serde_json::to_string(&tiles).unwrap()).unwrap();
        assert_eq!(back, tiles);
        // A warps variant plans with that CTA shape; the default leaves it to the cost model.
        let w8 = variants(Arch::Sm80)[2];
        assert_eq!(w8.warps, Some(8));
        assert_eq!(w8.to_string(), "path=auto split=on pdl=off warps=8");
        let base80 = Options::for_target(Target::new(Arch::Sm80));
        assert_eq!(w8.apply(&base80).cta, CtaChoice::Warps(8));
        assert_eq!(Variant::DEFAULT.apply(&base80).cta, CtaChoice::Auto);
        // The default variant plans exactly as the default options.
        let base = Options::for_target(Target::new(Arch::Sm90a));
        let o = Variant::DEFAULT.apply(&base);
        assert_eq!(
            (o.path, o.cluster_split, o.dependent_launch, o.fuse_matmuls),
            (
                base.path,
                base.cluster_split,
                base.dependent_launch,
                base.fuse_matmuls
            )
        );
        assert_eq!(Variant::DEFAULT.to_string(), "path=auto split=on pdl=off");
    }

    /// A cache this mucc never tuned into gives the base options (without hashing the graph).
    #[test]
    fn an_empty_cache_gives_the_base_options() {
        let dir = std::env::temp_dir().join(format!("mucc-tune-empty-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let g = crate::graph::workloads::decode_gated_linear(
            1,
            64,
            128,
            2,
            2,
            crate::graph::DType::F16,
        )
        .unwrap();
        let base = Options::for_target(Target::new(Arch::Sm90a));
        let (opts, entry) = tuned_options(Some(&TuneCache::at(&dir)), &g, None, &base);
        assert!(entry.is_none());
        assert_eq!(opts.max_stages, base.max_stages);
        assert_eq!(opts.cta, base.cta);
        assert!(!dir.exists(), "a lookup creates nothing");
    }

    #[test]
    fn cache_round_trip_keys_and_version_invalidation() {
        let dir = std::env::temp_dir().join(format!("mucc-tune-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = TuneCache::at(&dir);
        let fast = Variant {
            path: VariantPath::Ampere,
            cluster_split: false,
            dependent_launch: false,
            ..Variant::DEFAULT
        };
        let e = entry("abc", "NVIDIA H200", Arch::Sm90a, fast);
        let p = cache.store(&e).unwrap();
        // Under the version and planner fingerprint.
        assert!(PLANNER.starts_with(concat!(env!("CARGO_PKG_VERSION"), "-")));
        assert!(PLANNER.len() > env!("CARGO_PKG_VERSION").len() + 8);
        assert!(p.starts_with(dir.join(PLANNER).join("abc")));
        assert_eq!(p.file_name().unwrap(), "NVIDIA_H200.json");
        // Keyed by graph and GPU.
        assert_eq!(cache.lookup("abc", "NVIDIA H200"), Some(e.clone()));
        assert_eq!(cache.lookup("abc", "NVIDIA H100 80GB HBM3"), None);
        assert_eq!(cache.lookup("abd", "NVIDIA H200"), None);
        // Without a GPU: any entry of the graph for the architecture.
        assert_eq!(cache.lookup_arch("abc", Arch::Sm90a), Some(e.clone()));
        assert_eq!(cache.lookup_arch("abc", Arch::Sm80), None);
        assert_eq!(e.speedup(), Some(10.0 / 8.0));
        // An entry written by another mucc version or planner is ignored, even in this
        // planner's folder.
        let mut old = e.clone();
        old.mucc_version = concat!(env!("CARGO_PKG_VERSION"), "-0000000000000000").into();
        cache.store(&old).unwrap();
        assert_eq!(cache.lookup("abc", "NVIDIA H200"), None);
        assert_eq!(cache.lookup_arch("abc", Arch::Sm90a), None);
        // A damaged entry counts as none.
        std::fs::write(&p, "{ not json").unwrap();
        assert_eq!(cache.lookup("abc", "NVIDIA H200"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn best_of_takes_the_fastest_timed_variant() {
        let a = Variant::DEFAULT;
        let b = *variants(Arch::Sm90a).last().unwrap();
        let rs = vec![
            VariantResult {
                variant: a,
                us: Some(5.0),
                note: None,
            },
            VariantResult {
                variant: b,
                us: None,
                note: Some("failed the check".into()),
            },
        ];
        assert_eq!(best_of(&rs), Some(a));
        assert_eq!(best_of(&rs[1..]), None);
    }
}
