//! The files mucc writes, as a hostile or unlucky user meets them (issue 33, items 3–6 and the
//! dangling link of item 10): device nodes and FIFOs are written in place, never renamed over;
//! two writers into one folder never mix their files; links are replaced, never followed. The
//! predictable-temporary and quadratic-check cases are unit tests of `mucc::outputs`.

#![cfg(unix)]

use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use mucc::graph::mirage_json::{ExportOptions, graphs_to_json};
use mucc::graph::{DType, GraphBuilder, KernelGraph};

fn mucc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mucc"))
        .args(args)
        .output()
        .expect("run mucc")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh temporary folder for one test.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mucc-output-files-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `n` small element-wise graphs; `rows` tells two files apart.
fn small_graphs(n: usize, rows: usize) -> Vec<KernelGraph> {
    (0..n)
        .map(|i| {
            let mut g = GraphBuilder::new();
            let x = g.new_input(&[rows, 64 + 8 * (i % 4)], DType::F16).unwrap();
            let y = g.exp(x).unwrap();
            g.mark_output(y).unwrap();
            g.build().unwrap()
        })
        .collect()
}

fn write_file(path: &Path, graphs: &[KernelGraph]) {
    let v = graphs_to_json(graphs, &ExportOptions::default()).unwrap();
    std::fs::write(path, v.to_string()).unwrap();
}

fn mkfifo(p: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// Reads a FIFO without ever blocking on it: opened non-blocking (so that a writer that never
/// comes cannot hang the test), read until the writer closes it or `limit` passes.
fn drain_fifo(p: PathBuf, limit: Duration) -> std::thread::JoinHandle<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&p)
        .unwrap();
    std::thread::spawn(move || {
        let start = Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 1 << 16];
        while start.elapsed() < limit {
            match f.read(&mut buf) {
                // End of file: no writer has the FIFO open; done once something came.
                Ok(0) if !got.is_empty() => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("reading the FIFO: {e}"),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        got
    })
}

/// Item 4: `--force` renamed a regular file over the output, so `-o /dev/null --force` as root
/// replaced the machine's /dev/null. A FIFO made here stands for the device node.
#[test]
fn force_writes_fifos_in_place_and_never_renames_over_them() {
    let d = dir("fifo");
    let input = d.join("g.json");
    write_file(&input, &small_graphs(1, 8));
    let fifo = d.join("out.cu");
    mkfifo(&fifo);
    let fifo_s = fifo.to_str().unwrap();
    let inp = input.to_str().unwrap();
    // Without --force an existing FIFO is an existing file.
    let o = mucc(&["transpile", inp, "-o", fifo_s]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("exists; pass --force"),
        "{}",
        stderr(&o)
    );
    let reader = drain_fifo(fifo.clone(), Duration::from_secs(60));
    let o = mucc(&["transpile", inp, "-o", fifo_s, "--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let ft = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(ft.is_fifo(), "the FIFO was replaced by {ft:?}");
    let got = String::from_utf8(reader.join().unwrap()).unwrap();
    assert!(got.contains("__global__"), "the reader got {got:?}");
    // Nothing else appeared in the folder.
    let names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    // A socket is refused even with --force, before anything is transpiled.
    let sock = d.join("out.sock");
    let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let o = mucc(&["transpile", inp, "-o", sock.to_str().unwrap(), "--force"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("is a socket"), "{}", stderr(&o));
    std::fs::remove_dir_all(&d).unwrap();
}

/// Item 10: a dangling symbolic link at an output path was replaced without `--force`; with
/// `--force` the link is replaced, its target never written.
#[test]
fn links_at_output_paths_are_existing_files_and_never_followed() {
    let d = dir("links");
    let input = d.join("g.json");
    write_file(&input, &small_graphs(1, 8));
    let inp = input.to_str().unwrap();
    let dangling = d.join("dangling.cu");
    std::os::unix::fs::symlink(d.join("elsewhere.cu"), &dangling).unwrap();
    let o = mucc(&["transpile", inp, "-o", dangling.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("exists; pass --force"),
        "{}",
        stderr(&o)
    );
    assert!(std::fs::symlink_metadata(&dangling).unwrap().is_symlink());
    let o = mucc(&[
        "transpile",
        inp,
        "-o",
        dangling.to_str().unwrap(),
        "--force",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!std::fs::symlink_metadata(&dangling).unwrap().is_symlink());
    assert!(!d.join("elsewhere.cu").exists(), "the link was followed");
    std::fs::remove_dir_all(&d).unwrap();
}

/// The `.cu` and launch plan of every graph in `dir`, by file name.
fn outputs_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Item 5: two `transpile --all --out-dir D` processes without `--force` whose inputs share a
/// base name both exited 0 and mixed their files. Now the second writer of a name fails with
/// the usual message, and every `.cu` sits beside the launch plan of the same graph.
#[test]
fn concurrent_writers_to_one_folder_never_mix_their_files() {
    let d = dir("concurrent");
    let (a, b) = (d.join("a"), d.join("b"));
    for (sub, rows) in [(&a, 8), (&b, 16)] {
        std::fs::create_dir_all(sub).unwrap();
        write_file(&sub.join("g.json"), &small_graphs(24, rows));
    }
    // What each writes alone.
    let alone = |sub: &Path| {
        let out = sub.join("alone");
        let o = mucc(&[
            "transpile",
            sub.join("g.json").to_str().unwrap(),
            "--all",
            "--out-dir",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        outputs_of(&out)
    };
    let (from_a, from_b) = (alone(&a), alone(&b));
    assert_eq!(from_a.len(), 48);
    assert_ne!(from_a, from_b);
    for trial in 0..6 {
        let out = d.join(format!("out{trial}"));
        let spawn = |sub: &Path| {
            Command::new(env!("CARGO_BIN_EXE_mucc"))
                .args(["transpile", sub.join("g.json").to_str().unwrap(), "--all"])
                .arg("--out-dir")
                .arg(&out)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (pa, pb) = (spawn(&a), spawn(&b));
        let (oa, ob) = (
            pa.wait_with_output().unwrap(),
            pb.wait_with_output().unwrap(),
        );
        let codes = [oa.status.code(), ob.status.code()];
        assert!(
            codes == [Some(0), Some(1)] || codes == [Some(1), Some(0)],
            "trial {trial}: exit codes {codes:?}\n{}\n{}",
            stderr(&oa),
            stderr(&ob)
        );
        let loser = if codes[0] == Some(1) { &oa } else { &ob };
        assert!(
            stderr(loser).contains("exists; pass --force"),
            "{}",
            stderr(loser)
        );
        let got = outputs_of(&out);
        let winner = if codes[0] == Some(0) {
            &from_a
        } else {
            &from_b
        };
        assert_eq!(&got, winner, "trial {trial}: files from both writers");
    }
    std::fs::remove_dir_all(&d).unwrap();
}
