//! softroce as `libibverbs.so.1`.
