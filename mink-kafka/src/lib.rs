//! mink-kafka
