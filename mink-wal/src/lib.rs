//! mink-wal
