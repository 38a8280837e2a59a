//! mink-flight
