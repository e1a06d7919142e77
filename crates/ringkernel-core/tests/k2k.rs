//! Routing tables for 2-D and 3-D tile grids, and the device layouts of K2K inboxes and
//! route entries.
//!
//! Run: `cargo test -p ringkernel-core --test k2k`.

use ringkernel_core::k2k::{
    inbox_flags, route_flags, Dir2, Dir3, K2kInboxHeader, RouteEntry, RoutingTable2D,
    RoutingTable3D, K2K_INBOX_HEADER_FIELDS, ROUTE_ENTRY_FIELDS,
};
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
fn grid_2d_row_major_and_entries() {
    let t = RoutingTable2D::new(3, 2, ids(6), false).unwrap();
    // Row-major: (x, y) -> y * width + x.
    assert_eq!(t.id_at(2, 1), Some(KernelId(100 + 3 * 5)));
    let e = t.route_entries(0, 0);
    assert_eq!(e[0].flags, 0, "no north neighbour at the top edge");
    assert_eq!(e[0].direction, Dir2::North.code());
    assert_eq!(e[1].dest_kernel, 109);
    assert_eq!(e[1].flags, route_flags::VALID);
    assert_eq!(e[2].dest_kernel, 103);
    let e = t.route_entries_with(1, 1, |id| id.0 as u64 * 4096);
    assert_eq!(e[0].inbox_addr, 103 * 4096);
    assert_eq!(e[1].inbox_addr, 0);
    let p = RoutingTable2D::new(3, 2, ids(6), true).unwrap();
    let e = p.route_entries(0, 0);
    assert_eq!(e[3].dest_kernel, 106);
    assert_eq!(e[3].flags, route_flags::VALID | route_flags::WRAPPED);
    assert_eq!(e[2].flags, route_flags::VALID);
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
                        let entry = t.route_entries([x, y, z])[k];
                        assert_eq!(entry.dest_kernel, want.map_or(0, |k| k.0));
                        assert_eq!(entry.flags & route_flags::VALID != 0, want.is_some());
                        assert_eq!(entry.direction, dir.code());
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

#[test]
fn device_layout_tables_match_the_structs() {
    let h = K2kInboxHeader::default();
    let base = &h as *const _ as usize;
    let actual = [
        ("head", &h.head as *const _ as usize),
        ("tail", &h.tail as *const _ as usize),
        ("capacity", &h.capacity as *const _ as usize),
        ("slot_size", &h.slot_size as *const _ as usize),
        ("mask", &h.mask as *const _ as usize),
        ("owner_kernel", &h.owner_kernel as *const _ as usize),
        ("delivered", &h.delivered as *const _ as usize),
        ("rejected", &h.rejected as *const _ as usize),
        ("flags", &h.flags as *const _ as usize),
        ("reserved", &h.reserved as *const _ as usize),
    ];
    assert_eq!(actual.len(), K2K_INBOX_HEADER_FIELDS.len());
    for ((name, addr), (tname, toff)) in actual.iter().zip(K2K_INBOX_HEADER_FIELDS) {
        assert_eq!((*name, addr - base), (*tname, *toff));
    }
    assert_eq!(std::mem::size_of::<K2kInboxHeader>(), 64);

    let r = RouteEntry::default();
    let base = &r as *const _ as usize;
    let actual = [
        ("dest_kernel", &r.dest_kernel as *const _ as usize),
        ("direction", &r.direction as *const _ as usize),
        ("inbox_addr", &r.inbox_addr as *const _ as usize),
        ("flags", &r.flags as *const _ as usize),
        ("reserved", &r.reserved as *const _ as usize),
    ];
    assert_eq!(actual.len(), ROUTE_ENTRY_FIELDS.len());
    for ((name, addr), (tname, toff)) in actual.iter().zip(ROUTE_ENTRY_FIELDS) {
        assert_eq!((*name, addr - base), (*tname, *toff));
    }
    assert_eq!(std::mem::size_of::<RouteEntry>(), 32);
}

#[test]
fn inbox_header_constructor() {
    let h = K2kInboxHeader::new(KernelId(7), 16, 256).unwrap();
    assert_eq!(
        (h.capacity, h.slot_size, h.mask, h.owner_kernel),
        (16, 256, 15, 7)
    );
    assert_eq!(h.flags, inbox_flags::ACTIVE);
    assert_eq!((h.head, h.tail), (0, 0));
    assert!(matches!(
        K2kInboxHeader::new(KernelId(7), 12, 256),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        K2kInboxHeader::new(KernelId(7), 16, 200),
        Err(Error::InvalidArgument(_))
    ));
}
