//! `tessera logs` (a task's, or a service's tasks' interleaved, each line prefixed with
//! its task as `docker compose logs` does) and `tessera exec` (a command in a running
//! task, over a WebSocket, with `-i` for input and `-t` for a terminal).

use crate::client::{Client, api_error};
use crate::{Exit, write_out};
use anyhow::Context;
use std::time::Duration;
use tessera_model::agent::streams::StreamEnd;
use tessera_model::bodies::TaskList;
use tessera_model::urlenc::encode;

/// What `tessera logs` was asked.
pub struct LogsAsk {
    pub target: String,
    pub follow: bool,
    pub tail: Option<u32>,
    pub since: Option<String>,
    pub container: Option<String>,
    pub timestamps: bool,
}

/// What one stream of logs says.
enum Said {
    Line(String),
    End(StreamEnd),
}

/// The query of a logs request.
fn query(ask: &LogsAsk) -> String {
    let mut q = vec![format!("follow={}", ask.follow)];
    if let Some(t) = ask.tail {
        q.push(format!("tail={t}"));
    }
    if let Some(s) = &ask.since {
        q.push(format!("since={}", encode(s)));
    }
    if let Some(c) = &ask.container {
        q.push(format!("container={}", encode(c)));
    }
    if ask.timestamps {
        q.push("timestamps=true".into());
    }
    q.join("&")
}

/// Reads task `task`'s logs as server-sent events, handing each line and the end to
/// `said` (which returns `false` to stop).
async fn read_logs(
    c: &Client,
    task: &str,
    query: &str,
    mut said: impl FnMut(Said),
) -> anyhow::Result<()> {
    let mut response = c
        .stream(&format!("/api/v1/tasks/{}/logs?{query}", encode(task)))
        .await?;
    let mut pending: Vec<u8> = Vec::new();
    let mut event = String::new();
    while let Some(chunk) = response.chunk().await.context("reading the logs")? {
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let raw: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&raw);
            let line = line.trim_end_matches(['\n', '\r']);
            if let Some(name) = line.strip_prefix("event: ") {
                event = name.to_owned();
            } else if let Some(data) = line.strip_prefix("data: ") {
                if event == "end" {
                    let end: StreamEnd = serde_json::from_str(data)
                        .context("the end of the logs, as the server said it")?;
                    said(Said::End(end));
                    return Ok(());
                }
                said(Said::Line(data.to_owned()));
            } else if line.is_empty() {
                event.clear();
            }
        }
    }
    Ok(())
}

/// `tessera logs TASK|SERVICE`: a task id, else a service's running tasks, interleaved
/// as their lines come, each prefixed with its task's first 8 characters.
pub async fn logs(c: &Client, ask: LogsAsk) -> anyhow::Result<()> {
    let q = query(&ask);
    let service = c
        .get::<TaskList>(&format!(
            "/api/v1/tasks?service={}&state=running",
            encode(&ask.target)
        ))
        .await
        .ok()
        .filter(|l| !l.tasks.is_empty());
    let Some(service) = service else {
        // One task: its lines as they are.
        let mut end = None;
        read_logs(c, &ask.target, &q, |s| match s {
            Said::Line(l) => write_out(&format!("{l}\n")),
            Said::End(e) => end = Some(e),
        })
        .await?;
        return finish(end.into_iter().collect());
    };
    let ids: Vec<String> = service.tasks.into_iter().map(|t| t.id).collect();
    let width = 8;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, Said)>(256);
    for id in &ids {
        let (c, id, q, tx) = (c.clone(), id.clone(), q.clone(), tx.clone());
        tokio::spawn(async move {
            let short: String = id.chars().take(width).collect();
            let result = read_logs(&c, &id, &q, |s| {
                let _ = tx.try_send((short.clone(), s));
            })
            .await;
            if let Err(e) = result {
                let _ = tx
                    .send((
                        short.clone(),
                        Said::End(StreamEnd {
                            reason: format!("{e:#}"),
                            exit_code: None,
                            failed: true,
                        }),
                    ))
                    .await;
            }
        });
    }
    drop(tx);
    let mut ends = Vec::new();
    while let Some((short, said)) = rx.recv().await {
        match said {
            Said::Line(l) => write_out(&format!("{short} | {l}\n")),
            Said::End(e) => ends.push(StreamEnd {
                reason: format!("task {short}: {}", e.reason),
                ..e
            }),
        }
    }
    finish(ends)
}

/// Says why streams ended when that was not simply their end; exit 1 when a stream could
/// not give what was asked.
fn finish(ends: Vec<StreamEnd>) -> anyhow::Result<()> {
    let mut failed = false;
    for e in &ends {
        if e.failed {
            eprintln!("tessera: {}", e.reason);
            failed = true;
        }
    }
    if failed {
        return Err(Exit::new(1, "the logs are not complete (see above)").into());
    }
    Ok(())
}

/// What `tessera exec` was asked.
pub struct ExecAsk {
    pub task: String,
    pub container: Option<String>,
    pub command: Vec<String>,
    pub stdin: bool,
    pub tty: bool,
}

/// The terminal's size, rows and columns (as `stty size` reads it from standard input).
fn terminal_size() -> Option<(u16, u16)> {
    let out = std::process::Command::new("stty")
        .arg("size")
        .stdin(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let (rows, cols) = text.trim().split_once(' ')?;
    Some((rows.parse().ok()?, cols.parse().ok()?))
}

/// Standard input in raw mode while it lives (a terminal's keys go to the remote one as
/// typed); restored when dropped.
struct RawMode(Option<nix::sys::termios::Termios>);

impl RawMode {
    fn enter() -> RawMode {
        use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        let Ok(before) = tcgetattr(&stdin) else {
            return RawMode(None);
        };
        let mut raw = before.clone();
        cfmakeraw(&mut raw);
        let _ = tcsetattr(&stdin, SetArg::TCSANOW, &raw);
        RawMode(Some(before))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(before) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin(),
                nix::sys::termios::SetArg::TCSANOW,
                before,
            );
        }
    }
}

/// `tessera exec TASK -- COMMAND…`: the command's output to standard output, standard
/// input to it with `-i`, on a terminal with `-t`; exits with its exit code.
pub async fn exec(c: &Client, ask: ExecAsk) -> anyhow::Result<()> {
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::Message;
    let mut path = format!(
        "/api/v1/tasks/{}/exec?command={}&tty={}",
        encode(&ask.task),
        encode(&serde_json::to_string(&ask.command)?),
        ask.tty
    );
    if let Some(name) = &ask.container {
        path.push_str(&format!("&container={}", encode(name)));
    }
    // Only fresh: the server's answer is checked by its status.
    let key = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(uuid::Uuid::new_v4().as_bytes())
    };
    let response = c
        .http
        .get(format!("{}{path}", c.base))
        .bearer_auth(&c.token)
        .header(reqwest::header::CONNECTION, "upgrade")
        .header(reqwest::header::UPGRADE, "websocket")
        .header(reqwest::header::SEC_WEBSOCKET_VERSION, "13")
        .header(reqwest::header::SEC_WEBSOCKET_KEY, key)
        .timeout(Duration::from_secs(24 * 3600))
        .send()
        .await
        .with_context(|| format!("cannot reach {}", c.base))?;
    let status = response.status();
    if status != reqwest::StatusCode::SWITCHING_PROTOCOLS {
        let bytes = response.bytes().await.unwrap_or_default();
        return Err(api_error(status, &bytes).into());
    }
    let upgraded = response
        .upgrade()
        .await
        .context("switching to a WebSocket")?;
    let socket = tokio_tungstenite::WebSocketStream::from_raw_socket(
        upgraded,
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await;
    let (mut send, mut receive) = socket.split();
    let raw = (ask.tty && ask.stdin).then(RawMode::enter);
    if ask.tty
        && let Some((rows, cols)) = terminal_size()
    {
        let said = serde_json::json!({"resize": {"rows": rows, "cols": cols}}).to_string();
        send.send(Message::Text(said.into())).await?;
    }
    let (to_send, mut sending) = tokio::sync::mpsc::channel::<Message>(64);
    if ask.stdin {
        let to_send = to_send.clone();
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 8192];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = to_send.send(Message::Text("\"eof\"".into())).await;
                        return;
                    }
                    Ok(n) => {
                        if to_send
                            .send(Message::Binary(buf[..n].to_vec().into()))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
    } else {
        let _ = to_send.send(Message::Text("\"eof\"".into())).await;
    }
    if ask.tty {
        // The terminal's new sizes, as it changes.
        let to_send = to_send.clone();
        tokio::spawn(async move {
            let Ok(mut changes) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
            else {
                return;
            };
            while changes.recv().await.is_some() {
                if let Some((rows, cols)) = terminal_size() {
                    let said =
                        serde_json::json!({"resize": {"rows": rows, "cols": cols}}).to_string();
                    if to_send.send(Message::Text(said.into())).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
    drop(to_send);
    let mut stdout = tokio::io::stdout();
    let mut end: Option<StreamEnd> = None;
    loop {
        tokio::select! {
            out = sending.recv() => {
                if let Some(m) = out
                    && send.send(m).await.is_err()
                {
                    break;
                }
            }
            message = receive.next() => match message {
                Some(Ok(Message::Binary(b))) => {
                    stdout.write_all(&b).await?;
                    stdout.flush().await?;
                }
                Some(Ok(Message::Text(t))) => {
                    #[derive(serde::Deserialize)]
                    struct Ended {
                        end: StreamEnd,
                    }
                    if let Ok(e) = serde_json::from_str::<Ended>(t.as_str()) {
                        end = Some(e.end);
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    drop(raw);
    match end {
        Some(StreamEnd {
            exit_code: Some(code),
            failed: false,
            ..
        }) => {
            if code == 0 {
                Ok(())
            } else {
                Err(Exit::new(u8::try_from(code).unwrap_or(1), "").into())
            }
        }
        Some(e) => Err(Exit::new(
            if e.failed { 126 } else { 137 },
            format!("tessera: {}", e.reason),
        )
        .into()),
        None => Err(Exit::new(1, "tessera: the connection ended before the command did").into()),
    }
}
