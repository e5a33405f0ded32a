//! A cache of CUDA compile outcomes shared by the compile tests: one line of text per key under
//! `$MUCC_CACHE_DIR` (default `~/.cache/mucc`)/`<folder>`, keyed by content (SHA-256 of the
//! source, the runtime headers, the compiler and its flags), so that an unchanged file is not
//! compiled again; `MUCC_NO_CACHE=1` ignores it. Only outcomes worth keeping are stored (a
//! failure is compiled again, so that its log is printed).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The digest of every runtime header, by path relative to `runtime-headers/` and contents (a
/// change invalidates the cache; where the checkout lives and the folder's README do not).
pub fn headers_digest() -> String {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "h") {
                out.push(p);
            }
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("runtime-headers");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    let mut h = Sha256::new();
    for f in files {
        h.update(f.strip_prefix(&root).unwrap().to_string_lossy().as_bytes());
        h.update(std::fs::read(&f).unwrap());
    }
    format!("{:x}", h.finalize())
}

/// The key of `parts` (kind first: it prefixes the key, for reading the folder).
pub fn key(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for part in parts {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    format!(
        "{}-{:x}",
        parts.first().copied().unwrap_or(""),
        h.finalize()
    )
}

/// `folder` under the tests' cache (`$MUCC_CACHE_DIR`, an empty value counting as unset as
/// mucc does, else `~/.cache/mucc`); `None` with `MUCC_NO_CACHE=1` or without a home.
pub fn cache_folder(folder: &str) -> Option<PathBuf> {
    if std::env::var_os("MUCC_NO_CACHE").is_some_and(|v| v == "1") {
        return None;
    }
    std::env::var_os("MUCC_CACHE_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mucc")))
        .map(|b| b.join(folder))
}

/// Outcomes by key, in one folder of the cache.
pub struct CompileCache {
    dir: Option<PathBuf>,
}

impl CompileCache {
    /// The cache folder `folder`, or none with `MUCC_NO_CACHE=1` or without a home.
    pub fn new(folder: &str) -> CompileCache {
        let dir = cache_folder(folder);
        if let Some(d) = &dir {
            let _ = std::fs::create_dir_all(d);
        }
        CompileCache { dir }
    }

    /// The line stored under `key`.
    pub fn get(&self, key: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.as_ref()?.join(key)).ok()
    }

    /// Stores `line` under `key`.
    pub fn put(&self, key: &str, line: &str) {
        if let Some(d) = &self.dir {
            // Write then rename: a concurrent reader never sees half a file.
            let tmp = d.join(format!("{key}.{}", std::process::id()));
            if std::fs::write(&tmp, line).is_ok() {
                let _ = std::fs::rename(&tmp, d.join(key));
            }
        }
    }
}
