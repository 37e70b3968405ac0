//! ibverbs registrar: pins memory with `ibv_reg_mr` (spec.md#S1.9).
//!
//! Laid out like rust-ibverbs: the C bindings stay in `rdma-sys`; this module
//! wraps exactly the verbs it uses behind the [`Verbs`] trait ([`RealVerbs`]
//! calls libibverbs, the tests drive the same code with an in-memory fake),
//! and every verbs resource is a safe owner type whose `Drop` releases it:
//!
//! - [`Context`] owns an `ibv_context` and closes it;
//! - [`ProtectionDomain`] owns an `ibv_pd` and an `Arc` of its context, and
//!   deallocates the PD;
//! - [`MemoryRegion`] owns an `ibv_mr` and an `Arc` of its PD, and deregisters
//!   the MR unless [`MemoryRegion::deregister`] already did.
//!
//! The `Arc` chain fixes the release order, whatever order the owners are
//! dropped in: every MR before its PD, the PD before its context.
//!
//! Each failing verb has its own [`VerbsError`] variant, which converts into a
//! [`RegistrarError`] carrying the verb's name and errno.
//!
//! No RDMA NIC? Soft-RoCE gives a software device on any Ethernet interface:
//! `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0`.

use super::{Keys, Registrar, RegistrarError};
use mrcache_types::{Access, Range};
use rdma_sys::{ibv_access_flags, ibv_context, ibv_device, ibv_mr, ibv_pd};
use std::ffi::CStr;
use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

/// Environment variable naming the device [`VerbsRegistrar::open`] uses when
/// it is not given one (for example `rxe0` or `mlx5_0`).
pub const DEVICE_ENV: &str = "MRCACHE_IBV_DEVICE";

/// How to get a software RDMA device, quoted by the "no device" errors.
const RXE_HINT: &str = "to get a software RDMA device (Soft-RoCE), run as root: \
     `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0` \
     (use an interface of `ip -br link`), then check it with `ibv_devices`";

fn os(errno: &i32) -> io::Error {
    io::Error::from_raw_os_error(*errno)
}

fn get_device_list_hint(errno: &i32) -> String {
    if *errno == libc::ENOSYS {
        format!("; the kernel has no RDMA support loaded (no /sys/class/infiniband): {RXE_HINT}")
    } else {
        String::new()
    }
}

fn reg_mr_hint(errno: &i32) -> &'static str {
    match *errno {
        libc::ENOMEM => "; pinned memory is limited by RLIMIT_MEMLOCK (`ulimit -l`) unless the process has CAP_IPC_LOCK",
        libc::EFAULT => "; the range is not (fully) mapped, or cannot be pinned",
        _ => "",
    }
}

/// A verbs call that failed: one variant per verb.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// `ibv_get_device_list` returned NULL. `ENOSYS` means the kernel has no
    /// RDMA subsystem loaded.
    #[error("ibv_get_device_list failed: {} (errno {errno}){}", os(.errno), get_device_list_hint(.errno))]
    GetDeviceList { errno: i32 },
    /// `ibv_get_device_list` succeeded but lists no device.
    #[error("no RDMA device found (ibv_get_device_list lists none); {RXE_HINT}")]
    NoDevice,
    /// The requested device is not among those `ibv_get_device_list` lists.
    #[error(
        "RDMA device `{name}` not found; available: {} (choose one with the device argument or {DEVICE_ENV})",
        .available.join(", ")
    )]
    DeviceNotFound { name: String, available: Vec<String> },
    #[error("ibv_open_device({name}) failed: {} (errno {errno})", os(.errno))]
    OpenDevice { name: String, errno: i32 },
    #[error("ibv_alloc_pd failed: {} (errno {errno})", os(.errno))]
    AllocPd { errno: i32 },
    #[error("ibv_reg_mr of {len:#x} bytes at {addr:#x} failed: {} (errno {errno}){}", os(.errno), reg_mr_hint(.errno))]
    RegMr { errno: i32, addr: u64, len: u64 },
    /// `ibv_dereg_mr` failed: the region stays registered until its context
    /// is closed (closing a context releases all its kernel objects).
    #[error("ibv_dereg_mr failed: {} (errno {errno}); the region stays pinned until its device is closed", os(.errno))]
    DeregMr { errno: i32 },
}

impl VerbsError {
    /// The verb that failed (device selection counts as `ibv_get_device_list`).
    pub fn verb(&self) -> &'static str {
        match self {
            VerbsError::GetDeviceList { .. } | VerbsError::NoDevice | VerbsError::DeviceNotFound { .. } => "ibv_get_device_list",
            VerbsError::OpenDevice { .. } => "ibv_open_device",
            VerbsError::AllocPd { .. } => "ibv_alloc_pd",
            VerbsError::RegMr { .. } => "ibv_reg_mr",
            VerbsError::DeregMr { .. } => "ibv_dereg_mr",
        }
    }

    /// The errno the verb reported; `ENODEV` when no (such) device exists.
    pub fn errno(&self) -> i32 {
        match *self {
            VerbsError::NoDevice | VerbsError::DeviceNotFound { .. } => libc::ENODEV,
            VerbsError::GetDeviceList { errno }
            | VerbsError::OpenDevice { errno, .. }
            | VerbsError::AllocPd { errno }
            | VerbsError::RegMr { errno, .. }
            | VerbsError::DeregMr { errno } => errno,
        }
    }
}

impl From<VerbsError> for RegistrarError {
    fn from(e: VerbsError) -> Self {
        RegistrarError::from_errno(e.verb(), e.errno(), e.to_string())
    }
}

/// Maps [`Access`] to `ibv_access_flags`. Local read is implied in both.
/// Verbs rejects remote write or remote atomic without local write, so those
/// add `IBV_ACCESS_LOCAL_WRITE`.
pub fn access_flags(access: Access) -> ibv_access_flags {
    let mut f = ibv_access_flags(0);
    if access.suffices_for(Access::LOCAL_WRITE) {
        f |= ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
    }
    if access.suffices_for(Access::REMOTE_READ) {
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_READ;
    }
    if access.suffices_for(Access::REMOTE_WRITE) {
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE | ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
    }
    if access.suffices_for(Access::REMOTE_ATOMIC) {
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC | ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
    }
    f
}

/// The verbs this module calls, and nothing else. Errors are errno values.
///
/// The raw handles are plain values with no `Drop`: releasing them is the
/// owner types' job. Releasing is `unsafe` because a released parent must not
/// be used by a child that is still alive.
#[doc(hidden)]
pub trait Verbs: Send + Sync + 'static {
    /// The result of `ibv_get_device_list`; dropping it is `ibv_free_device_list`.
    type DeviceList;
    type Ctx: Send + Sync + 'static;
    type Pd: Send + Sync + 'static;
    type Mr: Send + Sync + 'static;

    /// `ibv_get_device_list`.
    fn get_device_list(&self) -> Result<Self::DeviceList, i32>;
    /// `ibv_get_device_name` of each listed device, in list order.
    fn device_names(&self, list: &Self::DeviceList) -> Vec<String>;
    /// `ibv_open_device` of the `index`th listed device.
    fn open_device(&self, list: &Self::DeviceList, index: usize) -> Result<Self::Ctx, i32>;
    /// `ibv_alloc_pd`.
    fn alloc_pd(&self, ctx: &Self::Ctx) -> Result<Self::Pd, i32>;
    /// `ibv_reg_mr`.
    fn reg_mr(&self, pd: &Self::Pd, addr: u64, len: u64, access: ibv_access_flags) -> Result<Self::Mr, i32>;
    /// The `lkey` and `rkey` of a registered MR.
    fn mr_keys(&self, mr: &Self::Mr) -> Keys;
    /// `ibv_dereg_mr`.
    ///
    /// # Safety
    /// Nothing uses `mr` again (it is consumed; on failure it is abandoned).
    unsafe fn dereg_mr(&self, mr: Self::Mr) -> Result<(), i32>;
    /// `ibv_dealloc_pd`.
    ///
    /// # Safety
    /// No MR of `pd` is used afterwards: all were deregistered (or abandoned
    /// after a failed deregistration).
    unsafe fn dealloc_pd(&self, pd: Self::Pd) -> Result<(), i32>;
    /// `ibv_close_device`.
    ///
    /// # Safety
    /// No PD or MR of `ctx` is used afterwards.
    unsafe fn close_device(&self, ctx: Self::Ctx) -> Result<(), i32>;
}

/// [`Verbs`] through libibverbs (`rdma-sys`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RealVerbs;

/// An `ibv_get_device_list` result; `Drop` frees it.
#[doc(hidden)]
pub struct RealDeviceList {
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl RealDeviceList {
    fn device(&self, index: usize) -> Option<*mut ibv_device> {
        // SAFETY: `list` is an array of `len` device pointers (plus a NULL
        // terminator) that stays valid until `ibv_free_device_list` in Drop.
        (index < self.len).then(|| unsafe { *self.list.as_ptr().add(index) })
    }
}

impl Drop for RealDeviceList {
    fn drop(&mut self) {
        // SAFETY: `list` came from `ibv_get_device_list` and is freed once, here.
        // Contexts opened from it stay valid after the free (libibverbs
        // documents opening devices before freeing the list, which `Context::open` does).
        unsafe { rdma_sys::ibv_free_device_list(self.list.as_ptr()) }
    }
}

/// An open `ibv_context`. Private field: only [`RealVerbs::open_device`] makes one.
#[doc(hidden)]
pub struct RealCtx(NonNull<ibv_context>);
/// An allocated `ibv_pd`.
#[doc(hidden)]
pub struct RealPd(NonNull<ibv_pd>);
/// A registered `ibv_mr`.
#[doc(hidden)]
pub struct RealMr(NonNull<ibv_mr>);

// SAFETY: libibverbs is thread-safe: contexts, PDs and MRs may be used and
// released from any thread, and concurrently (reg/dereg on one PD included).
// The handles are not Clone, so each is released once.
unsafe impl Send for RealCtx {}
// SAFETY: as for Send: every verb used through `&RealCtx` is thread-safe.
unsafe impl Sync for RealCtx {}
// SAFETY: see RealCtx.
unsafe impl Send for RealPd {}
// SAFETY: see RealCtx.
unsafe impl Sync for RealPd {}
// SAFETY: see RealCtx; `&RealMr` only reads the immutable lkey/rkey.
unsafe impl Send for RealMr {}
// SAFETY: see RealCtx.
unsafe impl Sync for RealMr {}

fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

impl Verbs for RealVerbs {
    type DeviceList = RealDeviceList;
    type Ctx = RealCtx;
    type Pd = RealPd;
    type Mr = RealMr;

    fn get_device_list(&self) -> Result<RealDeviceList, i32> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out pointer for the duration of the call.
        let list = unsafe { rdma_sys::ibv_get_device_list(&mut n) };
        match NonNull::new(list) {
            Some(list) => Ok(RealDeviceList { list, len: usize::try_from(n).unwrap_or(0) }),
            None => Err(last_errno()),
        }
    }

    fn device_names(&self, list: &RealDeviceList) -> Vec<String> {
        (0..list.len)
            .filter_map(|i| list.device(i))
            .map(|dev| {
                // SAFETY: `dev` is a device of a live list.
                let name = unsafe { rdma_sys::ibv_get_device_name(dev) };
                if name.is_null() {
                    return String::from("<unnamed>");
                }
                // SAFETY: a non-NULL name is a NUL-terminated string owned by
                // the device, valid while the list is; it is copied out here.
                unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
            })
            .collect()
    }

    fn open_device(&self, list: &RealDeviceList, index: usize) -> Result<RealCtx, i32> {
        let dev = list.device(index).ok_or(libc::ENODEV)?;
        // SAFETY: `dev` is a device of a list that is still alive.
        let ctx = unsafe { rdma_sys::ibv_open_device(dev) };
        NonNull::new(ctx).map(RealCtx).ok_or_else(last_errno)
    }

    fn alloc_pd(&self, ctx: &RealCtx) -> Result<RealPd, i32> {
        // SAFETY: `ctx` is open: closing it consumes the handle.
        let pd = unsafe { rdma_sys::ibv_alloc_pd(ctx.0.as_ptr()) };
        NonNull::new(pd).map(RealPd).ok_or_else(last_errno)
    }

    fn reg_mr(&self, pd: &RealPd, addr: u64, len: u64, access: ibv_access_flags) -> Result<RealMr, i32> {
        let len = usize::try_from(len).map_err(|_| libc::EINVAL)?;
        let access = libc::c_int::try_from(access.0).map_err(|_| libc::EINVAL)?;
        // SAFETY: `pd` is allocated: deallocating it consumes the handle. The
        // kernel validates the range (EFAULT if unmapped); the call itself
        // neither reads nor writes the memory.
        let mr = unsafe { rdma_sys::ibv_reg_mr(pd.0.as_ptr(), addr as *mut libc::c_void, len, access) };
        NonNull::new(mr).map(RealMr).ok_or_else(last_errno)
    }

    fn mr_keys(&self, mr: &RealMr) -> Keys {
        // SAFETY: `mr` is registered (deregistering consumes the handle), so
        // it points to a live `ibv_mr`, whose keys never change.
        let mr = unsafe { mr.0.as_ref() };
        Keys { lkey: mr.lkey, rkey: mr.rkey }
    }

    unsafe fn dereg_mr(&self, mr: RealMr) -> Result<(), i32> {
        // SAFETY: `mr` is registered and, by the caller's contract, unused after this.
        match unsafe { rdma_sys::ibv_dereg_mr(mr.0.as_ptr()) } {
            0 => Ok(()),
            // ibv_dereg_mr returns the errno value.
            e => Err(e),
        }
    }

    unsafe fn dealloc_pd(&self, pd: RealPd) -> Result<(), i32> {
        // SAFETY: `pd` is allocated and, by the caller's contract, neither it
        // nor its MRs are used after this.
        match unsafe { rdma_sys::ibv_dealloc_pd(pd.0.as_ptr()) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    unsafe fn close_device(&self, ctx: RealCtx) -> Result<(), i32> {
        // SAFETY: `ctx` is open and, by the caller's contract, nothing
        // allocated from it is used after this.
        match unsafe { rdma_sys::ibv_close_device(ctx.0.as_ptr()) } {
            0 => Ok(()),
            _ => Err(last_errno()),
        }
    }
}

/// The device to open: `explicit`, else a non-empty `env` (the value of
/// [`DEVICE_ENV`]), else `None` (the first device).
fn wanted_device(explicit: Option<&str>, env: Option<String>) -> Option<String> {
    explicit.map(str::to_owned).or_else(|| env.filter(|s| !s.trim().is_empty()))
}

/// Index of the device to open among `names`.
fn select_device(names: &[String], wanted: Option<&str>) -> Result<usize, VerbsError> {
    if names.is_empty() {
        return Err(VerbsError::NoDevice);
    }
    match wanted {
        None => Ok(0),
        Some(w) => {
            names.iter().position(|n| n == w).ok_or_else(|| VerbsError::DeviceNotFound { name: w.to_owned(), available: names.to_vec() })
        }
    }
}

/// An open device context. `Drop` closes it (after every PD, which each hold
/// an `Arc` of it).
pub struct Context<V: Verbs = RealVerbs> {
    /// `Some` until `Drop`.
    raw: Option<V::Ctx>,
    name: String,
    verbs: V,
}

impl<V: Verbs> Context<V> {
    /// Opens the device called `device`, or the first listed device.
    pub fn open(verbs: V, device: Option<&str>) -> Result<Arc<Self>, VerbsError> {
        let list = verbs.get_device_list().map_err(|errno| VerbsError::GetDeviceList { errno })?;
        let names = verbs.device_names(&list);
        let index = select_device(&names, device)?;
        let name = names[index].clone();
        let raw = verbs.open_device(&list, index).map_err(|errno| VerbsError::OpenDevice { name: name.clone(), errno })?;
        // Free the list only after opening, as libibverbs requires.
        drop(list);
        Ok(Arc::new(Context { raw: Some(raw), name, verbs }))
    }

    pub fn device_name(&self) -> &str {
        &self.name
    }

    fn raw(&self) -> &V::Ctx {
        self.raw.as_ref().expect("a Context's handle is only taken by Drop")
    }
}

impl<V: Verbs> Drop for Context<V> {
    fn drop(&mut self) {
        if let Some(ctx) = self.raw.take() {
            // SAFETY: every PD of this context holds an `Arc` of it, so all of
            // them (and hence all their MRs) are already released.
            // ibv_close_device cannot usefully fail; nothing to report in Drop.
            let _ = unsafe { self.verbs.close_device(ctx) };
        }
    }
}

impl<V: Verbs> fmt::Debug for Context<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("device", &self.name).finish()
    }
}

/// A protection domain. Keeps its [`Context`] alive; `Drop` deallocates the
/// PD (after every MR, which each hold an `Arc` of it).
pub struct ProtectionDomain<V: Verbs = RealVerbs> {
    /// `Some` until `Drop`.
    raw: Option<V::Pd>,
    ctx: Arc<Context<V>>,
}

impl<V: Verbs> ProtectionDomain<V> {
    pub fn alloc(ctx: &Arc<Context<V>>) -> Result<Arc<Self>, VerbsError> {
        let raw = ctx.verbs.alloc_pd(ctx.raw()).map_err(|errno| VerbsError::AllocPd { errno })?;
        Ok(Arc::new(ProtectionDomain { raw: Some(raw), ctx: Arc::clone(ctx) }))
    }

    pub fn context(&self) -> &Arc<Context<V>> {
        &self.ctx
    }

    fn raw(&self) -> &V::Pd {
        self.raw.as_ref().expect("a ProtectionDomain's handle is only taken by Drop")
    }
}

impl<V: Verbs> Drop for ProtectionDomain<V> {
    fn drop(&mut self) {
        if let Some(pd) = self.raw.take() {
            // SAFETY: every MR of this PD holds an `Arc` of it, so all are
            // deregistered (or abandoned after a failed ibv_dereg_mr). The
            // context is still open: `self.ctx` is dropped after this.
            // A failure (EBUSY after an abandoned MR) leaves the PD to the
            // context's close; Drop has no one to report it to.
            let _ = unsafe { self.ctx.verbs.dealloc_pd(pd) };
        }
    }
}

impl<V: Verbs> fmt::Debug for ProtectionDomain<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain").field("device", &self.ctx.name).finish()
    }
}

/// A registered memory region. Keeps its [`ProtectionDomain`] alive; `Drop`
/// deregisters it unless [`MemoryRegion::deregister`] already did.
pub struct MemoryRegion<V: Verbs = RealVerbs> {
    /// `Some` while registered.
    raw: Option<V::Mr>,
    keys: Keys,
    range: Range,
    access: Access,
    pd: Arc<ProtectionDomain<V>>,
}

impl<V: Verbs> MemoryRegion<V> {
    /// `ibv_reg_mr` of `range` with `access` (mapped by [`access_flags`]).
    pub fn register(pd: &Arc<ProtectionDomain<V>>, range: Range, access: Access) -> Result<Self, VerbsError> {
        let verbs = &pd.ctx.verbs;
        let raw = verbs.reg_mr(pd.raw(), range.addr, range.len, access_flags(access)).map_err(|errno| VerbsError::RegMr {
            errno,
            addr: range.addr,
            len: range.len,
        })?;
        let keys = verbs.mr_keys(&raw);
        Ok(MemoryRegion { raw: Some(raw), keys, range, access, pd: Arc::clone(pd) })
    }

    /// `ibv_dereg_mr`, reporting failure (which `Drop` cannot). On failure the
    /// region is abandoned: it stays pinned until its context is closed.
    pub fn deregister(mut self) -> Result<(), VerbsError> {
        match self.raw.take() {
            // SAFETY: the handle was just taken out of `self`, so nothing uses it again.
            Some(mr) => unsafe { self.pd.ctx.verbs.dereg_mr(mr) }.map_err(|errno| VerbsError::DeregMr { errno }),
            None => Ok(()),
        }
    }

    pub fn keys(&self) -> Keys {
        self.keys
    }
    pub fn lkey(&self) -> u32 {
        self.keys.lkey
    }
    pub fn rkey(&self) -> u32 {
        self.keys.rkey
    }
    pub fn range(&self) -> Range {
        self.range
    }
    pub fn access(&self) -> Access {
        self.access
    }
    pub fn protection_domain(&self) -> &Arc<ProtectionDomain<V>> {
        &self.pd
    }
}

impl<V: Verbs> Drop for MemoryRegion<V> {
    fn drop(&mut self) {
        if let Some(mr) = self.raw.take() {
            // SAFETY: the handle was just taken out of `self`, so nothing uses
            // it again; the PD is still allocated (`self.pd` drops after this).
            let _ = unsafe { self.pd.ctx.verbs.dereg_mr(mr) };
        }
    }
}

impl<V: Verbs> fmt::Debug for MemoryRegion<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("range", &self.range)
            .field("access", &self.access)
            .field("keys", &self.keys)
            .field("registered", &self.raw.is_some())
            .finish()
    }
}

/// A [`Registrar`] over ibverbs: one device context and one protection
/// domain; each registration is a [`MemoryRegion`].
pub struct VerbsRegistrar<V: Verbs = RealVerbs> {
    pd: Arc<ProtectionDomain<V>>,
}

impl VerbsRegistrar<RealVerbs> {
    /// Opens `device`, else the device named by [`DEVICE_ENV`], else the
    /// first device, and allocates a protection domain. Without an RDMA
    /// device this fails with [`VerbsError::NoDevice`] (or
    /// [`VerbsError::GetDeviceList`] with `ENOSYS` when the kernel has no
    /// RDMA support loaded); both messages say how to set up Soft-RoCE.
    pub fn open(device: Option<&str>) -> Result<Self, VerbsError> {
        Self::open_with(RealVerbs, device)
    }
}

impl<V: Verbs> VerbsRegistrar<V> {
    /// [`VerbsRegistrar::open`] through the given [`Verbs`].
    pub fn open_with(verbs: V, device: Option<&str>) -> Result<Self, VerbsError> {
        let wanted = wanted_device(device, std::env::var(DEVICE_ENV).ok());
        Self::open_exact(verbs, wanted.as_deref())
    }

    /// Opens `device` or the first device, ignoring [`DEVICE_ENV`].
    fn open_exact(verbs: V, device: Option<&str>) -> Result<Self, VerbsError> {
        let ctx = Context::open(verbs, device)?;
        let pd = ProtectionDomain::alloc(&ctx)?;
        Ok(VerbsRegistrar { pd })
    }

    pub fn device_name(&self) -> &str {
        self.pd.ctx.device_name()
    }

    pub fn protection_domain(&self) -> &Arc<ProtectionDomain<V>> {
        &self.pd
    }
}

impl<V: Verbs> fmt::Debug for VerbsRegistrar<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsRegistrar").field("device", &self.device_name()).finish()
    }
}

impl<V: Verbs> Registrar for VerbsRegistrar<V> {
    type Handle = MemoryRegion<V>;

    fn register(&self, range: Range, access: Access) -> Result<MemoryRegion<V>, RegistrarError> {
        Ok(MemoryRegion::register(&self.pd, range, access)?)
    }

    /// Deregisters by handle. The handle carries its own PD, so it is
    /// released correctly even after the registrar itself was dropped.
    fn deregister(&self, handle: MemoryRegion<V>) -> Result<(), RegistrarError> {
        Ok(handle.deregister()?)
    }

    fn keys(&self, handle: &MemoryRegion<V>) -> Keys {
        handle.keys()
    }

    fn name(&self) -> &'static str {
        "verbs"
    }
}

/// An in-memory [`Verbs`] with scripted failures and a log of calls.
#[cfg(test)]
mod fake {
    use super::*;
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Mutex;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Verb {
        GetDeviceList,
        OpenDevice,
        AllocPd,
        RegMr,
        DeregMr,
        DeallocPd,
        CloseDevice,
    }

    #[derive(Default)]
    struct State {
        devices: Vec<String>,
        fail_next: HashMap<Verb, i32>,
        log: Vec<String>,
        next_id: u32,
        /// pd -> ctx
        live_pds: BTreeMap<u32, u32>,
        /// mr -> pd
        live_mrs: BTreeMap<u32, u32>,
        live_ctxs: Vec<u32>,
    }

    /// Cloning shares the state, so a test keeps a clone to read the log.
    #[derive(Clone, Default)]
    pub struct FakeVerbs(Arc<Mutex<State>>);

    pub struct FakeList {
        names: Vec<String>,
        state: Arc<Mutex<State>>,
    }
    impl Drop for FakeList {
        fn drop(&mut self) {
            self.state.lock().unwrap().log.push("free_device_list".into());
        }
    }
    pub struct FakeCtx(u32);
    pub struct FakePd(u32);
    pub struct FakeMr(u32);

    impl FakeVerbs {
        pub fn with_devices(names: &[&str]) -> Self {
            let v = FakeVerbs::default();
            v.0.lock().unwrap().devices = names.iter().map(|s| s.to_string()).collect();
            v
        }
        /// The next call of `verb` fails with `errno`.
        pub fn fail_next(&self, verb: Verb, errno: i32) {
            self.0.lock().unwrap().fail_next.insert(verb, errno);
        }
        pub fn log(&self) -> Vec<String> {
            self.0.lock().unwrap().log.clone()
        }
        pub fn clear_log(&self) {
            self.0.lock().unwrap().log.clear();
        }
        /// Live (contexts, PDs, MRs).
        pub fn live(&self) -> (usize, usize, usize) {
            let s = self.0.lock().unwrap();
            (s.live_ctxs.len(), s.live_pds.len(), s.live_mrs.len())
        }
        fn call(&self, verb: Verb, entry: String) -> Result<u32, i32> {
            let mut s = self.0.lock().unwrap();
            if let Some(errno) = s.fail_next.remove(&verb) {
                s.log.push(format!("{entry} -> errno {errno}"));
                return Err(errno);
            }
            s.next_id += 1;
            s.log.push(entry);
            Ok(s.next_id)
        }
    }

    impl Verbs for FakeVerbs {
        type DeviceList = FakeList;
        type Ctx = FakeCtx;
        type Pd = FakePd;
        type Mr = FakeMr;

        fn get_device_list(&self) -> Result<FakeList, i32> {
            self.call(Verb::GetDeviceList, "get_device_list".into())?;
            let names = self.0.lock().unwrap().devices.clone();
            Ok(FakeList { names, state: Arc::clone(&self.0) })
        }
        fn device_names(&self, list: &FakeList) -> Vec<String> {
            list.names.clone()
        }
        fn open_device(&self, list: &FakeList, index: usize) -> Result<FakeCtx, i32> {
            let id = self.call(Verb::OpenDevice, format!("open_device({})", list.names[index]))?;
            self.0.lock().unwrap().live_ctxs.push(id);
            Ok(FakeCtx(id))
        }
        fn alloc_pd(&self, ctx: &FakeCtx) -> Result<FakePd, i32> {
            let id = self.call(Verb::AllocPd, "alloc_pd".into())?;
            self.0.lock().unwrap().live_pds.insert(id, ctx.0);
            Ok(FakePd(id))
        }
        fn reg_mr(&self, pd: &FakePd, addr: u64, len: u64, access: ibv_access_flags) -> Result<FakeMr, i32> {
            let id = self.call(Verb::RegMr, format!("reg_mr({addr:#x}, {len:#x}, {:#x})", access.0))?;
            self.0.lock().unwrap().live_mrs.insert(id, pd.0);
            Ok(FakeMr(id))
        }
        fn mr_keys(&self, mr: &FakeMr) -> Keys {
            Keys { lkey: 0x100 + mr.0, rkey: 0x200 + mr.0 }
        }
        unsafe fn dereg_mr(&self, mr: FakeMr) -> Result<(), i32> {
            self.call(Verb::DeregMr, format!("dereg_mr({:#x})", 0x100 + mr.0))?;
            self.0.lock().unwrap().live_mrs.remove(&mr.0);
            Ok(())
        }
        unsafe fn dealloc_pd(&self, pd: FakePd) -> Result<(), i32> {
            // Like the kernel: a PD with registered MRs is busy.
            if self.0.lock().unwrap().live_mrs.values().any(|&p| p == pd.0) {
                self.fail_next(Verb::DeallocPd, libc::EBUSY);
            }
            self.call(Verb::DeallocPd, "dealloc_pd".into())?;
            self.0.lock().unwrap().live_pds.remove(&pd.0);
            Ok(())
        }
        unsafe fn close_device(&self, ctx: FakeCtx) -> Result<(), i32> {
            // ibv_close_device succeeds whatever is left: closing releases it all.
            self.call(Verb::CloseDevice, "close_device".into())?;
            let mut s = self.0.lock().unwrap();
            s.live_ctxs.retain(|&c| c != ctx.0);
            let pds: Vec<u32> = s.live_pds.iter().filter(|(_, &c)| c == ctx.0).map(|(&p, _)| p).collect();
            s.live_mrs.retain(|_, p| !pds.contains(p));
            s.live_pds.retain(|_, c| *c != ctx.0);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{FakeVerbs, Verb};
    use super::*;
    use mrcache_types::RegistrarFailure;

    const LW: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    const RR: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    const RW: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    const RA: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;

    fn range(addr: u64, len: u64) -> Range {
        Range::new(addr, len).unwrap()
    }

    fn open(fake: &FakeVerbs, device: &str) -> VerbsRegistrar<FakeVerbs> {
        VerbsRegistrar::open_exact(fake.clone(), Some(device)).unwrap()
    }

    #[test]
    fn access_flag_mapping_table() {
        // Access bits differ from ibverbs bits (REMOTE_READ is 2 here, 4 in
        // verbs), so each right is checked by name.
        let table: &[(Access, u32)] = &[
            (Access::LOCAL_READ, 0),
            (Access::LOCAL_WRITE, LW),
            (Access::REMOTE_READ, RR),
            (Access::REMOTE_WRITE, RW | LW),
            (Access::REMOTE_ATOMIC, RA | LW),
            (Access::LOCAL_WRITE | Access::REMOTE_READ, LW | RR),
            (Access::REMOTE_READ | Access::REMOTE_WRITE, RR | RW | LW),
            (Access::REMOTE_READ | Access::REMOTE_ATOMIC, RR | RA | LW),
            (Access::from_bits(0xf).unwrap(), LW | RR | RW | RA),
        ];
        for &(access, want) in table {
            assert_eq!(access_flags(access).0, want, "{access}");
        }
        // Every combination: each right maps, nothing else is set, and remote
        // write/atomic always carry local write.
        for bits in 0..16u8 {
            let a = Access::from_bits(bits).unwrap();
            let f = access_flags(a).0;
            assert_eq!(f & !(LW | RR | RW | RA), 0, "{a}");
            assert_eq!(f & RR != 0, a.suffices_for(Access::REMOTE_READ), "{a}");
            assert_eq!(f & RW != 0, a.suffices_for(Access::REMOTE_WRITE), "{a}");
            assert_eq!(f & RA != 0, a.suffices_for(Access::REMOTE_ATOMIC), "{a}");
            let needs_lw =
                a.suffices_for(Access::LOCAL_WRITE) || a.suffices_for(Access::REMOTE_WRITE) || a.suffices_for(Access::REMOTE_ATOMIC);
            assert_eq!(f & LW != 0, needs_lw, "{a}");
        }
    }

    #[test]
    fn register_passes_range_and_mapped_flags_and_keys_come_from_the_mr() {
        let fake = FakeVerbs::with_devices(&["mlx5_0", "rxe0"]);
        let reg = open(&fake, "rxe0");
        assert_eq!(reg.device_name(), "rxe0");
        assert_eq!(reg.name(), "verbs");
        let h = reg.register(range(0x10000, 0x3000), Access::REMOTE_WRITE).unwrap();
        let log = fake.log();
        assert_eq!(
            log,
            ["get_device_list", "open_device(rxe0)", "free_device_list", "alloc_pd", &format!("reg_mr(0x10000, 0x3000, {:#x})", LW | RW),]
        );
        assert_eq!(reg.keys(&h), Keys { lkey: h.lkey(), rkey: h.rkey() });
        assert_ne!(h.lkey(), 0);
        assert_eq!((h.range(), h.access()), (range(0x10000, 0x3000), Access::REMOTE_WRITE));
        reg.deregister(h).unwrap();
        assert_eq!(fake.live(), (1, 1, 0));
    }

    #[test]
    fn first_device_is_the_default_and_explicit_beats_env() {
        let fake = FakeVerbs::with_devices(&["mlx5_0", "rxe0"]);
        let ctx = Context::open(fake.clone(), None).unwrap();
        assert_eq!(ctx.device_name(), "mlx5_0");

        let env = |s: &str| Some(s.to_owned());
        assert_eq!(wanted_device(Some("a"), env("b")).as_deref(), Some("a"));
        assert_eq!(wanted_device(None, env("b")).as_deref(), Some("b"));
        assert_eq!(wanted_device(None, env("")).as_deref(), None);
        assert_eq!(wanted_device(None, None), None);
    }

    #[test]
    fn get_device_list_failure() {
        let fake = FakeVerbs::with_devices(&["rxe0"]);
        fake.fail_next(Verb::GetDeviceList, libc::ENOSYS);
        let e = VerbsRegistrar::open_exact(fake.clone(), None).unwrap_err();
        assert_eq!(e, VerbsError::GetDeviceList { errno: libc::ENOSYS });
        assert!(e.to_string().contains("rdma_rxe"), "{e}");
        let r = RegistrarError::from(e);
        assert_eq!((r.verb, r.errno, r.failure), ("ibv_get_device_list", libc::ENOSYS, RegistrarFailure::Other));
        assert_eq!(fake.live(), (0, 0, 0));
    }

    #[test]
    fn no_device_explains_soft_roce() {
        let fake = FakeVerbs::with_devices(&[]);
        // Also when a name is asked for: "no device at all" is the better answer.
        for dev in [None, Some("rxe0")] {
            let e = VerbsRegistrar::open_exact(fake.clone(), dev).unwrap_err();
            assert_eq!(e, VerbsError::NoDevice);
            let msg = e.to_string();
            assert!(msg.contains("modprobe rdma_rxe") && msg.contains("rdma link add rxe0 type rxe netdev eth0"), "{msg}");
            let r = RegistrarError::from(e);
            assert_eq!((r.verb, r.errno), ("ibv_get_device_list", libc::ENODEV));
        }
        assert_eq!(fake.log(), ["get_device_list", "free_device_list", "get_device_list", "free_device_list"]);
    }

    #[test]
    fn device_not_found_lists_the_available_names() {
        let fake = FakeVerbs::with_devices(&["mlx5_0", "rxe0"]);
        let e = VerbsRegistrar::open_exact(fake.clone(), Some("mlx5_9")).unwrap_err();
        assert_eq!(e, VerbsError::DeviceNotFound { name: "mlx5_9".into(), available: vec!["mlx5_0".into(), "rxe0".into()] });
        let msg = e.to_string();
        assert!(msg.contains("`mlx5_9`") && msg.contains("mlx5_0, rxe0") && msg.contains(DEVICE_ENV), "{msg}");
        assert_eq!(fake.log(), ["get_device_list", "free_device_list"]);
    }

    #[test]
    fn open_device_failure() {
        let fake = FakeVerbs::with_devices(&["rxe0"]);
        fake.fail_next(Verb::OpenDevice, libc::EACCES);
        let e = VerbsRegistrar::open_exact(fake.clone(), Some("rxe0")).unwrap_err();
        assert_eq!(e, VerbsError::OpenDevice { name: "rxe0".into(), errno: libc::EACCES });
        assert!(e.to_string().starts_with("ibv_open_device(rxe0) failed"), "{e}");
        let r = RegistrarError::from(e);
        assert_eq!((r.verb, r.errno), ("ibv_open_device", libc::EACCES));
        assert_eq!(fake.log(), ["get_device_list", "open_device(rxe0) -> errno 13", "free_device_list"]);
        assert_eq!(fake.live(), (0, 0, 0));
    }

    #[test]
    fn alloc_pd_failure_closes_the_context() {
        let fake = FakeVerbs::with_devices(&["rxe0"]);
        fake.fail_next(Verb::AllocPd, libc::ENOMEM);
        let e = VerbsRegistrar::open_exact(fake.clone(), None).unwrap_err();
        assert_eq!(e, VerbsError::AllocPd { errno: libc::ENOMEM });
        let r = RegistrarError::from(e);
        assert_eq!((r.verb, r.failure), ("ibv_alloc_pd", RegistrarFailure::NoMemory));
        assert_eq!(fake.log(), ["get_device_list", "open_device(rxe0)", "free_device_list", "alloc_pd -> errno 12", "close_device"]);
        assert_eq!(fake.live(), (0, 0, 0));
    }

    #[test]
    fn reg_mr_failures_map_to_registrar_failures() {
        let fake = FakeVerbs::with_devices(&["rxe0"]);
        let reg = open(&fake, "rxe0");
        for (errno, failure) in [
            (libc::ENOMEM, RegistrarFailure::NoMemory),
            (libc::EAGAIN, RegistrarFailure::Again),
            (libc::EFAULT, RegistrarFailure::Fault),
            (libc::EINVAL, RegistrarFailure::Other),
        ] {
            fake.fail_next(Verb::RegMr, errno);
            let e = reg.register(range(0x7000, 0x2000), Access::REMOTE_READ).unwrap_err();
            assert_eq!((e.verb, e.errno, e.failure), ("ibv_reg_mr", errno, failure));
            assert!(e.detail.contains("0x2000 bytes at 0x7000"), "{e}");
        }
        let e = VerbsError::RegMr { errno: libc::ENOMEM, addr: 0, len: 1 };
        assert!(e.to_string().contains("RLIMIT_MEMLOCK"), "{e}");
        // A failed registration has no side effect.
        assert_eq!(fake.live(), (1, 1, 0));
    }

    #[test]
    fn dereg_mr_failure_is_reported_and_the_mr_is_left_to_close() {
        let fake = FakeVerbs::with_devices(&["rxe0"]);
        let reg = open(&fake, "rxe0");
        let h = reg.register(range(0x1000, 0x1000), Access::LOCAL_WRITE).unwrap();
        fake.clear_log();
        fake.fail_next(Verb::DeregMr, libc::EBUSY);
        let e = reg.deregister(h).unwrap_err();
        assert_eq!((e.verb, e.errno, e.failure), ("ibv_dereg_mr", libc::EBUSY, RegistrarFailure::Other));
        assert!(e.detail.contains("stays pinned"), "{e}");
        // Not retried by Drop (the handle was consumed); the PD is then busy,
        // and closing the context releases everything.
        drop(reg);
        assert_eq!(fake.log(), ["dereg_mr(0x104) -> errno 16", "dealloc_pd -> errno 16", "close_device"]);
        assert_eq!(fake.live(), (0, 0, 0));
    }

    #[test]
    fn drop_order_is_mrs_then_pd_then_context() {
        let fake = FakeVerbs::with_devices(&["rxe0"]);
        let reg = open(&fake, "rxe0");
        let a = reg.register(range(0x1000, 0x1000), Access::LOCAL_WRITE).unwrap();
        let b = reg.register(range(0x4000, 0x2000), Access::REMOTE_READ).unwrap();
        let c = reg.register(range(0x8000, 0x1000), Access::REMOTE_ATOMIC).unwrap();
        fake.clear_log();

        reg.deregister(a).unwrap();
        // The registrar goes first; its MRs keep the PD and context alive.
        drop(reg);
        assert_eq!(fake.log(), ["dereg_mr(0x104)"]);
        assert_eq!(fake.live(), (1, 1, 2));
        drop(c);
        drop(b);
        assert_eq!(fake.log(), ["dereg_mr(0x104)", "dereg_mr(0x106)", "dereg_mr(0x105)", "dealloc_pd", "close_device"]);
        assert_eq!(fake.live(), (0, 0, 0));
    }

    #[test]
    fn handles_are_send_and_sync() {
        fn registrar<R: Registrar>() {}
        registrar::<VerbsRegistrar<RealVerbs>>();
        registrar::<VerbsRegistrar<FakeVerbs>>();
    }

    /// On a machine without an RDMA device (like the one this was written
    /// on: no /sys/class/infiniband) opening fails with an error, not a
    /// panic, and the error says how to get a Soft-RoCE device.
    #[test]
    fn real_verbs_without_a_device_fails_clearly() {
        let have_device = std::fs::read_dir("/sys/class/infiniband").map(|mut d| d.next().is_some()).unwrap_or(false);
        match VerbsRegistrar::open(None) {
            Err(e) => {
                assert!(matches!(e, VerbsError::NoDevice | VerbsError::GetDeviceList { .. } | VerbsError::DeviceNotFound { .. }), "{e:?}");
                if !matches!(e, VerbsError::DeviceNotFound { .. }) {
                    assert!(e.to_string().contains("rdma_rxe"), "{e}");
                }
                assert!(!have_device || std::env::var_os(DEVICE_ENV).is_some(), "device present but: {e}");
                let r = RegistrarError::from(e);
                assert_eq!(r.verb, "ibv_get_device_list");
            }
            Ok(reg) => assert!(have_device, "opened {reg:?} without /sys/class/infiniband"),
        }
    }

    /// Loopback check on a real device. Needs an RDMA device, e.g. Soft-RoCE:
    /// `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0`, then
    /// `cargo test -p mrcache --features verbs --lib registrar::verbs -- --ignored`.
    /// A full RDMA write needs queue pairs, which this module does not
    /// create, so it only registers, checks the keys and deregisters.
    /// It is ignored by default and does not count as coverage.
    #[test]
    #[ignore = "needs an RDMA device (rdma_rxe); run with --ignored"]
    fn loopback_register_on_a_real_device() {
        let reg = VerbsRegistrar::open(None).unwrap_or_else(|e| panic!("{e}"));
        let layout = std::alloc::Layout::from_size_align(64 << 10, 4096).unwrap();
        // SAFETY: the layout has a non-zero size.
        let buf = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!buf.is_null());
        let r = range(buf as u64, layout.size() as u64);
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let h = reg.register(r, access).unwrap_or_else(|e| panic!("{e}"));
        let keys = reg.keys(&h);
        assert_ne!(keys.lkey, 0);
        assert_ne!(keys.rkey, 0);
        assert_eq!(keys, h.keys());
        reg.deregister(h).unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: `buf` was allocated above with `layout` and is deregistered.
        unsafe { std::alloc::dealloc(buf, layout) };
    }
}
