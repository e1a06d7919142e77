//! Each macro of ringkernel-derive, used as a user would.

use ringkernel_core::builtin::Token;
use ringkernel_core::context::KernelContext;
use ringkernel_core::gpu_type::{wgsl_struct_layout, GpuType};
use ringkernel_core::message::{read_slot, write_slot, Envelope, RingMessage, DEFAULT_SLOT_SIZE};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::RingKernelRuntime;
use ringkernel_core::Error;
use ringkernel_cpu::CpuRuntime;
use ringkernel_derive::{ring_kernel, GpuType, RingMessage};
use std::mem::{offset_of, size_of};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, RingMessage)]
#[message(type_id = 0x0D00_0001)]
#[repr(C)]
struct Scale {
    id: u64,
    factor: f32,
    value: f32,
}

#[derive(Clone, Copy, Debug, PartialEq, RingMessage)]
#[message(type_id = 0x0D00_0002, name = "scaled")]
#[repr(C)]
struct Scaled {
    id: u64,
    value: f32,
    calls: u32,
}

/// A tuple struct with `repr(transparent)` and a constant expression as its id.
#[derive(Clone, Copy, Debug, PartialEq, RingMessage)]
#[message(type_id = BASE_ID + 3)]
#[repr(transparent)]
struct Ticket([u32; 4]);

const BASE_ID: u32 = 0x0D00_0000;

#[test]
fn ring_message_constants_and_pod() {
    assert_eq!(Scale::TYPE_ID, 0x0D00_0001);
    assert_eq!(Scale::NAME, "Scale");
    assert_eq!(Scaled::NAME, "scaled");
    assert_eq!(Ticket::TYPE_ID, 0x0D00_0003);
    assert_eq!(size_of::<Scale>(), 16);
    // Pod: a message can be viewed as bytes and back.
    let s = Scale {
        id: 9,
        factor: 2.0,
        value: -1.5,
    };
    let bytes = bytemuck::bytes_of(&s);
    assert_eq!(bytes.len(), 16);
    assert_eq!(bytemuck::pod_read_unaligned::<Scale>(bytes), s);
    let z: Ticket = bytemuck::Zeroable::zeroed();
    assert_eq!(z, Ticket([0; 4]));
}

#[test]
fn ring_message_round_trips_through_a_slot() {
    let msg = Scale {
        id: 1 << 40,
        factor: 0.5,
        value: 8.0,
    };
    let mut env = Envelope::new(&msg);
    env.header.message_id = 77;
    let mut slot = vec![0u8; DEFAULT_SLOT_SIZE];
    write_slot(&mut slot, &env.header, &env.payload).unwrap();
    let back = read_slot(&slot).unwrap();
    assert_eq!(back.header.type_id, Scale::TYPE_ID);
    assert_eq!(back.header.message_id, 77);
    assert!(back.is::<Scale>());
    assert_eq!(back.decode::<Scale>().unwrap(), msg);
    // Decoding as another derived message is a typed error, not garbage.
    assert_eq!(
        back.decode::<Scaled>(),
        Err(Error::TypeMismatch {
            expected: Scaled::TYPE_ID,
            found: Scale::TYPE_ID
        })
    );
    let t = Ticket([1, 2, 3, 4]);
    assert_eq!(Envelope::new(&t).decode::<Ticket>().unwrap(), t);
}

#[derive(Clone, Copy, Debug, PartialEq, GpuType)]
#[repr(C)]
struct Particle {
    id: u64,
    pos: [f32; 3],
    mass: f32,
    tags: [i64; 2],
    charge: i32,
    flags: u32,
}

/// Both a message and a GPU type (RingMessage provides the Pod impls).
#[derive(Clone, Copy, Debug, PartialEq, RingMessage, GpuType)]
#[message(type_id = 0x0D00_0010)]
#[repr(C)]
struct Cell {
    x: u32,
    y: u32,
    heat: f32,
    pressure: f32,
}

#[test]
fn gpu_type_writes_the_wgsl_struct() {
    assert_eq!(
        Particle::WGSL_STRUCT,
        "struct Particle {\n    id: vec2<u32>,\n    pos: array<f32, 3>,\n    mass: f32,\n    \
         tags: array<vec2<i32>, 2>,\n    charge: i32,\n    flags: u32,\n}\n"
    );
    assert_eq!(Particle::WGSL_NAME, "Particle");
    assert_eq!(Particle::SIZE, size_of::<Particle>());
    assert_eq!(Particle::ALIGN, 8);
    assert_eq!(
        Cell::WGSL_STRUCT,
        "struct Cell {\n    x: u32,\n    y: u32,\n    heat: f32,\n    pressure: f32,\n}\n"
    );
    assert_eq!(Cell::ALIGN, 4);
    assert_eq!(Cell::TYPE_ID, 0x0D00_0010);
}

/// The WGSL rules, applied independently to the generated text, give the Rust layout.
#[test]
fn gpu_type_layout_matches_wgsl_rules() {
    fn check<T: GpuType>() {
        let l = wgsl_struct_layout(T::WGSL_STRUCT).unwrap();
        assert_eq!(l.name, T::WGSL_NAME);
        let rust: Vec<(String, usize)> =
            T::FIELDS.iter().map(|(n, o)| (n.to_string(), *o)).collect();
        assert_eq!(l.fields, rust, "{}", T::WGSL_STRUCT);
        assert_eq!(l.size, T::SIZE);
        assert_eq!(l.align, T::ALIGN);
    }
    check::<Particle>();
    check::<Cell>();
    assert_eq!(
        Particle::FIELDS,
        &[
            ("id", offset_of!(Particle, id)),
            ("pos", offset_of!(Particle, pos)),
            ("mass", offset_of!(Particle, mass)),
            ("tags", offset_of!(Particle, tags)),
            ("charge", offset_of!(Particle, charge)),
            ("flags", offset_of!(Particle, flags)),
        ]
    );
    assert_eq!(Particle::FIELDS[3].1, 24);
}

/// Registered globally as "derive.scale".
#[ring_kernel(name = "derive.scale")]
fn scale(_ctx: &mut KernelContext<'_>, m: Scale) -> Option<Scaled> {
    Some(Scaled {
        id: m.id,
        value: m.value * m.factor,
        calls: 0,
    })
}

/// Stateful: counts the calls of each launched kernel.
#[ring_kernel(name = "derive.counting_scale")]
fn counting_scale(_ctx: &mut KernelContext<'_>, calls: &mut u32, m: Scale) -> Option<Scaled> {
    *calls += 1;
    Some(Scaled {
        id: m.id,
        value: m.value * m.factor,
        calls: *calls,
    })
}

/// No name given: registered under the function's name. Replies via the context.
#[ring_kernel]
fn derive_echo_token(ctx: &mut KernelContext<'_>, t: Token) -> ringkernel_core::Result<()> {
    ctx.reply(&Token {
        hops: t.hops + 10,
        ..t
    })
}

#[test]
fn ring_kernel_registers_by_name() {
    let reg = KernelRegistry::new();
    assert!(reg.cpu("derive.scale").is_ok());
    assert!(reg.cpu("derive.counting_scale").is_ok());
    assert!(reg.cpu("derive_echo_token").is_ok());
    let names = reg.cpu_names();
    for n in ["derive.scale", "derive.counting_scale", "derive_echo_token"] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
    assert!(matches!(
        reg.cpu("derive.nope"),
        Err(Error::KernelNotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_kernel_handlers_run_on_the_cpu_runtime() {
    let rt = CpuRuntime::with_registry(KernelRegistry::new())
        .await
        .unwrap();
    let t = Duration::from_secs(10);
    let k = rt
        .launch("derive.scale", LaunchOptions::default())
        .await
        .unwrap();
    let r: Scaled = k
        .call(
            Scale {
                id: 3,
                factor: 2.5,
                value: 4.0,
            },
            t,
        )
        .await
        .unwrap();
    assert_eq!(
        r,
        Scaled {
            id: 3,
            value: 10.0,
            calls: 0
        }
    );

    // Each launched instance has its own state, starting at Default.
    let a = rt
        .launch(
            "derive.counting_scale",
            LaunchOptions::default().with_name("a"),
        )
        .await
        .unwrap();
    let b = rt
        .launch(
            "derive.counting_scale",
            LaunchOptions::default().with_name("b"),
        )
        .await
        .unwrap();
    for i in 1..=3u32 {
        let r: Scaled = a
            .call(
                Scale {
                    id: i as u64,
                    factor: 1.0,
                    value: 1.0,
                },
                t,
            )
            .await
            .unwrap();
        assert_eq!(r.calls, i);
    }
    let r: Scaled = b
        .call(
            Scale {
                id: 9,
                factor: 1.0,
                value: 1.0,
            },
            t,
        )
        .await
        .unwrap();
    assert_eq!(r.calls, 1);

    let e = rt
        .launch("derive_echo_token", LaunchOptions::default())
        .await
        .unwrap();
    let r: Token = e.call(Token::new(5, 1.0), t).await.unwrap();
    assert_eq!((r.id, r.hops), (5, 10));
    rt.shutdown().await.unwrap();
}

/// Plain data with an id field: a batch receive copies a run of them at once and still
/// sets each id from its header.
#[derive(Clone, Copy, Debug, PartialEq, RingMessage)]
#[message(type_id = 0x0D00_0020)]
#[repr(C)]
struct Tagged {
    #[message(id)]
    id: ringkernel_core::message::MessageId,
    n: u64,
}

/// Replies `n + 1` with an id of 0 (the receiver's decode sets the real one).
#[ring_kernel(name = "derive.tagged_next")]
fn tagged_next(_ctx: &mut KernelContext<'_>, t: Tagged) -> Option<Tagged> {
    Some(Tagged {
        id: ringkernel_core::message::MessageId(0),
        n: t.n + 1,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_receive_sets_the_ids_of_plain_data_messages() {
    let rt = CpuRuntime::with_registry(KernelRegistry::new())
        .await
        .unwrap();
    let k = rt
        .launch("derive.tagged_next", LaunchOptions::default())
        .await
        .unwrap();
    const N: u64 = 777;
    let batch: Vec<Tagged> = (0..N)
        .map(|n| Tagged {
            id: ringkernel_core::message::MessageId(0),
            n,
        })
        .collect();
    k.send_batch(&batch).await.unwrap();
    let mut got: Vec<Tagged> = Vec::new();
    while (got.len() as u64) < N {
        let left = N as usize - got.len();
        k.receive_batch_into(&mut got, left, Some(Duration::from_secs(10)))
            .await
            .unwrap();
    }
    for (i, t) in got.iter().enumerate() {
        assert_eq!(t.n, i as u64 + 1, "reply {i}");
        assert_ne!(t.id.0, 0, "reply {i} has no id");
        if i > 0 {
            assert!(t.id.0 > got[i - 1].id.0, "ids rise: {:?}", &got[i - 1..=i]);
        }
    }
    rt.shutdown().await.unwrap();
}
