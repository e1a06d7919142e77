//! The seed README's proc-macro example ("Define messages and kernels declaratively"),
//! as a user types it after `use ringkernel::prelude::*;`, plus checks that what the
//! derives generate works: the message round-trips through a CPU kernel (rkyv, with
//! its id field set from the header) and the GPU type has the WGSL layout.

use ringkernel::prelude::*;

#[derive(RingMessage)]
#[message(type_id = 1)]
struct ComputeRequest {
    #[message(id)]
    id: MessageId,
    data: Vec<f32>,
}

#[derive(GpuType)]
struct Matrix4x4 {
    data: [f32; 16],
}

// ---- checks (not part of the seed's block) ----

use ringkernel::core::gpu_type::wgsl_struct_layout;
use ringkernel::core::message::{flags, Encoding};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// Doubles every element and echoes the request's id in the reply.
#[ring_kernel(name = "seed.double")]
fn double(_ctx: &mut KernelContext<'_>, req: ComputeRequest) -> Option<ComputeRequest> {
    Some(ComputeRequest {
        id: req.id,
        data: req.data.iter().map(|x| x * 2.0).collect(),
    })
}

#[test]
fn compute_request_is_an_rkyv_message() {
    assert_eq!(ComputeRequest::TYPE_ID, 1);
    assert_eq!(ComputeRequest::NAME, "ComputeRequest");
    assert_eq!(ComputeRequest::encoding(), Encoding::Rkyv);
    let mut env = Envelope::new(&ComputeRequest {
        id: MessageId::default(),
        data: vec![1.0, 2.0, 3.0],
    });
    assert_ne!(env.header.flags & flags::RKYV, 0);
    env.header.message_id = 41;
    let back: ComputeRequest = env.decode().unwrap();
    assert_eq!(back.id, MessageId(41));
    assert_eq!(back.data, vec![1.0, 2.0, 3.0]);
    let archived = env.archived::<ComputeRequest>().unwrap();
    assert_eq!(archived.data.len(), 3);
    assert_eq!(archived.id.get(), 0, "the archive holds the sender's value");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compute_request_round_trips_through_a_cpu_kernel() {
    let rt = RingKernel::builder()
        .backend(Backend::Cpu)
        .use_env(false)
        .build()
        .await
        .unwrap();
    let k = rt
        .launch("seed.double", LaunchOptions::default())
        .await
        .unwrap();
    let req = ComputeRequest {
        id: MessageId::default(),
        data: (0..16).map(|i| i as f32).collect(),
    };
    let reply: ComputeRequest = k.call(req, WAIT).await.unwrap();
    assert_eq!(
        reply.data,
        (0..16).map(|i| i as f32 * 2.0).collect::<Vec<_>>()
    );
    // The reply's id field is set from its own header on receive.
    assert_ne!(reply.id, MessageId(0));
    let sent = k
        .send(ComputeRequest {
            id: MessageId::default(),
            data: vec![0.5],
        })
        .await
        .unwrap();
    let env = k.receive_timeout(WAIT).await.unwrap();
    assert_eq!(env.header.correlation_id, sent);
    let back: ComputeRequest = env.decode().unwrap();
    assert_eq!(back.data, vec![1.0]);
    rt.shutdown().await.unwrap();
}

#[test]
fn matrix4x4_has_the_wgsl_layout() {
    assert_eq!(Matrix4x4::WGSL_NAME, "Matrix4x4");
    assert_eq!(
        Matrix4x4::WGSL_STRUCT,
        "struct Matrix4x4 {\n    data: array<f32, 16>,\n}\n"
    );
    assert_eq!((Matrix4x4::SIZE, Matrix4x4::ALIGN), (64, 4));
    assert_eq!(Matrix4x4::FIELDS, &[("data", 0)]);
    // WGSL's own rules, computed independently, agree.
    let l = wgsl_struct_layout(Matrix4x4::WGSL_STRUCT).unwrap();
    assert_eq!((l.size, l.align), (Matrix4x4::SIZE, Matrix4x4::ALIGN));
    assert_eq!(l.fields, vec![("data".to_string(), 0)]);

    let m = Matrix4x4 {
        data: std::array::from_fn(|i| i as f32 + 0.25),
    };
    let bytes = m.to_bytes();
    assert_eq!(bytes.len(), 64);
    assert_eq!(&bytes[4..8], &1.25f32.to_ne_bytes());
    let back = Matrix4x4::read_bytes(&bytes).unwrap();
    assert_eq!(back.data, m.data);
    assert!(matches!(
        Matrix4x4::read_bytes(&bytes[..60]),
        Err(Error::InvalidArgument(_))
    ));
    let two = Matrix4x4::slice_to_bytes(&[back, m]);
    assert_eq!(two.len(), 128);
    assert_eq!(&two[64..68], &0.25f32.to_ne_bytes());
}
