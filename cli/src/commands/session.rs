//! `tessera login` and `tessera logout`: signing in for an API token and keeping it, and
//! deleting it on the server again.

use crate::client::{Client, api_error, base_url, http_client};
use crate::login_store::{Login, load_login, login_file, save_login};
use crate::{Token, seg};
use anyhow::Context;
use std::path::PathBuf;
use tessera_model::auth::{Caller, NewApiToken};

/// `who`: the user (asked for when `None`) and the project to scope the token to.
pub(crate) async fn login(
    url: &str,
    insecure_http: bool,
    (username, project): (Option<String>, Option<String>),
    password_stdin: bool,
    token: Option<Token>,
    expires_in_days: u32,
    ca_cert: Option<PathBuf>,
) -> anyhow::Result<()> {
    let base = base_url(url, insecure_http)?;
    let http = http_client(ca_cert.as_deref())?;
    let (token, token_id) = match token {
        Some(Token(t)) => (t, None),
        None => {
            let user = match username {
                Some(u) => u,
                None => {
                    eprint!("Username: ");
                    let mut line = String::new();
                    std::io::stdin()
                        .read_line(&mut line)
                        .context("reading the username")?;
                    line.trim().to_owned()
                }
            };
            let password = if password_stdin {
                let mut line = String::new();
                std::io::stdin()
                    .read_line(&mut line)
                    .context("reading the password from standard input")?;
                line.trim_end_matches(['\n', '\r']).to_owned()
            } else {
                rpassword::prompt_password("Password: ").context("reading the password")?
            };
            let host = nix_hostname();
            let mut body = serde_json::json!({
                "username": user,
                "password": password,
                "name": format!("cli {user}@{host}"),
                "expires_in_days": expires_in_days,
            });
            if let Some(p) = &project {
                body["project"] = serde_json::json!(p);
            }
            let resp = http
                .post(format!("{base}/api/v1/session/token"))
                .json(&body)
                .send()
                .await
                .with_context(|| format!("cannot reach {base}"))?;
            let status = resp.status();
            let bytes = resp.bytes().await?;
            if !status.is_success() {
                return Err(api_error(status, &bytes).into());
            }
            let made: NewApiToken = serde_json::from_slice(&bytes)
                .context("the server's answer is not a token: is this a Tessera server?")?;
            (made.token, Some(made.info.id))
        }
    };
    // The token must work before it is kept.
    let client = Client {
        http,
        base: base.clone(),
        token: token.clone(),
    };
    let me: Caller = client.get("/api/v1/session").await?;
    let path = save_login(&Login {
        url: base.clone(),
        token,
        token_id,
        user: me.name.clone(),
        ca_cert,
        insecure_http,
    })?;
    say!(
        "signed in to {base} as {} ({}); token kept in {}",
        me.on_behalf_of.as_deref().unwrap_or(&me.name),
        me.role,
        path.display()
    );
    Ok(())
}

fn nix_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into())
}

pub(crate) async fn logout() -> anyhow::Result<()> {
    let Some(login) = load_login()? else {
        say!("not signed in");
        return Ok(());
    };
    let client = Client {
        http: http_client(login.ca_cert.as_deref())?,
        base: login.url.clone(),
        token: login.token.clone(),
    };
    // A token this login made is deleted on the server; one given with --token is the
    // caller's to keep.
    let Some(id) = &login.token_id else {
        std::fs::remove_file(login_file()?).context("forgetting the login")?;
        say!(
            "forgot the login to {}; the token was given to `tessera login --token`, so it still works",
            login.url
        );
        return Ok(());
    };
    let ended: anyhow::Result<serde_json::Value> = client
        .send(
            reqwest::Method::DELETE,
            &format!("/api/v1/tokens/{}", seg(id)),
            None,
        )
        .await;
    std::fs::remove_file(login_file()?).context("forgetting the login")?;
    match ended {
        Ok(_) => say!("signed out of {}; the token no longer works", login.url),
        Err(e) => {
            say!("forgot the login; the server could not delete the token ({e:#}): an admin can")
        }
    }
    Ok(())
}
