//! Handler registry: what a kernel name resolves to on each backend.
//!
//! * CPU handlers are Rust values implementing [`CpuHandler`], registered on a
//!   [`KernelRegistry`] or globally with `#[ring_kernel]` (collected by `inventory`).
//! * GPU handlers are device functions in the backend's language ([`GpuHandler`]):
//!   WGSL for WebGPU and Metal, CUDA C for CUDA, each following the handler ABI
//!   `handle(ctx, in_slot, out_slot, state)` documented in the backend crates.

use crate::context::KernelContext;
use crate::error::{Error, Result};
use crate::message::{Encoding, Envelope, MessageHeader, RingMessage};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, RwLock};

/// A CPU message handler. One instance per launched kernel; it owns the kernel's state.
pub trait CpuHandler: Send + 'static {
    /// Handles one message. An `Err` drops the message: it is counted in
    /// `dropped`, logged with `tracing`, and the kernel goes on.
    fn handle(&mut self, ctx: &mut KernelContext<'_>, msg: &Envelope) -> Result<()>;
}

/// Makes a fresh handler for each launch.
pub type CpuHandlerFactory = Arc<dyn Fn() -> Box<dyn CpuHandler> + Send + Sync>;

/// A CPU handler registered at compile time by `#[ring_kernel]`.
pub struct StaticCpuHandler {
    /// Handler name (what `launch` looks up).
    pub name: &'static str,
    /// Constructor.
    pub factory: fn() -> Box<dyn CpuHandler>,
}

inventory::collect!(StaticCpuHandler);

/// A GPU handler registered at compile time by `#[ring_kernel(gpu)]` (its CUDA and WGSL
/// translated from the Rust handler). [`KernelRegistry::gpu`] finds it when nothing was
/// registered under its name, and keeps what `factory` built.
pub struct StaticGpuHandler {
    /// Handler name.
    pub name: &'static str,
    /// Builds the handler (its sources with the message type ids filled in); an error
    /// says why the handler cannot run on a GPU.
    pub factory: fn() -> Result<GpuHandler>,
}

inventory::collect!(StaticGpuHandler);

/// A GPU handler: device source in each language it exists in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHandler {
    /// Handler name.
    pub name: String,
    /// WGSL source defining `fn handle(...)` (WebGPU and Metal).
    pub wgsl: Option<String>,
    /// CUDA C source defining `__device__ void handle(...)`.
    pub cuda: Option<String>,
    /// Bytes of per-kernel state the handler keeps on the device.
    pub state_bytes: usize,
    /// The message types the handler reads, if it declares them
    /// ([`GpuHandler::with_input`]); empty: undeclared (raw bytes, anything goes).
    pub inputs: Vec<MessageInput>,
}

/// A message type a GPU handler declares it reads (see [`GpuHandler::with_input`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageInput {
    /// [`RingMessage::TYPE_ID`].
    pub type_id: u32,
    /// [`RingMessage::NAME`].
    pub name: &'static str,
    /// How its payload is encoded.
    pub encoding: Encoding,
}

impl MessageInput {
    /// The declaration of `M`.
    pub fn of<M: RingMessage>() -> Self {
        MessageInput {
            type_id: M::TYPE_ID,
            name: M::NAME,
            encoding: M::encoding(),
        }
    }
}

/// Whether a kernel (`kernel` names it in errors) whose handler declares `inputs` can
/// read a message with `header`: the one check every engine uses
/// ([`KernelEngine::accepts`](crate::runtime::KernelEngine::accepts)).
///
/// * No declared inputs: anything is accepted (the handler gets raw bytes).
/// * A declared type id must arrive in its declared encoding.
/// * An rkyv message ([`flags::RKYV`](crate::message::flags::RKYV)) of an undeclared
///   type is refused when every declared input is plain data: a GPU handler that reads
///   fixed-layout structs cannot read an archive.
///
/// Refusals are [`Error::EncodingMismatch`].
pub fn check_accepts(kernel: &str, inputs: &[MessageInput], header: &MessageHeader) -> Result<()> {
    if inputs.is_empty() {
        return Ok(());
    }
    let found = Encoding::of(header);
    match inputs.iter().find(|i| i.type_id == header.type_id) {
        Some(i) if i.encoding != found => Err(Error::EncodingMismatch {
            type_id: header.type_id,
            reason: format!(
                "kernel {kernel:?} reads {} as {} but the message is {}",
                i.name,
                i.encoding.name(),
                found.name()
            ),
        }),
        Some(_) => Ok(()),
        None if found == Encoding::Rkyv && inputs.iter().all(|i| i.encoding == Encoding::Plain) => {
            let names: Vec<&str> = inputs.iter().map(|i| i.name).collect();
            Err(Error::EncodingMismatch {
                type_id: header.type_id,
                reason: format!(
                    "kernel {kernel:?} reads plain-data messages ({}) and cannot read an rkyv archive",
                    names.join(", ")
                ),
            })
        }
        None => Ok(()),
    }
}

impl GpuHandler {
    /// A handler with no sources yet.
    pub fn new(name: impl Into<String>) -> Self {
        GpuHandler {
            name: name.into(),
            wgsl: None,
            cuda: None,
            state_bytes: 0,
            inputs: Vec::new(),
        }
    }
    /// Declares a message type the handler reads (call once per type). Sends of a
    /// message the handler cannot read are then refused on the host
    /// ([`GpuHandler::accepts`]), e.g. an rkyv message to a handler of plain-data
    /// structs.
    ///
    /// ```
    /// use ringkernel_core::builtin::Token;
    /// use ringkernel_core::message::{Envelope, MessageHeader, flags};
    /// use ringkernel_core::registry::GpuHandler;
    ///
    /// let h = GpuHandler::new("echo").with_input::<Token>();
    /// assert!(h.accepts("echo", &Envelope::new(&Token::default()).header).is_ok());
    /// let mut archived = MessageHeader::new(99, 16);
    /// archived.flags |= flags::RKYV;
    /// assert!(h.accepts("echo", &archived).is_err());
    /// ```
    pub fn with_input<M: RingMessage>(mut self) -> Self {
        let input = MessageInput::of::<M>();
        if !self.inputs.contains(&input) {
            self.inputs.push(input);
        }
        self
    }
    /// [`check_accepts`] against this handler's declared inputs (`kernel` names the
    /// kernel in errors).
    pub fn accepts(&self, kernel: &str, header: &MessageHeader) -> Result<()> {
        check_accepts(kernel, &self.inputs, header)
    }
    /// Adds the WGSL source.
    pub fn with_wgsl(mut self, src: impl Into<String>) -> Self {
        self.wgsl = Some(src.into());
        self
    }
    /// Adds the CUDA C source.
    pub fn with_cuda(mut self, src: impl Into<String>) -> Self {
        self.cuda = Some(src.into());
        self
    }
    /// Sets the device state size.
    pub fn with_state_bytes(mut self, bytes: usize) -> Self {
        self.state_bytes = bytes;
        self
    }
}

/// Name → handler tables. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct KernelRegistry {
    cpu: Arc<RwLock<HashMap<String, CpuHandlerFactory>>>,
    gpu: Arc<RwLock<HashMap<String, GpuHandler>>>,
}

impl std::fmt::Debug for KernelRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelRegistry")
            .field("cpu", &self.cpu_names())
            .field(
                "gpu",
                &self
                    .gpu
                    .read()
                    .map(|g| g.keys().cloned().collect::<Vec<_>>())
                    .unwrap_or_default(),
            )
            .finish()
    }
}

impl KernelRegistry {
    /// An empty registry (the global `#[ring_kernel]` handlers are still found).
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a CPU handler factory under `name` (replacing an earlier one).
    pub fn register_cpu(
        &self,
        name: impl Into<String>,
        factory: impl Fn() -> Box<dyn CpuHandler> + Send + Sync + 'static,
    ) {
        self.cpu
            .write()
            .expect("registry lock")
            .insert(name.into(), Arc::new(factory));
    }

    /// Registers a typed closure as a CPU handler (see [`handler_fn`]).
    pub fn register_fn<Req, Out, F>(&self, name: impl Into<String>, f: F)
    where
        Req: RingMessage,
        Out: HandlerOutput,
        F: FnMut(&mut KernelContext<'_>, Req) -> Out + Clone + Send + Sync + 'static,
    {
        self.register_cpu(name, move || Box::new(handler_fn(f.clone())));
    }

    /// Registers a GPU handler under its name. Sources merge with an earlier
    /// registration of the same name (so the WGSL and the CUDA version of a handler can
    /// be registered separately); a source given again replaces the earlier one.
    pub fn register_gpu(&self, handler: GpuHandler) {
        let mut g = self.gpu.write().expect("registry lock");
        match g.get_mut(&handler.name) {
            Some(old) => {
                if handler.wgsl.is_some() {
                    old.wgsl = handler.wgsl;
                }
                if handler.cuda.is_some() {
                    old.cuda = handler.cuda;
                }
                old.state_bytes = old.state_bytes.max(handler.state_bytes);
                for i in handler.inputs {
                    if !old.inputs.contains(&i) {
                        old.inputs.push(i);
                    }
                }
            }
            None => {
                g.insert(handler.name.clone(), handler);
            }
        }
    }

    /// The CPU handler factory for `name`: this registry first, then `#[ring_kernel]`
    /// handlers. [`Error::KernelNotFound`] lists what exists.
    pub fn cpu(&self, name: &str) -> Result<CpuHandlerFactory> {
        if let Some(f) = self.cpu.read().expect("registry lock").get(name) {
            return Ok(f.clone());
        }
        for s in inventory::iter::<StaticCpuHandler> {
            if s.name == name {
                let f = s.factory;
                return Ok(Arc::new(f));
            }
        }
        Err(Error::KernelNotFound(format!(
            "no CPU handler named {name:?} (registered: {})",
            self.cpu_names().join(", ")
        )))
    }

    /// The GPU handler for `name`: this registry first, then the `#[ring_kernel(gpu)]`
    /// handlers (built on first use, then kept here).
    pub fn gpu(&self, name: &str) -> Result<GpuHandler> {
        if let Some(h) = self.gpu.read().expect("registry lock").get(name) {
            return Ok(h.clone());
        }
        if let Some(s) = inventory::iter::<StaticGpuHandler>
            .into_iter()
            .find(|s| s.name == name)
        {
            let h = (s.factory)()?;
            let mut g = self.gpu.write().expect("registry lock");
            // A registration that raced this one wins.
            return Ok(g.entry(name.to_string()).or_insert(h).clone());
        }
        let g = self.gpu.read().expect("registry lock");
        let mut names: Vec<String> = g
            .keys()
            .cloned()
            .chain(
                inventory::iter::<StaticGpuHandler>
                    .into_iter()
                    .map(|s| s.name.to_string()),
            )
            .collect();
        names.sort();
        names.dedup();
        Err(Error::KernelNotFound(format!(
            "no GPU handler named {name:?} (registered: {})",
            names.join(", ")
        )))
    }

    /// Names of all GPU handlers (registered here and `#[ring_kernel(gpu)]` ones), sorted.
    pub fn gpu_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .gpu
            .read()
            .map(|g| g.keys().cloned().collect())
            .unwrap_or_default();
        v.extend(
            inventory::iter::<StaticGpuHandler>
                .into_iter()
                .map(|s| s.name.to_string()),
        );
        v.sort();
        v.dedup();
        v
    }

    /// Names of all CPU handlers (registry and global), sorted.
    pub fn cpu_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .cpu
            .read()
            .map(|c| c.keys().cloned().collect())
            .unwrap_or_default();
        v.extend(
            inventory::iter::<StaticCpuHandler>
                .into_iter()
                .map(|s| s.name.to_string()),
        );
        v.sort();
        v.dedup();
        v
    }
}

impl KernelRegistry {
    /// The process-wide registry. The backend runtimes' `new()` constructors
    /// (`CpuRuntime::new()`, `WgpuRuntime::new()`, `MetalRuntime::new()`,
    /// `CudaRuntime::new()`) resolve handler names through it, so a program registers its
    /// GPU handlers here once, before or after starting a runtime:
    ///
    /// ```
    /// use ringkernel_core::registry::{GpuHandler, KernelRegistry};
    /// KernelRegistry::global().register_gpu(GpuHandler::new("compute").with_wgsl("/* .. */"));
    /// assert!(KernelRegistry::global().gpu("compute").is_ok());
    /// ```
    ///
    /// It is an ordinary shared registry: the runtimes add their built-in kernels to it
    /// where missing. `with_registry(..)` constructors use the registry given instead.
    pub fn global() -> &'static KernelRegistry {
        static GLOBAL: std::sync::OnceLock<KernelRegistry> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(KernelRegistry::new)
    }
}

/// What a typed handler closure may return: nothing, a reply, or an optional reply.
/// A reply goes to the kernel's output queue, correlated with the request.
pub trait HandlerOutput {
    /// Emits the output through `ctx`.
    fn emit(self, ctx: &mut KernelContext<'_>) -> Result<()>;
}

impl HandlerOutput for () {
    fn emit(self, _ctx: &mut KernelContext<'_>) -> Result<()> {
        Ok(())
    }
}

impl<R: RingMessage> HandlerOutput for Option<R> {
    #[inline]
    fn emit(self, ctx: &mut KernelContext<'_>) -> Result<()> {
        match self {
            Some(r) => ctx.reply(&r),
            None => Ok(()),
        }
    }
}

impl<O: HandlerOutput> HandlerOutput for Result<O> {
    #[inline]
    fn emit(self, ctx: &mut KernelContext<'_>) -> Result<()> {
        // A plain match, not `self?`: `?` moves the output into a `ControlFlow` first, a
        // copy that reads back what the handler has just written (a store-forwarding
        // stall per message on the CPU worker, perf annotate).
        match self {
            Ok(out) => out.emit(ctx),
            Err(e) => Err(e),
        }
    }
}

/// A [`CpuHandler`] from a typed closure `FnMut(&mut KernelContext, Req) -> Out`.
pub struct FnHandler<Req, F> {
    f: F,
    _req: PhantomData<fn(Req)>,
}

/// Wraps a typed closure as a [`CpuHandler`]. Messages of another type than `Req` are
/// refused with [`Error::TypeMismatch`] (counted as dropped).
///
/// ```
/// use ringkernel_core::registry::handler_fn;
/// use ringkernel_core::context::KernelContext;
/// # use ringkernel_core::message::RingMessage;
/// # #[repr(C)] #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)] struct N(u64);
/// # impl RingMessage for N { const TYPE_ID: u32 = 1; const NAME: &'static str = "N"; }
/// let h = handler_fn(|_ctx: &mut KernelContext<'_>, n: N| Some(N(n.0 + 1)));
/// ```
pub fn handler_fn<Req, Out, F>(f: F) -> FnHandler<Req, F>
where
    Req: RingMessage,
    Out: HandlerOutput,
    F: FnMut(&mut KernelContext<'_>, Req) -> Out + Send + 'static,
{
    FnHandler {
        f,
        _req: PhantomData,
    }
}

impl<Req, Out, F> CpuHandler for FnHandler<Req, F>
where
    Req: RingMessage,
    Out: HandlerOutput,
    F: FnMut(&mut KernelContext<'_>, Req) -> Out + Send + 'static,
{
    fn handle(&mut self, ctx: &mut KernelContext<'_>, msg: &Envelope) -> Result<()> {
        let req: Req = msg.decode()?;
        (self.f)(ctx, req).emit(ctx)
    }
}

/// A [`CpuHandler`] with explicit state: `FnMut(&mut KernelContext, &mut S, Req) -> Out`.
pub struct StatefulHandler<S, Req, F> {
    state: S,
    f: F,
    _req: PhantomData<fn(Req)>,
}

/// Wraps a stateful typed closure as a [`CpuHandler`] (state starts at `init`).
pub fn stateful_fn<S, Req, Out, F>(init: S, f: F) -> StatefulHandler<S, Req, F>
where
    S: Send + 'static,
    Req: RingMessage,
    Out: HandlerOutput,
    F: FnMut(&mut KernelContext<'_>, &mut S, Req) -> Out + Send + 'static,
{
    StatefulHandler {
        state: init,
        f,
        _req: PhantomData,
    }
}

impl<S, Req, Out, F> CpuHandler for StatefulHandler<S, Req, F>
where
    S: Send + 'static,
    Req: RingMessage,
    Out: HandlerOutput,
    F: FnMut(&mut KernelContext<'_>, &mut S, Req) -> Out + Send + 'static,
{
    fn handle(&mut self, ctx: &mut KernelContext<'_>, msg: &Envelope) -> Result<()> {
        let req: Req = msg.decode()?;
        (self.f)(ctx, &mut self.state, req).emit(ctx)
    }
}

/// A [`CpuHandler`] that reads the archived form of an rkyv message in place:
/// `FnMut(&mut KernelContext, &Archived<Req>) -> Out`. See [`archived_fn`].
pub struct ArchivedHandler<Req, F> {
    f: F,
    _req: PhantomData<fn(Req)>,
}

/// Wraps a closure that reads an rkyv message's archived form (validated, not
/// deserialised, no copy) as a [`CpuHandler`]. Messages of another type or encoding,
/// and invalid archives, are refused with a typed error (counted as dropped).
/// `#[ring_kernel]` uses it for a handler whose message parameter is `&Archived<M>`.
///
/// ```
/// use ringkernel_core::context::KernelContext;
/// use ringkernel_core::registry::archived_fn;
/// use ringkernel_core::rkyv::Archived;
/// use ringkernel_derive::RingMessage;
///
/// #[derive(RingMessage)]
/// #[message(type_id = 30)]
/// struct Samples { data: Vec<f32> }
///
/// // `Req` is named: it cannot be inferred from `&Archived<Req>`.
/// let h = archived_fn::<Samples, _, _>(|_ctx: &mut KernelContext<'_>, s: &Archived<Samples>| {
///     let _sum: f32 = s.data.iter().map(|x| x.to_native()).sum();
/// });
/// ```
pub fn archived_fn<Req, Out, F>(f: F) -> ArchivedHandler<Req, F>
where
    Req: RingMessage + rkyv::Archive,
    Req::Archived: for<'a> rkyv::bytecheck::CheckBytes<crate::message::RkyvValidator<'a>>,
    Out: HandlerOutput,
    F: FnMut(&mut KernelContext<'_>, &rkyv::Archived<Req>) -> Out + Send + 'static,
{
    ArchivedHandler {
        f,
        _req: PhantomData,
    }
}

impl<Req, Out, F> CpuHandler for ArchivedHandler<Req, F>
where
    Req: RingMessage + rkyv::Archive,
    Req::Archived: for<'a> rkyv::bytecheck::CheckBytes<crate::message::RkyvValidator<'a>>,
    Out: HandlerOutput,
    F: FnMut(&mut KernelContext<'_>, &rkyv::Archived<Req>) -> Out + Send + 'static,
{
    fn handle(&mut self, ctx: &mut KernelContext<'_>, msg: &Envelope) -> Result<()> {
        let archived = msg.archived::<Req>()?;
        (self.f)(ctx, archived).emit(ctx)
    }
}

/// A [`CpuHandler`] with explicit state that reads the archived form of an rkyv
/// message: `FnMut(&mut KernelContext, &mut S, &Archived<Req>) -> Out`. See
/// [`stateful_archived_fn`].
pub struct StatefulArchivedHandler<S, Req, F> {
    state: S,
    f: F,
    _req: PhantomData<fn(Req)>,
}

/// [`archived_fn`] with per-kernel state (starting at `init`), as [`stateful_fn`] is to
/// [`handler_fn`]. `#[ring_kernel]` uses it for `fn(ctx, &mut S, &Archived<M>)`.
pub fn stateful_archived_fn<S, Req, Out, F>(init: S, f: F) -> StatefulArchivedHandler<S, Req, F>
where
    S: Send + 'static,
    Req: RingMessage + rkyv::Archive,
    Req::Archived: for<'a> rkyv::bytecheck::CheckBytes<crate::message::RkyvValidator<'a>>,
    Out: HandlerOutput,
    F: FnMut(&mut KernelContext<'_>, &mut S, &rkyv::Archived<Req>) -> Out + Send + 'static,
{
    StatefulArchivedHandler {
        state: init,
        f,
        _req: PhantomData,
    }
}

impl<S, Req, Out, F> CpuHandler for StatefulArchivedHandler<S, Req, F>
where
    S: Send + 'static,
    Req: RingMessage + rkyv::Archive,
    Req::Archived: for<'a> rkyv::bytecheck::CheckBytes<crate::message::RkyvValidator<'a>>,
    Out: HandlerOutput,
    F: FnMut(&mut KernelContext<'_>, &mut S, &rkyv::Archived<Req>) -> Out + Send + 'static,
{
    fn handle(&mut self, ctx: &mut KernelContext<'_>, msg: &Envelope) -> Result<()> {
        let archived = msg.archived::<Req>()?;
        (self.f)(ctx, &mut self.state, archived).emit(ctx)
    }
}
