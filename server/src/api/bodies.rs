//! The REST API's own response bodies live in `tessera_model::bodies`, shared with the
//! command line.

pub use tessera_model::bodies::*;
