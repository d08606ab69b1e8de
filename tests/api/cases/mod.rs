//! Case tables shared by the unit tests (which include these files with `#[path]`) and the wire replay.

pub mod conditional;
pub mod range;
