//! Webhooks and their deliveries: the `WebhookStore` trait. Deliveries are made with the
//! event they tell of ([`crate::store::EventStore::add_notice`]), one per matching webhook.

use crate::error::StoreError;
use async_trait::async_trait;
use tessera_model::notify::{Delivery, Webhook, WebhookFormat, WebhookInput};
use tessera_model::time::Timestamp;

/// Where and how a delivery is sent: its webhook's URL, body format and signing secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub url: String,
    pub format: WebhookFormat,
    pub secret: String,
}

/// What one try of a delivery came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Delivered {
        status: u16,
    },
    /// To be tried again at `next_at`.
    Retry {
        status: Option<u16>,
        error: String,
        next_at: Timestamp,
    },
    /// Its tries are spent.
    GaveUp {
        status: Option<u16>,
        error: String,
    },
}

#[async_trait]
/// Webhooks and their deliveries.
pub trait WebhookStore: Send + Sync + 'static {
    /// Stores a webhook (validated) with its signing secret; `Conflict` when its name is
    /// taken.
    async fn create_webhook(
        &self,
        input: &WebhookInput,
        secret: &str,
        at: Timestamp,
    ) -> Result<Webhook, StoreError>;
    async fn list_webhooks(&self) -> Result<Vec<Webhook>, StoreError>;
    /// Deletes it and its deliveries; `NotFound` when there is none.
    async fn delete_webhook(&self, id: i64) -> Result<(), StoreError>;
    /// Pending deliveries due at `now`, oldest first, with where they go.
    async fn due_deliveries(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> Result<Vec<(Delivery, Target)>, StoreError>;
    /// Records one try of delivery `id` (taken at `at`).
    async fn record_attempt(
        &self,
        id: i64,
        at: Timestamp,
        attempt: &Attempt,
    ) -> Result<(), StoreError>;
    /// Webhook `id`'s deliveries, newest first.
    async fn list_deliveries(&self, webhook: i64, limit: u32) -> Result<Vec<Delivery>, StoreError>;
}
