//! Files the user asked for are written whole or not at all: into a temporary file beside the
//! destination, then renamed over it (a rename within one directory is atomic), so a reader or
//! a crash never sees half a file.

use std::io::Write;
use std::path::{Path, PathBuf};

/// A temporary path in `dest`'s directory, unique to this process and call.
fn temp_beside(dest: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = dest
        .file_name()
        .map_or("out".into(), |s| s.to_string_lossy().into_owned());
    dest.with_file_name(format!(".{name}.mucc-{}-{n}.tmp", std::process::id()))
}

/// Writes `bytes` to `dest` through a temporary file and a rename.
pub fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = temp_beside(dest);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dest)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", dest.display())
    })
}

/// Copies `from` to `dest` through a temporary file and a rename (keeping `from`'s permissions).
pub fn install_file(from: &Path, dest: &Path) -> Result<(), String> {
    let tmp = temp_beside(dest);
    let result = std::fs::copy(from, &tmp).and_then(|_| std::fs::rename(&tmp, dest));
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", dest.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replace_whole_files_and_leave_no_temporaries() {
        let dir = std::env::temp_dir().join(format!("mucc-outputs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.txt");
        write_atomic(&p, b"first").unwrap();
        write_atomic(&p, b"second").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "second");
        let q = dir.join("b.txt");
        install_file(&p, &q).unwrap();
        assert_eq!(std::fs::read_to_string(&q).unwrap(), "second");
        // A destination in a missing directory fails and leaves nothing behind.
        assert!(write_atomic(&dir.join("missing/c.txt"), b"x").is_err());
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
