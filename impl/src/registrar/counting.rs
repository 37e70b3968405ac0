//! A registrar that pins nothing and counts calls: for tests and benches.

use super::{Keys, Registrar, RegistrarError};
use mrcache_types::{Access, Range};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts `register`/`deregister` calls and live handles.
#[derive(Debug, Default)]
pub struct CountingRegistrar {
    next: AtomicU64,
    pub registered: AtomicU64,
    pub deregistered: AtomicU64,
}

/// The handle of a [`CountingRegistrar`] registration.
#[derive(Debug, PartialEq, Eq)]
pub struct CountingHandle {
    pub id: u64,
    pub range: Range,
    pub access: Access,
}

impl CountingRegistrar {
    pub fn live(&self) -> u64 {
        self.registered.load(Ordering::SeqCst) - self.deregistered.load(Ordering::SeqCst)
    }
}

impl Registrar for CountingRegistrar {
    type Handle = CountingHandle;

    fn register(&self, range: Range, access: Access) -> Result<CountingHandle, RegistrarError> {
        self.registered.fetch_add(1, Ordering::Relaxed);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        Ok(CountingHandle { id, range, access })
    }

    fn deregister(&self, _handle: CountingHandle) -> Result<(), RegistrarError> {
        self.deregistered.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn keys(&self, h: &CountingHandle) -> Keys {
        Keys { lkey: h.id as u32, rkey: h.id as u32 }
    }

    fn name(&self) -> &'static str {
        "counting"
    }
}
