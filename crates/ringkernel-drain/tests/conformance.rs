//! The cross-backend behavioural suite (`ringkernel_core::conformance`), run against the
//! Metal runtime's host side on Linux: the same `launch_engine`/`DrainEngine` code the
//! `MetalRuntime` uses, with a CPU stand-in for the GPU drain passes (see
//! `tests/common`). What this does not cover is the Metal glue itself (buffers,
//! pipelines, command buffers), which CI cannot run.

mod common;

use common::{CpuTarget, Handler};
use ringkernel_core::builtin::{COUNTER, ECHO, STAGE};
use ringkernel_core::conformance;
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::{KernelHandle, RingKernelRuntime, RuntimeCore};
use ringkernel_core::util::BoxFuture;
use ringkernel_core::{BackendKind, Error, Result};
use ringkernel_drain::engine::launch_engine;
use std::sync::Arc;

struct StandInRuntime {
    core: Arc<RuntimeCore>,
}

impl RingKernelRuntime for StandInRuntime {
    fn core(&self) -> &Arc<RuntimeCore> {
        &self.core
    }
    fn launch<'a>(
        &'a self,
        handler: &'a str,
        opts: LaunchOptions,
    ) -> BoxFuture<'a, Result<KernelHandle>> {
        Box::pin(async move {
            opts.validate()?;
            let h = match handler {
                ECHO => Handler::Echo,
                STAGE => Handler::Stage,
                COUNTER => Handler::Counter,
                other => {
                    return Err(Error::KernelNotFound(format!(
                        "no stand-in handler {other:?}"
                    )))
                }
            };
            let serial = h == Handler::Counter;
            launch_engine(&self.core, handler, &opts, serial, 16, |_| {
                Ok(CpuTarget::new(opts.queue_capacity, opts.slot_size, h))
            })
        })
    }
    fn device_info(&self) -> String {
        "Metal host side with a CPU stand-in device".into()
    }
}

fn rt() -> StandInRuntime {
    StandInRuntime {
        core: RuntimeCore::new(BackendKind::Metal, KernelRegistry::new()),
    }
}

macro_rules! conformance_tests {
    ($($name:ident => |$rt:ident| $body:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let $rt = rt();
            $body.await.unwrap();
        }
    )*};
}

conformance_tests! {
    lifecycle => |r| conformance::lifecycle(&r);
    call_correlation => |r| conformance::call_correlation(&r, 4, 50);
    echo_many => |r| conformance::echo_many(&r, 5_000);
    deactivate_keeps_messages => |r| conformance::deactivate_keeps_messages(&r);
    terminate_in_flight => |r| conformance::terminate_in_flight(&r);
    unknown_kernel => |r| conformance::unknown_kernel(&r);
    bad_capacity => |r| conformance::bad_capacity(&r);
    oversized_payload => |r| conformance::oversized_payload(&r);
    receive_timeout => |r| conformance::receive_timeout(&r);
    k2k_pipeline => |r| conformance::k2k_pipeline(&r, 1_000);
    pubsub_fanout => |r| conformance::pubsub_fanout(&r);
    queue_full => |r| conformance::queue_full(&r);
}
