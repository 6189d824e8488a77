//! One route per file.

pub mod audit;
pub mod consolidation;
pub mod host;
pub mod hosts;
pub mod join_tokens;
pub mod overview;
pub mod projects;
pub mod service;
pub mod service_new;
pub mod services;
pub mod sign_in;
pub mod task_definition;
pub mod task_definitions;
