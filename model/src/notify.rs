//! Notifications: what on-call people must hear (a deployment rolled back, an alarm fired,
//! a host impaired or lost, a task crash-looping, a preemption, autoscaling held at its
//! maximum, a provider failing), sent to webhooks an admin registers, each delivery kept
//! with its status. Bodies: Tessera's JSON signed with HMAC-SHA256, Slack's `{"text"}`, or
//! Alertmanager's `/api/v2/alerts`.

use crate::error::{FieldError, ValidationErrors};
use crate::inventory::{ParseEnumError, text_enum};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

text_enum!(
    /// What a notification is about.
    NoticeKind, "notification kind" {
        /// A deployment's alarm or failed tasks rolled it back.
        DeploymentRolledBack => "deployment_rolled_back",
        /// A service's alarm fired.
        AlarmFired => "alarm_fired",
        /// A host's MPS daemon or a GPU failed: its tasks move.
        HostImpaired => "host_impaired",
        /// A host stopped syncing: its tasks are replaced elsewhere.
        HostLost => "host_lost",
        /// A deployment's tasks keep exiting: new ones wait before they start.
        TaskCrashLooping => "task_crash_looping",
        /// Tasks were stopped to make room for a project's guarantee.
        Preemption => "preemption",
        /// Autoscaling wants more tasks than its maximum.
        AutoscalingAtMax => "autoscaling_at_max",
        /// A capacity provider failed to make or remove a machine.
        ProviderFailed => "provider_failed",
    }
);

text_enum!(
    /// The body a webhook receives.
    WebhookFormat, "webhook format" {
        /// Tessera's JSON (see [`NoticeBody`]), signed.
        Json => "json",
        /// `{"text": …}`, as Slack's (and Mattermost's) incoming webhooks take it.
        Slack => "slack",
        /// An alert posted to Alertmanager's `/api/v2/alerts` under the URL.
        Alertmanager => "alertmanager",
    }
);

impl Default for WebhookFormat {
    /// Tessera's own JSON, signed, unless told otherwise.
    fn default() -> Self {
        WebhookFormat::Json
    }
}

/// `POST /api/v1/webhooks`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookInput {
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 64,
            pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
        )
    )]
    pub name: String,
    /// `http://` or `https://`; for Alertmanager, its base URL (`http://am:9093`).
    #[cfg_attr(
        feature = "openapi",
        schema(
            max_length = 2048,
            pattern = "^https?://[^/\\s\\u0000-\\u001f\\u007f-\\u009f][^\\s\\u0000-\\u001f\\u007f-\\u009f]*$"
        )
    )]
    pub url: String,
    #[serde(default)]
    pub format: WebhookFormat,
    /// What it is sent (empty: everything).
    #[serde(default)]
    pub kinds: Vec<NoticeKind>,
    /// Only notifications about this project's services.
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 128,
            pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
        )
    )]
    pub project: Option<String>,
    /// Only those about this pool's hosts and services.
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 128,
            pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
        )
    )]
    pub pool: Option<String>,
    /// Only those about this service.
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 128,
            pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
        )
    )]
    pub service: Option<String>,
}

/// A registered webhook (its signing secret is shown once, when it is made).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Webhook {
    pub id: i64,
    pub name: String,
    pub url: String,
    pub format: WebhookFormat,
    pub kinds: Vec<NoticeKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    pub created_at: Timestamp,
}

/// A webhook just made, with the secret its deliveries are signed with: shown this once.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookCreated {
    pub webhook: Webhook,
    /// `X-Tessera-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
    pub secret: String,
}

text_enum!(
    /// Where a delivery stands.
    DeliveryStatus, "delivery status" {
        /// Not sent yet, or to be tried again at `next_at`.
        Pending => "pending",
        /// The receiver answered 2xx.
        Delivered => "delivered",
        /// Every try failed: given up on.
        Failed => "failed",
    }
);

/// One notification to one webhook.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub id: i64,
    pub webhook_id: i64,
    pub notice: NoticeBody,
    pub status: DeliveryStatus,
    pub attempts: u32,
    /// The receiver's last HTTP status, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When it is tried next, while pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_at: Option<Timestamp>,
}

/// What a `json` webhook receives: the notification, with the delivery's id (the same on
/// every try: receivers drop repeats by it).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoticeBody {
    pub delivery: i64,
    pub kind: NoticeKind,
    pub at: Timestamp,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

/// `GET /api/v1/webhooks`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookList {
    pub webhooks: Vec<Webhook>,
}

/// `GET /api/v1/webhooks/{id}/deliveries`: the newest first.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryList {
    pub deliveries: Vec<Delivery>,
}

/// The longest webhook URL.
pub const MAX_URL: usize = 2048;

/// Checks `input`, naming each field that is wrong.
pub fn validate(input: &WebhookInput) -> Result<(), ValidationErrors> {
    let mut errors = Vec::new();
    let mut add = |field: &str, message: &str| {
        errors.push(FieldError {
            field: field.into(),
            message: message.into(),
        })
    };
    let plain = |v: &str| !v.chars().any(char::is_control);
    if !(1..=64).contains(&input.name.chars().count()) || !plain(&input.name) {
        add(
            "name",
            "must be 1 to 64 characters, none of them control characters",
        );
    }
    let url = &input.url;
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(r) if !r.is_empty() && !r.starts_with('/') => {
            if url.chars().count() > MAX_URL
                || url.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                add("url", "must be at most 2048 characters, without spaces");
            }
        }
        _ => add(
            "url",
            "must be an http:// or https:// URL with a host, e.g. https://hooks.example.com/tessera",
        ),
    }
    for (field, value) in [
        ("project", &input.project),
        ("pool", &input.pool),
        ("service", &input.service),
    ] {
        if value
            .as_deref()
            .is_some_and(|v| !(1..=128).contains(&v.chars().count()) || !plain(v))
        {
            add(field, "must be a name of 1 to 128 characters (or left out)");
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors { errors })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(url: &str) -> WebhookInput {
        WebhookInput {
            name: "on-call".into(),
            url: url.into(),
            format: WebhookFormat::Json,
            kinds: vec![NoticeKind::HostLost],
            project: None,
            pool: None,
            service: None,
        }
    }

    #[test]
    fn urls_must_be_http_with_a_host() {
        assert!(validate(&input("https://hooks.example.com/x")).is_ok());
        assert!(validate(&input("http://127.0.0.1:9093")).is_ok());
        for bad in [
            "ftp://x",
            "https://",
            "hooks.example.com",
            "https:///path",
            "http://a b",
        ] {
            let e = validate(&input(bad)).expect_err(bad);
            assert_eq!(e.errors[0].field, "url", "{bad}");
        }
    }

    #[test]
    fn kinds_read_as_they_are_written() {
        for k in NoticeKind::ALL {
            let json = serde_json::to_string(k).expect("json");
            assert_eq!(json, format!("\"{}\"", k.as_str()));
            assert_eq!(k.as_str().parse::<NoticeKind>().expect("parses"), *k);
        }
    }
}
