//! The buffer forms of acquire: a slice or a pointer and
//! a length, beside the raw `u64` address.

use mrcache::registrar::counting::CountingRegistrar;
use mrcache::types::{Access, OpError};
use mrcache::{Cache, CacheConfig, SharedCache};

#[test]
fn a_slice_acquires_exactly_its_bytes() {
    let cache = Cache::new(CountingRegistrar::default(), CacheConfig::explicit());
    let words = vec![7u64; 1024]; // 8 KiB
    let lease = cache.acquire_slice(&words, Access::LOCAL_WRITE).expect("acquire");
    let view = lease.view();
    let (addr, len) = (words.as_ptr() as u64, 8 * 1024u64);
    assert!(view.addr <= addr && view.addr + view.len >= addr + len, "{view:?}");
    drop(lease);
    let again = cache.acquire_ptr(words.as_ptr(), 8 * 1024, Access::LOCAL_WRITE).expect("acquire");
    assert!(again.hit(), "the same bytes as a pointer and a length hit");
}

#[test]
fn an_empty_slice_is_e1() {
    let cache = Cache::new(CountingRegistrar::default(), CacheConfig::explicit());
    let empty: [u8; 0] = [];
    let err = cache.acquire_slice(&empty, Access::LOCAL_WRITE).map(|_| ()).expect_err("empty");
    assert_eq!(err.op_error(), OpError::EmptyRange);
    let shared = SharedCache::new(CountingRegistrar::default(), CacheConfig::explicit());
    let err = shared.acquire_owned_slice(&empty, Access::LOCAL_WRITE).map(|_| ()).expect_err("empty");
    assert_eq!(err.op_error(), OpError::EmptyRange);
}
