//! mink-log
