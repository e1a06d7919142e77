//! Routing tables for 2-D and 3-D tile grids.
//!
//! Run: `cargo test -p ringkernel-core --test k2k`.

use ringkernel_core::k2k::{Dir2, Dir3, RoutingTable2D, RoutingTable3D};
use ringkernel_core::runtime::KernelId;
use ringkernel_core::Error;

fn ids(n: u32) -> Vec<KernelId> {
    // Non-contiguous ids so positions and ids cannot be confused.
    (0..n).map(|i| KernelId(100 + 3 * i)).collect()
}

/// Reference neighbour computed independently with signed arithmetic.
fn reference_2d(w: i64, h: i64, x: i64, y: i64, d: Dir2, periodic: bool) -> Option<KernelId> {
    let (dx, dy) = match d {
        Dir2::North => (0, -1),
        Dir2::South => (0, 1),
        Dir2::East => (1, 0),
        Dir2::West => (-1, 0),
    };
    let (mut nx, mut ny) = (x + dx, y + dy);
    if periodic {
        nx = (nx + w) % w;
        ny = (ny + h) % h;
    } else if nx < 0 || ny < 0 || nx >= w || ny >= h {
        return None;
    }
    Some(KernelId(100 + 3 * (ny * w + nx) as u32))
}

#[test]
fn grid_2d_matches_reference() {
    for (w, h) in [(1u32, 1u32), (1, 5), (4, 1), (3, 2), (5, 4)] {
        for periodic in [false, true] {
            let t = RoutingTable2D::new(w, h, ids(w * h), periodic).unwrap();
            for y in 0..h {
                for x in 0..w {
                    let n = t.neighbours(x, y);
                    for (k, d) in Dir2::ALL.into_iter().enumerate() {
                        let want =
                            reference_2d(w as i64, h as i64, x as i64, y as i64, d, periodic);
                        assert_eq!(
                            t.neighbour(x, y, d),
                            want,
                            "{w}x{h} p={periodic} ({x},{y}) {d:?}"
                        );
                        assert_eq!(n[k], want);
                        // Symmetry: my neighbour's opposite neighbour is me.
                        if let Some(nb) = want {
                            let (px, py) = t.position_of(nb).unwrap();
                            assert_eq!(t.neighbour(px, py, d.opposite()), t.id_at(x, y));
                        }
                    }
                    let me = t.id_at(x, y).unwrap();
                    assert_eq!(t.position_of(me), Some((x, y)));
                }
            }
            assert_eq!(t.neighbour(w, 0, Dir2::West), None, "outside the grid");
            assert_eq!(t.position_of(KernelId(1)), None);
        }
    }
}

#[test]
fn grid_2d_row_major_and_edges() {
    let t = RoutingTable2D::new(3, 2, ids(6), false).unwrap();
    // Row-major: (x, y) -> y * width + x.
    assert_eq!(t.id_at(2, 1), Some(KernelId(100 + 3 * 5)));
    assert_eq!(t.id_at(3, 0), None, "x outside the grid");
    assert_eq!(
        t.neighbours(0, 0),
        [None, Some(KernelId(109)), Some(KernelId(103)), None]
    );
    let p = RoutingTable2D::new(3, 2, ids(6), true).unwrap();
    assert_eq!(
        p.neighbours(0, 0),
        [
            Some(KernelId(109)),
            Some(KernelId(109)),
            Some(KernelId(103)),
            Some(KernelId(106))
        ]
    );
}

#[test]
fn grid_3d_x_fastest_and_wrap() {
    let (w, h, d) = (3u32, 2u32, 4u32);
    for periodic in [false, true] {
        let t = RoutingTable3D::new([w, h, d], ids(w * h * d), periodic).unwrap();
        for z in 0..d {
            for y in 0..h {
                for x in 0..w {
                    let me = t.id_at([x, y, z]).unwrap();
                    assert_eq!(me, KernelId(100 + 3 * ((z * h + y) * w + x)));
                    assert_eq!(t.position_of(me), Some([x, y, z]));
                    let n = t.neighbours([x, y, z]);
                    for (k, dir) in Dir3::ALL.into_iter().enumerate() {
                        let (axis, delta) = match dir {
                            Dir3::PosX => (0, 1i64),
                            Dir3::NegX => (0, -1),
                            Dir3::PosY => (1, 1),
                            Dir3::NegY => (1, -1),
                            Dir3::PosZ => (2, 1),
                            Dir3::NegZ => (2, -1),
                        };
                        let dims = [w as i64, h as i64, d as i64];
                        let mut q = [x as i64, y as i64, z as i64];
                        q[axis] += delta;
                        let want = if (0..dims[axis]).contains(&q[axis]) || periodic {
                            q[axis] = q[axis].rem_euclid(dims[axis]);
                            t.id_at([q[0] as u32, q[1] as u32, q[2] as u32])
                        } else {
                            None
                        };
                        assert_eq!(n[k], want, "p={periodic} ({x},{y},{z}) {dir:?}");
                        if let Some(nb) = want {
                            let pos = t.position_of(nb).unwrap();
                            assert_eq!(t.neighbour(pos, dir.opposite()), Some(me));
                        }
                    }
                }
            }
        }
        assert_eq!(t.neighbours([w, 0, 0]), [None; 6], "outside the grid");
    }
}

#[test]
fn bad_grids_are_invalid() {
    assert!(matches!(
        RoutingTable2D::new(3, 2, ids(5), false),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        RoutingTable2D::new(0, 2, vec![], false),
        Err(Error::InvalidArgument(_))
    ));
    let mut dup = ids(4);
    dup[3] = dup[0];
    assert!(matches!(
        RoutingTable2D::new(2, 2, dup.clone(), false),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        RoutingTable3D::new([2, 2, 1], dup, false),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        RoutingTable3D::new([2, 2, 2], ids(7), true),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        RoutingTable3D::new([u32::MAX, u32::MAX, u32::MAX], ids(1), true),
        Err(Error::InvalidArgument(_))
    ));
}
