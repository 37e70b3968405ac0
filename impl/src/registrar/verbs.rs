//! ibverbs registrar (in progress).
