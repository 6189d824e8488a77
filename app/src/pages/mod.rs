//! One route per file.

pub mod hosts;
