//! Files the user asked for: checked before anything is written, then written whole or not at
//! all.
//!
//! The rules, for every command that writes files:
//! - an output is never one of the command's input files, and no two outputs are one file;
//! - an output that exists (a dangling symbolic link counts) is replaced only with
//!   [`Existing::Replace`] (`--force`); without it, the existence check and the creation are one
//!   step (the new file is linked into place only if the name is still free), so that of two
//!   processes writing the same name, one fails with "exists; pass --force";
//! - a regular file (or a symbolic link, which is replaced, never followed) is written into a
//!   temporary file beside it, created exclusively under a random name (`O_CREAT | O_EXCL`,
//!   which never follows a link planted at that name), then renamed over it, so a reader or a
//!   crash never sees half a file;
//! - an existing character device or FIFO (`/dev/null`, a pipe) is written in place, never
//!   renamed over; block devices, sockets and directories are refused;
//! - [`write_group`] writes files that belong together (a `.cu` and its launch plan) so that
//!   either all of them are new and from this call, or the call fails and removes the ones it
//!   created.
//!
//! [`check`] applies the rules to a whole command's outputs up front, in time linear in their
//! number; the writers apply them again at the moment of writing.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use tempfile::TempPath;

use crate::text::escape_path;

/// What a writer may do with an output that already exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Fail with [`OutputError::Exists`] (the default of every command).
    Refuse,
    /// Replace it (`--force`).
    Replace,
}

impl Existing {
    /// [`Existing::Replace`] when `force`, else [`Existing::Refuse`].
    pub fn from_force(force: bool) -> Self {
        if force {
            Existing::Replace
        } else {
            Existing::Refuse
        }
    }
}

/// Why an output could not be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The output exists and [`Existing::Refuse`] was asked for.
    #[error("{} exists; pass --force to overwrite it", escape_path(.0))]
    Exists(PathBuf),
    /// The output is one of the command's inputs.
    #[error("{} is the input file {}; mucc never writes over its input (choose another output)", escape_path(.output), escape_path(.input))]
    IsInput {
        /// The output path.
        output: PathBuf,
        /// The input it names.
        input: PathBuf,
    },
    /// Two outputs name one file.
    #[error("{} and {} are the same file; give each output its own path", escape_path(.0), escape_path(.1))]
    SameFile(PathBuf, PathBuf),
    /// The output exists and is something mucc does not write (a directory, a block device, a
    /// socket).
    #[error("{} is {what}; mucc writes regular files (and character devices or FIFOs in place): give a file name", escape_path(.path))]
    NotAFile {
        /// The output path.
        path: PathBuf,
        /// What it is ("a directory", …).
        what: &'static str,
    },
    /// The output's directory does not exist.
    #[error("cannot write {}: the directory {} does not exist", escape_path(.path), escape_path(.dir))]
    NoDirectory {
        /// The output path.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
    },
    /// The operating system refused.
    #[error("cannot write {}: {source}", escape_path(.path))]
    Io {
        /// The output path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> OutputError + '_ {
    move |source| OutputError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How an output path is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// Nothing is there: create it (exclusively under [`Existing::Refuse`]).
    New,
    /// A regular file or a symbolic link: a temporary file renamed over it.
    Replace,
    /// A character device or FIFO: opened and written in place.
    InPlace,
}

/// What a file type is, for messages; `None` for the kinds mucc writes.
fn unwritable_kind(ft: std::fs::FileType) -> Option<&'static str> {
    if ft.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_block_device() {
            return Some("a block device");
        }
        if ft.is_socket() {
            return Some("a socket");
        }
    }
    None
}

fn is_in_place(ft: std::fs::FileType) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        ft.is_char_device() || ft.is_fifo()
    }
    #[cfg(not(unix))]
    {
        let _ = ft;
        false
    }
}

/// How `dest` would be written now under `existing` (no symbolic link is followed).
fn target(dest: &Path, existing: Existing) -> Result<Target, OutputError> {
    let meta = match std::fs::symlink_metadata(dest) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Target::New),
        Err(e) => return Err(io_error(dest)(e)),
    };
    let ft = meta.file_type();
    if let Some(what) = unwritable_kind(ft) {
        return Err(OutputError::NotAFile {
            path: dest.to_path_buf(),
            what,
        });
    }
    if existing == Existing::Refuse {
        return Err(OutputError::Exists(dest.to_path_buf()));
    }
    Ok(if is_in_place(ft) {
        Target::InPlace
    } else {
        Target::Replace
    })
}

/// The directory a path's file lives in (`.` for a bare name).
fn dir_of(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// What identifies a file: its device and inode when it exists, else its canonical path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum FileKey {
    Inode(u64, u64),
    Path(PathBuf),
}

/// Computes [`FileKey`]s, canonicalising each directory once.
#[derive(Default)]
struct Keys {
    dirs: HashMap<PathBuf, PathBuf>,
}

impl Keys {
    fn key(&mut self, p: &Path) -> FileKey {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            if let Ok(m) = std::fs::metadata(p) {
                return FileKey::Inode(m.dev(), m.ino());
            }
        }
        let dir = dir_of(p);
        let canon = self
            .dirs
            .entry(dir.to_path_buf())
            .or_insert_with(|| dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf()));
        FileKey::Path(match p.file_name() {
            Some(n) => canon.join(n),
            None => canon.clone(),
        })
    }
}

/// Checks a command's `outputs` before anything is written: none is one of `inputs`, no two are
/// one file, each can be written under `existing` (see the module's rules) and goes into an
/// existing directory. Linear in the number of paths.
pub fn check(outputs: &[PathBuf], inputs: &[&Path], existing: Existing) -> Result<(), OutputError> {
    let mut keys = Keys::default();
    let input_keys: HashMap<FileKey, &Path> = inputs.iter().map(|i| (keys.key(i), *i)).collect();
    let mut seen: HashMap<FileKey, &Path> = HashMap::new();
    let mut dirs_ok: HashSet<PathBuf> = HashSet::new();
    for o in outputs {
        let key = keys.key(o);
        if let Some(i) = input_keys.get(&key) {
            return Err(OutputError::IsInput {
                output: o.clone(),
                input: i.to_path_buf(),
            });
        }
        if let Some(other) = seen.insert(key, o) {
            return Err(OutputError::SameFile(other.to_path_buf(), o.clone()));
        }
        target(o, existing)?;
        let dir = dir_of(o);
        if !dirs_ok.contains(dir) {
            if !dir.is_dir() {
                return Err(OutputError::NoDirectory {
                    path: o.clone(),
                    dir: dir.to_path_buf(),
                });
            }
            dirs_ok.insert(dir.to_path_buf());
        }
    }
    Ok(())
}

/// One output made ready to be put in place.
enum Staged {
    /// A complete temporary file beside the destination (deleted if never put in place).
    Temp {
        tmp: TempPath,
        dest: PathBuf,
        new: bool,
    },
    /// Bytes for a character device or FIFO.
    InPlace { dest: PathBuf, bytes: Vec<u8> },
}

/// Where a file's contents come from.
enum Source<'a> {
    Bytes(&'a [u8]),
    /// A file to copy, with its permissions.
    File(&'a Path),
}

/// Writes `src` into an exclusively created, randomly named temporary file beside `dest`.
fn temp_beside(dest: &Path, src: &Source<'_>) -> Result<TempPath, OutputError> {
    let name = dest
        .file_name()
        .map_or("out".into(), |s| s.to_string_lossy().into_owned());
    let prefix = format!(".{name}.");
    let mut b = tempfile::Builder::new();
    b.prefix(&prefix).suffix(".mucc-tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // What `File::create` would give (the umask applies), or the copied file's mode.
        let mode = match src {
            Source::Bytes(_) => 0o666,
            Source::File(from) => std::fs::metadata(from)
                .map_err(io_error(from))?
                .permissions()
                .mode(),
        };
        b.permissions(std::fs::Permissions::from_mode(mode));
    }
    let mut f = b.tempfile_in(dir_of(dest)).map_err(io_error(dest))?;
    match src {
        Source::Bytes(bytes) => f.write_all(bytes).map_err(io_error(dest))?,
        Source::File(from) => {
            let mut r = std::fs::File::open(from).map_err(io_error(from))?;
            std::io::copy(&mut r, &mut f).map_err(io_error(dest))?;
        }
    }
    f.as_file().sync_all().map_err(io_error(dest))?;
    Ok(f.into_temp_path())
}

fn stage(dest: &Path, src: Source<'_>, existing: Existing) -> Result<Staged, OutputError> {
    match target(dest, existing)? {
        Target::InPlace => Ok(Staged::InPlace {
            dest: dest.to_path_buf(),
            bytes: match src {
                Source::Bytes(b) => b.to_vec(),
                Source::File(from) => std::fs::read(from).map_err(io_error(from))?,
            },
        }),
        t => Ok(Staged::Temp {
            tmp: temp_beside(dest, &src)?,
            dest: dest.to_path_buf(),
            new: t == Target::New,
        }),
    }
}

/// Opens an existing character device or FIFO for writing (no link followed, nothing created
/// or truncated) and writes `bytes`; refuses if it is no longer such a file.
fn write_in_place(dest: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW);
    }
    let mut f = opts.open(dest).map_err(io_error(dest))?;
    let ft = f.metadata().map_err(io_error(dest))?.file_type();
    if !is_in_place(ft) {
        return Err(OutputError::NotAFile {
            path: dest.to_path_buf(),
            what: "no longer a character device or FIFO",
        });
    }
    f.write_all(bytes).map_err(io_error(dest))?;
    f.flush().map_err(io_error(dest))
}

/// Puts one staged output in place; returns whether it created a new file.
fn commit(s: Staged, existing: Existing) -> Result<bool, OutputError> {
    match s {
        Staged::InPlace { dest, bytes } => write_in_place(&dest, &bytes).map(|()| false),
        Staged::Temp { tmp, dest, new } => {
            if existing == Existing::Refuse {
                // Linked into place only if the name is still free (the temporary is deleted
                // when the error drops it).
                tmp.persist_noclobber(&dest).map_err(|e| {
                    if e.error.kind() == std::io::ErrorKind::AlreadyExists {
                        OutputError::Exists(dest.clone())
                    } else {
                        io_error(&dest)(e.error)
                    }
                })?;
                Ok(true)
            } else {
                // Renamed over whatever is there, unless it became a file mucc must not
                // replace since it was staged.
                if !new && target(&dest, existing)? == Target::InPlace {
                    return Err(OutputError::NotAFile {
                        path: dest,
                        what: "now a character device or FIFO (it changed while mucc ran)",
                    });
                }
                tmp.persist(&dest).map_err(|e| io_error(&dest)(e.error))?;
                Ok(new)
            }
        }
    }
}

/// Writes `bytes` to `dest` whole (see the module's rules).
pub fn write(dest: &Path, bytes: &[u8], existing: Existing) -> Result<(), OutputError> {
    commit(stage(dest, Source::Bytes(bytes), existing)?, existing).map(|_| ())
}

/// Copies the file `from` to `dest` whole, with `from`'s permissions (see the module's rules).
pub fn install(from: &Path, dest: &Path, existing: Existing) -> Result<(), OutputError> {
    commit(stage(dest, Source::File(from), existing)?, existing).map(|_| ())
}

/// Writes files that belong together: all are staged first, then put in place in order; if one
/// cannot be (under [`Existing::Refuse`], another process took its name), the files this call
/// created are removed again and the error is returned.
pub fn write_group(files: &[(&Path, &[u8])], existing: Existing) -> Result<(), OutputError> {
    let staged = files
        .iter()
        .map(|(p, b)| stage(p, Source::Bytes(b), existing))
        .collect::<Result<Vec<_>, _>>()?;
    let mut created: Vec<PathBuf> = Vec::new();
    for s in staged {
        let dest = match &s {
            Staged::Temp { dest, .. } | Staged::InPlace { dest, .. } => dest.clone(),
        };
        match commit(s, existing) {
            Ok(true) => created.push(dest),
            Ok(false) => {}
            Err(e) => {
                for p in &created {
                    let _ = std::fs::remove_file(p);
                }
                return Err(e);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mucc-outputs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn writes_replace_whole_files_and_leave_no_temporaries() {
        let dir = fresh_dir("whole");
        let p = dir.join("a.txt");
        write(&p, b"first", Existing::Refuse).unwrap();
        assert!(matches!(
            write(&p, b"second", Existing::Refuse),
            Err(OutputError::Exists(_))
        ));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "first");
        write(&p, b"second", Existing::Replace).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "second");
        let q = dir.join("b.txt");
        install(&p, &q, Existing::Refuse).unwrap();
        assert_eq!(std::fs::read_to_string(&q).unwrap(), "second");
        // A destination in a missing directory fails and leaves nothing behind.
        assert!(write(&dir.join("missing/c.txt"), b"x", Existing::Replace).is_err());
        assert_eq!(names(&dir), ["a.txt", "b.txt"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn new_files_get_the_usual_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = fresh_dir("mode");
        let p = dir.join("a.txt");
        write(&p, b"x", Existing::Refuse).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        // 0666 less the umask: at least readable and writable by the owner, never executable.
        assert_eq!(mode & 0o600, 0o600, "{mode:o}");
        assert_eq!(mode & 0o111, 0, "{mode:o}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 33, item 3: the temporary name was `.NAME.mucc-<pid>-<n>.tmp`, opened without
    /// exclusive creation, so a symbolic link planted at it redirected the write to its target.
    #[cfg(unix)]
    #[test]
    fn a_link_planted_at_a_predictable_temporary_name_is_never_followed() {
        let dir = fresh_dir("planted");
        let victim = dir.join("victim.json");
        std::fs::write(&victim, "precious").unwrap();
        for n in 0..64 {
            let name = format!(".out.cu.mucc-{}-{n}.tmp", std::process::id());
            std::os::unix::fs::symlink(&victim, dir.join(name)).unwrap();
        }
        for existing in [Existing::Refuse, Existing::Replace] {
            write(&dir.join("out.cu"), b"generated", existing).unwrap();
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(
            std::fs::read_to_string(dir.join("out.cu")).unwrap(),
            "generated"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn links_are_replaced_not_followed_and_dangling_ones_exist() {
        let dir = fresh_dir("links");
        let target = dir.join("target.txt");
        std::fs::write(&target, "kept").unwrap();
        let link = dir.join("link.txt");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dangling = dir.join("dangling.txt");
        std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
        for p in [&link, &dangling] {
            assert!(matches!(
                check(std::slice::from_ref(p), &[], Existing::Refuse),
                Err(OutputError::Exists(_))
            ));
            assert!(matches!(
                write(p, b"new", Existing::Refuse),
                Err(OutputError::Exists(_))
            ));
            write(p, b"new", Existing::Replace).unwrap();
            assert!(!std::fs::symlink_metadata(p).unwrap().is_symlink());
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "kept");
        assert!(!dir.join("nowhere").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn sockets_and_directories_are_refused_even_with_force() {
        use std::os::unix::fs::FileTypeExt;
        let dir = fresh_dir("kinds");
        let sock = dir.join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        for p in [&sock, &dir] {
            for existing in [Existing::Refuse, Existing::Replace] {
                let e = write(p, b"x", existing).unwrap_err();
                assert!(matches!(e, OutputError::NotAFile { .. }), "{e}");
            }
        }
        assert!(
            std::fs::symlink_metadata(&sock)
                .unwrap()
                .file_type()
                .is_socket()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_group_is_all_new_or_removed_again() {
        let dir = fresh_dir("group");
        let a = dir.join("g.cu");
        let b = dir.join("g.plan.json");
        // Another writer took the second name after the check.
        std::fs::write(&b, "theirs").unwrap();
        let e = write_group(&[(&a, b"ours"), (&b, b"ours")], Existing::Refuse).unwrap_err();
        assert!(matches!(e, OutputError::Exists(_)), "{e}");
        assert!(!a.exists(), "the first file of the group was left behind");
        assert_eq!(std::fs::read_to_string(&b).unwrap(), "theirs");
        assert_eq!(names(&dir), ["g.plan.json"]);
        write_group(&[(&a, b"ours"), (&b, b"ours")], Existing::Replace).unwrap();
        assert_eq!(std::fs::read_to_string(&b).unwrap(), "ours");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 33, item 6: the check compared every output with every earlier one through
    /// `canonicalize` (quadratic: 37 s for 500 outputs of `transpile --all --out-dir`).
    #[test]
    fn checking_many_outputs_is_linear() {
        let dir = fresh_dir("many");
        let input = dir.join("in.json");
        std::fs::write(&input, "[]").unwrap();
        let outputs: Vec<PathBuf> = (0..20_000)
            .map(|i| dir.join(format!("in.g{i}.sm_80.cu")))
            .collect();
        let t = std::time::Instant::now();
        check(&outputs, &[&input], Existing::Refuse).unwrap();
        let secs = t.elapsed().as_secs_f64();
        assert!(secs < 5.0, "checking 20,000 outputs took {secs:.1} s");
        let mut dup = outputs[..3].to_vec();
        dup.push(dir.join("sub/../in.g1.sm_80.cu"));
        std::fs::create_dir(dir.join("sub")).unwrap();
        assert!(matches!(
            check(&dup, &[&input], Existing::Refuse),
            Err(OutputError::SameFile(..))
        ));
        assert!(matches!(
            check(&[dir.join("./in.json")], &[&input], Existing::Replace),
            Err(OutputError::IsInput { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
