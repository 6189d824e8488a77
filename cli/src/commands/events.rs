//! `tessera events`: what happened, newest last; with `--follow`, what happens next.

use crate::{Client, seg};
use std::time::Duration;
use tessera_model::bodies::EventList;

pub(crate) async fn events(
    c: &Client,
    service: Option<String>,
    host: Option<String>,
    follow: bool,
    limit: u32,
) -> anyhow::Result<()> {
    let mut filter = String::new();
    if let Some(s) = &service {
        filter.push_str(&format!("&service={}", seg(s)));
    }
    if let Some(h) = &host {
        filter.push_str(&format!("&host={}", seg(h)));
    }
    let first: EventList = c
        .get(&format!("/api/v1/events?limit={limit}{filter}"))
        .await?;
    let mut last = 0;
    // Newest first from the server; oldest first on the terminal.
    for e in first.events.iter().rev() {
        say!("{}  {}", e.at, e.message);
        last = last.max(e.id);
    }
    if !follow {
        return Ok(());
    }
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let next: EventList = c
            .get(&format!("/api/v1/events?after={last}&limit=500{filter}"))
            .await?;
        for e in next.events.iter().rev() {
            say!("{}  {}", e.at, e.message);
            last = last.max(e.id);
        }
    }
}
