//! Timing launch plans on the GPU, and the two ceilings their times are compared with.
//!
//! **Timing.** A plan is executed over several *sets* of input and output buffers in turn, so
//! that together they exceed the L2 cache (twice over) and no execution finds its inputs still
//! cached by the one before, as a real caller would not ([`rotation_sets`]). Each timed sample
//! is bracketed by CUDA events on the stream. With [`Launch::Graph`] (the default of `mucc
//! bench`), the executions over all sets are captured once in a CUDA graph and a sample is one
//! replay of it, divided by the executions it holds: launch gaps shrink to what a graph replay
//! costs, as in a serving loop that replays graphs. With [`Launch::Stream`], a sample is one
//! execution launched on the stream. Warm-up samples run first and are not timed; the median
//! of the samples is the figure reported.
//!
//! **Ceilings.** [`Gpu::measure_copy_bandwidth`]: a device-to-device copy of a large buffer,
//! counting bytes read plus bytes written. [`Gpu::measure_matmul_rate`]: a large square cuBLAS
//! product on random data (zeros run faster than real data) with the accumulation mucc uses.
//! Both take the median of several timed runs after warm-up. The floor of a graph is the larger
//! of its bytes over the bandwidth and its matrix operations over the rate
//! ([`Ceilings::floor`]).

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaSlice, DevicePtr};

use super::run::{Buffers, Gpu, Program, RunError, driver};
use crate::graph::DType;
use crate::graph::cost::Work;

/// How executions are launched while timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// Captured once into a CUDA graph, replayed.
    Graph,
    /// Launched one by one on the stream.
    Stream,
}

/// How to time a plan.
#[derive(Clone, Copy, Debug)]
pub struct TimingOptions {
    /// Timed samples.
    pub samples: usize,
    /// Untimed samples before them.
    pub warmup: usize,
    /// Graph replay or stream launches.
    pub launch: Launch,
    /// Fewest executions per sample in graph mode (a multiple of the number of sets).
    pub min_executions_per_sample: usize,
    /// Also time every step of the plan alone (kernels, cuBLAS calls, all-reduces), the same
    /// way, after the whole plan.
    pub per_step: bool,
}

impl Default for TimingOptions {
    fn default() -> Self {
        TimingOptions {
            samples: 50,
            warmup: 5,
            launch: Launch::Graph,
            min_executions_per_sample: 10,
            per_step: false,
        }
    }
}

/// Times of one plan, per execution.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// Median over the samples, in µs per execution.
    pub median_us: f64,
    /// Fastest sample, µs per execution.
    pub min_us: f64,
    /// Slowest sample, µs per execution.
    pub max_us: f64,
    /// Number of timed samples.
    pub samples: usize,
    /// Executions in each sample.
    pub executions_per_sample: usize,
    /// Buffer sets rotated through.
    pub sets: usize,
}

/// How many buffer sets of `set_bytes` each make the executions' working set exceed twice the
/// L2 cache of `l2_bytes`, using at most `budget_bytes` of device memory in all (at least 1,
/// at most 1024).
pub fn rotation_sets(set_bytes: usize, l2_bytes: usize, budget_bytes: usize) -> usize {
    let set = set_bytes.max(1);
    let wanted = (2 * l2_bytes).div_ceil(set) + 1;
    let affordable = (budget_bytes / set).max(1);
    wanted.min(affordable).clamp(1, 1024)
}

/// Median of `v` (the mean of the middle two for an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    }
}

/// Which ceiling sets a floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Moving the bytes.
    Memory,
    /// The matrix products.
    Compute,
}

impl Bound {
    /// `memory` or `compute`.
    pub fn name(self) -> &'static str {
        match self {
            Bound::Memory => "memory",
            Bound::Compute => "compute",
        }
    }
}

/// The measured ceilings of a GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ceilings {
    /// Device-memory bandwidth in bytes per second (copy: read + write).
    pub copy_bytes_per_s: f64,
    /// Matrix-product rate in operations per second, per operand type.
    pub matmul_flops_per_s: Vec<(DType, f64)>,
}

impl Ceilings {
    /// The rate measured for `dt`, if it was.
    pub fn rate(&self, dt: DType) -> Option<f64> {
        self.matmul_flops_per_s
            .iter()
            .find(|(d, _)| *d == dt)
            .map(|(_, r)| *r)
    }

    /// Seconds the bytes need at the measured bandwidth.
    pub fn memory_seconds(&self, w: &Work) -> f64 {
        w.bytes() as f64 / self.copy_bytes_per_s
    }

    /// Seconds the matrix products need at the measured rates (types without a rate count
    /// nothing).
    pub fn compute_seconds(&self, w: &Work) -> f64 {
        w.matmul_flops
            .iter()
            .filter_map(|(dt, f)| self.rate(*dt).map(|r| f / r))
            .sum()
    }

    /// The floor in seconds — the larger of the memory and compute times — and which it is.
    pub fn floor(&self, w: &Work) -> (f64, Bound) {
        let (m, c) = (self.memory_seconds(w), self.compute_seconds(w));
        if c > m {
            (c, Bound::Compute)
        } else {
            (m, Bound::Memory)
        }
    }
}

/// cuBLAS data type and compute type for products of `dt`, if mucc measures them.
fn gemm_types(
    dt: DType,
) -> Option<(
    cudarc::cublas::sys::cudaDataType,
    cudarc::cublas::sys::cublasComputeType_t,
)> {
    let (d, c) = crate::sched::gemm::cublas_types(dt).ok()?;
    Some((super::run::cuda_data_type(d), super::run::compute_type(c)))
}

/// `n` random values in [−1, 1) encoded in `dt` (xorshift; fast, not statistical quality),
/// encoded a chunk at a time ([`super::data::encode`]).
fn random_bytes(dt: DType, n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    const CHUNK: usize = 1 << 20;
    let mut out = Vec::with_capacity(n * dt.bytes());
    let mut values = Vec::with_capacity(CHUNK.min(n));
    let mut left = n;
    while left > 0 {
        values.clear();
        values.extend((0..CHUNK.min(left)).map(|_| next()));
        out.extend(super::data::encode(dt, &values));
        left -= values.len();
    }
    out
}

impl Gpu {
    fn timing_event(&self) -> Result<CudaEvent, RunError> {
        self.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating a timing event"))
    }

    /// Free and total device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize), RunError> {
        self.ctx
            .mem_get_info()
            .map_err(driver("reading the free device memory"))
    }

    /// Times `n` samples of `work` (which queues one sample on the stream), after `warmup`
    /// untimed ones; returns milliseconds per sample.
    fn time_samples(
        &self,
        warmup: usize,
        n: usize,
        mut work: impl FnMut() -> Result<(), RunError>,
    ) -> Result<Vec<f64>, RunError> {
        for _ in 0..warmup {
            work()?;
        }
        self.synchronize()?;
        let events: Vec<(CudaEvent, CudaEvent)> = (0..n)
            .map(|_| Ok((self.timing_event()?, self.timing_event()?)))
            .collect::<Result<_, RunError>>()?;
        for (start, end) in &events {
            start
                .record(&self.stream)
                .map_err(driver("recording an event"))?;
            work()?;
            end.record(&self.stream)
                .map_err(driver("recording an event"))?;
        }
        self.synchronize()?;
        events
            .iter()
            .map(|(s, e)| {
                s.elapsed_ms(e)
                    .map(f64::from)
                    .map_err(driver("reading an event time"))
            })
            .collect()
    }

    /// Times `prog` over the buffer `sets` in turn (see the module docs); the sets' outputs hold
    /// the last results afterwards.
    pub fn time(
        &self,
        prog: &Program,
        sets: &[Buffers],
        opts: &TimingOptions,
    ) -> Result<Timing, RunError> {
        self.time_steps(prog, sets, opts, 0..prog.plan().steps.len())
    }

    /// Times each step of `prog` alone, as [`Gpu::time`] times the whole plan; returns per step
    /// its name and median µs. A step that updates a buffer in place runs several times over,
    /// so the outputs are meaningless afterwards.
    pub fn time_each_step(
        &self,
        prog: &Program,
        sets: &[Buffers],
        opts: &TimingOptions,
    ) -> Result<Vec<(String, f64)>, RunError> {
        (0..prog.plan().steps.len())
            .map(|i| {
                let t = self.time_steps(prog, sets, opts, i..i + 1)?;
                Ok((super::run::step_name(prog, i), t.median_us))
            })
            .collect()
    }

    /// Times the steps `steps` of `prog` (see [`Gpu::time`]).
    fn time_steps(
        &self,
        prog: &Program,
        sets: &[Buffers],
        opts: &TimingOptions,
        steps: std::ops::Range<usize>,
    ) -> Result<Timing, RunError> {
        let exec = |set: &Buffers| {
            self.execute_steps(
                prog,
                super::run::Bufs::Owned(set),
                steps.clone(),
                self.stream.cu_stream(),
            )
        };
        if sets.is_empty() {
            return Err(RunError::Plan("no buffer set to time".into()));
        }
        let samples = opts.samples.max(1);
        let (ms, per_sample) = match opts.launch {
            Launch::Stream => {
                let mut k = 0usize;
                let ms = self.time_samples(opts.warmup.max(sets.len()), samples, || {
                    let r = exec(&sets[k % sets.len()]);
                    k += 1;
                    r
                })?;
                (ms, 1)
            }
            Launch::Graph => {
                let per = sets.len() * opts.min_executions_per_sample.max(1).div_ceil(sets.len());
                // One plain execution first: module loading and cuBLAS's lazy set-up must not
                // happen under capture.
                exec(&sets[0])?;
                self.synchronize()?;
                self.stream
                    .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                    .map_err(driver("starting a CUDA-graph capture"))?;
                let queued = (0..per).try_for_each(|k| exec(&sets[k % sets.len()]));
                let captured = self.stream.end_capture(CUgraphInstantiate_flags(0));
                queued?;
                let graph = captured
                    .map_err(driver("capturing the plan into a CUDA graph"))?
                    .ok_or_else(|| RunError::Plan("the CUDA-graph capture was empty".into()))?;
                graph.upload().map_err(driver("uploading the CUDA graph"))?;
                let ms = self.time_samples(opts.warmup.max(1), samples, || {
                    graph.launch().map_err(driver("replaying the CUDA graph"))
                })?;
                (ms, per)
            }
        };
        let per_exec_us: Vec<f64> = ms.iter().map(|m| m * 1e3 / per_sample as f64).collect();
        Ok(Timing {
            median_us: median(&per_exec_us),
            min_us: per_exec_us.iter().copied().fold(f64::INFINITY, f64::min),
            max_us: per_exec_us.iter().copied().fold(0.0, f64::max),
            samples,
            executions_per_sample: per_sample,
            sets: sets.len(),
        })
    }

    /// Device-memory bandwidth in bytes per second: the median of timed device-to-device
    /// copies of a buffer of up to 1 GiB (an eighth of the free memory at most), counting the
    /// bytes read and the bytes written.
    pub fn measure_copy_bandwidth(&self) -> Result<f64, RunError> {
        let (free, _) = self.memory_info()?;
        let bytes = (1usize << 30).min(free / 8).max(1 << 20) & !0xfff;
        let src: CudaSlice<u8> = self
            .stream
            .alloc_zeros(bytes)
            .map_err(driver("allocating the copy buffers"))?;
        let mut dst: CudaSlice<u8> = self
            .stream
            .alloc_zeros(bytes)
            .map_err(driver("allocating the copy buffers"))?;
        let ms = self.time_samples(3, 15, || {
            self.stream
                .memcpy_dtod(&src, &mut dst)
                .map_err(driver("copying on the device"))
        })?;
        Ok(2.0 * bytes as f64 / (median(&ms) * 1e-3))
    }

    /// Matrix-product rate for operands of `dt` in operations per second: the median of timed
    /// square cuBLAS products (8192 for 16-bit types, 4096 otherwise) on random data, with
    /// fp32 accumulation (fp64 for f64) as mucc's plans use. `None` for types cuBLAS products
    /// are not measured for.
    pub fn measure_matmul_rate(&mut self, dt: DType) -> Result<Option<f64>, RunError> {
        use cudarc::cublas::sys;
        let Some((data_type, compute)) = gemm_types(dt) else {
            return Ok(None);
        };
        self.ensure_blas()?;
        let n: usize = if dt.bits() == 16 { 8192 } else { 4096 };
        let upload = |seed: u64| -> Result<CudaSlice<u8>, RunError> {
            let host = random_bytes(dt, n * n, seed);
            self.stream
                .clone_htod(&host)
                .map_err(driver("copying matrix operands to the device"))
        };
        let a = upload(0x9e37_79b9_7f4a_7c15)?;
        let b = upload(0xd1b5_4a32_d192_ed03)?;
        let c: CudaSlice<u8> = self
            .stream
            .alloc_zeros(n * n * dt.bytes())
            .map_err(driver("allocating the product"))?;
        let ptr = |s: &CudaSlice<u8>| {
            let (p, _sync) = s.device_ptr(&self.stream);
            p
        };
        let ni = n as i32;
        let product = super::run::Product {
            trans_a: false,
            trans_b: false,
            m: ni,
            n: ni,
            k: ni,
            a: ptr(&a),
            lda: ni,
            stride_a: 0,
            b: ptr(&b),
            ldb: ni,
            stride_b: 0,
            c: ptr(&c),
            ldc: ni,
            stride_c: 0,
            batch: 1,
            data_type,
            compute,
        };
        let blas = self.blas.as_ref().expect("created by ensure_blas");
        let ms = self.time_samples(3, 10, || {
            // SAFETY: a, b and c are n×n matrices of `dt` alive for the whole timing.
            let status = unsafe { blas.product(&product, self.stream.cu_stream())? };
            if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(RunError::Cublas {
                    what: format!("timing a {n}³ {} product", dt.name()),
                    status: format!("{status:?}"),
                });
            }
            Ok(())
        })?;
        let flops = 2.0 * (n as f64).powi(3);
        Ok(Some(flops / (median(&ms) * 1e-3)))
    }

    /// Measures the bandwidth and the matrix rates of the types in `dtypes`.
    pub fn measure_ceilings(&mut self, dtypes: &[DType]) -> Result<Ceilings, RunError> {
        let copy_bytes_per_s = self.measure_copy_bandwidth()?;
        let mut matmul_flops_per_s = Vec::new();
        for &dt in dtypes {
            if let Some(r) = self.measure_matmul_rate(dt)? {
                matmul_flops_per_s.push((dt, r));
            }
        }
        Ok(Ceilings {
            copy_bytes_per_s,
            matmul_flops_per_s,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_operands_span_chunks_and_stay_in_range() {
        let n = (1 << 20) + 3;
        for dt in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            let bytes = random_bytes(dt, n, 7);
            assert_eq!(bytes.len(), n * dt.bytes());
            let values = super::super::data::decode(dt, &bytes);
            assert!(values.iter().all(|v| (-1.0..=1.0).contains(v)), "{dt:?}");
            // Not constant across the chunk boundary.
            assert_ne!(values[(1 << 20) - 1], values[1 << 20]);
        }
    }

    #[test]
    fn rotation_exceeds_twice_l2_within_the_budget() {
        // 50 MB of L2, 2 MB sets: 51 sets (102 MB > 100 MB).
        assert_eq!(rotation_sets(2_000_000, 50_000_000, 1 << 40), 51);
        // A set larger than twice the L2 needs a second one only to alternate.
        assert_eq!(rotation_sets(200_000_000, 50_000_000, 1 << 40), 2);
        // The memory budget wins, but one set is always there.
        assert_eq!(rotation_sets(2_000_000, 50_000_000, 10_000_000), 5);
        assert_eq!(rotation_sets(2_000_000, 50_000_000, 0), 1);
        // Tiny sets are capped.
        assert_eq!(rotation_sets(1, 50_000_000, 1 << 40), 1024);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn floor_is_the_larger_of_memory_and_compute() {
        let c = Ceilings {
            copy_bytes_per_s: 1e12,
            matmul_flops_per_s: vec![(DType::F16, 1e15)],
        };
        let w = Work {
            input_bytes: 1_000_000,
            output_bytes: 0,
            matmul_flops: vec![(DType::F16, 2e9)],
        };
        assert!((c.memory_seconds(&w) - 1e-6).abs() < 1e-15);
        assert!((c.compute_seconds(&w) - 2e-6).abs() < 1e-15);
        assert_eq!(c.floor(&w), (c.compute_seconds(&w), Bound::Compute));
        // A type without a measured rate counts nothing.
        let w32 = Work {
            matmul_flops: vec![(DType::F32, 1e12)],
            ..w
        };
        assert_eq!(c.floor(&w32), (c.memory_seconds(&w32), Bound::Memory));
    }

    #[test]
    fn random_operands_are_not_zero() {
        let b = random_bytes(DType::F16, 1000, 1);
        assert_eq!(b.len(), 2000);
        let vals: Vec<f64> = super::super::data::decode(DType::F16, &b);
        assert!(vals.iter().all(|v| v.abs() <= 1.0));
        assert!(vals.iter().filter(|v| **v != 0.0).count() > 990);
    }
}
