//! `Notifications`: webhooks an admin registers and the delivery of what on-call people
//! must hear to them. A notice is recorded with its event ([`crate::parts::Core::notify`]):
//! one delivery row per matching webhook, in the same transaction. The server holding the
//! scheduler lease sends them: each try its own task with a timeout (a slow receiver holds
//! up only its own deliveries), signed with HMAC-SHA256, retried with backoff until it is
//! delivered or [`MAX_ATTEMPTS`] tries are spent. Delivery is at least once: a handover
//! between servers may send a try twice; receivers drop repeats by the delivery's id.

use crate::error::ControlError;
use crate::parts::Core;
use crate::store::{Attempt, NotifyStore, Target};
use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use sha2::Sha256;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tessera_model::notify::{
    Delivery, NoticeBody, Webhook, WebhookCreated, WebhookFormat, WebhookInput, validate,
};
use tokio::task::JoinHandle;

/// Tries of one delivery before it is given up on (about 38 minutes of backoff).
pub const MAX_ATTEMPTS: u32 = 15;
/// How long one try may take.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the lease holder looks for deliveries due.
pub const POLL: Duration = Duration::from_millis(250);
/// Tries in flight at once, over every webhook.
const IN_FLIGHT: usize = 64;
/// Tries in flight at once to one webhook: a receiver that is down or slow takes at most
/// this many of [`IN_FLIGHT`], and the others' deliveries go on.
const IN_FLIGHT_PER_WEBHOOK: usize = 8;
/// Deliveries listed per webhook.
pub const DELIVERIES_LISTED: u32 = 50;

/// The wait before try `n + 1` after `n` failed tries: 1 s, doubling, at most 5 minutes.
pub fn retry_delay(failed: u32) -> Duration {
    Duration::from_secs(1u64 << failed.saturating_sub(1).min(9)).min(Duration::from_secs(300))
}

/// The `X-Tessera-Signature` header of `body` sent at `t` (unix seconds):
/// `t=<t>,v1=<hex HMAC-SHA256 of "<t>.<body>" keyed with the webhook's secret>`.
pub fn signature(secret: &str, t: i64, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("t={t},v1={hex}")
}

/// Where a delivery is posted and its body, in its webhook's format.
pub fn request_of(target: &Target, notice: &NoticeBody) -> (String, serde_json::Value) {
    match target.format {
        WebhookFormat::Json => (target.url.clone(), serde_json::json!(notice)),
        WebhookFormat::Slack => (
            target.url.clone(),
            serde_json::json!({"text": format!("Tessera · {}: {}", notice.kind.as_str().replace('_', " "), notice.message)}),
        ),
        WebhookFormat::Alertmanager => {
            let name: String = notice
                .kind
                .as_str()
                .split('_')
                .map(|w| {
                    let mut c = w.chars();
                    c.next()
                        .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                        .unwrap_or_default()
                })
                .collect();
            let mut labels = serde_json::json!({
                "alertname": format!("Tessera{name}"),
                "kind": notice.kind.as_str(),
                "severity": "warning",
            });
            for (k, v) in [
                ("service", &notice.service),
                ("host", &notice.host),
                ("pool", &notice.pool),
            ] {
                if let Some(v) = v {
                    labels[k] = serde_json::json!(v);
                }
            }
            (
                format!("{}/api/v2/alerts", target.url.trim_end_matches('/')),
                serde_json::json!([{
                    "labels": labels,
                    "annotations": {"summary": notice.message, "delivery": notice.delivery.to_string()},
                    "startsAt": notice.at.to_string(),
                }]),
            )
        }
    }
}

/// Webhooks and deliveries. Cheap to clone; clones share the deliveries in flight.
#[derive(Clone)]
pub struct Notifications {
    store: Arc<dyn NotifyStore>,
    core: Core,
    http: reqwest::Client,
    /// Deliveries being tried now, with their webhook: not picked up again meanwhile.
    in_flight: Arc<Mutex<HashMap<i64, i64>>>,
}

impl Notifications {
    pub(crate) fn new(store: Arc<dyn NotifyStore>, core: Core) -> Notifications {
        let http = reqwest::Client::builder()
            .timeout(SEND_TIMEOUT)
            .connect_timeout(SEND_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client with rustls");
        Notifications {
            store,
            core,
            http,
            in_flight: Arc::default(),
        }
    }

    /// The same component on `store` and `core` (a pass's fenced ones); the deliveries in
    /// flight are shared.
    pub(crate) fn with_store(&self, store: Arc<dyn NotifyStore>, core: Core) -> Notifications {
        Notifications {
            store,
            core,
            ..self.clone()
        }
    }

    /// `POST /api/v1/webhooks`: the webhook, and the secret its deliveries are signed
    /// with (shown this once).
    pub async fn create_webhook(
        &self,
        input: &WebhookInput,
    ) -> Result<WebhookCreated, ControlError> {
        validate(input).map_err(ControlError::Invalid)?;
        let secret = crate::agents::new_token();
        let webhook = self
            .store
            .create_webhook(input, &secret, self.core.instant())
            .await?;
        self.core
            .event(
                None,
                None,
                &format!("webhook {} added ({})", webhook.name, webhook.url),
            )
            .await;
        Ok(WebhookCreated { webhook, secret })
    }

    pub async fn list_webhooks(&self) -> Result<Vec<Webhook>, ControlError> {
        Ok(self.store.list_webhooks().await?)
    }

    /// Deletes it and its deliveries (pending ones are not sent).
    pub async fn delete_webhook(&self, id: i64) -> Result<(), ControlError> {
        self.store.delete_webhook(id).await?;
        self.core
            .event(None, None, &format!("webhook {id} deleted"))
            .await;
        Ok(())
    }

    /// Webhook `id`'s latest deliveries, newest first (`NotFound` when there is no such
    /// webhook).
    pub async fn deliveries(&self, id: i64) -> Result<Vec<Delivery>, ControlError> {
        if !self.store.list_webhooks().await?.iter().any(|w| w.id == id) {
            return Err(ControlError::NotFound(format!("no webhook {id}")));
        }
        Ok(self.store.list_deliveries(id, DELIVERIES_LISTED).await?)
    }

    /// Starts a try of each delivery due now that is not in flight (at most [`IN_FLIGHT`]
    /// at once, [`IN_FLIGHT_PER_WEBHOOK`] to one webhook); the tries run on their own, and their handles are returned (tests wait
    /// for them; the loop does not).
    pub async fn deliver_due(&self) -> Result<Vec<JoinHandle<()>>, ControlError> {
        let room = IN_FLIGHT.saturating_sub(self.in_flight.lock().len());
        if room == 0 {
            return Ok(Vec::new());
        }
        let due = self
            .store
            .due_deliveries(self.core.instant(), (room + IN_FLIGHT) as u32)
            .await?;
        let mut started = Vec::new();
        for (d, target) in due {
            {
                let mut flying = self.in_flight.lock();
                let to_hook = flying.values().filter(|w| **w == d.webhook_id).count();
                if started.len() >= room
                    || to_hook >= IN_FLIGHT_PER_WEBHOOK
                    || flying.insert(d.id, d.webhook_id).is_some()
                {
                    continue;
                }
            }
            let this = self.clone();
            started.push(tokio::spawn(async move {
                let id = d.id;
                this.try_once(d, target).await;
                this.in_flight.lock().remove(&id);
            }));
        }
        Ok(started)
    }

    /// One try of `d`, recorded.
    async fn try_once(&self, d: Delivery, target: Target) {
        let (url, body) = request_of(&target, &d.notice);
        let body = serde_json::to_vec(&body).expect("JSON values serialize");
        let sent = std::time::Instant::now();
        let answer = self
            .http
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("X-Tessera-Delivery", d.id.to_string())
            .header("X-Tessera-Kind", d.notice.kind.as_str())
            .header(
                "X-Tessera-Signature",
                signature(&target.secret, self.core.unix_now(), &body),
            )
            .body(body)
            .send()
            .await;
        let (status, error) = match answer {
            Ok(r) if r.status().is_success() => (Some(r.status().as_u16()), None),
            Ok(r) => (
                Some(r.status().as_u16()),
                Some(format!("the receiver answered {}", r.status())),
            ),
            Err(e) => (None, Some(format!("{:#}", anyhow_free(&e)))),
        };
        let tries = d.attempts + 1;
        let attempt = match (status, error) {
            (Some(s), None) => {
                let at = self.core.now();
                let lag = (at - d.notice.at.to_utc()).num_milliseconds().max(0) as f64 / 1000.0;
                metrics::histogram!("tessera_webhook_delivery_seconds").record(lag);
                Attempt::Delivered { status: s }
            }
            (status, Some(error)) if tries >= MAX_ATTEMPTS => Attempt::GaveUp { status, error },
            (status, error) => Attempt::Retry {
                status,
                error: error.unwrap_or_default(),
                next_at: crate::clock::instant(
                    self.core.now() + crate::clock::to_chrono(retry_delay(tries)),
                ),
            },
        };
        metrics::histogram!("tessera_webhook_try_seconds").record(sent.elapsed().as_secs_f64());
        if let Attempt::GaveUp { error, .. } = &attempt {
            tracing::error!(
                delivery = d.id,
                webhook = d.webhook_id,
                error,
                "a webhook delivery is given up on after {tries} tries"
            );
        }
        if let Err(e) = self
            .store
            .record_attempt(d.id, self.core.instant(), &attempt)
            .await
        {
            tracing::warn!(delivery = d.id, error = %e, "recording a webhook delivery's try failed; it is tried again");
        }
    }

    /// Sends deliveries while this server holds the scheduler lease, until `shutdown`.
    pub(crate) async fn run(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            if self.core.membership().holds_lease()
                && let Err(e) = self.deliver_due().await
            {
                tracing::warn!(error = %e, "reading webhook deliveries due failed");
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(POLL) => {}
            }
        }
    }
}

/// An HTTP client's error with its causes, in one line.
fn anyhow_free(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_five_minutes_within_the_budget() {
        assert_eq!(retry_delay(1), Duration::from_secs(1));
        assert_eq!(retry_delay(2), Duration::from_secs(2));
        assert_eq!(retry_delay(9), Duration::from_secs(256));
        assert_eq!(retry_delay(10), Duration::from_secs(300));
        let total: Duration = (1..MAX_ATTEMPTS).map(retry_delay).sum();
        // A receiver down for half an hour loses nothing.
        assert!(total > Duration::from_secs(30 * 60), "{total:?}");
    }

    #[test]
    fn signatures_are_hmac_sha256_of_the_time_and_the_body() {
        // Computed apart (Python's hmac): HMAC-SHA256, key "Jefe", of "0." and the body.
        assert_eq!(
            signature("Jefe", 0, b"what do ya want for nothing?"),
            "t=0,v1=37f471929915ccd2cbbe79feb84ffcff4f2bb25e15fc41c2506687331ae179cc"
        );
        assert_ne!(signature("other", 0, b"x"), signature("Jefe", 0, b"x"));
    }
}
