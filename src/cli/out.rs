//! The files a command writes: all checked together before any is written, and each written
//! whole — the rules are [`mucc::outputs`]'s.
//!
//! A command's outputs must be distinct from each other, none may be one of its input files
//! (`--force` never destroys the input), none may exist unless `--force`, and each must go into
//! an existing directory. Checking all of them first means a command does not write its first
//! file and then fail on its second (short of another process taking a name meanwhile, which
//! the writers catch).

use std::path::{Path, PathBuf};

use mucc::outputs::{self, Existing, OutputError};

use super::Failure;

impl From<OutputError> for Failure {
    fn from(e: OutputError) -> Self {
        Failure::User(e.to_string())
    }
}

/// Checks `outputs` before anything is written (see the module's rules); `inputs` are the
/// command's input files.
pub fn check(outputs: &[PathBuf], inputs: &[&Path], force: bool) -> Result<(), Failure> {
    Ok(outputs::check(
        outputs,
        inputs,
        Existing::from_force(force),
    )?)
}

/// Writes `bytes` to `path` whole; an existing file only with `force`.
pub fn write(path: &Path, bytes: impl AsRef<[u8]>, force: bool) -> Result<(), Failure> {
    Ok(outputs::write(
        path,
        bytes.as_ref(),
        Existing::from_force(force),
    )?)
}

/// Writes files that belong together (a `.cu` and its launch plan): all new and from this
/// call, or none of them.
pub fn write_group(files: &[(&Path, &[u8])], force: bool) -> Result<(), Failure> {
    Ok(outputs::write_group(files, Existing::from_force(force))?)
}
