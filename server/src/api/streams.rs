//! A task's logs and commands run in it, for clients; and the agent's side of the same
//! streams (`/agent/v1/streams/…`), which the agent opens (see
//! `tessera_control::streams`).

use super::{Body, Params, Segment};
use crate::AppState;
use crate::auth::Declaration;
use crate::edge::{AgentHost, Held};
use crate::error::ApiError;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::time::Duration;
use tessera_control::streams::{Gone, LogsAnswer, Opened, Piece};
use tessera_model::agent::streams::{
    ExecRequest, LogRequest, OutputAnswer, OutputBatch, StreamEnd, StreamInput, StreamOrders,
    parse_since,
};
use tessera_model::auth::Caller;
use tessera_model::operations as ops;
use utoipa::IntoParams;

/// How long an agent's wait is held when no order comes.
const WAIT: Duration = Duration::from_secs(20);
/// How long an exec's agent asks for input before it asks again.
const INPUT_WAIT: Duration = Duration::from_secs(20);
/// How long a request waits for its host's agent to pick it up.
const PICK_UP: Duration = Duration::from_secs(10);
/// A follow whose agent sent nothing (not even its heartbeat, every 5 s) for this long
/// has lost its host.
const SILENT: Duration = Duration::from_secs(20);

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogParams {
    /// Only this container's output (all of the task's when left out).
    container: Option<String>,
    /// Only the last this many lines (then, with `follow`, every new one).
    #[param(maximum = 100000)]
    tail: Option<u32>,
    /// Only lines written since this time (RFC 3339) or this long ago (`90s`, `10m`,
    /// `2h`, `1d`).
    since: Option<String>,
    /// Go on with each new line until the task ends (or the client leaves).
    #[serde(default)]
    follow: bool,
    /// Start each line with the time its agent read it.
    #[serde(default)]
    timestamps: bool,
}

fn now() -> tessera_model::time::Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    tessera_model::time::Timestamp::from_millis(ms).unwrap_or_default()
}

/// Whether the client asked for server-sent events (the console's Logs panel).
fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

/// How a stream's answer is written: plain text (each line as written; how it ended on a
/// last line starting `tessera: ` when it did not simply end), or server-sent events
/// (`data:` a line each, then `event: end` with the end as JSON).
#[derive(Clone, Copy)]
enum Shape {
    Text,
    Events,
}

impl Shape {
    fn lines(self, bytes: &[u8]) -> Vec<u8> {
        match self {
            Shape::Text => bytes.to_vec(),
            Shape::Events => {
                let text = String::from_utf8_lossy(bytes);
                let mut out = String::with_capacity(text.len() + 16);
                for line in text.split_terminator('\n') {
                    out.push_str("data: ");
                    out.push_str(line.trim_end_matches('\r'));
                    out.push_str("\n\n");
                }
                out.into_bytes()
            }
        }
    }

    fn end(self, end: &StreamEnd, quiet_when_done: bool) -> Vec<u8> {
        match self {
            Shape::Text if quiet_when_done && !end.failed => Vec::new(),
            Shape::Text => format!("tessera: {}\n", end.reason).into_bytes(),
            Shape::Events => format!(
                "event: end\ndata: {}\n\n",
                serde_json::to_string(end).unwrap_or_default()
            )
            .into_bytes(),
        }
    }

    /// What tells a client the stream is alive while nothing is written: an event
    /// stream's comment; plain text has no such thing.
    fn keep_alive(self) -> Option<Vec<u8>> {
        match self {
            Shape::Text => None,
            Shape::Events => Some(b":\n\n".to_vec()),
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Shape::Text => "text/plain; charset=utf-8",
            Shape::Events => "text/event-stream",
        }
    }
}

/// A streamed answer whose pieces come from `rx` (closed: the answer ends).
fn streamed(shape: Shape, rx: tokio::sync::mpsc::Receiver<Vec<u8>>) -> Response {
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    (
        [
            (header::CONTENT_TYPE, shape.content_type()),
            (header::CACHE_CONTROL, "no-cache"),
            // Through nginx and the like: each line as it comes.
            (header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        // Fused: a compressing layer polls the body once more after its end.
        axum::body::Body::from_stream(futures_util::StreamExt::fuse(body)),
    )
        .into_response()
}

/// A task's logs: the lines it wrote (each container's standard output and error, in the
/// order written), read from its host; with `follow`, each new line as it is written until
/// the task has ended. Plain text, or server-sent events when asked (`Accept:
/// text/event-stream`). A task whose host cannot be reached gets the last lines its agent
/// sent when it stopped, and why. An operator in the task's project; every read is
/// audited
#[utoipa::path(get, path = "/api/v1/tasks/{id}/logs", tag = "workloads",
    extensions(("x-access" = json!(ops::READ_TASK_OUTPUT))),
    params(("id" = String, Path, description = "task id"), LogParams),
    responses(
        (status = 200, description = "The lines, as they come", content_type = "text/plain", body = String),
        (status = 404, description = "No such task", body = crate::api::bodies::ErrorBody),
        (status = 422, description = "A parameter breaks its rule", body = crate::api::bodies::ErrorBody),
        (status = 503, description = "Too many streams are open on the task's host, or the caller's", body = crate::api::bodies::ErrorBody),
    ))]
pub async fn task_logs(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    headers: HeaderMap,
    Segment(id): Segment,
    Params(p): Params<LogParams>,
) -> Result<Response, ApiError> {
    let since = p
        .since
        .as_deref()
        .map(|s| parse_since(s, now()))
        .transpose()
        .map_err(|m| ApiError::Invalid(vec![super::field_error("since", m)]))?;
    let request = LogRequest {
        container: p.container,
        tail: p.tail,
        since,
        follow: p.follow,
        timestamps: p.timestamps,
    };
    let shape = if wants_events(&headers) {
        Shape::Events
    } else {
        Shape::Text
    };
    let turn = streams_turn(&state, &caller)?;
    let streams = state.control.streams().clone();
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    match streams.logs(&id, request).await? {
        LogsAnswer::Stored { text, why } => {
            let mut body = text.map(|t| shape.lines(format!("{t}\n").as_bytes()));
            let end = StreamEnd {
                reason: why,
                exit_code: None,
                failed: true,
            };
            tokio::spawn(async move {
                let _turn = turn;
                if let Some(b) = body.take() {
                    let _ = tx.send(b).await;
                }
                let _ = tx.send(shape.end(&end, false)).await;
            });
        }
        LogsAnswer::Live { opened, host } => {
            tokio::spawn(async move {
                let _turn = turn;
                relay_logs(streams, id, host, opened, shape, tx).await
            });
        }
    }
    Ok(streamed(shape, rx))
}

/// The caller's turn for one more task stream (a log read or follow, an exec session),
/// held while the stream is open: `503` past its share.
fn streams_turn(
    state: &AppState,
    caller: &Option<axum::Extension<Caller>>,
) -> Result<Option<Held<String>>, ApiError> {
    let Some(axum::Extension(c)) = caller else {
        return Ok(None);
    };
    state
        .task_stream_users
        .enter(&c.name)
        .map(Some)
        .ok_or_else(|| {
            ApiError::Unavailable(format!(
                "{} has {} log and exec streams open already; close one",
                c.name, state.limits.task_streams_per_user
            ))
        })
}

/// Copies a live log stream to its client: pieces as they come; the end as its agent
/// says, or why it never came (the agent did not pick the order up; it went silent).
/// When the agent cannot read the task's logs, the stored last lines are given instead.
async fn relay_logs(
    streams: tessera_control::streams::TaskStreams,
    id: String,
    host: String,
    mut opened: Opened,
    shape: Shape,
    tx: tokio::sync::mpsc::Sender<Vec<u8>>,
) {
    let waited = tokio::select! {
        picked = opened.picked_within(PICK_UP) => picked,
        // The client left before the agent took the order: the stream (and the
        // client's turn) ends now.
        () = tx.closed() => return,
    };
    let end = if !waited {
        StreamEnd {
            reason: format!(
                "the agent of host {host} did not take the request within {} s: it may be down or busy",
                PICK_UP.as_secs()
            ),
            exit_code: None,
            failed: true,
        }
    } else {
        loop {
            tokio::select! {
                piece = tokio::time::timeout(SILENT, opened.next()) => match piece {
                    Ok(Some(Piece::Data(d))) => {
                        if tx.send(shape.lines(&d)).await.is_err() {
                            return;
                        }
                    }
                    // The agent is there: an event stream's client (and every proxy
                    // between) hears from the server too.
                    Ok(Some(Piece::Alive)) => {
                        if let Some(k) = shape.keep_alive()
                            && tx.send(k).await.is_err()
                        {
                            return;
                        }
                    }
                    Ok(Some(Piece::End(end))) => break end,
                    Ok(None) => return,
                    Err(_) => break StreamEnd {
                        reason: format!(
                            "host {host} stopped answering: nothing from its agent for {} s",
                            SILENT.as_secs()
                        ),
                        exit_code: None,
                        failed: true,
                    },
                },
                // The client left: dropping the stream tells the agent at its next piece.
                () = tx.closed() => return,
            }
        }
    };
    if end.failed
        && let Ok(Some(text)) = streams.stored_lines(&id).await
    {
        let said = format!("the last lines its agent sent when task {id} stopped:\n{text}\n");
        let _ = tx.send(shape.lines(said.as_bytes())).await;
    }
    let _ = tx.send(shape.end(&end, true)).await;
}

/// Waits for stream orders for this host (an agent's long poll): the orders, or none
/// after about 20 s
#[utoipa::path(post, path = "/agent/v1/streams/wait", tag = "agents",
    extensions(("x-access" = json!(Declaration::AGENT))),
    responses((status = 200, description = "Orders to open streams", body = StreamOrders)))]
pub async fn agent_stream_wait(
    State(state): State<AppState>,
    checked: Option<axum::Extension<AgentHost>>,
    headers: HeaderMap,
) -> Response {
    let host = match super::agents::agent_of(&state, checked, &headers).await {
        Ok(host) => host,
        Err(e) => return e.into_response(),
    };
    // Within the server's own request timeout, which would answer 503 instead.
    let wait = WAIT.min(state.limits.request_timeout / 2);
    let orders = state.control.streams().relay().wait(&host, wait).await;
    Json(StreamOrders { orders }).into_response()
}

fn gone(e: Gone) -> Response {
    (
        StatusCode::GONE,
        Json(serde_json::json!({ "error": e.to_string() })),
    )
        .into_response()
}

/// Output of several of this host's streams at once (an `OutputBatch`: for each piece,
/// the stream id's length in one byte, the id, the length of its bytes in four bytes
/// big-endian, and the bytes; no bytes: a heartbeat). The answer says, piece by piece,
/// whether it was passed on, whether its client has not read what came before (send it
/// again shortly), or whether its stream is closed
#[utoipa::path(post, path = "/agent/v1/streams/output", tag = "agents",
    extensions(("x-access" = json!(Declaration::AGENT))),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, description = "What became of each piece", body = OutputAnswer),
        (status = 400, description = "The body is not a batch", body = crate::api::bodies::ErrorBody)))]
pub async fn agent_stream_outputs(
    State(state): State<AppState>,
    checked: Option<axum::Extension<AgentHost>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let host = match super::agents::agent_of(&state, checked, &headers).await {
        Ok(host) => host,
        Err(e) => return e.into_response(),
    };
    let batch = match OutputBatch::decode(&body) {
        Ok(batch) => batch,
        Err(e) => return ApiError::BadRequest(format!("the output batch: {e}")).into_response(),
    };
    let relay = state.control.streams().relay();
    Json(OutputAnswer {
        pieces: batch
            .pieces
            .into_iter()
            .map(|(id, bytes)| relay.offer(&host, &id, bytes))
            .collect(),
    })
    .into_response()
}

/// Output of one stream of this host (the bytes as the body; empty: a heartbeat), as
/// agents before batches sent it (they now send [`agent_stream_outputs`]). `410`: the
/// client has gone, stop
#[utoipa::path(post, path = "/agent/v1/streams/{id}/output", tag = "agents",
    extensions(("x-access" = json!(Declaration::AGENT))),
    params(("id" = String, Path, description = "stream id")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204, description = "Passed on"), (status = 410, description = "The stream is closed", body = crate::api::bodies::ErrorBody)))]
pub async fn agent_stream_output(
    State(state): State<AppState>,
    checked: Option<axum::Extension<AgentHost>>,
    headers: HeaderMap,
    Segment(id): Segment,
    body: axum::body::Bytes,
) -> Response {
    let host = match super::agents::agent_of(&state, checked, &headers).await {
        Ok(host) => host,
        Err(e) => return e.into_response(),
    };
    if body.len() > tessera_model::limits::streams::MAX_CHUNK_BYTES {
        return ApiError::BadRequest(format!(
            "a piece of output is at most {} bytes",
            tessera_model::limits::streams::MAX_CHUNK_BYTES
        ))
        .into_response();
    }
    match state
        .control
        .streams()
        .relay()
        .output(&host, &id, body.to_vec())
        .await
    {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => gone(e),
    }
}

/// How a stream of this host ended
#[utoipa::path(post, path = "/agent/v1/streams/{id}/end", tag = "agents", request_body = StreamEnd,
    extensions(("x-access" = json!(Declaration::AGENT))),
    params(("id" = String, Path, description = "stream id")),
    responses((status = 204, description = "Passed on"), (status = 410, description = "The stream is closed", body = crate::api::bodies::ErrorBody)))]
pub async fn agent_stream_end(
    State(state): State<AppState>,
    checked: Option<axum::Extension<AgentHost>>,
    headers: HeaderMap,
    Segment(id): Segment,
    Body(end): Body<StreamEnd>,
) -> Response {
    let host = match super::agents::agent_of(&state, checked, &headers).await {
        Ok(host) => host,
        Err(e) => return e.into_response(),
    };
    let end = StreamEnd {
        reason: tessera_model::bounds::cut_text(&end.reason, 1000).unwrap_or(end.reason),
        ..end
    };
    match state.control.streams().relay().end(&host, &id, end).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => gone(e),
    }
}

/// What the client of an exec stream of this host typed (an agent's long poll): the
/// pieces, or none after about 20 s. `410`: the client has gone
#[utoipa::path(post, path = "/agent/v1/streams/{id}/input", tag = "agents",
    extensions(("x-access" = json!(Declaration::AGENT))),
    params(("id" = String, Path, description = "stream id")),
    responses((status = 200, description = "Input", body = StreamInput), (status = 410, description = "The stream is closed", body = crate::api::bodies::ErrorBody)))]
pub async fn agent_stream_input(
    State(state): State<AppState>,
    checked: Option<axum::Extension<AgentHost>>,
    headers: HeaderMap,
    Segment(id): Segment,
) -> Response {
    let host = match super::agents::agent_of(&state, checked, &headers).await {
        Ok(host) => host,
        Err(e) => return e.into_response(),
    };
    match state
        .control
        .streams()
        .relay()
        .input(&host, &id, INPUT_WAIT.min(state.limits.request_timeout / 2))
        .await
    {
        Ok(pieces) => Json(StreamInput {
            pieces: pieces.unwrap_or_default(),
        })
        .into_response(),
        Err(e) => gone(e),
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExecParams {
    /// The program and its arguments, as a JSON array of strings (`["sh","-c","ls"]`).
    command: String,
    /// The container to run it in (the task's first when left out).
    container: Option<String>,
    /// With a pseudo-terminal (`tessera exec -t`).
    #[serde(default)]
    tty: bool,
}

/// What a client's text message says on an exec's WebSocket.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum ClientSays {
    /// Its terminal's new size.
    Resize { rows: u16, cols: u16 },
    /// The end of its input.
    Eof,
}

/// Runs a command in a running task, over a WebSocket: binary messages carry what the
/// client types and what the command writes (standard output and error together, or its
/// terminal's); the client's text messages say `{"resize":{"rows":R,"cols":C}}` or
/// `"eof"`, and the server's last text message is `{"end":{"reason":…,"exit_code":N}}`.
/// As the task's user, in its environment and cgroup (a container's through its engine).
/// Only where the task's pool allows exec; an operator in the task's project; every
/// session is audited
#[utoipa::path(get, path = "/api/v1/tasks/{id}/exec", tag = "workloads",
    extensions(("x-access" = json!(ops::EXEC_IN_TASK))),
    params(("id" = String, Path, description = "task id"), ExecParams),
    responses(
        (status = 101, description = "Switched to a WebSocket"),
        (status = 404, description = "No such task", body = crate::api::bodies::ErrorBody),
        (status = 409, description = "The task's pool does not allow exec, or the task is not running", body = crate::api::bodies::ErrorBody),
        (status = 503, description = "Too many streams are open on the task's host, or the caller's", body = crate::api::bodies::ErrorBody),
        (status = 422, description = "A parameter breaks its rule", body = crate::api::bodies::ErrorBody),
    ))]
pub async fn task_exec(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    Segment(id): Segment,
    Params(p): Params<ExecParams>,
    upgrade: axum::extract::ws::WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let command: Vec<String> = serde_json::from_str(&p.command).map_err(|e| {
        ApiError::Invalid(vec![super::field_error(
            "command",
            format!("must be a JSON array of strings, like [\"sh\",\"-c\",\"ls\"]: {e}"),
        )])
    })?;
    let request = ExecRequest {
        container: p.container,
        command,
        tty: p.tty,
    };
    let turn = streams_turn(&state, &caller)?;
    let opened = state.control.streams().exec(&id, request).await?;
    Ok(upgrade
        .max_message_size(tessera_model::limits::streams::MAX_CHUNK_BYTES)
        .on_upgrade(move |socket| async move {
            let _turn = turn;
            relay_exec(socket, opened).await
        }))
}

/// Copies an exec's input and output between its client's WebSocket and its agent, and
/// tells the client how it ended (or why it never started).
async fn relay_exec(mut socket: axum::extract::ws::WebSocket, mut opened: Opened) {
    use axum::extract::ws::Message;
    use tessera_model::agent::streams::InputPiece;
    let said =
        |end: &StreamEnd| Message::Text(serde_json::json!({ "end": end }).to_string().into());
    let waited = opened.picked_within(PICK_UP).await;
    if !waited {
        let end = StreamEnd {
            reason: format!(
                "the task's agent did not take the command within {} s: its host may be down or busy",
                PICK_UP.as_secs()
            ),
            exit_code: None,
            failed: true,
        };
        let _ = socket.send(said(&end)).await;
        return;
    }
    loop {
        tokio::select! {
            piece = tokio::time::timeout(SILENT, opened.next()) => match piece {
                Ok(Some(Piece::Data(d))) => {
                    if socket.send(Message::Binary(d.into())).await.is_err() {
                        return;
                    }
                }
                // A quiet command: a ping keeps the connection (and any proxy's idle
                // timer) alive.
                Ok(Some(Piece::Alive)) => {
                    if socket.send(Message::Ping(Default::default())).await.is_err() {
                        return;
                    }
                }
                Ok(Some(Piece::End(end))) => {
                    let _ = socket.send(said(&end)).await;
                    let _ = socket.send(Message::Close(None)).await;
                    return;
                }
                Ok(None) => return,
                Err(_) => {
                    let end = StreamEnd {
                        reason: format!("the task's host stopped answering: nothing from its agent for {} s", SILENT.as_secs()),
                        exit_code: None,
                        failed: true,
                    };
                    let _ = socket.send(said(&end)).await;
                    return;
                }
            },
            message = socket.recv() => {
                let piece = match message {
                    Some(Ok(Message::Binary(b))) => InputPiece::Data(b.to_vec()),
                    Some(Ok(Message::Text(t))) => match serde_json::from_str::<ClientSays>(t.as_str()) {
                        Ok(ClientSays::Resize { rows, cols }) => InputPiece::Resize { rows, cols },
                        Ok(ClientSays::Eof) => InputPiece::Eof,
                        Err(e) => {
                            let end = StreamEnd {
                                reason: format!("a text message must be {{\"resize\":{{\"rows\":R,\"cols\":C}}}} or \"eof\": {e}"),
                                exit_code: None,
                                failed: true,
                            };
                            let _ = socket.send(said(&end)).await;
                            return;
                        }
                    },
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    // The client left: dropping the stream ends the command.
                    Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                };
                if opened.send(piece).await.is_err() {
                    return;
                }
            }
        }
    }
}
