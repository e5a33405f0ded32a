//! Multi-GPU (tensor-parallel) graphs: the GPU mesh a kernel graph runs on and how each graph
//! input and output is partitioned across it (Mirage's `gpu_dim`, `kn_input_op.input_map` and
//! `kn_output_op.output_map`; `docs/multi-gpu.md` has the facts and references).
//!
//! The model is SPMD, as in Mirage: the kernel graph describes what *one* GPU (rank) computes,
//! and every DTensor shape in it is a per-rank shape. A graph input with map `m` is the rank's
//! shard of a *global* tensor: for each mesh axis `a` with more than one GPU and `m[a] = d`, the
//! global tensor's dim `d` is cut into `mesh[a]` equal consecutive pieces and the rank with
//! coordinate `c[a]` along that axis holds piece `c[a]` — the rule of a threadblock input map,
//! one level up (GPUs instead of blocks). An axis the map leaves unmapped replicates: every rank
//! along it holds the same data. Outputs are the inverse: the global output is the ranks'
//! outputs side by side along the mapped dims, and along an unmapped axis every rank holds a
//! copy (the first one is the result). `kn_allreduce_op` replaces its input on every rank by
//! the element-wise sum over all ranks.
//!
//! Mirage's JSON does not record the mesh (`gpu_dim` lives on the C++ graph object only), so it
//! comes from the caller ([`crate::graph::mirage_json::MirageFile::set_gpu_mesh`], the builder's
//! [`crate::graph::GraphBuilder::set_gpu_mesh`]) or from the `mucc_gpu_dim` key that mucc's
//! exporter writes. A graph whose mesh is unknown runs on one GPU; partitioning a tensor then is
//! a validation error, since the global shapes depend on the GPU count.

use std::collections::BTreeMap;
use std::fmt;

use super::arena::Handle;
use super::error::ErrorKind;
use super::kernel::KnOp;
use super::ops::{AXIS_NAMES, DimMap};
use super::shape::Shape;

/// The largest number of GPUs mucc accepts in one mesh.
pub const MAX_GPUS: usize = 1024;

/// A GPU mesh (Mirage's `gpu_dim`): the number of GPUs along the axes x, y and z. Ranks are
/// numbered with x fastest: rank = x + X·(y + Y·z), as CUDA numbers the blocks of a grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GpuMesh(pub [usize; 3]);

impl GpuMesh {
    /// One GPU.
    pub const SINGLE: GpuMesh = GpuMesh([1, 1, 1]);

    /// `n` GPUs along x (the only shape Mirage's runtime supports: it asserts y = z = 1).
    pub fn line(n: usize) -> GpuMesh {
        GpuMesh([n, 1, 1])
    }

    /// The number of GPUs (ranks).
    pub fn num_gpus(self) -> usize {
        self.0.iter().product()
    }

    /// The coordinates (x, y, z) of `rank`.
    pub fn coords(self, rank: usize) -> [usize; 3] {
        let [x, y, _] = self.0;
        [rank % x, (rank / x) % y, rank / (x * y)]
    }

    /// The rank at coordinates `c`.
    pub fn rank(self, c: [usize; 3]) -> usize {
        c[0] + self.0[0] * (c[1] + self.0[1] * c[2])
    }

    /// Checks the extents: each at least 1, at most [`MAX_GPUS`] GPUs in all.
    pub fn check(self) -> Result<(), ErrorKind> {
        if let Some(a) = self.0.iter().position(|&n| n == 0) {
            return Err(ErrorKind::BadValue(format!(
                "GPU mesh {self} has no GPUs along {} (every extent must be at least 1)",
                AXIS_NAMES[a]
            )));
        }
        let n = self
            .0
            .iter()
            .try_fold(1usize, |acc, &e| acc.checked_mul(e))
            .unwrap_or(usize::MAX);
        if n > MAX_GPUS {
            return Err(ErrorKind::BadValue(format!(
                "GPU mesh {self} has {n} GPUs; mucc accepts at most {MAX_GPUS}"
            )));
        }
        Ok(())
    }
}

impl fmt::Display for GpuMesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {}, {})", self.0[0], self.0[1], self.0[2])
    }
}

/// How a graph input or output is partitioned across the GPU mesh: for each mesh axis (x, y,
/// z), the tensor dim it splits, or `None` (replicated; −1 in Mirage's `input_map` /
/// `output_map`). The same triple as a threadblock map, over mesh axes instead of grid axes.
pub type GpuMap = DimMap;

/// The multi-GPU description of a kernel graph: its mesh and the partition maps of its inputs
/// and outputs. A side table keyed by operator (as naga keeps names of expressions), so that
/// single-GPU code never sees it; the default is one GPU with everything replicated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sharding {
    /// The GPU mesh; `None` when unknown (Mirage's JSON does not record it), which means one
    /// GPU for a graph that partitions nothing.
    pub mesh: Option<GpuMesh>,
    /// The map of every input or output operator whose map is not (−1, −1, −1).
    pub maps: BTreeMap<Handle<KnOp>, GpuMap>,
}

impl Sharding {
    /// The map of input/output operator `op` ((−1, −1, −1) if none was set).
    pub fn map(&self, op: Handle<KnOp>) -> GpuMap {
        self.maps.get(&op).copied().unwrap_or(DimMap::NONE)
    }

    /// Sets the map of input/output operator `op` ((−1, −1, −1) removes it).
    pub fn set_map(&mut self, op: Handle<KnOp>, map: GpuMap) {
        if map == DimMap::NONE {
            self.maps.remove(&op);
        } else {
            self.maps.insert(op, map);
        }
    }

    /// Whether some input or output map names a dim.
    pub fn is_partitioned(&self) -> bool {
        self.maps.values().any(|m| *m != DimMap::NONE)
    }

    /// The mesh the graph runs on: the recorded one, or one GPU when unknown.
    pub fn mesh_or_single(&self) -> GpuMesh {
        self.mesh.unwrap_or(GpuMesh::SINGLE)
    }

    /// The number of GPUs the graph runs on (1 when the mesh is unknown).
    pub fn num_gpus(&self) -> usize {
        self.mesh_or_single().num_gpus()
    }
}

/// Checks a map against the per-rank shape it partitions: every entry is a dim of the tensor,
/// and no two mesh axes split the same dim (whatever their extents: Mirage never writes that,
/// and the offsets would be ambiguous).
pub fn check_map(map: GpuMap, shape: &Shape) -> Result<(), ErrorKind> {
    for a in 0..3 {
        if let Some(d) = map.axis(a)
            && d >= shape.rank()
        {
            return Err(ErrorKind::BadValue(format!(
                "map entry {} = {d} names dim {d}, but the tensor {shape} has {} dims",
                AXIS_NAMES[a],
                shape.rank()
            )));
        }
    }
    for a in 0..3 {
        for b in a + 1..3 {
            if let Some(d) = map.axis(a)
                && map.axis(b) == Some(d)
            {
                return Err(ErrorKind::MeshAxesShareDim {
                    a: AXIS_NAMES[a],
                    b: AXIS_NAMES[b],
                    dim: d,
                });
            }
        }
    }
    Ok(())
}

/// The global shape of a tensor whose per-rank shape is `local`: each dim mapped by a mesh axis
/// with more than one GPU is multiplied by that axis's extent. `None` if the result overflows.
/// Assumes [`check_map`] passed.
pub fn global_shape(local: &Shape, map: GpuMap, mesh: GpuMesh) -> Option<Shape> {
    let mut dims = local.dims().to_vec();
    for a in 0..3 {
        if let (true, Some(d)) = (mesh.0[a] > 1, map.axis(a)) {
            let e = dims.get(d)?.checked_mul(mesh.0[a])?;
            dims[d] = e;
        }
    }
    Shape::new(&dims)
}

/// The per-rank shape of a tensor whose global shape is `global`: each dim mapped by a mesh
/// axis with more than one GPU is divided by that axis's extent, which must divide it.
pub fn local_shape(global: &Shape, map: GpuMap, mesh: GpuMesh) -> Result<Shape, ErrorKind> {
    check_map(map, global)?;
    let mut s = *global;
    for a in 0..3 {
        if let (true, Some(d)) = (mesh.0[a] > 1, map.axis(a)) {
            let e = s.dim(d);
            if !e.is_multiple_of(mesh.0[a]) {
                return Err(ErrorKind::NotDivisible {
                    what: format!(
                        "GPU mesh axis {} ({} GPUs) partitions",
                        AXIS_NAMES[a], mesh.0[a]
                    ),
                    dim: d,
                    extent: e,
                    by: mesh.0[a],
                });
            }
            s = s.with_dim(d, e / mesh.0[a]);
        }
    }
    Ok(s)
}

/// The origin, in the global tensor, of the shard held by the rank at coordinates `c`: along
/// each dim mapped by a mesh axis with more than one GPU, `c[axis]` times the per-rank extent.
pub fn shard_origin(local: &Shape, map: GpuMap, mesh: GpuMesh, c: [usize; 3]) -> Vec<usize> {
    let mut origin = vec![0; local.rank()];
    for a in 0..3 {
        if let (true, Some(d)) = (mesh.0[a] > 1, map.axis(a)) {
            origin[d] = c[a] * local.dim(d);
        }
    }
    origin
}

/// Whether the rank at coordinates `c` holds the copy of an output that counts: coordinate 0
/// along every mesh axis that the map leaves unmapped (the axes along which the output is
/// replicated).
pub fn is_first_replica(map: GpuMap, mesh: GpuMesh, c: [usize; 3]) -> bool {
    (0..3).all(|a| mesh.0[a] == 1 || map.axis(a).is_some() || c[a] == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(d: &[usize]) -> Shape {
        Shape::new(d).unwrap()
    }

    #[test]
    fn ranks_and_coordinates() {
        let m = GpuMesh([2, 3, 2]);
        assert_eq!(m.num_gpus(), 12);
        for r in 0..12 {
            assert_eq!(m.rank(m.coords(r)), r);
        }
        assert_eq!(m.coords(7), [1, 0, 1]);
        assert_eq!(GpuMesh::line(4).coords(3), [3, 0, 0]);
        assert!(GpuMesh([2, 0, 1]).check().is_err());
        assert!(GpuMesh([1024, 2, 1]).check().is_err());
        assert!(GpuMesh::line(8).check().is_ok());
        assert_eq!(GpuMesh::line(2).to_string(), "(2, 1, 1)");
    }

    #[test]
    fn global_and_local_shapes() {
        let m = GpuMesh([4, 2, 1]);
        let map = DimMap([Some(1), Some(0), None]);
        let local = shape(&[8, 16]);
        let g = global_shape(&local, map, m).unwrap();
        assert_eq!(g, shape(&[16, 64]));
        assert_eq!(local_shape(&g, map, m).unwrap(), local);
        assert_eq!(shard_origin(&local, map, m, [3, 1, 0]), vec![8, 48]);
        // An axis of extent 1 does not partition.
        let one = GpuMesh([1, 1, 1]);
        assert_eq!(global_shape(&local, map, one).unwrap(), local);
        assert!(matches!(
            local_shape(&shape(&[6, 10]), map, m),
            Err(ErrorKind::NotDivisible { dim: 1, by: 4, .. })
        ));
        assert!(matches!(
            check_map(DimMap([Some(2), None, None]), &local),
            Err(ErrorKind::BadValue(_))
        ));
        assert!(matches!(
            check_map(DimMap([Some(1), None, Some(1)]), &local),
            Err(ErrorKind::MeshAxesShareDim {
                a: "x",
                b: "z",
                dim: 1
            })
        ));
        assert!(is_first_replica(
            DimMap([Some(0), None, None]),
            m,
            [3, 0, 0]
        ));
        assert!(!is_first_replica(
            DimMap([Some(0), None, None]),
            m,
            [3, 1, 0]
        ));
    }
}
