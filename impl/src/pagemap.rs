//! /proc/self/pagemap reader (in progress).
