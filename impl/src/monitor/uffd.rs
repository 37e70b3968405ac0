//! userfaultfd monitor (in progress).
