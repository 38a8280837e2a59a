//! mink-kv
