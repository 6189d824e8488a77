//! Tessera's control plane: the store that holds the fleet's state, and the logic on top of
//! it that the HTTP server, the console and the agents call.
//!
//! # Layout
//! - [`store`]: the `Store` interface every backend implements, and `open` to pick one from
//!   a database URL.
//! - [`sqlite`]: the embedded SQLite backend (the default), with its migrations.
//! - [`error`]: `StoreError`, the one error type of the store boundary.

#![forbid(unsafe_code)]

pub mod error;
pub mod sqlite;
pub mod store;

pub use error::StoreError;
pub use store::{Store, open};
