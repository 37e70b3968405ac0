//! Test helpers shared by the integration tests.
#![allow(dead_code)]

pub mod gen;

use mrcache::registrar::counting::{CountingHandle, CountingRegistrar};
use mrcache::registrar::{Keys, Registrar, RegistrarError};
use mrcache::types::{Access, Range};
use std::collections::VecDeque;
use std::sync::Mutex;

/// What a [`Recorder`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Call {
    /// `register(range, access)` succeeded.
    Register(Range, Access),
    /// `deregister` of the handle with this registrar serial.
    Deregister(u64),
    /// `register` failed with this errno.
    Failed(Range, i32),
}

/// A counting registrar that logs every call and can fail on a script of
/// errnos (`Some(errno)`: fail the next register with it; `None`: succeed).
#[derive(Debug, Default)]
pub struct Recorder {
    pub inner: CountingRegistrar,
    pub calls: Mutex<Vec<Call>>,
    pub script: Mutex<VecDeque<Option<i32>>>,
}

impl Recorder {
    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
    pub fn fail_next(&self, errnos: &[Option<i32>]) {
        self.script.lock().unwrap().extend(errnos.iter().copied());
    }
    pub fn live(&self) -> u64 {
        self.inner.live()
    }
}

impl Registrar for Recorder {
    type Handle = CountingHandle;

    fn register(&self, range: Range, access: Access) -> Result<CountingHandle, RegistrarError> {
        if let Some(Some(errno)) = self.script.lock().unwrap().pop_front() {
            self.calls.lock().unwrap().push(Call::Failed(range, errno));
            return Err(RegistrarError::from_errno("test_reg", errno, "scripted failure"));
        }
        let h = self.inner.register(range, access)?;
        self.calls.lock().unwrap().push(Call::Register(range, access));
        Ok(h)
    }

    fn deregister(&self, handle: CountingHandle) -> Result<(), RegistrarError> {
        self.calls.lock().unwrap().push(Call::Deregister(handle.id));
        self.inner.deregister(handle)
    }

    fn keys(&self, handle: &CountingHandle) -> Keys {
        self.inner.keys(handle)
    }

    fn name(&self) -> &'static str {
        "recorder"
    }
}

/// Physical truth for freshness checks (spec.md#P2): a generation per page,
/// bumped by a test's release events. A [`GenRegistrar`] handle records the
/// generations of its pages when it was registered ("pinned frames").
#[derive(Debug)]
pub struct Pages {
    pub page_size: u64,
    /// Current generation (frames mapped now).
    pub gens: Vec<std::sync::atomic::AtomicU64>,
    /// Generation as of the last *completed* release event (its hook returned).
    pub completed: Vec<std::sync::atomic::AtomicU64>,
}

impl Pages {
    pub fn new(pages: usize, page_size: u64) -> Self {
        Pages {
            page_size,
            gens: (0..pages).map(|_| Default::default()).collect(),
            completed: (0..pages).map(|_| Default::default()).collect(),
        }
    }
    pub fn page_range(&self, addr: u64, len: u64) -> std::ops::Range<usize> {
        let first = (addr / self.page_size) as usize;
        let end = (addr + len).div_ceil(self.page_size) as usize;
        first.min(self.gens.len())..end.min(self.gens.len())
    }
    /// The frames change (before the hook runs). Returns the generation this
    /// event installed on each page: [`Pages::complete`] records exactly
    /// those, as the checker's `done_gens` does (spec.md#P2).
    pub fn bump(&self, addr: u64, len: u64) -> Bumped {
        Bumped(
            self.page_range(addr, len)
                .map(|p| (p, self.gens[p].fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1))
                .collect(),
        )
    }
    /// The release event completed (after the hook returned).
    ///
    /// Records the generations *this* event installed, not the pages'
    /// current ones: another event may have bumped a page since and still be
    /// running (its hook has not returned), and P2 does not order an acquire
    /// after an event that has not completed. Reading the current generation
    /// here was the false alarm of `four_threads_with_limits` (issue 10,
    /// traces/regressions/stale-lease-oracle-current-generation.jsonl).
    pub fn complete(&self, bumped: &Bumped) {
        for &(p, g) in &bumped.0 {
            self.completed[p].fetch_max(g, std::sync::atomic::Ordering::SeqCst);
        }
    }
    pub fn completed_snapshot(&self, addr: u64, len: u64) -> Vec<(usize, u64)> {
        self.page_range(addr, len).map(|p| (p, self.completed[p].load(std::sync::atomic::Ordering::SeqCst))).collect()
    }
}

/// The generations one release event installed, per page (see [`Pages::bump`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bumped(pub Vec<(usize, u64)>);

/// A handle that remembers the page generations it pinned.
#[derive(Debug)]
pub struct GenHandle {
    pub serial: u64,
    pub range: Range,
    pub first_page: usize,
    pub pinned: Vec<u64>,
}

impl GenHandle {
    /// P2: for every page of the snapshot (taken when the acquire began), the
    /// registration pinned that generation or a later one.
    pub fn is_fresh_for(&self, snapshot: &[(usize, u64)]) -> bool {
        snapshot.iter().all(|&(p, g)| {
            let i = p - self.first_page;
            self.pinned.get(i).is_some_and(|&pg| pg >= g)
        })
    }
}

/// A registrar that pins page generations and counts live handles. An
/// optional hook runs inside `register` after pinning (to raise release
/// events from inside a cache operation).
pub struct GenRegistrar {
    pub pages: std::sync::Arc<Pages>,
    pub serial: std::sync::atomic::AtomicU64,
    pub registered: std::sync::atomic::AtomicU64,
    pub deregistered: std::sync::atomic::AtomicU64,
    #[allow(clippy::type_complexity)]
    pub on_register: Option<Box<dyn Fn(Range) + Send + Sync>>,
}

impl GenRegistrar {
    pub fn new(pages: std::sync::Arc<Pages>) -> Self {
        GenRegistrar {
            pages,
            serial: Default::default(),
            registered: Default::default(),
            deregistered: Default::default(),
            on_register: None,
        }
    }
    pub fn live(&self) -> u64 {
        self.registered.load(std::sync::atomic::Ordering::SeqCst)
            - self.deregistered.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Registrar for GenRegistrar {
    type Handle = GenHandle;

    fn register(&self, range: Range, _access: Access) -> Result<GenHandle, RegistrarError> {
        use std::sync::atomic::Ordering::SeqCst;
        let pr = self.pages.page_range(range.addr, range.len);
        let pinned = pr.clone().map(|p| self.pages.gens[p].load(SeqCst)).collect();
        if let Some(hook) = &self.on_register {
            hook(range);
        }
        self.registered.fetch_add(1, SeqCst);
        Ok(GenHandle { serial: self.serial.fetch_add(1, SeqCst), range, first_page: pr.start, pinned })
    }

    fn deregister(&self, _handle: GenHandle) -> Result<(), RegistrarError> {
        self.deregistered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    fn keys(&self, handle: &GenHandle) -> Keys {
        Keys { lkey: handle.serial as u32, rkey: handle.serial as u32 }
    }

    fn name(&self) -> &'static str {
        "gen"
    }
}
