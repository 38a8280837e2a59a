//! mink-meta
