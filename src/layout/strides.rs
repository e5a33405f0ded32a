//! Strides from an innermost dim: the innermost dim gets stride 1, a swizzled dim (if any) comes
//! next, then the other dims from last to first. The first dim of extent > 1 in that order is
//! padded to a multiple of 16 bytes, so that every row of the tensor starts 16-byte aligned
//! (the precondition of 16-byte copies and `ldmatrix`).

use crate::graph::shape::{Shape, Strides};

/// Rounds `x` up to a multiple of `m` (m ≥ 1).
pub fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

/// The dim order, innermost first: `innermost`, then `swizzled`, then the rest from last to first.
pub fn dim_order(rank: usize, innermost: usize, swizzled: Option<usize>) -> Vec<usize> {
    let mut order = vec![innermost];
    if let Some(s) = swizzled.filter(|&s| s != innermost) {
        order.push(s);
    }
    let rest: Vec<usize> = (0..rank).rev().filter(|d| !order.contains(d)).collect();
    order.extend(rest);
    order
}

/// Strides and the number of physical elements (the allocation, at least 16 bytes) of `shape`
/// with this innermost (and optionally swizzled) dim, for elements of `elem_bytes` bytes.
pub fn padded_strides(
    shape: &Shape,
    innermost: usize,
    swizzled: Option<usize>,
    elem_bytes: usize,
) -> (Strides, usize) {
    let align = (16 / elem_bytes.max(1)).max(1);
    let mut strides = vec![0; shape.rank()];
    let mut run = 1usize;
    let mut padded = false;
    for d in dim_order(shape.rank(), innermost, swizzled) {
        strides[d] = run;
        let e = shape.dim(d);
        if e != 1 {
            run = run.saturating_mul(if padded { e } else { round_up(e, align) });
            padded = true;
        }
    }
    if run == 1 {
        run = align;
    }
    (Strides(strides), run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_rule() {
        let s = Shape::new(&[8, 50]).unwrap();
        // fp16: 8 elements per 16 bytes; rows of 50 are padded to 56.
        assert_eq!(padded_strides(&s, 1, None, 2), (Strides(vec![56, 1]), 448));
        // Column-major: columns of 8 are already 16 bytes.
        assert_eq!(padded_strides(&s, 0, None, 2), (Strides(vec![1, 8]), 400));
        let t = Shape::new(&[1, 16, 64]).unwrap();
        assert_eq!(
            padded_strides(&t, 2, None, 2),
            (Strides(vec![1024, 64, 1]), 1024)
        );
        assert_eq!(
            padded_strides(&t, 1, Some(2), 2),
            (Strides(vec![1024, 1, 16]), 1024)
        );
        // fp32 vector [1, 1] still takes 16 bytes.
        let u = Shape::new(&[1, 1]).unwrap();
        assert_eq!(padded_strides(&u, 1, None, 4).1, 4);
        assert_eq!(dim_order(4, 1, Some(3)), vec![1, 3, 2, 0]);
    }
}
