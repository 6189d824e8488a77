//! One route per file, and the panels pages share (`join_tokens`, `pool_admin` and
//! `pool_provider` on the Hosts page, `project_admin` on the Projects page).

pub mod audit;
pub mod consolidation;
pub mod host;
pub mod hosts;
pub mod join_tokens;
pub mod notifications;
pub mod overview;
pub mod pool_admin;
pub mod pool_provider;
pub mod project_admin;
pub mod projects;
pub mod service;
pub mod service_new;
pub mod services;
pub mod sign_in;
pub mod task;
pub mod task_definition;
pub mod task_definitions;
pub mod task_logs;
pub mod users;
