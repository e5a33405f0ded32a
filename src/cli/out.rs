//! The files a command writes: all checked together before any is written, and each written
//! whole (a temporary file, then a rename).
//!
//! A command's outputs must be distinct from each other, none may be one of its input files
//! (`--force` never destroys the input), none may exist unless `--force`, and each must go into
//! an existing directory. Checking all of them first means a command never writes its first
//! file and then fails on its second.

use std::path::{Path, PathBuf};

use super::Failure;

/// The same file: equal canonical paths, or (both existing) the same device and inode.
fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return x.dev() == y.dev() && x.ino() == y.ino();
        }
    }
    canonical(a) == canonical(b)
}

/// The canonical form of a path that may not exist yet: its canonical directory and its name.
fn canonical(p: &Path) -> PathBuf {
    if let Ok(c) = p.canonicalize() {
        return c;
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    match p.file_name() {
        Some(n) => dir.join(n),
        None => dir,
    }
}

/// Checks `outputs` before anything is written (see the module's rules); `inputs` are the
/// command's input files.
pub fn check(outputs: &[PathBuf], inputs: &[&Path], force: bool) -> Result<(), Failure> {
    for (k, o) in outputs.iter().enumerate() {
        if let Some(i) = inputs.iter().find(|i| same_file(o, i)) {
            return Err(Failure::User(format!(
                "{} is the input file {}; mucc never writes over its input (choose another output)",
                o.display(),
                i.display()
            )));
        }
        if let Some(other) = outputs[..k].iter().find(|x| same_file(o, x)) {
            return Err(Failure::User(format!(
                "{} and {} are the same file; give each output its own path",
                other.display(),
                o.display()
            )));
        }
        if o.is_dir() {
            return Err(Failure::User(format!(
                "{} is a directory; give a file name",
                o.display()
            )));
        }
        if o.exists() && !force {
            return Err(Failure::User(format!(
                "{} exists; pass --force to overwrite it",
                o.display()
            )));
        }
        let dir = match o.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            return Err(Failure::User(format!(
                "cannot write {}: the directory {} does not exist",
                o.display(),
                dir.display()
            )));
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` whole (a temporary file beside it, then a rename).
pub fn write(path: &Path, bytes: impl AsRef<[u8]>) -> Result<(), Failure> {
    mucc::outputs::write_atomic(path, bytes.as_ref()).map_err(Failure::User)
}
