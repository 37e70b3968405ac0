//! One shared [`Op`] applied to the cache, answering the shared [`Ret`], so
//! the kit drives the cache and the model (`Model::step` / `Model::judge`)
//! with the same operations. (Was `Cache::apply`, in the production crate.)

use mrcache::registrar::Registrar;
use mrcache::{Cache, Lease};
use mrcache_types::{LeaseId, Op, OpError, Range, Ret};
use std::collections::HashMap;

/// [`Apply::apply`]: an [`Op`] applied to a [`Cache`].
pub trait Apply<R: Registrar> {
    /// Applies `op` and returns what the model returns for it (spec.md#S2):
    ///
    /// - `acquire`: E1/E2 for a bad range, then E3 if `lease` is held, else the
    ///   lease is stored in `leases` under its id;
    /// - `release`: drops the stored lease (E4 if none; counted as a release
    ///   call all the same, spec.md#S2);
    /// - `release_event`: [`Cache::invalidate`];
    /// - `release_begin`, `release_end`: [`Cache::release_begin`],
    ///   [`Cache::release_end`] (spec.md#S2.9);
    /// - `alloc`, `free`: no effect, never an error (spec.md#S2.4);
    /// - `flush`: [`Cache::flush`];
    /// - `fork`: [`Cache::simulate_fork`]; leases held stay in `leases` and
    ///   their later `release` is a no-op, as in a child (S2.6).
    fn apply<'c>(&'c self, op: &Op, leases: &mut HashMap<LeaseId, Lease<'c, R>>) -> Ret;
}

impl<R: Registrar> Apply<R> for Cache<R> {
    fn apply<'c>(&'c self, op: &Op, leases: &mut HashMap<LeaseId, Lease<'c, R>>) -> Ret {
        match *op {
            Op::Acquire { lease, addr, len, access } => {
                if Range::new(addr, len).is_ok() && leases.contains_key(&lease) {
                    self.count_acquire();
                    self.count_error();
                    return Ret::Failed { error: OpError::LeaseInUse { lease } };
                }
                match self.acquire(addr, len, access) {
                    Ok(l) => {
                        let ret = Ret::Granted { reg: l.view(), hit: l.hit(), pressure: l.pressure() };
                        leases.insert(lease, l);
                        ret
                    }
                    Err(e) => Ret::Failed { error: e.op_error() },
                }
            }
            Op::Release { lease } => match leases.remove(&lease) {
                Some(l) => {
                    drop(l);
                    Ret::Done
                }
                None => {
                    self.count_unknown_release();
                    Ret::Failed { error: OpError::UnknownLease { lease } }
                }
            },
            Op::ReleaseEvent { kind, addr, len } => match self.invalidate(addr, len, kind) {
                Ok(()) => Ret::Done,
                Err(e) => Ret::Failed { error: e.op_error() },
            },
            Op::ReleaseBegin { addr, len } => match self.release_begin(addr, len) {
                Ok(()) => Ret::Done,
                Err(e) => Ret::Failed { error: e.op_error() },
            },
            Op::ReleaseEnd { addr, len } => match self.release_end(addr, len) {
                Ok(()) => Ret::Done,
                Err(e) => Ret::Failed { error: e.op_error() },
            },
            //= spec.md#S2.4
            Op::Alloc { .. } | Op::Free { .. } => Ret::Done,
            Op::Flush => {
                self.flush();
                Ret::Done
            }
            Op::Trim => {
                self.trim();
                Ret::Done
            }
            Op::Fork => {
                self.simulate_fork();
                Ret::Done
            }
        }
    }
}
