//! `tessera join-token create|list|delete`: the tokens agents register with.

use super::print_json;
use crate::table::Table;
use crate::{Client, JoinTokenCommand, Output, seg};

pub(crate) async fn join_token(command: JoinTokenCommand) -> anyhow::Result<()> {
    use tessera_model::auth::{JoinTokenInfo, JoinTokenInput, NewJoinToken};
    match command {
        JoinTokenCommand::Create {
            pool,
            host,
            uses,
            expires_in_hours,
            preapproved,
            description,
            conn,
        } => {
            let body = serde_json::to_value(JoinTokenInput {
                description,
                pool,
                host,
                expires_in_secs: Some(expires_in_hours.saturating_mul(3600)),
                uses: Some(uses),
                preapproved,
            })?;
            let t: NewJoinToken = Client::new(&conn)?
                .send(reqwest::Method::POST, "/api/v1/join-tokens", Some(&body))
                .await?;
            say!("{}", t.token);
            eprintln!(
                "join token {}: pool {}, {} use(s), expires {}{}; shown this once. Give it to the agent in a file (--join-token-file) or TESSERA_AGENT_JOIN_TOKEN, never on its command line.",
                t.info.id,
                t.info.pool.as_deref().unwrap_or("any"),
                t.info.uses_left,
                t.info.expires_at,
                t.info
                    .host
                    .as_deref()
                    .map_or(String::new(), |h| format!(", rejoins host {h}")),
            );
            Ok(())
        }
        JoinTokenCommand::List { output, conn } => {
            #[derive(serde::Deserialize, serde::Serialize)]
            struct List {
                join_tokens: Vec<JoinTokenInfo>,
            }
            let list: List = Client::new(&conn)?.get("/api/v1/join-tokens").await?;
            if output == Output::Json {
                return print_json(&list);
            }
            let mut t = Table::new(&["ID", "POOL", "USES LEFT", "USED", "EXPIRES", "DESCRIPTION"]);
            for j in &list.join_tokens {
                t.row(vec![
                    j.id.clone(),
                    j.pool.clone().unwrap_or_else(|| "any".into()),
                    j.uses_left.to_string(),
                    j.uses.to_string(),
                    j.expires_at.to_string(),
                    j.description.clone(),
                ]);
            }
            t.print();
            Ok(())
        }
        JoinTokenCommand::Delete { id, conn } => {
            let _: serde_json::Value = Client::new(&conn)?
                .send(
                    reqwest::Method::DELETE,
                    &format!("/api/v1/join-tokens/{}", seg(&id)),
                    None,
                )
                .await?;
            say!("join token {id} deleted");
            Ok(())
        }
    }
}
