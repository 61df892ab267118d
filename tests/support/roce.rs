//! Builders that add extended headers to a hand-made `RoceRepr`: the
//! library's own (`softroce::wire::build`).

pub use softroce::wire::build::{bth, Build};
