//! The running thread's identity without a thread-local lookup: the cache
//! crate's ([`mrcache_impl::thread_token`]), which the per-thread
//! buckets ([`crate::threads`]) share with the cache's lanes.

pub(crate) use mrcache_impl::thread_token::{bucket, thread_token};
