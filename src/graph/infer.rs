//! Shape inference: the shape each operator produces from its operands' shapes
//! (`mirage-graph-format.md` §4). The builder uses these rules to create results; validation
//! uses them to check recorded shapes.

use super::error::ErrorKind;
use super::ops::{AXIS_NAMES, AccumKind, DimMap, TbReduction};
use super::shape::Shape;

type R = Result<Shape, ErrorKind>;

fn operands(msg: String) -> ErrorKind {
    ErrorKind::Operands(msg)
}

/// Kernel- or threadblock-level matmul. At threadblock level every leading dim must be 1; at
/// kernel level the leading (batch) dims of both operands must be equal.
pub fn matmul(a: &Shape, b: &Shape, threadblock: bool) -> R {
    if a.rank() != b.rank() {
        return Err(operands(format!(
            "matmul operands have different ranks: {a} and {b}"
        )));
    }
    let r = a.rank();
    if r < 2 {
        return Err(operands(format!(
            "matmul operands need at least 2 dims, found {a} and {b}"
        )));
    }
    if a.dim(r - 1) != b.dim(r - 2) {
        return Err(operands(format!(
            "matmul inner extents differ: A {a} has k = {}, B {b} has k = {}",
            a.dim(r - 1),
            b.dim(r - 2)
        )));
    }
    for d in 0..r - 2 {
        if threadblock && (a.dim(d) != 1 || b.dim(d) != 1) {
            return Err(operands(format!(
                "threadblock matmul operands must have leading dims of 1, found {a} and {b}"
            )));
        }
        if a.dim(d) != b.dim(d) {
            return Err(operands(format!(
                "matmul batch dims differ: {a} and {b} (no broadcasting)"
            )));
        }
    }
    Ok(a.with_dim(r - 1, b.dim(r - 1)))
}

/// Element-wise binary operator: broadcasting of equal-rank shapes.
pub fn binary(a: &Shape, b: &Shape) -> R {
    a.broadcast(b).ok_or_else(|| {
        operands(format!(
            "shapes {a} and {b} do not broadcast (equal ranks, and each dim equal or 1)"
        ))
    })
}

/// Checks that `dim` is a dim of `s`.
pub fn check_dim(s: &Shape, dim: usize, what: &str) -> Result<(), ErrorKind> {
    if dim >= s.rank() {
        Err(ErrorKind::BadValue(format!(
            "{what} {dim} is out of range for a {}-dim tensor {s}",
            s.rank()
        )))
    } else {
        Ok(())
    }
}

/// Concatenation of `parts` along `dim`.
pub fn concat(parts: &[Shape], dim: usize) -> R {
    let first = parts
        .first()
        .ok_or_else(|| operands("concat of nothing".into()))?;
    check_dim(first, dim, "concat dim")?;
    let mut total = 0usize;
    for p in parts {
        if p.rank() != first.rank() || (0..p.rank()).any(|d| d != dim && p.dim(d) != first.dim(d)) {
            return Err(operands(format!(
                "concat along dim {dim} needs equal extents in the other dims, found {first} and {p}"
            )));
        }
        total = total.saturating_add(p.dim(dim));
    }
    Ok(first.with_dim(dim, total))
}

/// Tile shape of a threadblock input (§4.4): each dim mapped by a grid axis with more than one
/// block is divided by that axis's size; the for-loop dim is further divided by F.
pub fn tb_input(
    d: &Shape,
    grid: [usize; 3],
    imap: DimMap,
    forloop_dim: Option<usize>,
    forloop_range: usize,
) -> R {
    let per_block = tb_input_grid(d, grid, imap)?;
    tb_input_loop(&per_block, forloop_dim, forloop_range)
}

/// The grid half of [`tb_input`]: the per-block extent of `d`.
pub fn tb_input_grid(d: &Shape, grid: [usize; 3], imap: DimMap) -> R {
    let mut s = *d;
    check_map(d, grid, imap, "input map")?;
    for a in 0..3 {
        if let (true, Some(dim)) = (grid[a] > 1, imap.axis(a)) {
            let e = s.dim(dim);
            if !e.is_multiple_of(grid[a]) {
                return Err(ErrorKind::NotDivisible {
                    what: format!(
                        "grid axis {} ({} blocks) partitions",
                        AXIS_NAMES[a], grid[a]
                    ),
                    dim,
                    extent: e,
                    by: grid[a],
                });
            }
            s = s.with_dim(dim, e / grid[a]);
        }
    }
    Ok(s)
}

/// The loop half of [`tb_input`]: the per-iteration tile of a per-block extent.
pub fn tb_input_loop(per_block: &Shape, forloop_dim: Option<usize>, forloop_range: usize) -> R {
    let Some(f) = forloop_dim else {
        return Ok(*per_block);
    };
    check_dim(per_block, f, "forloop_dim")?;
    let e = per_block.dim(f);
    if forloop_range == 0 || !e.is_multiple_of(forloop_range) {
        return Err(ErrorKind::NotDivisible {
            what: format!("the for-loop ({forloop_range} iterations) partitions per-block"),
            dim: f,
            extent: e,
            by: forloop_range,
        });
    }
    Ok(per_block.with_dim(f, e / forloop_range))
}

/// Checks a partition map: entries are dims of the tensor, and no two axes with more than one
/// block partition the same dim.
pub fn check_map(s: &Shape, grid: [usize; 3], map: DimMap, what: &str) -> Result<(), ErrorKind> {
    for a in 0..3 {
        if let Some(dim) = map.axis(a) {
            check_dim(s, dim, &format!("{what} entry {}", AXIS_NAMES[a]))?;
        }
    }
    for a in 0..3 {
        for b in a + 1..3 {
            if grid[a] > 1 && grid[b] > 1 && map.axis(a).is_some() && map.axis(a) == map.axis(b) {
                return Err(ErrorKind::AxesShareDim {
                    a: AXIS_NAMES[a],
                    b: AXIS_NAMES[b],
                    dim: map.axis(a).unwrap_or_default(),
                });
            }
        }
    }
    Ok(())
}

/// Shape of the DTensor a threadblock output writes (§4.4): each dim mapped by a grid axis with
/// more than one block is multiplied by that axis's size. Every such axis must be mapped.
pub fn tb_output(s: &Shape, grid: [usize; 3], omap: DimMap) -> R {
    check_map(s, grid, omap, "output map")?;
    let mut o = *s;
    for a in 0..3 {
        if grid[a] > 1 {
            match omap.axis(a) {
                Some(dim) => o = o.with_dim(dim, o.dim(dim).saturating_mul(grid[a])),
                None => {
                    return Err(ErrorKind::UnmappedGridAxis {
                        axis: AXIS_NAMES[a],
                        size: grid[a],
                    });
                }
            }
        }
    }
    Ok(o)
}

/// Shape after a threadblock reduction (for `Max`, the shape of both outputs).
pub fn tb_reduction(x: &Shape, dim: usize, kind: TbReduction, dimx: usize) -> R {
    check_dim(x, dim, "reduction dim")?;
    match kind {
        TbReduction::Sum | TbReduction::Max | TbReduction::PlainMax => Ok(x.with_dim(dim, 1)),
        TbReduction::ToDimx => {
            let e = x.dim(dim);
            if dimx == 0 || !e.is_multiple_of(dimx) {
                return Err(ErrorKind::NotDivisible {
                    what: "reduction to reduction_dimx groups".into(),
                    dim,
                    extent: e,
                    by: dimx,
                });
            }
            Ok(x.with_dim(dim, dimx))
        }
    }
}

/// Shape of a for-loop accumulator's result; `r` is the rescale operand of the rescale kinds.
pub fn accum(kind: AccumKind, x: &Shape, r: Option<&Shape>, dimx: usize) -> R {
    let last = x.rank() - 1;
    let out = match kind {
        AccumKind::Nored | AccumKind::NoredRescale | AccumKind::Max => *x,
        AccumKind::RedLdSum
        | AccumKind::RedLdMean
        | AccumKind::RedLdRms
        | AccumKind::RedLdSumRescale => x.with_dim(last, 1),
        AccumKind::RedtoxLdSum => tb_reduction(x, last, TbReduction::ToDimx, dimx)?,
    };
    if let Some(r) = r {
        match out.broadcast(r) {
            Some(b) if b == out => {}
            _ => {
                return Err(operands(format!(
                    "rescale factor {r} does not broadcast to the accumulator {out}"
                )));
            }
        }
    }
    Ok(out)
}

/// Output shape of a kernel-level reduction over `dim` to extent `to` (1, or a divisor of the
/// input extent for a strided grouped sum).
pub fn kn_reduction(x: &Shape, dim: usize, to: usize) -> R {
    check_dim(x, dim, "reduction dim")?;
    let e = x.dim(dim);
    if to == 0 || !e.is_multiple_of(to) {
        return Err(ErrorKind::NotDivisible {
            what: "reduction output groups".into(),
            dim,
            extent: e,
            by: to,
        });
    }
    Ok(x.with_dim(dim, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[usize]) -> Shape {
        Shape::new(d).unwrap()
    }

    #[test]
    fn gated_mlp_tiles() {
        // §6 of the format reference.
        let x = tb_input(&s(&[8, 4096]), [128, 1, 1], DimMap::NONE, Some(1), 64);
        assert_eq!(x, Ok(s(&[8, 64])));
        let w = tb_input(
            &s(&[4096, 4096]),
            [128, 1, 1],
            DimMap::from([1, -1, -1]),
            Some(0),
            64,
        );
        assert_eq!(w, Ok(s(&[64, 32])));
        assert_eq!(matmul(&s(&[8, 64]), &s(&[64, 32]), true), Ok(s(&[8, 32])));
        assert_eq!(
            tb_output(&s(&[8, 32]), [128, 1, 1], DimMap::from([1, -1, -1])),
            Ok(s(&[8, 4096]))
        );
    }

    #[test]
    fn errors() {
        assert!(matches!(
            tb_output(&s(&[8, 32]), [128, 2, 1], DimMap::from([1, -1, -1])),
            Err(ErrorKind::UnmappedGridAxis { axis: "y", size: 2 })
        ));
        assert!(matches!(
            tb_input(&s(&[8, 30]), [4, 1, 1], DimMap::from([1, -1, -1]), None, 1),
            Err(ErrorKind::NotDivisible {
                extent: 30,
                by: 4,
                ..
            })
        ));
        assert!(matches!(
            tb_input(&s(&[8, 32]), [2, 2, 1], DimMap::from([1, 1, -1]), None, 1),
            Err(ErrorKind::AxesShareDim {
                a: "x",
                b: "y",
                dim: 1
            })
        ));
        // An axis with one block is ignored.
        assert_eq!(
            tb_input(&s(&[8, 32]), [2, 1, 1], DimMap::from([1, 1, -1]), None, 1),
            Ok(s(&[8, 16]))
        );
        assert!(matmul(&s(&[2, 8, 64]), &s(&[2, 64, 32]), true).is_err());
        assert_eq!(
            matmul(&s(&[2, 8, 64]), &s(&[2, 64, 32]), false),
            Ok(s(&[2, 8, 32]))
        );
        assert_eq!(
            accum(AccumKind::RedtoxLdSum, &s(&[1, 16, 512]), None, 64),
            Ok(s(&[1, 16, 64]))
        );
        assert!(accum(AccumKind::RedtoxLdSum, &s(&[1, 16, 100]), None, 64).is_err());
        assert_eq!(
            accum(
                AccumKind::NoredRescale,
                &s(&[1, 16, 64]),
                Some(&s(&[1, 16, 1])),
                64
            ),
            Ok(s(&[1, 16, 64]))
        );
        assert!(
            accum(
                AccumKind::NoredRescale,
                &s(&[1, 16, 1]),
                Some(&s(&[1, 16, 64])),
                64
            )
            .is_err()
        );
        assert_eq!(concat(&[s(&[16, 256]), s(&[16, 16])], 1), Ok(s(&[16, 272])));
        assert!(concat(&[s(&[16, 256]), s(&[8, 16])], 1).is_err());
    }
}
