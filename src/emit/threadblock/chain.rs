//! One pass per chain: the leader computes a value (element-wise operators, a row of rms_norm,
//! a reduction; matmuls in [`super::matmul`], copies in [`super::copy`]), the fused unary
//! operators transform it in registers, and the sink stores or accumulates it, as the chain's
//! plan says.

use super::Ctx;
use crate::emit::EmitError;
use crate::emit::cxx;
use crate::graph::arena::Handle;
use crate::graph::ops::{AccumKind, TbReduction};
use crate::graph::shape::Shape;
use crate::graph::threadblock::{TbOp, TbOpKind};
use crate::sched::ops::{OpPlan, RowSplit};
use crate::sched::order::Phase;
use crate::sched::plan::{ApproxExp, ChainPlan, Sink};

/// Natural (row-major) order of a shape's dims.
pub(super) fn natural(s: &Shape) -> Vec<usize> {
    (0..s.rank()).collect()
}

impl Ctx<'_> {
    /// Emits chain `c`, which runs in `phase`.
    pub(super) fn chain(&mut self, c: usize, phase: Phase) -> Result<(), EmitError> {
        let chain = self.kp.fusion.chains[c].clone();
        let lead = chain.leader();
        let lop = self.tb.ops[lead].clone();
        let cp = self.kp.chains[c].clone();
        let names: Vec<String> = chain
            .ops
            .iter()
            .map(|&o| format!("op{} {}", o.index(), self.tb.ops[o].kind.name()))
            .collect();
        for l in cxx::comment(&names.join(" -> "), 2 * self.w.level()) {
            self.w.line(l);
        }
        if let Some(p) = self.kp.pipe_into(c) {
            let producer = self.kp.fusion.chains[p.producer].leader().index();
            self.w.line(format!(
                "// runs in op{producer}'s chain: s{} stays in registers (register pipe)",
                p.tile
            ));
            return Ok(());
        }
        if let Some(p) = self.kp.pipe_from(c).cloned() {
            return self.pipe_chain(lead, &cp, &p);
        }
        match &lop.kind {
            TbOpKind::Input { .. } => self.input_copy(lead, phase),
            TbOpKind::Output { .. } => self.output_copy(lead),
            TbOpKind::Matmul => self.matmul_chain(lead, &cp),
            TbOpKind::RmsNorm => self.rms_chain(lead, &lop, &cp),
            TbOpKind::Reduction {
                dim,
                kind: TbReduction::Max,
            } => self.running_max(&lop, *dim),
            TbOpKind::Reduction { dim, kind } => self.reduction_chain(lead, &lop, *dim, *kind, &cp),
            _ => self.elementwise_chain(&lop, &cp),
        }
    }

    /// `v = u(v);` for each unary member of chain plan `cp` (the last one's `exp`
    /// approximate where the plan says so), `v = b(v, side);` (or `b(side, v)`) for each
    /// binary member, its side tile read at element `at.2` of `at.0` walked in `at.1` (chains
    /// with binary members are element-wise, so their emitters pass `at`).
    pub(super) fn member_lines(
        &mut self,
        cp: &ChainPlan,
        at: Option<(&Shape, &[usize], &str)>,
    ) -> Result<Vec<String>, EmitError> {
        let c = self.compute();
        let n = cp.members.len();
        let mut lines = Vec::new();
        for (i, &m) in cp.members.iter().enumerate() {
            match &self.tb.ops[m].kind {
                TbOpKind::Unary(u) => {
                    lines.push(format!(
                        "v = {};",
                        unary(
                            u,
                            cp.approx_exp.filter(|_| i + 1 == n),
                            cp.approx_logistic,
                            c
                        )
                    ));
                }
                TbOpKind::Binary(b) => {
                    let (Some((value, side)), Some((space, order, e))) =
                        (self.kp.fusion.side_input(self.tb, m), at)
                    else {
                        return Err(self.internal(&format!(
                            "binary op{} fused where no element index is known",
                            m.index()
                        )));
                    };
                    let x = self.tile_read(side, space, order, e)?;
                    lines.push(format!("const {c} side{i} = {x};"));
                    let side = format!("side{i}");
                    let (l, r) = if value == 0 {
                        ("v", side.as_str())
                    } else {
                        (side.as_str(), "v")
                    };
                    lines.push(format!("v = {};", cxx::binary(*b, l, r)));
                }
                _ => {}
            }
        }
        Ok(lines)
    }

    /// The plan's row split of `op` (a row-reducing operator or accumulator).
    fn row_split(&self, op: Handle<TbOp>) -> Result<RowSplit, EmitError> {
        match &self.kp.ops[op.index()] {
            OpPlan::RowReduce(split)
            | OpPlan::Accum {
                rows: Some(split), ..
            } => Ok(*split),
            _ => Err(self.internal(&format!("op{} has no row split", op.index()))),
        }
    }

    /// Statements storing or accumulating `v` (compute type) at element `e` of the chain's
    /// space `space` walked in `order`; `r` is the per-thread register slot.
    pub(super) fn sink_lines(
        &mut self,
        sink: Sink,
        space: &Shape,
        order: &[usize],
        e: &str,
        r: &str,
    ) -> Result<Vec<String>, EmitError> {
        Ok(match sink {
            Sink::Tile(t) => {
                let l = self.tile_layout(t, order)?;
                let ty = self.tile_ctype(t);
                let p = self.tile_ref(t);
                let v = self.stored_value(t, "v");
                vec![format!(
                    "{p}[{l}::offset({e})] = mucc::from_compute<{ty}>({v});"
                )]
            }
            Sink::Global(o) => {
                let (p, l) = self.global_out(o, space, order)?;
                vec![format!(
                    "{p}[{l}::offset({e})] = mucc::from_compute<{}>(v);",
                    self.t()
                )]
            }
            Sink::Copy => return Err(self.internal("a copy chain has no value sink")),
            Sink::Accum(a) if self.accum_reduces(a) => {
                let len = space.dim(space.rank() - 1);
                self.reduce_atomic_lines(a, &format!("({e}) / {len}"), &format!("({e}) % {len}"))?
            }
            Sink::Accum(a) => self.accum_lines(a, space, order, e, r)?,
        })
    }

    /// Statements accumulating `v` into element-wise accumulator `a`.
    fn accum_lines(
        &mut self,
        a: Handle<TbOp>,
        space: &Shape,
        order: &[usize],
        e: &str,
        r: &str,
    ) -> Result<Vec<String>, EmitError> {
        let TbOpKind::Accum(kind) = self.tb.ops[a].kind else {
            return Err(self.internal("an accumulator sink names a non-accumulator"));
        };
        let i = a.index();
        if self.in_registers(a) {
            return match kind {
                AccumKind::Max => Ok(vec![format!(
                    "acc{i}[{r}] = mucc::tb::max_of(acc{i}[{r}], v);"
                )]),
                AccumKind::Nored => Ok(vec![format!("acc{i}[{r}] += v;")]),
                _ => Err(self.internal(&format!("accumulator op{i} cannot live in registers"))),
            };
        }
        let out = self.tb.ops[a].outputs[0];
        let l = self.tile_layout(out, order)?;
        let slot = format!("{}[{l}::offset({e})]", self.tile_ref(out));
        Ok(match kind {
            AccumKind::Max => vec![format!("mucc::tb::acc_max({slot}, v);")],
            AccumKind::Nored => vec![format!("mucc::tb::acc_add({slot}, v);")],
            AccumKind::NoredRescale => {
                let scale = self.tb.ops[a].inputs[1];
                let read = self.tile_read(scale, space, order, e)?;
                vec![
                    format!("const {} scale = {read};", self.compute()),
                    format!("mucc::tb::acc_rescale({slot}, scale, v);"),
                ]
            }
            _ => return Err(self.internal(&format!("accumulator op{i} reduces"))),
        })
    }

    /// Statements adding `v` at (`row`, `col`) of the space into reducing accumulator `a` with
    /// shared-memory atomics (its tile holds the compute type).
    pub(super) fn reduce_atomic_lines(
        &mut self,
        a: Handle<TbOp>,
        row: &str,
        col: &str,
    ) -> Result<Vec<String>, EmitError> {
        let TbOpKind::Accum(kind) = self.tb.ops[a].kind else {
            return Err(self.internal("an accumulator sink names a non-accumulator"));
        };
        let out = self.tb.ops[a].outputs[0];
        let os = self.tb.tensors[out].shape;
        let l = self.tile_layout(out, &natural(&os))?;
        let p = self.tile_ref(out);
        let n = os.dim(os.rank() - 1);
        Ok(vec![match kind {
            AccumKind::RedLdSum | AccumKind::RedLdMean => {
                format!("atomicAdd(&{p}[{l}::offset({row})], v);")
            }
            AccumKind::RedLdRms => format!("atomicAdd(&{p}[{l}::offset({row})], v * v);"),
            AccumKind::RedtoxLdSum => {
                format!("atomicAdd(&{p}[{l}::offset(({row}) * {n} + ({col}) % {n})], v);")
            }
            // Fusion never makes a rescaling accumulator a chain's sink (`graph::fusion`, rule 1:
            // it has a second input), so every reducing sink is one of the kinds above.
            _ => {
                return Err(self.internal(&format!(
                    "accumulator {} as the sink of a chain",
                    kind.name()
                )));
            }
        }])
    }

    /// Statements adding row sum `s` of row `row` into reducing accumulator `a`.
    pub(super) fn row_sink_lines(
        &mut self,
        a: Handle<TbOp>,
        row: &str,
    ) -> Result<Vec<String>, EmitError> {
        let out = self.tb.ops[a].outputs[0];
        let os = self.tb.tensors[out].shape;
        let natural = natural(&os);
        let l = self.tile_layout(out, &natural)?;
        let slot = format!("{}[{l}::offset({row})]", self.tile_ref(out));
        Ok(match self.tb.ops[a].kind {
            TbOpKind::Accum(AccumKind::RedLdSumRescale) => {
                let scale = self.tb.ops[a].inputs[1];
                let read = self.tile_read(scale, &os, &natural, row)?;
                vec![
                    format!("const {} scale = {read};", self.compute()),
                    format!("mucc::tb::acc_rescale({slot}, scale, s);"),
                ]
            }
            _ => vec![format!("mucc::tb::acc_add({slot}, s);")],
        })
    }

    /// Statements declaring `v`, the leader's value at element `e` of `space` (walked in
    /// `order`), with the members applied.
    fn value_lines(
        &mut self,
        lop: &TbOp,
        space: &Shape,
        order: &[usize],
        e: &str,
        cp: &ChainPlan,
    ) -> Result<Vec<String>, EmitError> {
        let c = self.compute();
        let mut lines = Vec::new();
        match &lop.kind {
            TbOpKind::Unary(u) => {
                let x = self.tile_read(lop.inputs[0], space, order, e)?;
                lines.push(format!("{c} v = {x};"));
                let approx = cp.approx_exp.filter(|_| cp.members.is_empty());
                lines.push(format!("v = {};", unary(u, approx, cp.approx_logistic, c)));
            }
            TbOpKind::Binary(b) => {
                let x = self.tile_read(lop.inputs[0], space, order, e)?;
                let y = self.tile_read(lop.inputs[1], space, order, e)?;
                lines.push(format!("const {c} x0 = {x};"));
                lines.push(format!("const {c} x1 = {y};"));
                lines.push(format!("{c} v = {};", cxx::binary(*b, "x0", "x1")));
            }
            TbOpKind::Concat { dim } => {
                let (a, b) = (lop.inputs[0], lop.inputs[1]);
                let (sa, sb) = (self.tb.tensors[a].shape, self.tb.tensors[b].shape);
                let inner: usize = space.dims()[dim + 1..].iter().product();
                let (eo, ea, eb) = (space.dim(*dim), sa.dim(*dim), sb.dim(*dim));
                let nat = natural(&sa);
                let ra = self.tile_read(
                    a,
                    &sa,
                    &nat,
                    &format!("(outer_ * {ea} + mid_) * {inner} + in_"),
                )?;
                let rb = self.tile_read(
                    b,
                    &sb,
                    &nat,
                    &format!("(outer_ * {eb} + mid_ - {ea}) * {inner} + in_"),
                )?;
                lines.push(format!("const int outer_ = ({e}) / {}, mid_ = (({e}) / {inner}) % {eo}, in_ = ({e}) % {inner};", eo * inner));
                lines.push(format!("{c} v;"));
                lines.push(format!("if (mid_ < {ea}) v = {ra};"));
                lines.push(format!("else v = {rb};"));
            }
            TbOpKind::Accum(_) => {
                let x = self.tile_read(lop.inputs[0], space, order, e)?;
                lines.push(format!("{c} v = {x};"));
            }
            // `chain` sends only these kinds here (inputs, outputs, matmuls, rms_norm and
            // reductions have passes of their own).
            other => {
                return Err(self.internal(&format!(
                    "{} as the leader of an element-wise chain",
                    other.name()
                )));
            }
        }
        lines.extend(self.member_lines(cp, Some((space, order, e)))?);
        Ok(lines)
    }

    /// The value lines of a run of `v` elements starting at element `e` (each tile read by one
    /// vector load, the element `j` of the run in the lines' loop) and those loads.
    fn vector_values(
        &mut self,
        lop: &TbOp,
        space: &Shape,
        order: &[usize],
        cp: &ChainPlan,
        v: usize,
    ) -> Result<(Vec<String>, Vec<String>), EmitError> {
        self.vector_loads = Some((v, Vec::new()));
        self.broadcast_reads = cp.broadcast_reads.clone();
        let body = self.value_lines(lop, space, order, "e", cp);
        let loads = self.vector_loads.take().map(|(_, l)| l).unwrap_or_default();
        self.broadcast_reads.clear();
        Ok((loads, body?))
    }

    /// An element-wise chain (unary, binary, concat leaders, or an accumulator as leader).
    fn elementwise_chain(&mut self, lop: &TbOp, cp: &ChainPlan) -> Result<(), EmitError> {
        let (nt, c) = (self.nt, self.compute());
        // The space the leader produces (an accumulator leader: its input's).
        let space = match &lop.kind {
            TbOpKind::Accum(_) => self.tb.tensors[lop.inputs[0]].shape,
            _ => self.tb.tensors[lop.outputs[0]].shape,
        };
        let order = cp.order.clone();
        if let Sink::Accum(a) = cp.sink
            && self.accum_reduces(a)
        {
            if matches!(self.tb.ops[a].kind, TbOpKind::Accum(AccumKind::RedtoxLdSum)) {
                return self.redtox_chain(a, lop, &space, &order, cp);
            }
            // Row sums, by the accumulator's row split.
            let split = self.row_split(a)?;
            let (rows, len, tpr) = (split.rows, split.len, split.threads_per_row);
            let rms = matches!(self.tb.ops[a].kind, TbOpKind::Accum(AccumKind::RedLdRms));
            let term = if rms { "v * v" } else { "v" };
            let done = self.row_sink_lines(a, "row")?;
            let v = cp.vector;
            if v > 1 {
                // A run of v elements per call: one vector load per tile, the run's sum.
                let (loads, mut body) = self.vector_values(lop, &space, &order, cp, v)?;
                body.push(format!("s_ += {term};"));
                let zero = cxx::number(0.0, c);
                self.w.block("", "", |w| {
                    w.block("auto elem = [&](int row, int j0)", ";", |w| {
                        w.line(format!("const int e = row * {len} + j0;"));
                        lines(w, &loads);
                        w.line(format!("{c} s_ = {zero};"));
                        w.line("#pragma unroll");
                        w.block(format!("for (int j = 0; j < {v}; ++j)"), "", |w| {
                            lines(w, &body)
                        });
                        w.line("return s_;");
                    });
                    w.block(format!("auto sink = [&](int row, {c} s)"), ";", |w| {
                        lines(w, &done)
                    });
                    w.line(format!(
                        "mucc::tb::for_each_row<{nt}, {tpr}, {rows}, {len}, {c}, {v}>(tid, elem, sink);"
                    ));
                });
                return Ok(());
            }
            let mut elem =
                self.value_lines(lop, &space, &order, &format!("row * {len} + j"), cp)?;
            elem.push(format!("return {term};"));
            self.w.block("", "", |w| {
                w.block("auto elem = [&](int row, int j)", ";", |w| lines(w, &elem));
                w.block(format!("auto sink = [&](int row, {c} s)"), ";", |w| {
                    lines(w, &done)
                });
                w.line(format!(
                    "mucc::tb::for_each_row<{nt}, {tpr}, {rows}, {len}, {c}>(tid, elem, sink);"
                ));
            });
            return Ok(());
        }
        if cp.vector > 1 {
            return self.vector_chain(lop, cp, &space, &order);
        }
        let mut body = self.value_lines(lop, &space, &order, "e", cp)?;
        body.extend(self.sink_lines(cp.sink, &space, &order, "e", "r")?);
        let unrolled = matches!(cp.sink, Sink::Accum(a) if self.in_registers(a));
        let (f, r) = if unrolled {
            ("for_each_unrolled", "int r")
        } else {
            ("for_each", "int")
        };
        let n = space.numel();
        self.w.block(
            format!("mucc::tb::{f}<{nt}, {n}>(tid, [&](int e, {r})"),
            ");",
            |w| lines(w, &body),
        );
        Ok(())
    }

    /// A vectorised element-wise chain ([`crate::sched::ChainPlan::vector`] V > 1, a tile or
    /// device-tensor sink): each thread step loads V consecutive elements of every tile it reads
    /// with one vector load (a tile broadcast along the step: one scalar), computes them in
    /// registers and stores them with one vector store.
    fn vector_chain(
        &mut self,
        lop: &TbOp,
        cp: &ChainPlan,
        space: &Shape,
        order: &[usize],
    ) -> Result<(), EmitError> {
        let (p, l) = match cp.sink {
            Sink::Tile(sink) => (self.tile_ref(sink), self.tile_layout(sink, order)?),
            Sink::Global(o) => self.global_out(o, space, order)?,
            _ => {
                return Err(self.internal(
                    "a vectorised chain that stores to neither a tile nor a device tensor",
                ));
            }
        };
        let (nt, c, v) = (self.nt, self.compute(), cp.vector);
        let (loads, mut body) = self.vector_values(lop, space, order, cp, v)?;
        body.push(match cp.sink {
            Sink::Tile(t) => format!("out_[j] = {};", self.stored_value(t, "v")),
            _ => "out_[j] = v;".into(),
        });
        self.w.block(
            format!(
                "mucc::tb::for_each_step<{nt}, {}, {v}>(tid, [&](int e)",
                space.numel()
            ),
            ");",
            |w| {
                lines(w, &loads);
                w.line(format!("{c} out_[{v}];"));
                w.line("#pragma unroll");
                w.block(format!("for (int j = 0; j < {v}; ++j)"), "", |w| {
                    lines(w, &body)
                });
                w.line(format!(
                    "mucc::tb::store_run<{v}>({p} + {l}::offset(e), out_);"
                ));
            },
        );
        Ok(())
    }

    /// A chain into a strided-group accumulator: each output element sums its group.
    fn redtox_chain(
        &mut self,
        a: Handle<TbOp>,
        lop: &TbOp,
        space: &Shape,
        order: &[usize],
        cp: &ChainPlan,
    ) -> Result<(), EmitError> {
        let (nt, c) = (self.nt, self.compute());
        let out = self.tb.ops[a].outputs[0];
        let os = self.tb.tensors[out].shape;
        let dimx = self.tb.reduction_dimx;
        let len = space.dim(space.rank() - 1);
        let k = len / dimx;
        let e = format!("(o / {dimx}) * {len} + kk * {dimx} + o % {dimx}");
        let mut value = self.value_lines(lop, space, order, &e, cp)?;
        value.push("s += v;".into());
        let l = self.tile_layout(out, &natural(&os))?;
        let p = self.tile_ref(out);
        let n = os.numel();
        self.w.block(
            format!("mucc::tb::for_each<{nt}, {n}>(tid, [&](int o, int)"),
            ");",
            |w| {
                w.line(format!("{c} s = {};", cxx::number(0.0, c)));
                w.block(format!("for (int kk = 0; kk < {k}; ++kk)"), "", |w| {
                    lines(w, &value)
                });
                w.line(format!("mucc::tb::acc_add({p}[{l}::offset(o)], s);"));
            },
        );
        Ok(())
    }

    /// rms_norm rows: the normalised values go through the members to the sink; a row-summing
    /// accumulator takes each row's total.
    fn rms_chain(
        &mut self,
        lead: Handle<TbOp>,
        lop: &TbOp,
        cp: &ChainPlan,
    ) -> Result<(), EmitError> {
        let (nt, c) = (self.nt, self.compute());
        let x = lop.inputs[0];
        let s = self.tb.tensors[x].shape;
        let split = self.row_split(lead)?;
        let (rows, len, tpr) = (split.rows, split.len, split.threads_per_row);
        let nat = natural(&s);
        let xr = self.tile_read(x, &s, &nat, &format!("row * {len} + j"))?;
        let mut out = vec!["(void)row;".to_string(), "(void)j;".to_string()];
        out.extend(self.member_lines(cp, None)?);
        let mut done = vec!["(void)row;".to_string(), "(void)s;".to_string()];
        let total = match cp.sink {
            Sink::Accum(a)
                if self.accum_reduces(a)
                    && !matches!(self.tb.ops[a].kind, TbOpKind::Accum(AccumKind::RedtoxLdSum)) =>
            {
                let rms = matches!(self.tb.ops[a].kind, TbOpKind::Accum(AccumKind::RedLdRms));
                out.push(if rms { "return v * v;" } else { "return v;" }.into());
                done.extend(self.row_sink_lines(a, "row")?);
                true
            }
            sink => {
                out.extend(self.sink_lines(sink, &s, &nat, &format!("row * {len} + j"), "0")?);
                out.push(format!("return {};", cxx::number(0.0, c)));
                false
            }
        };
        self.w.block("", "", |w| {
            w.block("auto x = [&](int row, int j)", ";", |w| {
                w.line(format!("return {xr};"))
            });
            w.block(format!("auto out = [&](int row, int j, {c} v)"), ";", |w| {
                lines(w, &out)
            });
            w.block(format!("auto done = [&](int row, {c} s)"), ";", |w| {
                lines(w, &done)
            });
            w.line(format!(
                "mucc::tb::rms_rows<{nt}, {tpr}, {rows}, {len}, {total}, {c}>(tid, x, out, done);"
            ));
        });
        Ok(())
    }

    /// A sum (or strided grouped sum) over one dim: a row per output element.
    fn reduction_chain(
        &mut self,
        lead: Handle<TbOp>,
        lop: &TbOp,
        dim: usize,
        kind: TbReduction,
        cp: &ChainPlan,
    ) -> Result<(), EmitError> {
        let (nt, c) = (self.nt, self.compute());
        let x = lop.inputs[0];
        let xs = self.tb.tensors[x].shape;
        let os = self.tb.tensors[lop.outputs[0]].shape;
        let to = if kind == TbReduction::ToDimx {
            self.tb.reduction_dimx
        } else {
            1
        };
        let inner: usize = os.dims()[dim + 1..].iter().product();
        let split = self.row_split(lead)?;
        // The elements reduced per row: the plan's (a dim, or a dim / dimx for to-dimx).
        let (rows, tpr, k) = (split.rows, split.threads_per_row, split.len);
        // The element function: one element, or (a plain max by vectors, the plan's width) a
        // run of v elements of a row by one vector load, the run's max (`run`: its first value
        // and the value of element j).
        let v = cp.vector;
        let by_vectors = v > 1;
        if by_vectors && !(kind == TbReduction::PlainMax && inner == 1) {
            return Err(self.internal(&format!(
                "op{} reduces by vectors of {v}, which only a plain max over the last dim does",
                lead.index()
            )));
        }
        let (elem, run) = if by_vectors {
            self.vector_loads = Some((v, Vec::new()));
            self.broadcast_reads = cp.broadcast_reads.clone();
            let x0 = self.tile_read(x, &xs, &natural(&xs), "e");
            let mut elem = vec![format!("const int e = row * {k} + j0;")];
            elem.extend(self.vector_loads.take().map(|(_, l)| l).unwrap_or_default());
            self.broadcast_reads.clear();
            let x0 = x0?;
            (elem, Some((x0.replace("[j]", "[0]"), x0)))
        } else {
            let idx = format!(
                "(row / {ti}) * {tki} + (j * {to} + (row / {inner}) % {to}) * {inner} + row % {inner}",
                ti = to * inner,
                tki = to * k * inner
            );
            let xr = self.tile_read(x, &xs, &natural(&xs), &idx)?;
            (vec![format!("return {xr};")], None)
        };
        let mut sink = vec![format!("{c} v = s;")];
        sink.extend(self.member_lines(cp, None)?);
        sink.extend(self.sink_lines(cp.sink, &os, &natural(&os), "row", "0")?);
        // The combining operation: a sum unless the plain max, with its run length.
        let op = match kind {
            TbReduction::PlainMax => format!(", {}, mucc::tb::Max", if by_vectors { v } else { 1 }),
            _ => String::new(),
        };
        let head = if by_vectors {
            "auto elem = [&](int row, int j0)"
        } else {
            "auto elem = [&](int row, int j)"
        };
        self.w.block("", "", |w| {
            w.block(head, ";", |w| {
                lines(w, &elem);
                if let Some((first, at_j)) = &run {
                    w.line(format!("{c} s_ = {first};"));
                    w.line("#pragma unroll");
                    w.block(format!("for (int j = 1; j < {v}; ++j)"), "", |w| {
                        w.line(format!("s_ = mucc::tb::Max::join(s_, {at_j});"))
                    });
                    w.line("return s_;");
                }
            });
            w.block(format!("auto sink = [&](int row, {c} s)"), ";", |w| {
                lines(w, &sink)
            });
            w.line(format!(
                "mucc::tb::for_each_row<{nt}, {tpr}, {rows}, {k}, {c}{op}>(tid, elem, sink);"
            ));
        });
        Ok(())
    }

    /// Running max over the iterations (out0, the state) and previous − new (out1).
    fn running_max(&mut self, lop: &TbOp, dim: usize) -> Result<(), EmitError> {
        let nt = self.nt;
        let x = lop.inputs[0];
        let (o0, o1) = (lop.outputs[0], lop.outputs[1]);
        let xs = self.tb.tensors[x].shape;
        let os = self.tb.tensors[o0].shape;
        let inner: usize = os.dims()[dim + 1..].iter().product();
        let k = xs.dim(dim);
        let nat = natural(&xs);
        let lx = self.tile_layout(x, &nat)?;
        let l0 = self.tile_layout(o0, &nat)?;
        let l1 = self.tile_layout(o1, &nat)?;
        let (px, p0, p1) = (self.tile_ref(x), self.tile_ref(o0), self.tile_ref(o1));
        let n = os.numel();
        self.w.line(format!(
            "mucc::tb::running_max<{nt}, {n}, {k}, {inner}, {lx}, {l0}, {l1}>(tid, {px}, {p0}, {p1});"
        ));
        Ok(())
    }
}

/// `u(v)` in compute type `c`; `exp` through `ex2.approx` as `approx` says (the plan's
/// [`ChainPlan::approx_exp`]), silu and sigmoid by their approximate forms where `logistic`
/// ([`ChainPlan::approx_logistic`]).
fn unary(
    u: &crate::graph::ops::UnaryOp,
    approx: Option<ApproxExp>,
    logistic: bool,
    c: &str,
) -> String {
    use crate::graph::ops::UnaryOp;
    match (u, approx) {
        (UnaryOp::Exp, Some(ApproxExp::Ex2)) => "mucc::op::exp_approx(v)".to_string(),
        (UnaryOp::Exp, Some(ApproxExp::Ex2FlushToZero)) => {
            "mucc::op::exp_approx_ftz(v)".to_string()
        }
        (UnaryOp::Silu, _) if logistic => "mucc::op::silu_approx(v)".to_string(),
        (UnaryOp::Sigmoid, _) if logistic => "mucc::op::sigmoid_approx(v)".to_string(),
        (u, _) => cxx::unary(u, "v", c),
    }
}

/// Writes `body`'s lines.
pub(super) fn lines(w: &mut cxx::Writer, body: &[String]) {
    for l in body {
        w.line(l);
    }
}
