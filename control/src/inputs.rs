//! Request bodies (`tessera_model::api`, shared with the console) and their rules
//! (`tessera_model::validate`, which the console also runs in the browser), as control's
//! operations take them: every error names its field.

use crate::error::ControlError;
use tessera_model::PoolInfo;
pub use tessera_model::api::{
    Density, PoolInput, PreviewInput, PreviewResult, PreviewTask, ServiceDetail, ServiceInput,
    ServicePatch,
};
use tessera_model::service::Service;
pub(crate) use tessera_model::validate::Errors;

/// Checks a pool body; returns the pool to store.
pub fn validate_pool(input: &PoolInput) -> Result<PoolInfo, ControlError> {
    Ok(tessera_model::validate::pool(input)?)
}

/// Checks the fields of a service body that need no store; returns the service to store.
pub(crate) fn validate_service(input: &ServiceInput) -> Result<Service, ControlError> {
    Ok(tessera_model::validate::service(input)?)
}
