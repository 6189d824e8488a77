//! `tessera drain`, `activate` and `approve`: a host's state changes; and a host's status
//! as lists show it.

use crate::{Client, seg};
use tessera_model::HostInfo;

pub(crate) async fn host_action(c: &Client, host: &str, action: &str) -> anyhow::Result<()> {
    let h: HostInfo = c
        .send(
            reqwest::Method::POST,
            &format!("/api/v1/hosts/{}/{action}", seg(host)),
            None,
        )
        .await?;
    say!("host {}: {}", h.id, host_status(&h));
    Ok(())
}

/// A host's status as lists show it: held hosts say so.
pub(super) fn host_status(h: &HostInfo) -> String {
    if h.held {
        format!("{} (held for approval)", h.status)
    } else {
        h.status.to_string()
    }
}
