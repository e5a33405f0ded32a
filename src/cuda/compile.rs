//! NVRTC compilation of generated sources to cubins, in process through cudarc, with a disk
//! cache keyed by everything that determines the result.
//!
//! The runtime headers are embedded in the mucc binary ([`RUNTIME_HEADERS`]) and written once,
//! content-addressed, under the cache directory, so an installed `mucc` needs no header folder;
//! `--runtime-headers DIR` / `MUCC_RUNTIME_HEADERS` use another copy. The CUDA headers the
//! runtime includes (`cuda_fp16.h`, `cuda_bf16.h`, `cuda_runtime.h`) come from the CUDA
//! toolkit: the first of `MUCC_CUDA_INCLUDE`, `$MUCC_CUDA_HOME/include`, `$CUDA_HOME/include`,
//! `$CUDA_PATH/include` and `/usr/local/cuda/include` that holds `cuda_fp16.h`.
//!
//! A compiled cubin is stored as `<cache>/nvrtc/<key>.entry`, where the key is the SHA-256 of
//! the NVRTC version, the target, the options, the runtime headers and the source; a second
//! compile of the same source is a file read. An entry carries the SHA-256 of its contents
//! (the compiler log and the cubin): a truncated or corrupted entry is detected, never loaded,
//! and compiled afresh. Entries are written to a temporary file and renamed into place, so
//! processes sharing the cache never see half an entry.

use std::ffi::{CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::target::Arch;

/// The runtime headers, as (path under `runtime-headers/`, contents), embedded at build time.
pub const RUNTIME_HEADERS: &[(&str, &str)] = &[
    (
        "mucc/runtime.h",
        include_str!("../../runtime-headers/mucc/runtime.h"),
    ),
    (
        "mucc/types.h",
        include_str!("../../runtime-headers/mucc/types.h"),
    ),
    (
        "mucc/layout.h",
        include_str!("../../runtime-headers/mucc/layout.h"),
    ),
    (
        "mucc/ops.h",
        include_str!("../../runtime-headers/mucc/ops.h"),
    ),
    (
        "mucc/host.h",
        include_str!("../../runtime-headers/mucc/host.h"),
    ),
    (
        "mucc/nccl.h",
        include_str!("../../runtime-headers/mucc/nccl.h"),
    ),
    (
        "mucc/kernel/elementwise.h",
        include_str!("../../runtime-headers/mucc/kernel/elementwise.h"),
    ),
    (
        "mucc/kernel/reduction.h",
        include_str!("../../runtime-headers/mucc/kernel/reduction.h"),
    ),
    (
        "mucc/arch/sm80.h",
        include_str!("../../runtime-headers/mucc/arch/sm80.h"),
    ),
    (
        "mucc/arch/sm90.h",
        include_str!("../../runtime-headers/mucc/arch/sm90.h"),
    ),
    (
        "mucc/arch/sm90_wgmma.h",
        include_str!("../../runtime-headers/mucc/arch/sm90_wgmma.h"),
    ),
    (
        "mucc/threadblock/loops.h",
        include_str!("../../runtime-headers/mucc/threadblock/loops.h"),
    ),
    (
        "mucc/threadblock/copy.h",
        include_str!("../../runtime-headers/mucc/threadblock/copy.h"),
    ),
    (
        "mucc/threadblock/cluster.h",
        include_str!("../../runtime-headers/mucc/threadblock/cluster.h"),
    ),
    (
        "mucc/threadblock/exchange.h",
        include_str!("../../runtime-headers/mucc/threadblock/exchange.h"),
    ),
    (
        "mucc/threadblock/accum.h",
        include_str!("../../runtime-headers/mucc/threadblock/accum.h"),
    ),
    (
        "mucc/threadblock/matmul.h",
        include_str!("../../runtime-headers/mucc/threadblock/matmul.h"),
    ),
    (
        "mucc/threadblock/arrival.h",
        include_str!("../../runtime-headers/mucc/threadblock/arrival.h"),
    ),
];

/// Why a compilation could not produce a cubin.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// libnvrtc could not be loaded.
    #[error(
        "NVRTC could not be loaded (libnvrtc.so.13): install CUDA 13.0's NVRTC or put it on LD_LIBRARY_PATH (scripts/cuda-toolchain.sh does both without a GPU)"
    )]
    NoNvrtc,
    /// No CUDA toolkit headers were found.
    #[error(
        "no CUDA headers (cuda_fp16.h) found: set MUCC_CUDA_INCLUDE to the toolkit's include folder, or CUDA_HOME (looked in: {0})"
    )]
    NoCudaHeaders(String),
    /// The source did not compile; `log` is NVRTC's full log.
    #[error("{path}: NVRTC failed to compile it for {arch}:\n{log}")]
    Failed {
        /// The source file (or the name given for an in-memory source).
        path: String,
        /// The target.
        arch: Arch,
        /// NVRTC's log.
        log: String,
    },
    /// An NVRTC call failed outside compilation proper.
    #[error("{path}: NVRTC call {call} failed: {code}")]
    Nvrtc {
        /// The source.
        path: String,
        /// The failing API call.
        call: &'static str,
        /// NVRTC's result code.
        code: String,
    },
    /// Reading or writing the cache or the runtime headers failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CompileError + '_ {
    move |source| CompileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How a [`Compiler`] finds its inputs and where it caches.
#[derive(Clone, Debug, Default)]
pub struct CompilerOptions {
    /// A runtime-headers folder (the one holding `mucc/runtime.h`) instead of the embedded
    /// copy; `MUCC_RUNTIME_HEADERS` when `None`.
    pub runtime_headers: Option<PathBuf>,
    /// The CUDA toolkit's include folder; searched for when `None` (see the module docs).
    pub cuda_include: Option<PathBuf>,
    /// The cache base folder; `$MUCC_CACHE_DIR`, else `$XDG_CACHE_HOME/mucc`, else
    /// `~/.cache/mucc` when `None`.
    pub cache_dir: Option<PathBuf>,
    /// Neither read nor write compiled cubins (the runtime headers are still materialised in
    /// the cache folder).
    pub no_cache: bool,
    /// Extra NVRTC options (e.g. `-lineinfo`); part of the cache key.
    pub extra_options: Vec<String>,
}

/// A source to compile.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    /// Its file path (or a name), used in messages and as NVRTC's program name.
    pub path: &'a str,
    /// The CUDA C++ text.
    pub text: &'a str,
    /// The target.
    pub arch: Arch,
}

/// A compiled module.
#[derive(Clone, Debug)]
pub struct Cubin {
    /// The cubin (an ELF image for the target).
    pub bytes: Vec<u8>,
    /// NVRTC's log (warnings; empty when clean).
    pub log: String,
    /// Whether it came from the cache.
    pub cached: bool,
    /// Seconds spent (compiling, or reading the cache).
    pub seconds: f64,
    /// The cache key (hex SHA-256).
    pub key: String,
}

/// Compiles generated sources with NVRTC; cheap to share between threads.
#[derive(Debug)]
pub struct Compiler {
    headers_dir: PathBuf,
    headers_hash: String,
    cuda_include: PathBuf,
    cache: Option<PathBuf>,
    version: (i32, i32),
    extra_options: Vec<String>,
}

/// The default cache base folder (see [`CompilerOptions::cache_dir`]). An empty variable counts
/// as unset (an empty `MUCC_CACHE_DIR` would put the cache folders in the current directory),
/// and so does a relative `XDG_CACHE_HOME`, as the XDG base directory specification says.
pub fn default_cache_dir() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(d) = var("MUCC_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
    {
        return d.join("mucc");
    }
    let home = var("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache/mucc")
}

fn find_cuda_include(given: Option<&Path>) -> Result<PathBuf, CompileError> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(g) = given {
        candidates.push(g.to_path_buf());
    } else {
        if let Some(d) = std::env::var_os("MUCC_CUDA_INCLUDE") {
            candidates.push(PathBuf::from(d));
        }
        for var in ["MUCC_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"] {
            if let Some(d) = std::env::var_os(var) {
                candidates.push(PathBuf::from(d).join("include"));
            }
        }
        candidates.push(PathBuf::from("/usr/local/cuda/include"));
    }
    candidates
        .iter()
        .find(|d| d.join("cuda_fp16.h").is_file())
        .cloned()
        .ok_or_else(|| {
            CompileError::NoCudaHeaders(
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })
}

fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Hash of a headers folder: every file under `mucc/`, by relative path and contents.
fn hash_headers_dir(dir: &Path) -> Result<String, CompileError> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for e in std::fs::read_dir(d)? {
            let p = e?.path();
            if p.is_dir() {
                walk(&p, out)?;
            } else {
                out.push(p);
            }
        }
        Ok(())
    }
    let root = dir.join("mucc");
    if !root.join("runtime.h").is_file() {
        return Err(CompileError::Io {
            path: root.join("runtime.h"),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "not a runtime-headers folder (no mucc/runtime.h)",
            ),
        });
    }
    let mut files = Vec::new();
    walk(&root, &mut files).map_err(io(&root))?;
    files.sort();
    let mut parts: Vec<Vec<u8>> = Vec::new();
    for f in &files {
        parts.push(
            f.strip_prefix(dir)
                .unwrap_or(f)
                .to_string_lossy()
                .as_bytes()
                .to_vec(),
        );
        parts.push(std::fs::read(f).map_err(io(f))?);
    }
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    Ok(sha256_hex(&refs))
}

/// Writes the embedded headers under `<cache>/runtime-headers/<hash>` once; returns the folder.
fn materialise_headers(cache: &Path, hash: &str) -> Result<PathBuf, CompileError> {
    let dir = cache.join("runtime-headers").join(&hash[..16]);
    let intact = || {
        RUNTIME_HEADERS
            .iter()
            .all(|(rel, text)| std::fs::read(dir.join(rel)).is_ok_and(|b| b == text.as_bytes()))
    };
    if intact() {
        return Ok(dir);
    }
    // Missing, or damaged since it was written: install afresh.
    if dir.exists() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let parent = cache.join("runtime-headers");
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    // A fresh folder under a random name (never one planted there), kept for the rename.
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".tmp-{}.", &hash[..16]))
        .tempdir_in(&parent)
        .map_err(io(&parent))?
        .keep();
    for (rel, text) in RUNTIME_HEADERS {
        let p = tmp.join(rel);
        std::fs::create_dir_all(p.parent().expect("header paths have a folder")).map_err(io(&p))?;
        std::fs::write(&p, text).map_err(io(&p))?;
    }
    // Another process may have won the race; its copy is identical.
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
        if !intact() {
            return Err(CompileError::Io {
                path: dir,
                source: std::io::Error::other("could not install the runtime headers"),
            });
        }
    }
    Ok(dir)
}

/// Writes `bytes` to `path` atomically (an exclusively created temporary file, then a rename).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CompileError> {
    let dir = path.parent().expect("cache files have a folder");
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    crate::outputs::write(path, bytes, crate::outputs::Existing::Replace).map_err(|e| {
        CompileError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        }
    })
}

/// The first line of a cache entry.
const ENTRY_MAGIC: &[u8] = b"mucc-nvrtc-entry-v2\n";

/// A cache entry: magic, SHA-256 of the rest (32 bytes), the log's length (8 bytes, little
/// endian), the log, the cubin.
fn encode_entry(log: &str, cubin: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(8 + log.len() + cubin.len());
    body.extend((log.len() as u64).to_le_bytes());
    body.extend(log.as_bytes());
    body.extend(cubin);
    let digest = Sha256::digest(&body);
    let mut e = Vec::with_capacity(ENTRY_MAGIC.len() + 32 + body.len());
    e.extend(ENTRY_MAGIC);
    e.extend(digest);
    e.extend(body);
    e
}

/// The log and cubin of an intact entry; `None` for anything else.
fn decode_entry(e: &[u8]) -> Option<(String, Vec<u8>)> {
    let rest = e.strip_prefix(ENTRY_MAGIC)?;
    let (digest, body) = (rest.get(..32)?, rest.get(32..)?);
    if Sha256::digest(body).as_slice() != digest {
        return None;
    }
    let n = u64::from_le_bytes(body.get(..8)?.try_into().ok()?) as usize;
    let log = String::from_utf8(body.get(8..8usize.checked_add(n)?)?.to_vec()).ok()?;
    let cubin = body.get(8 + n..)?.to_vec();
    (!cubin.is_empty()).then_some((log, cubin))
}

/// SHA-256 of the embedded runtime headers (paths and contents).
fn embedded_headers_hash() -> String {
    let mut parts: Vec<&[u8]> = Vec::new();
    for (rel, text) in RUNTIME_HEADERS {
        parts.push(rel.as_bytes());
        parts.push(text.as_bytes());
    }
    sha256_hex(&parts)
}

/// Installs the embedded runtime headers under `cache` (default: [`default_cache_dir`]) once,
/// content-addressed, and returns the folder to pass as `-I` (it holds `mucc/runtime.h`).
pub fn install_runtime_headers(cache: Option<&Path>) -> Result<PathBuf, CompileError> {
    let base = cache.map_or_else(default_cache_dir, Path::to_path_buf);
    materialise_headers(&base, &embedded_headers_hash())
}

/// Whether libnvrtc can be loaded (cudarc's loader panics otherwise, so check first).
pub fn nvrtc_available() -> bool {
    // SAFETY: only probes for the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

impl Compiler {
    /// A compiler: checks that NVRTC loads, finds the CUDA headers, installs the runtime
    /// headers.
    pub fn new(opts: CompilerOptions) -> Result<Self, CompileError> {
        if !nvrtc_available() {
            return Err(CompileError::NoNvrtc);
        }
        let cuda_include = find_cuda_include(opts.cuda_include.as_deref())?;
        let base = opts.cache_dir.clone().unwrap_or_else(default_cache_dir);
        let given = opts
            .runtime_headers
            .clone()
            .or_else(|| std::env::var_os("MUCC_RUNTIME_HEADERS").map(PathBuf::from));
        let (headers_dir, headers_hash) = match given {
            Some(d) => {
                let h = hash_headers_dir(&d)?;
                (d, h)
            }
            None => {
                let h = embedded_headers_hash();
                (materialise_headers(&base, &h)?, h)
            }
        };
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: NVRTC is loaded (checked above); the pointers are valid for the call.
        let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(CompileError::Nvrtc {
                path: String::new(),
                call: "nvrtcVersion",
                code: format!("{r:?}"),
            });
        }
        Ok(Compiler {
            headers_dir,
            headers_hash,
            cuda_include,
            cache: (!opts.no_cache).then(|| base.join("nvrtc")),
            version: (major, minor),
            extra_options: opts.extra_options,
        })
    }

    /// NVRTC's version (major, minor).
    pub fn nvrtc_version(&self) -> (i32, i32) {
        self.version
    }

    /// The runtime-headers folder in use.
    pub fn runtime_headers(&self) -> &Path {
        &self.headers_dir
    }

    fn options(&self, arch: Arch) -> Vec<String> {
        let mut o = vec![
            format!("--gpu-architecture={}", arch.name()),
            "-std=c++17".to_string(),
            format!("-I{}", self.headers_dir.display()),
            format!("-I{}", self.cuda_include.display()),
        ];
        o.extend(self.extra_options.iter().cloned());
        o
    }

    /// The cache key of `src`.
    pub fn key(&self, src: &Source<'_>) -> String {
        let version = format!("{}.{}", self.version.0, self.version.1);
        // The include folders are paths on this machine; what they hold is what matters.
        let opts = self.extra_options.join("\u{1f}");
        sha256_hex(&[
            b"mucc-nvrtc-cubin-v2",
            version.as_bytes(),
            src.arch.name().as_bytes(),
            opts.as_bytes(),
            self.headers_hash.as_bytes(),
            src.text.as_bytes(),
        ])
    }

    /// Compiles `src` to a cubin, or reads it from the cache.
    pub fn compile(&self, src: &Source<'_>) -> Result<Cubin, CompileError> {
        let t0 = Instant::now();
        let key = self.key(src);
        if let Some(dir) = &self.cache {
            let path = dir.join(format!("{key}.entry"));
            // A damaged entry (wrong checksum, truncated) counts as absent and is rewritten.
            if let Some((log, bytes)) = std::fs::read(&path).ok().and_then(|e| decode_entry(&e)) {
                return Ok(Cubin {
                    bytes,
                    log,
                    cached: true,
                    seconds: t0.elapsed().as_secs_f64(),
                    key,
                });
            }
        }
        let (bytes, log) = self.nvrtc(src)?;
        if let Some(dir) = &self.cache {
            write_atomic(
                &dir.join(format!("{key}.entry")),
                &encode_entry(&log, &bytes),
            )?;
        }
        Ok(Cubin {
            bytes,
            log,
            cached: false,
            seconds: t0.elapsed().as_secs_f64(),
            key,
        })
    }

    /// Compiles every source on rayon's threads; results in input order.
    pub fn compile_all(&self, srcs: &[Source<'_>]) -> Vec<Result<Cubin, CompileError>> {
        srcs.par_iter().map(|s| self.compile(s)).collect()
    }

    fn nvrtc(&self, src: &Source<'_>) -> Result<(Vec<u8>, String), CompileError> {
        use cudarc::nvrtc::sys;
        let fail = |call: &'static str, r: sys::nvrtcResult| CompileError::Nvrtc {
            path: src.path.to_string(),
            call,
            code: format!("{r:?}"),
        };
        let text = CString::new(src.text).map_err(|_| CompileError::Failed {
            path: src.path.to_string(),
            arch: src.arch,
            log: "the source contains a NUL byte".into(),
        })?;
        let name = CString::new(src.path.replace('\0', "")).expect("NULs removed");
        let opts: Vec<CString> = self
            .options(src.arch)
            .into_iter()
            .map(|o| CString::new(o).expect("options hold no NUL"))
            .collect();
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: NVRTC was loaded in `new`; every pointer outlives the calls that use it, and
        // the program is destroyed on every path below.
        unsafe {
            let r = sys::nvrtcCreateProgram(
                &mut prog,
                text.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            if r != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail("nvrtcCreateProgram", r));
            }
            let result = (|| {
                let compiled =
                    sys::nvrtcCompileProgram(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr());
                let mut log_len = 0usize;
                let r = sys::nvrtcGetProgramLogSize(prog, &mut log_len);
                if r != sys::nvrtcResult::NVRTC_SUCCESS {
                    return Err(fail("nvrtcGetProgramLogSize", r));
                }
                let mut log = vec![0u8; log_len.max(1)];
                let r = sys::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast());
                if r != sys::nvrtcResult::NVRTC_SUCCESS {
                    return Err(fail("nvrtcGetProgramLog", r));
                }
                let log = String::from_utf8_lossy(&log)
                    .trim_end_matches('\0')
                    .trim()
                    .to_string();
                if compiled != sys::nvrtcResult::NVRTC_SUCCESS {
                    return Err(CompileError::Failed {
                        path: src.path.to_string(),
                        arch: src.arch,
                        log,
                    });
                }
                let mut size = 0usize;
                let r = sys::nvrtcGetCUBINSize(prog, &mut size);
                if r != sys::nvrtcResult::NVRTC_SUCCESS {
                    return Err(fail("nvrtcGetCUBINSize", r));
                }
                let mut cubin = vec![0u8; size];
                let r = sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast());
                if r != sys::nvrtcResult::NVRTC_SUCCESS {
                    return Err(fail("nvrtcGetCUBIN", r));
                }
                Ok((cubin, log))
            })();
            sys::nvrtcDestroyProgram(&mut prog);
            result
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of `runtime-headers/mucc` is embedded, and the embedded copies are current.
    #[test]
    fn damaged_cache_entries_are_refused() {
        let e = encode_entry("ptxas info", b"\x7fELF cubin bytes");
        assert_eq!(
            decode_entry(&e),
            Some(("ptxas info".to_string(), b"\x7fELF cubin bytes".to_vec()))
        );
        // Truncated anywhere, or one byte flipped anywhere: refused.
        for cut in 0..e.len() {
            assert_eq!(decode_entry(&e[..cut]), None, "cut at {cut}");
        }
        for i in 0..e.len() {
            let mut d = e.clone();
            d[i] ^= 0x40;
            assert_eq!(decode_entry(&d), None, "flip at {i}");
        }
    }

    #[test]
    fn embedded_headers_match_the_folder() {
        fn walk(d: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else {
                    out.push(p);
                }
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("runtime-headers");
        let mut files = Vec::new();
        walk(&root.join("mucc"), &mut files);
        let mut on_disk: Vec<String> = files
            .iter()
            .map(|p| {
                p.strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> =
            RUNTIME_HEADERS.iter().map(|(p, _)| p.to_string()).collect();
        embedded.sort();
        assert_eq!(
            embedded, on_disk,
            "RUNTIME_HEADERS must list every runtime header"
        );
        for (rel, text) in RUNTIME_HEADERS {
            assert_eq!(
                &std::fs::read_to_string(root.join(rel)).unwrap(),
                text,
                "{rel}"
            );
        }
    }
}
