//! Page generations: the physical truth of freshness checks (spec.md#P2)
//! without real memory. [`Pages`] keeps a generation per page, which a
//! test's release events bump; a [`GenRegistrar`] handle records the
//! generations its registration pinned, and [`GenHandle::is_fresh_for`]
//! says whether a lease still maps the frames the memory has. Used by the
//! concurrent, reentrant, release-window and oracle tests of `impl/tests/`.
//! (Was `impl/tests/common`.)

use mrcache::registrar::{Keys, Registrar, RegistrarError};
use mrcache_types::{Access, Range};

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
        Bumped(self.page_range(addr, len).map(|p| (p, self.gens[p].fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1)).collect())
    }
    /// The release event completed (after the hook returned).
    ///
    /// Records the generations *this* event installed, not the pages'
    /// current ones: another event may have bumped a page since and still be
    /// running (its hook has not returned), and P2 does not order an acquire
    /// after an event that has not completed. Reading the current generation
    /// here was the false alarm of `four_threads_with_limits` (under contention,
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
        self.registered.load(std::sync::atomic::Ordering::SeqCst) - self.deregistered.load(std::sync::atomic::Ordering::SeqCst)
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
