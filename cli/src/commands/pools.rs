//! `tessera pool set-provider` and `remove-provider`: a pool's capacity provider, from a
//! YAML or JSON file of its settings.

use crate::args::PoolCommand;
use crate::{Client, seg};
use anyhow::Context as _;
use std::io::Read as _;
use tessera_model::PoolInfo;
use tessera_model::api::PoolPatch;
use tessera_model::provider::ProviderInput;

pub(crate) async fn pool(command: PoolCommand) -> anyhow::Result<()> {
    let (c, pool, provider) = match command {
        PoolCommand::SetProvider { pool, file, conn } => {
            let provider = read_provider(&file)?;
            (Client::new(&conn)?, pool, Some(provider))
        }
        PoolCommand::RemoveProvider { pool, conn } => (Client::new(&conn)?, pool, None),
    };
    let body = serde_json::to_value(PoolPatch {
        provider: Some(provider),
        ..Default::default()
    })?;
    let p: PoolInfo = c
        .send(
            reqwest::Method::PATCH,
            &format!("/api/v1/pools/{}", seg(&pool)),
            Some(&body),
        )
        .await?;
    match &p.provider {
        Some(pr) => say!(
            "pool {}: {} provider, {} to {} hosts, target capacity {} %",
            p.name,
            pr.kind,
            pr.min_hosts,
            pr.max_hosts,
            pr.target_capacity_percent
        ),
        None => say!("pool {}: no capacity provider (its hosts stay)", p.name),
    }
    Ok(())
}

/// The provider's settings in `file` (`-`: stdin), YAML or JSON; an unknown or malformed
/// setting is named with the file.
fn read_provider(file: &str) -> anyhow::Result<ProviderInput> {
    let (name, text) = if file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading standard input")?;
        ("(stdin)", s)
    } else {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
        (file, text)
    };
    // YAML reads JSON too; a document of its own `provider:` key is taken as well.
    let value: serde_yaml::Value =
        serde_yaml::from_str(&text).with_context(|| format!("{name}: not YAML or JSON"))?;
    let value = match value.get("provider") {
        Some(inner) if value.get("kind").is_none() => inner.clone(),
        _ => value,
    };
    serde_yaml::from_value(value).with_context(|| format!("{name}: not a provider's settings"))
}
