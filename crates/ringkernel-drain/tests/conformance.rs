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

ringkernel_core::conformance_tests! {
    runtime: rt(),
    scale: conformance::Scale {
        echo_messages: 5_000,
        pipeline_messages: 1_000,
        callers: 4,
        calls_per_caller: 50,
    },
}
