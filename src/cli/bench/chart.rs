//! The SVG chart of `mucc bench --svg`: every candidate of the file, x = median µs per
//! execution, y = ratio to the floor, drawn with `plotters`' SVG backend.
//!
//! [`render`] is a pure function of the [`Chart`] (no GPU), so the drawing is unit-tested.
//! Markers: a filled blue circle per clean candidate, a larger filled red one for the fastest,
//! a hollow orange one for a candidate that ran but may not be the fastest (failed the check,
//! non-finite outputs); each is labelled with its graph index, up and to the right of it (labels
//! of candidates with nearly the same time may overlap; the table `mucc bench` prints has every
//! figure). Below the plot, the candidates that failed (not plotted) or are unverified (hollow),
//! one line per reason. When no floor is known (a graph with no work), the candidates are drawn
//! on one line at their times and the y axis says so; a grey line marks ×1 (the floor) when the
//! y range reaches it.

use plotters::prelude::*;

/// One candidate of the file.
pub struct Point {
    /// Index of the graph in the file.
    pub graph: usize,
    /// What happened to it.
    pub outcome: Outcome,
}

/// What happened to one candidate.
pub enum Outcome {
    /// It ran and was timed.
    Timed {
        /// Median µs per execution.
        us: f64,
        /// Time over the floor; `None` when no floor is known.
        ratio: Option<f64>,
        /// Why it may not be the fastest (failed the check, non-finite outputs); `None` when it
        /// ran cleanly.
        problem: Option<String>,
    },
    /// It did not run (invalid, did not compile, failed on the GPU): why.
    Failed(String),
}

/// What the chart shows.
pub struct Chart<'a> {
    /// The µGraph file (named in the title).
    pub file: &'a str,
    /// The GPU (named in the title).
    pub gpu: &'a str,
    /// Lines under the title: how it was timed, the floor, the ceilings.
    pub notes: &'a [String],
    /// Every candidate.
    pub points: &'a [Point],
    /// The graph marked fastest by `mucc bench`, if any.
    pub fastest: Option<usize>,
}

/// Width of the drawing in pixels.
const WIDTH: u32 = 900;
/// Height of the plot (axes and markers) below the title lines; the list of failed candidates
/// comes below it.
const PLOT_HEIGHT: u32 = 500;
/// Height of one line of the list below the plot.
const LINE: u32 = 18;
/// The longest reason shown in the list, in characters.
const REASON_CHARS: usize = 110;
/// The longest line under the title, in characters.
const NOTE_CHARS: usize = 125;
/// Font size of the marker labels (plotters' units: an SVG font-size of size / 1.24 pixels).
const LABEL_SIZE: f64 = 13.0;

/// Fill of the fastest candidate's marker.
pub const FASTEST_COLOR: RGBColor = RGBColor(0xd6, 0x27, 0x28);
/// Fill of a clean candidate's marker.
pub const CLEAN_COLOR: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
/// Outline of an unverified candidate's (hollow) marker.
pub const UNVERIFIED_COLOR: RGBColor = RGBColor(0xff, 0x7f, 0x0e);

/// Text safe for XML 1.0 (which forbids most control characters even escaped): control
/// characters become `%XX`, as the input's name does in generated code.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                format!("%{:02X}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `s` cleaned and cut to `max` characters.
fn cut(s: &str, max: usize) -> String {
    let s = clean(s);
    if s.chars().count() > max {
        let kept: String = s.chars().take(max - 1).collect();
        format!("{kept}…")
    } else {
        s
    }
}

/// The first line of `s`, cleaned and cut to `REASON_CHARS` characters.
fn reason(s: &str) -> String {
    cut(s.lines().next().unwrap_or(""), REASON_CHARS)
}

/// A range around `lo..=hi` with some room on both sides, never below 0 and never empty.
fn padded(lo: f64, hi: f64) -> (f64, f64) {
    let span = hi - lo;
    let pad = if span > 1e-9 * hi.abs().max(1e-300) {
        0.08 * span
    } else {
        (0.1 * hi.abs()).max(1e-3)
    };
    ((lo - pad).max(0.0), hi + pad)
}

/// Tick label of `v` on an axis that spans `span`: as many decimals as the tick spacing needs.
fn tick(v: f64, span: f64) -> String {
    let step = span / 8.0;
    let decimals = if step > 0.0 && step.is_finite() {
        (-step.log10().floor()).clamp(0.0, 4.0) as usize
    } else {
        2
    };
    format!("{v:.decimals$}")
}

/// A timed candidate as drawn: graph, µs, ratio, and whether it is clean.
struct Drawn {
    graph: usize,
    us: f64,
    ratio: Option<f64>,
    clean: bool,
}

/// "graph 3", or "graphs 0–4, 7, 9–12" (cut with the count when long).
fn graph_list(gs: &[usize]) -> String {
    if let [g] = gs {
        return format!("graph {g}");
    }
    let mut runs: Vec<String> = Vec::new();
    let mut k = 0;
    while k < gs.len() {
        let mut end = k;
        while end + 1 < gs.len() && gs[end + 1] == gs[end] + 1 {
            end += 1;
        }
        runs.push(if end > k + 1 {
            format!("{}–{}", gs[k], gs[end])
        } else if end == k + 1 {
            format!("{}, {}", gs[k], gs[end])
        } else {
            gs[k].to_string()
        });
        k = end + 1;
    }
    let all = runs.join(", ");
    if all.chars().count() <= 48 {
        return format!("graphs {all}");
    }
    let mut shown = String::new();
    for r in &runs {
        if shown.chars().count() + r.chars().count() > 40 {
            break;
        }
        shown.push_str(r);
        shown.push_str(", ");
    }
    format!("graphs {shown}… ({} graphs)", gs.len())
}

/// Renders the chart as an SVG document.
pub fn render(c: &Chart) -> Result<String, String> {
    let mut drawn = Vec::new();
    // The list below the plot: (plotted hollow, reason, graphs), one line per reason.
    let mut groups: Vec<(bool, String, Vec<usize>)> = Vec::new();
    let mut list = |hollow: bool, why: String, graph: usize| match groups
        .iter_mut()
        .find(|(h, w, _)| *h == hollow && *w == why)
    {
        Some((_, _, gs)) => gs.push(graph),
        None => groups.push((hollow, why, vec![graph])),
    };
    for p in c.points {
        match &p.outcome {
            Outcome::Timed { us, ratio, problem } if us.is_finite() && *us > 0.0 => {
                drawn.push(Drawn {
                    graph: p.graph,
                    us: *us,
                    ratio: ratio.filter(|r| r.is_finite() && *r > 0.0),
                    clean: problem.is_none(),
                });
                if let Some(why) = problem {
                    list(true, reason(why), p.graph);
                }
            }
            Outcome::Timed { us, .. } => list(false, format!("no usable time ({us} µs)"), p.graph),
            Outcome::Failed(why) => list(false, reason(why), p.graph),
        }
    }
    let listed: Vec<String> = groups
        .iter()
        .map(|(hollow, why, gs)| {
            let how = match (hollow, gs.len()) {
                (true, 1) => "hollow marker",
                (true, _) => "hollow markers",
                (false, _) => "not plotted",
            };
            format!("{} ({how}): {why}", graph_list(gs))
        })
        .collect();
    // With a floor for every plotted candidate, y is the ratio; otherwise all sit on one line.
    let with_floor = !drawn.is_empty() && drawn.iter().all(|d| d.ratio.is_some());
    let range = |f: fn(&Drawn) -> f64| {
        let (lo, hi) = drawn
            .iter()
            .map(f)
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
        padded(lo, hi)
    };
    let (x_lo, x_hi) = if drawn.is_empty() {
        (0.0, 1.0)
    } else {
        range(|d| d.us)
    };
    let (y_lo, y_hi) = if with_floor {
        range(|d| d.ratio.unwrap_or(0.0))
    } else {
        (0.0, 1.0)
    };
    // The lines above the plot: title, notes, legend.
    let title = cut(&format!("{} — {}", c.file, c.gpu), 90);
    let n = c.points.len();
    let n_clean = drawn.iter().filter(|d| d.clean).count();
    let mut legend = format!(
        "{n} candidate{}: {n_clean} clean (filled)",
        if n == 1 { "" } else { "s" }
    );
    if drawn.len() > n_clean {
        legend.push_str(&format!(", {} unverified (hollow)", drawn.len() - n_clean));
    }
    if n > drawn.len() {
        legend.push_str(&format!(", {} failed (listed below)", n - drawn.len()));
    }
    match c.fastest.and_then(|g| drawn.iter().find(|d| d.graph == g)) {
        Some(d) => legend.push_str(&format!(
            "; fastest (red): graph {}, {:.2} µs",
            d.graph, d.us
        )),
        None => legend.push_str("; no fastest: no candidate ran cleanly"),
    }
    let mut lines: Vec<String> = c.notes.iter().map(|l| cut(l, NOTE_CHARS)).collect();
    lines.push(legend);
    let header = 34 + 18 * lines.len() as u32 + 6;
    let list_height = if listed.is_empty() {
        0
    } else {
        LINE * (listed.len() as u32 + 1) + 10
    };
    let mut svg = String::new();
    {
        let size = (WIDTH, header + PLOT_HEIGHT + list_height);
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        let e = |e: DrawingAreaErrorKind<_>| format!("drawing the chart: {e}");
        root.fill(&WHITE).map_err(e)?;
        let (top, bottom) = root.split_vertically(header + PLOT_HEIGHT);
        top.draw(&Text::new(title, (12, 8), ("sans-serif", 20).into_font()))
            .map_err(e)?;
        for (k, line) in lines.into_iter().enumerate() {
            let at = (12, 34 + 18 * k as i32);
            top.draw(&Text::new(line, at, ("sans-serif", 15).into_font()))
                .map_err(e)?;
        }
        let (_, plot) = top.split_vertically(header);
        let mut chart = ChartBuilder::on(&plot)
            .margin(14)
            .x_label_area_size(48)
            .y_label_area_size(70)
            .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)
            .map_err(e)?;
        let x_fmt = |v: &f64| tick(*v, x_hi - x_lo);
        let y_fmt = |v: &f64| tick(*v, y_hi - y_lo);
        let mut mesh = chart.configure_mesh();
        mesh.x_desc("median time per execution (µs)")
            .x_labels(8)
            .x_label_formatter(&x_fmt)
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 14));
        if with_floor {
            mesh.y_desc("time / floor (×floor)")
                .y_labels(8)
                .y_label_formatter(&y_fmt);
        } else {
            mesh.y_desc("no floor known: ×floor not available")
                .y_labels(0)
                .disable_y_mesh();
        }
        mesh.draw().map_err(e)?;
        if with_floor && y_lo <= 1.0 && 1.0 <= y_hi {
            let floor = vec![(x_lo, 1.0), (x_hi, 1.0)];
            let grey = BLACK.mix(0.5).stroke_width(1);
            chart
                .draw_series(std::iter::once(PathElement::new(floor, grey)))
                .map_err(e)?;
        }
        if drawn.is_empty() {
            let at = (x_lo + 0.4 * (x_hi - x_lo), y_lo + 0.5 * (y_hi - y_lo));
            let font = ("sans-serif", 16).into_font();
            chart
                .draw_series(std::iter::once(Text::new("no candidate ran", at, font)))
                .map_err(e)?;
        }
        // Clean markers first, then the hollow unverified ones (so that no clean marker hides
        // them), then the fastest on top of everything.
        let layer = |d: &Drawn| match (Some(d.graph) == c.fastest, d.clean) {
            (true, _) => 2,
            (false, true) => 0,
            (false, false) => 1,
        };
        let mut order: Vec<&Drawn> = drawn.iter().collect();
        order.sort_by(|a, b| layer(a).cmp(&layer(b)).then(a.us.total_cmp(&b.us)));
        let markers = order.into_iter().map(|d| {
            let (label, style, r, color) = match layer(d) {
                2 => (
                    format!("{} (fastest)", d.graph),
                    FASTEST_COLOR.filled(),
                    7,
                    FASTEST_COLOR,
                ),
                0 => (d.graph.to_string(), CLEAN_COLOR.filled(), 4, BLACK),
                _ => (
                    d.graph.to_string(),
                    UNVERIFIED_COLOR.stroke_width(2),
                    5,
                    BLACK,
                ),
            };
            let y = if with_floor {
                d.ratio.unwrap_or(0.5)
            } else {
                0.5
            };
            let font = ("sans-serif", LABEL_SIZE).into_font().color(&color);
            EmptyElement::at((d.us, y))
                + Circle::new((0, 0), r, style)
                + Text::new(label, (r + 2, -r - 14), font)
        });
        chart.draw_series(markers).map_err(e)?;
        if !listed.is_empty() {
            let heading = "failed or unverified candidates:";
            bottom
                .draw(&Text::new(heading, (12, 4), ("sans-serif", 14).into_font()))
                .map_err(e)?;
            for (k, line) in listed.iter().enumerate() {
                let at = (24, (LINE * (k as u32 + 1)) as i32 + 4);
                bottom
                    .draw(&Text::new(line.as_str(), at, ("monospace", 12).into_font()))
                    .map_err(e)?;
            }
        }
        root.present().map_err(e)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timed(graph: usize, us: f64, ratio: Option<f64>) -> Point {
        Point {
            graph,
            outcome: Outcome::Timed {
                us,
                ratio,
                problem: None,
            },
        }
    }

    fn chart<'a>(points: &'a [Point], fastest: Option<usize>) -> Chart<'a> {
        Chart {
            file: "gated_mlp.json",
            gpu: "NVIDIA H100 80GB HBM3 (sm_90a)",
            notes: &[],
            points,
            fastest,
        }
    }

    /// The document parsed as XML (which checks that it is well formed).
    fn parse(svg: &str) -> roxmltree::Document<'_> {
        roxmltree::Document::parse(svg)
            .unwrap_or_else(|e| panic!("not well-formed XML: {e}\n{svg}"))
    }

    fn circles<'a>(doc: &'a roxmltree::Document<'a>) -> Vec<roxmltree::Node<'a, 'a>> {
        doc.descendants()
            .filter(|n| n.has_tag_name("circle"))
            .collect()
    }

    /// The trimmed contents of every `<text>`.
    fn texts(doc: &roxmltree::Document) -> Vec<String> {
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| n.text().unwrap_or("").trim().to_string())
            .collect()
    }

    fn fill(n: &roxmltree::Node) -> String {
        n.attribute("fill").unwrap_or("").to_ascii_lowercase()
    }

    #[test]
    fn candidates_fastest_and_failures() {
        let points = vec![
            timed(0, 25.0, Some(2.5)),
            timed(1, 12.5, Some(1.25)),
            Point {
                graph: 2,
                outcome: Outcome::Timed {
                    us: 11.0,
                    ratio: Some(1.1),
                    problem: Some("CHECK FAILED (rel err 3.1e-1)".into()),
                },
            },
            Point {
                graph: 3,
                outcome: Outcome::Failed(
                    "NVRTC: error: identifier \"x\" is undefined <here> & there\nsecond line"
                        .into(),
                ),
            },
            timed(4, 40.0, Some(4.0)),
        ];
        let notes = ["mucc bench: CUDA-graph replay, median of 50 samples".to_string()];
        let svg = render(&Chart {
            notes: &notes,
            ..chart(&points, Some(1))
        })
        .unwrap();
        let doc = parse(&svg);
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        // One marker per candidate that ran; the failed one is not drawn.
        let cs = circles(&doc);
        assert_eq!(cs.len(), 4, "{svg}");
        // The fastest is the only red, filled marker, and it is the largest.
        let red = format!("#{:02x}{:02x}{:02x}", 0xd6, 0x27, 0x28);
        let reds: Vec<_> = cs.iter().filter(|n| fill(n) == red).collect();
        assert_eq!(reds.len(), 1, "{svg}");
        assert_eq!(reds[0].attribute("r"), Some("7"));
        // The unverified one is hollow, drawn after the clean ones (so none hides it), and the
        // fastest is drawn last, on top of everything.
        assert_eq!(cs.iter().filter(|n| fill(n) == "none").count(), 1, "{svg}");
        let fills: Vec<String> = cs.iter().map(fill).collect();
        assert_eq!(fills.last(), Some(&red), "{fills:?}");
        assert_eq!(fills[fills.len() - 2], "none", "{fills:?}");
        let t = texts(&doc);
        for label in ["0", "1 (fastest)", "2", "4"] {
            assert!(t.iter().any(|x| x == label), "no label {label:?} in {t:?}");
        }
        assert!(
            !t.iter().any(|x| x == "3"),
            "failed graph 3 was plotted: {t:?}"
        );
        // Title, axes, legend, and the list of failures with their reasons (first line only,
        // escaped in the file, read back unescaped).
        assert!(
            t.iter()
                .any(|x| x == "gated_mlp.json — NVIDIA H100 80GB HBM3 (sm_90a)")
        );
        assert!(t.iter().any(|x| x == "median time per execution (µs)"));
        assert!(t.iter().any(|x| x == "time / floor (×floor)"));
        assert!(t.iter().any(|x| x == &notes[0]), "{t:?}");
        assert!(
            t.iter().any(|x| x
                == "5 candidates: 3 clean (filled), 1 unverified (hollow), 1 failed (listed below); fastest (red): graph 1, 12.50 µs"),
            "{t:?}"
        );
        assert!(
            t.iter()
                .any(|x| x == "graph 2 (hollow marker): CHECK FAILED (rel err 3.1e-1)"),
            "{t:?}"
        );
        assert!(t.iter().any(|x| x == "graph 3 (not plotted): NVRTC: error: identifier \"x\" is undefined <here> & there"), "{t:?}");
        assert!(!svg.contains("second line"));
        assert!(svg.contains("&lt;here&gt; &amp; there"));
        // Ticks: numbers on both axes.
        let numbers = t.iter().filter(|x| x.parse::<f64>().is_ok()).count();
        assert!(numbers >= 8, "too few tick labels in {t:?}");
        assert!(
            t.iter().any(|x| x == "1.5" || x == "2.0" || x == "2.5"),
            "{t:?}"
        );
        assert!(t.iter().any(|x| x == "20" || x == "30"), "{t:?}");
    }

    #[test]
    fn one_candidate() {
        let points = vec![timed(7, 8.0, Some(1.6))];
        let svg = render(&chart(&points, Some(7))).unwrap();
        let doc = parse(&svg);
        let cs = circles(&doc);
        assert_eq!(cs.len(), 1, "{svg}");
        assert_eq!(fill(&cs[0]), "#d62728");
        let t = texts(&doc);
        assert!(t.iter().any(|x| x == "7 (fastest)"), "{t:?}");
        assert!(
            t.iter()
                .any(|x| x == "1 candidate: 1 clean (filled); fastest (red): graph 7, 8.00 µs"),
            "{t:?}"
        );
        // No list of failures.
        assert!(
            !t.iter().any(|x| x.contains("failed or unverified")),
            "{t:?}"
        );
        // The marker is inside the drawing, below the title lines.
        let cx: f64 = cs[0].attribute("cx").unwrap().parse().unwrap();
        let cy: f64 = cs[0].attribute("cy").unwrap().parse().unwrap();
        let height: f64 = doc
            .root_element()
            .attribute("height")
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            cx > 0.0 && cx < WIDTH as f64 && cy > 58.0 && cy < height,
            "{cx}, {cy}"
        );
    }

    #[test]
    fn no_floor_draws_times_on_one_line() {
        let points = vec![
            timed(0, 5.0, None),
            timed(1, 3.0, None),
            timed(2, 4.0, None),
        ];
        let svg = render(&chart(&points, Some(1))).unwrap();
        let doc = parse(&svg);
        let cs = circles(&doc);
        assert_eq!(cs.len(), 3, "{svg}");
        let ys: Vec<&str> = cs.iter().map(|n| n.attribute("cy").unwrap()).collect();
        assert!(ys.iter().all(|y| *y == ys[0]), "not on one line: {ys:?}");
        // Left to right by time: graph 1 (3 µs), 2, 0.
        let x_of = |g: usize| -> f64 {
            let label = if g == 1 {
                "1 (fastest)".to_string()
            } else {
                g.to_string()
            };
            let n = doc
                .descendants()
                .find(|n| n.has_tag_name("text") && n.text().unwrap_or("").trim() == label)
                .unwrap();
            n.attribute("x").unwrap().parse().unwrap()
        };
        assert!(x_of(1) < x_of(2) && x_of(2) < x_of(0));
        // The fastest (red) marker is the leftmost.
        let cx = |n: &roxmltree::Node| -> f64 { n.attribute("cx").unwrap().parse().unwrap() };
        let red = cs.iter().find(|n| fill(n) == "#d62728").unwrap();
        assert!(cs.iter().all(|n| cx(n) >= cx(red)));
        let t = texts(&doc);
        assert!(
            t.iter()
                .any(|x| x == "no floor known: ×floor not available"),
            "{t:?}"
        );
    }

    #[test]
    fn nothing_ran() {
        let points = vec![Point {
            graph: 0,
            outcome: Outcome::Failed("invalid:\nshape mismatch".into()),
        }];
        let svg = render(&chart(&points, None)).unwrap();
        let doc = parse(&svg);
        assert!(circles(&doc).is_empty());
        let t = texts(&doc);
        assert!(t.iter().any(|x| x == "no candidate ran"), "{t:?}");
        assert!(
            t.iter().any(|x| x
                == "1 candidate: 0 clean (filled), 1 failed (listed below); no fastest: no candidate ran cleanly"),
            "{t:?}"
        );
        assert!(
            t.iter().any(|x| x == "graph 0 (not plotted): invalid:"),
            "{t:?}"
        );
    }

    #[test]
    fn control_characters_are_kept_out_of_the_xml() {
        let points = vec![timed(0, 1.0, Some(1.0))];
        let c = Chart {
            file: "a\u{1}b\u{7f}.json",
            ..chart(&points, Some(0))
        };
        let svg = render(&c).unwrap();
        parse(&svg);
        assert!(svg.contains("a%01b%7F.json"), "{svg}");
    }

    /// 32 candidates in three tight clusters, as the candidates of one file often are.
    fn crowd() -> Vec<Point> {
        (0..32)
            .map(|g| {
                let us = [26.0, 38.0, 57.0][g % 3] + 0.07 * g as f64;
                timed(g, us, Some(us / 22.3))
            })
            .collect()
    }

    #[test]
    fn a_crowd_gets_every_label() {
        let points = crowd();
        let svg = render(&chart(&points, Some(0))).unwrap();
        let doc = parse(&svg);
        assert_eq!(circles(&doc).len(), 32);
        // The marker labels: the texts in the fastest's label's font size (tick labels, also
        // numbers, are larger).
        let text_nodes: Vec<_> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .collect();
        let size = text_nodes
            .iter()
            .find(|n| n.text().unwrap_or("").trim() == "0 (fastest)")
            .and_then(|n| n.attribute("font-size"))
            .unwrap();
        let mut labels: Vec<String> = text_nodes
            .iter()
            .filter(|n| n.attribute("font-size") == Some(size))
            .map(|n| n.text().unwrap_or("").trim().to_string())
            .collect();
        labels.sort();
        let mut expected: Vec<String> = (1..32).map(|g| g.to_string()).collect();
        expected.push("0 (fastest)".into());
        expected.sort();
        assert_eq!(labels, expected);
    }

    #[test]
    fn the_list_below_has_one_line_per_reason() {
        let mut points: Vec<Point> = (0..12)
            .map(|g| Point {
                graph: g,
                outcome: Outcome::Timed {
                    us: 10.0 + g as f64,
                    ratio: Some(1.0 + 0.1 * g as f64),
                    problem: (g != 6).then(|| "NON-FINITE OUTPUT".to_string()),
                },
            })
            .collect();
        points.push(Point {
            graph: 12,
            outcome: Outcome::Failed("FAILED: out of memory".into()),
        });
        let svg = render(&chart(&points, Some(6))).unwrap();
        let doc = parse(&svg);
        assert_eq!(circles(&doc).len(), 12);
        let t = texts(&doc);
        assert!(
            t.iter()
                .any(|x| x == "graphs 0–5, 7–11 (hollow markers): NON-FINITE OUTPUT"),
            "{t:?}"
        );
        assert!(
            t.iter()
                .any(|x| x == "graph 12 (not plotted): FAILED: out of memory"),
            "{t:?}"
        );
        assert_eq!(graph_list(&[1, 2]), "graphs 1, 2");
        assert_eq!(graph_list(&[0, 1, 2, 4, 6, 7]), "graphs 0–2, 4, 6, 7");
        let every_other: Vec<usize> = (0..190).step_by(2).collect();
        assert_eq!(
            graph_list(&every_other),
            "graphs 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, … (95 graphs)"
        );
    }

    #[test]
    fn ticks_have_the_decimals_their_spacing_needs() {
        assert_eq!(tick(20.0, 80.0), "20");
        assert_eq!(tick(1.2, 2.0), "1.2");
        assert_eq!(tick(0.05, 0.4), "0.05");
        assert_eq!(padded(10.0, 10.0), (9.0, 11.0));
        let (lo, hi) = padded(1.0, 101.0);
        assert!((lo - 0.0).abs() < 1e-12 && (hi - 109.0).abs() < 1e-9);
    }
}
