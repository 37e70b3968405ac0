//! io_uring fixed-buffer registrar (in progress).
