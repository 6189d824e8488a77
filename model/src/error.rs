//! Validation errors the whole model shares: each names the field (a path such as
//! `containers[0].gpu.mps.memory_mib`) and the rule it broke.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One rule broken at one place in the input.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    /// Where, e.g. `containers[0].gpu.mps.memory_mib`.
    pub field: String,
    /// What is wrong and what would be right.
    pub message: String,
}

/// Every error found in one input; empty never escapes a validator.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct ValidationErrors {
    pub errors: Vec<FieldError>,
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        f.write_str(&parts.join("; "))
    }
}
