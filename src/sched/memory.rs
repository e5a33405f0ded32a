//! Memory planning as dynamic storage allocation (DSA): buffers with known sizes and lifetimes
//! are packed into one address range with the lowest peak.
//!
//! Offline DSA is NP-hard; several greedy heuristics run (four placement orders × first fit /
//! best fit) and the plan with the lowest peak wins (ties: the earlier heuristic in that list,
//! so plans are deterministic). The plan reports the lower bound — the largest total size of
//! buffers live at one time — beside the achieved peak.

use std::fmt::Write;

/// A buffer to place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Name shown in plans.
    pub name: String,
    /// Size in bytes.
    pub bytes: usize,
    /// First time step it is live.
    pub start: usize,
    /// First time step it is dead (exclusive).
    pub end: usize,
    /// Required alignment of its offset (a power of two).
    pub align: usize,
}

impl Buffer {
    #[cfg(test)]
    fn overlaps(&self, other: &Buffer) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// Where every buffer went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packing {
    /// Offset of each buffer (same order as the input).
    pub offsets: Vec<usize>,
    /// Highest address used.
    pub peak: usize,
    /// Largest total size of simultaneously live buffers.
    pub lower_bound: usize,
    /// The heuristic that won.
    pub heuristic: &'static str,
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a.max(1)) * a.max(1)
}

/// The largest total size of buffers live at one time (a sweep over starts and ends).
pub fn lower_bound(buffers: &[Buffer]) -> usize {
    // (time, is a start, bytes): at equal times ends come first, as a buffer is dead at its
    // end. Buffers that are never live (end <= start) are left out: the live total only rises
    // at the start of a buffer that is live.
    let mut events: Vec<(usize, bool, usize)> = Vec::with_capacity(2 * buffers.len());
    for b in buffers.iter().filter(|b| b.start < b.end) {
        events.push((b.start, true, b.bytes));
        events.push((b.end, false, b.bytes));
    }
    events.sort_unstable();
    let (mut live, mut most) = (0usize, 0usize);
    for (_, start, bytes) in events {
        if start {
            live += bytes;
            most = most.max(live);
        } else {
            live -= bytes;
        }
    }
    most
}

/// The placed buffers, searchable by lifetime: a max tree over the buffers sorted by start,
/// holding the end of each placed buffer (0 while unplaced). Finding the placed buffers live
/// during a buffer's lifetime costs O(log n) per buffer found, in O(n) memory.
struct Placed<'a> {
    buffers: &'a [Buffer],
    /// Buffer indices sorted by (start, index).
    by_start: Vec<usize>,
    /// Position of each buffer in `by_start`.
    slot: Vec<usize>,
    /// Leaves from `width`: the end of the placed buffer in that slot; inner nodes: the max.
    tree: Vec<usize>,
    width: usize,
}

impl<'a> Placed<'a> {
    fn new(buffers: &'a [Buffer]) -> Self {
        let mut by_start: Vec<usize> = (0..buffers.len()).collect();
        by_start.sort_by_key(|&i| (buffers[i].start, i));
        let mut slot = vec![0; buffers.len()];
        for (p, &i) in by_start.iter().enumerate() {
            slot[i] = p;
        }
        let width = buffers.len().next_power_of_two();
        Placed {
            buffers,
            by_start,
            slot,
            tree: vec![0; 2 * width],
            width,
        }
    }

    fn insert(&mut self, i: usize) {
        let mut node = self.width + self.slot[i];
        self.tree[node] = self.buffers[i].end;
        while node > 1 {
            node /= 2;
            self.tree[node] = self.tree[2 * node].max(self.tree[2 * node + 1]);
        }
    }

    /// Calls `f` with every placed buffer that overlaps `b` in time.
    fn overlapping(&self, b: &Buffer, mut f: impl FnMut(usize)) {
        // Candidates start before `b` ends: a prefix of `by_start`; among them, the overlapping
        // ones end after `b` starts.
        let prefix = self
            .by_start
            .partition_point(|&j| self.buffers[j].start < b.end);
        if prefix == 0 {
            return;
        }
        // Depth-first over the nodes that cover part of the prefix and hold a late enough end.
        let mut stack = vec![(1usize, 0usize, self.width)];
        while let Some((node, lo, hi)) = stack.pop() {
            if lo >= prefix || self.tree[node] <= b.start {
                continue;
            }
            if node >= self.width {
                f(self.by_start[lo]);
            } else {
                let mid = (lo + hi) / 2;
                stack.push((2 * node + 1, mid, hi));
                stack.push((2 * node, lo, mid));
            }
        }
    }
}

/// Places `buffers` in `order`, each at the lowest fitting offset (`best_fit = false`) or in the
/// gap that leaves the least slack (`best_fit = true`).
fn place(
    buffers: &[Buffer],
    order: &[usize],
    best_fit: bool,
    origin: usize,
) -> (Vec<usize>, usize) {
    let mut offsets = vec![usize::MAX; buffers.len()];
    let mut peak = 0;
    let mut placed = Placed::new(buffers);
    let mut busy: Vec<(usize, usize)> = Vec::new();
    for &i in order {
        let b = &buffers[i];
        // Busy ranges of already placed buffers that overlap in time, sorted by offset.
        busy.clear();
        placed.overlapping(b, |j| {
            busy.push((offsets[j], offsets[j] + buffers[j].bytes))
        });
        busy.sort_unstable();
        // Candidate gaps: before each busy range and after the last.
        let mut best: Option<(usize, usize)> = None; // (slack, offset)
        let mut cursor = 0usize;
        let mut consider = |start: usize, limit: Option<usize>| {
            let at = align_up(origin + start, b.align) - origin;
            let fits = limit.is_none_or(|l| at + b.bytes <= l);
            if fits {
                let slack = limit.map_or(usize::MAX, |l| l - at - b.bytes);
                let better = match best {
                    None => true,
                    Some((s, o)) => {
                        if best_fit {
                            (slack, at) < (s, o)
                        } else {
                            at < o
                        }
                    }
                };
                if better {
                    best = Some((slack, at));
                }
            }
        };
        for &(s, e) in &busy {
            if s > cursor {
                consider(cursor, Some(s));
            }
            cursor = cursor.max(e);
        }
        consider(cursor, None);
        let (_, at) = best.expect("the space above everything always fits");
        offsets[i] = at;
        placed.insert(i);
        peak = peak.max(at + b.bytes);
    }
    (offsets, peak)
}

/// Packs `buffers` with every heuristic and keeps the lowest peak.
pub fn pack(buffers: &[Buffer]) -> Packing {
    pack_from(buffers, 0)
}

/// As [`pack`], for a range that starts at address `origin`: each buffer's alignment holds for
/// `origin` + its offset.
pub fn pack_from(buffers: &[Buffer], origin: usize) -> Packing {
    let n = buffers.len();
    let idx: Vec<usize> = (0..n).collect();
    let by = |key: &dyn Fn(&Buffer) -> (usize, usize, usize)| {
        let mut v = idx.clone();
        v.sort_by_key(|&i| (key(&buffers[i]), i));
        v
    };
    let orders: [(&'static str, Vec<usize>); 4] = [
        ("by start", by(&|b| (b.start, usize::MAX - b.bytes, 0))),
        ("by size", by(&|b| (usize::MAX - b.bytes, b.start, 0))),
        (
            "by lifetime",
            by(&|b| (usize::MAX - (b.end - b.start), usize::MAX - b.bytes, 0)),
        ),
        (
            "by area",
            by(&|b| {
                (
                    usize::MAX - b.bytes.saturating_mul(b.end - b.start),
                    b.start,
                    0,
                )
            }),
        ),
    ];
    let mut best: Option<Packing> = None;
    for (name, order) in &orders {
        for (fit, best_fit) in [("first fit", false), ("best fit", true)] {
            let (offsets, peak) = place(buffers, order, best_fit, origin);
            if best.as_ref().is_none_or(|b| peak < b.peak) {
                let heuristic: &'static str = match (*name, fit) {
                    ("by start", "first fit") => "first fit by start",
                    ("by start", _) => "best fit by start",
                    ("by size", "first fit") => "first fit by size",
                    ("by size", _) => "best fit by size",
                    ("by lifetime", "first fit") => "first fit by lifetime",
                    ("by lifetime", _) => "best fit by lifetime",
                    ("by area", "first fit") => "first fit by area",
                    _ => "best fit by area",
                };
                best = Some(Packing {
                    offsets,
                    peak,
                    lower_bound: 0,
                    heuristic,
                });
            }
        }
    }
    let mut p = best.unwrap_or(Packing {
        offsets: vec![],
        peak: 0,
        lower_bound: 0,
        heuristic: "empty",
    });
    p.lower_bound = lower_bound(buffers);
    p
}

/// A table of the packing: offset, size, lifetime and name of every buffer, by offset.
pub fn dump(buffers: &[Buffer], p: &Packing, base: usize) -> String {
    let mut s = String::new();
    let mut order: Vec<usize> = (0..buffers.len()).collect();
    order.sort_by_key(|&i| (p.offsets[i], buffers[i].start, i));
    for i in order {
        let b = &buffers[i];
        let _ = writeln!(
            s,
            "  [{:>7}, {:>7})  {:>7} B  steps [{}, {})  {}",
            base + p.offsets[i],
            base + p.offsets[i] + b.bytes,
            b.bytes,
            b.start,
            b.end,
            b.name
        );
    }
    s
}

/// An SVG drawing of a packing: x = time step, y = address.
pub fn svg(title: &str, buffers: &[Buffer], p: &Packing) -> String {
    let steps = buffers.iter().map(|b| b.end).max().unwrap_or(1).max(1);
    let peak = p.peak.max(1);
    let (w, h) = (900.0f64, 500.0f64);
    let (x0, y0) = (60.0, 30.0);
    let sx = (w - x0 - 20.0) / steps as f64;
    let sy = (h - y0 - 30.0) / peak as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"monospace\" font-size=\"11\">"
    );
    let _ = writeln!(
        s,
        "<text x=\"{x0}\" y=\"18\">{} — peak {} B, lower bound {} B ({})</text>",
        escape(title),
        p.peak,
        p.lower_bound,
        p.heuristic
    );
    let _ = writeln!(
        s,
        "<rect x=\"{x0}\" y=\"{y0}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#888\"/>",
        w - x0 - 20.0,
        h - y0 - 30.0
    );
    let palette = [
        "#8ecae6", "#ffb703", "#90be6d", "#f28482", "#b5838d", "#cdb4db", "#a8dadc", "#f4a261",
    ];
    for (i, b) in buffers.iter().enumerate() {
        let x = x0 + b.start as f64 * sx;
        let y = y0 + p.offsets[i] as f64 * sy;
        let bw = (b.end - b.start) as f64 * sx;
        let bh = (b.bytes as f64 * sy).max(1.0);
        let _ = writeln!(
            s,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" fill=\"{}\" stroke=\"#333\"><title>{} ({} B, steps {}..{}, offset {})</title></rect>",
            palette[i % palette.len()],
            escape(&b.name),
            b.bytes,
            b.start,
            b.end,
            p.offsets[i]
        );
        if bh > 12.0 && bw > 40.0 {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                x + 3.0,
                y + 12.0,
                escape(&b.name)
            );
        }
    }
    let _ = writeln!(s, "<text x=\"{x0}\" y=\"{}\">step →</text>", h - 8.0);
    let _ = writeln!(s, "<text x=\"4\" y=\"{}\">addr ↓</text>", y0 + 12.0);
    s.push_str("</svg>\n");
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn buf(bytes: usize, start: usize, end: usize) -> Buffer {
        Buffer {
            name: format!("b{bytes}@{start}"),
            bytes,
            start,
            end,
            align: 16,
        }
    }

    #[test]
    fn reuse_after_death() {
        let bufs = vec![buf(1024, 0, 2), buf(1024, 2, 4), buf(512, 1, 3)];
        let p = pack(&bufs);
        assert_eq!(p.lower_bound, 1536);
        assert_eq!(p.peak, 1536);
        assert_eq!(
            p.offsets[0], p.offsets[1],
            "the second reuses the first's space"
        );
    }

    #[test]
    fn alignment_holds_from_the_origin() {
        let mut bufs = vec![buf(100, 0, 2), buf(2048, 0, 2), buf(64, 1, 3)];
        bufs[1].align = 1024;
        let p = pack_from(&bufs, 48);
        assert_eq!((48 + p.offsets[1]) % 1024, 0, "{:?}", p.offsets);
        valid_from(&bufs, &p, 48).unwrap();
    }

    fn valid(bufs: &[Buffer], p: &Packing) -> Result<(), String> {
        valid_from(bufs, p, 0)
    }

    fn valid_from(bufs: &[Buffer], p: &Packing, origin: usize) -> Result<(), String> {
        for i in 0..bufs.len() {
            if !(origin + p.offsets[i]).is_multiple_of(bufs[i].align) {
                return Err(format!("buffer {i} misaligned"));
            }
            for j in i + 1..bufs.len() {
                let (a, b) = (&bufs[i], &bufs[j]);
                let space =
                    p.offsets[i] < p.offsets[j] + b.bytes && p.offsets[j] < p.offsets[i] + a.bytes;
                if a.overlaps(b) && space {
                    return Err(format!("buffers {i} and {j} overlap"));
                }
            }
        }
        Ok(())
    }

    /// The quadratic definitions the planner used before [`Placed`] and the sweep: every
    /// placed buffer and every start tested against every other.
    fn quadratic_lower_bound(buffers: &[Buffer]) -> usize {
        let mut events: Vec<usize> = buffers.iter().map(|b| b.start).collect();
        events.sort_unstable();
        events.dedup();
        events
            .iter()
            .map(|&t| {
                buffers
                    .iter()
                    .filter(|b| b.start <= t && t < b.end)
                    .map(|b| b.bytes)
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0)
    }

    fn quadratic_busy(buffers: &[Buffer], offsets: &[usize], i: usize) -> Vec<(usize, usize)> {
        let mut busy: Vec<(usize, usize)> = (0..buffers.len())
            .filter(|&j| offsets[j] != usize::MAX && buffers[j].overlaps(&buffers[i]))
            .map(|j| (offsets[j], offsets[j] + buffers[j].bytes))
            .collect();
        busy.sort_unstable();
        busy
    }

    proptest! {
        /// The sweep and the lifetime tree find exactly what testing every pair finds, so
        /// packings (and the code planned from them) do not depend on which is used.
        #[test]
        fn fast_queries_match_the_quadratic_ones(spec in prop::collection::vec((1usize..64, 0usize..20, 0usize..10), 0..40), seed in 0usize..1000) {
            let bufs: Vec<Buffer> = spec.iter().map(|&(k, s, l)| buf(k * 16, s, s + l)).collect();
            prop_assert_eq!(lower_bound(&bufs), quadratic_lower_bound(&bufs));
            // Place in a scrambled order, comparing the busy ranges before each placement.
            let mut order: Vec<usize> = (0..bufs.len()).collect();
            order.sort_by_key(|&i| (i * 7919 + seed) % 97);
            let mut placed = Placed::new(&bufs);
            let mut offsets = vec![usize::MAX; bufs.len()];
            for (n, &i) in order.iter().enumerate() {
                let mut busy = Vec::new();
                placed.overlapping(&bufs[i], |j| busy.push((offsets[j], offsets[j] + bufs[j].bytes)));
                busy.sort_unstable();
                prop_assert_eq!(&busy, &quadratic_busy(&bufs, &offsets, i));
                offsets[i] = n * 4096;
                placed.insert(i);
            }
        }

        /// No two simultaneously live buffers share bytes; the peak is at least the lower bound
        /// and at most the sum of all sizes; the plan is deterministic.
        #[test]
        fn packings_are_valid(spec in prop::collection::vec((1usize..64, 0usize..20, 1usize..10), 0..40)) {
            let bufs: Vec<Buffer> = spec.iter().map(|&(k, s, l)| buf(k * 16, s, s + l)).collect();
            let p = pack(&bufs);
            prop_assert!(valid(&bufs, &p).is_ok(), "{:?}", valid(&bufs, &p));
            prop_assert!(p.peak >= p.lower_bound);
            prop_assert!(p.peak <= bufs.iter().map(|b| b.bytes).sum::<usize>());
            prop_assert_eq!(pack(&bufs), p);
        }
    }
}
