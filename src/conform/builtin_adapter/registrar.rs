//! The registrar both backends use ([`EmitRegistrar`]): it pins each
//! registration as an io_uring fixed buffer ([`UringPins`], or nothing with
//! `--registrar counting`), reports every call as a `reg` or `dereg` line,
//! performs the acquire's `during_register` after the pin, and pauses there
//! when the command asked to.
//!
//! Invariant: [`LIVE`] holds every registration made and not yet
//! deregistered (what `query` answers); a `reg` line is written only once
//! the pin exists, a `dereg` line only once it is gone. Above
//! [`super::protocol`] only.

use super::protocol::{during_point, emit, pause_point};
use mrcache::registrar::uring::{UringHandle, UringRegistrar};
use mrcache::registrar::{Keys, Registrar, RegistrarError};
use mrcache_types::{Access, LeaseId, Range};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The last registration id: unique for the session, across the caches a
/// `create` makes and across a fork.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// The registrations the registrar holds (id -> bytes), for `query`.
pub(super) static LIVE: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// The answer to `query`: the registrations held and their bytes.
pub(super) fn live_now() -> Value {
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    json!({"registrations": live.len(), "pinned_bytes": live.iter().map(|(_, b)| b).sum::<u64>()})
}

/// The registrar both caches use: pins (with the io_uring registrar),
/// reports every call, pauses after the pin.
pub struct EmitRegistrar {
    /// The io_uring pins, or `None` with `--registrar counting`.
    pins: Option<&'static UringPins>,
}

impl EmitRegistrar {
    pub(super) fn new() -> EmitRegistrar {
        EmitRegistrar { pins: PINS.get().copied() }
    }
}

/// The io_uring registrar and the pin of each registration id.
pub struct UringPins {
    /// Replaced in a fork child (the parent's ring is `MADV_DONTFORK`); the
    /// old one is leaked, never dropped there.
    ring: Mutex<&'static UringRegistrar>,
    pub(super) handles: Mutex<HashMap<u64, UringHandle>>,
}

/// Set once at start when the registrar is io_uring.
pub(super) static PINS: OnceLock<&'static UringPins> = OnceLock::new();
/// The registration id each held lease names (for the data commands).
pub(super) static LEASE_REGS: Mutex<Option<HashMap<LeaseId, u64>>> = Mutex::new(None);

/// The io_uring slots: more than any case keeps live.
const URING_SLOTS: u32 = 4096;

impl UringPins {
    pub(super) fn open() -> Result<&'static UringPins, String> {
        let ring = UringRegistrar::new(URING_SLOTS).map_err(|e| {
            format!("the io_uring registrar is unavailable: {e} (run with --registrar counting to judge by event order only)")
        })?;
        Ok(Box::leak(Box::new(UringPins { ring: Mutex::new(Box::leak(Box::new(ring))), handles: Mutex::new(HashMap::new()) })))
    }

    pub(super) fn ring(&self) -> &'static UringRegistrar {
        *self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// In a fork child: a ring of its own; the parent's pins are forgotten.
    pub(super) fn forked(&self) {
        match UringRegistrar::new(URING_SLOTS) {
            Ok(r) => *self.ring.lock().unwrap_or_else(|e| e.into_inner()) = Box::leak(Box::new(r)),
            Err(e) => emit(&json!({"ev": "log", "text": format!("no io_uring ring in the fork child: {e}")})),
        }
        let old = std::mem::take(&mut *self.handles.lock().unwrap_or_else(|e| e.into_inner()));
        // The parent's handles name slots of the parent's ring: never used here.
        std::mem::forget(old);
    }
}

impl Registrar for EmitRegistrar {
    type Handle = u64;
    fn register(&self, range: Range, access: Access) -> Result<u64, RegistrarError> {
        let pin = match self.pins {
            Some(p) => Some(p.ring().register(range, access)?),
            None => None,
        };
        let id = NEXT_ID.fetch_add(1, Ordering::SeqCst) + 1;
        if let (Some(p), Some(h)) = (self.pins, pin) {
            p.handles.lock().unwrap_or_else(|e| e.into_inner()).insert(id, h);
        }
        emit(&json!({"ev": "reg", "id": id, "addr": format!("{:#x}", range.addr), "len": range.len, "access": access.to_string()}));
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).push((id, range.len));
        during_point();
        pause_point();
        Ok(id)
    }
    fn deregister(&self, id: u64) -> Result<(), RegistrarError> {
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).retain(|(i, _)| *i != id);
        if let Some(p) = self.pins {
            let h = p.handles.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            if let Some(h) = h {
                if let Err(e) = p.ring().deregister(h) {
                    emit(&json!({"ev": "log", "text": format!("registration {id}: the io_uring registrar could not unpin it: {e}")}));
                }
            }
        }
        emit(&json!({"ev": "dereg", "id": id}));
        Ok(())
    }
    fn keys(&self, id: &u64) -> Keys {
        Keys { lkey: *id as u32, rkey: *id as u32 }
    }
    fn name(&self) -> &'static str {
        "conformance"
    }
}
