//! K2K inbox and route layouts (core's 64-byte `K2kInboxHeader` and 32-byte
//! `RouteEntry`) as the Metal backend lays them out in one shared buffer.

use ringkernel_core::k2k::{
    inbox_flags, route_flags, Dir2, K2kInboxHeader, K2kReceipt, RouteEntry, RoutingTable2D,
    RoutingTable3D, K2K_INBOX_HEADER_FIELDS, ROUTE_ENTRY_FIELDS,
};
use ringkernel_core::message::{Envelope, MessageHeader};
use ringkernel_core::runtime::KernelId;
use ringkernel_core::Error;
use ringkernel_metal::k2k::{close, pop, push, InboxArena};
use std::mem::{offset_of, size_of};

#[test]
fn field_tables_match_the_structs() {
    assert_eq!(size_of::<K2kInboxHeader>(), 64);
    assert_eq!(size_of::<RouteEntry>(), 32);
    for (name, off) in K2K_INBOX_HEADER_FIELDS {
        let actual = match *name {
            "head" => offset_of!(K2kInboxHeader, head),
            "tail" => offset_of!(K2kInboxHeader, tail),
            "capacity" => offset_of!(K2kInboxHeader, capacity),
            "slot_size" => offset_of!(K2kInboxHeader, slot_size),
            "mask" => offset_of!(K2kInboxHeader, mask),
            "owner_kernel" => offset_of!(K2kInboxHeader, owner_kernel),
            "delivered" => offset_of!(K2kInboxHeader, delivered),
            "rejected" => offset_of!(K2kInboxHeader, rejected),
            "flags" => offset_of!(K2kInboxHeader, flags),
            "reserved" => offset_of!(K2kInboxHeader, reserved),
            other => panic!("unknown inbox field {other}"),
        };
        assert_eq!(actual, *off, "K2kInboxHeader.{name}");
    }
    for (name, off) in ROUTE_ENTRY_FIELDS {
        let actual = match *name {
            "dest_kernel" => offset_of!(RouteEntry, dest_kernel),
            "direction" => offset_of!(RouteEntry, direction),
            "inbox_addr" => offset_of!(RouteEntry, inbox_addr),
            "flags" => offset_of!(RouteEntry, flags),
            "reserved" => offset_of!(RouteEntry, reserved),
            other => panic!("unknown route field {other}"),
        };
        assert_eq!(actual, *off, "RouteEntry.{name}");
    }
}

fn msg(id: u64, len: usize) -> (MessageHeader, Vec<u8>) {
    let mut h = MessageHeader::new(7, len);
    h.message_id = id;
    (h, (0..len as u8).collect())
}

#[test]
fn grid_2d_arena_routes_point_at_neighbour_inboxes() {
    let ids: Vec<KernelId> = (1..=6).map(KernelId).collect(); // 3 × 2
    let table = RoutingTable2D::new(3, 2, ids.clone(), true).unwrap();
    let arena = InboxArena::for_grid_2d(&table, 4, 128).unwrap();
    let mut buf = vec![0u8; arena.bytes()];
    arena.init(&mut buf).unwrap();
    for &k in &ids {
        let off = arena.inbox_offset(k).unwrap();
        assert_eq!(off % 64, 0, "inbox headers are 64-byte aligned");
        let h: K2kInboxHeader = bytemuck::pod_read_unaligned(&buf[off..off + 64]);
        assert_eq!(
            (h.owner_kernel, h.capacity, h.slot_size, h.mask),
            (k.0, 4, 128, 3)
        );
        assert_eq!(h.flags, inbox_flags::ACTIVE);
        let (roff, routes) = arena.routes(k).unwrap();
        assert_eq!(roff % 64, 0);
        assert_eq!(routes.len(), 4);
        let stored: Vec<RouteEntry> = buf[roff..roff + 4 * 32]
            .chunks(32)
            .map(bytemuck::pod_read_unaligned)
            .collect();
        assert_eq!(stored, routes);
        let (x, y) = table.position_of(k).unwrap();
        for (e, dir) in routes.iter().zip(Dir2::ALL) {
            let n = table.neighbour(x, y, dir).unwrap();
            assert_eq!(e.dest_kernel, n.0);
            assert_eq!(e.direction, dir.code());
            assert!(e.flags & route_flags::VALID != 0);
            assert_eq!(
                e.inbox_addr,
                arena.inbox_offset(n).unwrap() as u64,
                "route of {k} towards {dir:?}"
            );
        }
    }
    // Inboxes do not overlap each other or the routes.
    let mut spans: Vec<(usize, usize)> = ids
        .iter()
        .map(|&k| (arena.inbox_offset(k).unwrap(), 64 + 4 * 128))
        .collect();
    spans.extend(ids.iter().map(|&k| (arena.routes(k).unwrap().0, 4 * 32)));
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "{w:?}");
    }
    assert!(
        InboxArena::for_grid_2d(&table, 3, 128).is_err(),
        "capacity must be a power of two"
    );
}

#[test]
fn grid_3d_arena_has_six_routes_per_kernel() {
    let ids: Vec<KernelId> = (10..18).map(KernelId).collect();
    let table = RoutingTable3D::new([2, 2, 2], ids.clone(), false).unwrap();
    let arena = InboxArena::for_grid_3d(&table, 2, 256).unwrap();
    for &k in &ids {
        let (_, routes) = arena.routes(k).unwrap();
        assert_eq!(routes.len(), 6);
        let valid = routes
            .iter()
            .filter(|e| e.flags & route_flags::VALID != 0)
            .count();
        assert_eq!(
            valid, 3,
            "a corner of a non-periodic 2×2×2 grid has 3 neighbours"
        );
        for e in routes.iter().filter(|e| e.flags & route_flags::VALID == 0) {
            assert_eq!((e.dest_kernel, e.inbox_addr), (0, 0));
        }
    }
}

#[test]
fn inbox_push_pop_full_and_closed() {
    let ids = vec![KernelId(1), KernelId(2)];
    let table = RoutingTable2D::new(2, 1, ids, false).unwrap();
    let arena = InboxArena::for_grid_2d(&table, 2, 128).unwrap();
    let mut buf = vec![0u8; arena.bytes()];
    arena.init(&mut buf).unwrap();
    let off = arena.inbox_offset(KernelId(2)).unwrap();
    for i in 0..2 {
        let (h, p) = msg(i, 10);
        assert_eq!(push(&mut buf, off, &h, &p).unwrap(), K2kReceipt::Delivered);
    }
    let (h, p) = msg(9, 10);
    assert_eq!(push(&mut buf, off, &h, &p).unwrap(), K2kReceipt::QueueFull);
    let (h, p) = msg(9, 65);
    assert!(matches!(
        push(&mut buf, off, &h, &p),
        Err(Error::MessageTooLarge { size: 65, max: 64 })
    ));
    let e: Envelope = pop(&mut buf, off).unwrap().unwrap();
    assert_eq!(e.header.message_id, 0);
    assert_eq!(e.payload, (0..10u8).collect::<Vec<_>>());
    assert_eq!(pop(&mut buf, off).unwrap().unwrap().header.message_id, 1);
    assert!(pop(&mut buf, off).unwrap().is_none());
    let hdr: K2kInboxHeader = bytemuck::pod_read_unaligned(&buf[off..off + 64]);
    assert_eq!(
        (hdr.head, hdr.tail, hdr.delivered, hdr.rejected),
        (2, 2, 2, 1)
    );
    close(&mut buf, off).unwrap();
    let (h, p) = msg(3, 1);
    assert_eq!(push(&mut buf, off, &h, &p).unwrap(), K2kReceipt::NotFound);
    // The other inbox is untouched.
    let other = arena.inbox_offset(KernelId(1)).unwrap();
    assert!(pop(&mut buf, other).unwrap().is_none());
    let end = buf.len();
    assert!(
        pop(&mut buf, end).is_err(),
        "an offset outside the arena is an error"
    );
}
