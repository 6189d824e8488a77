//! The agent's side of streams (a task's logs, commands run in it): it waits for orders
//! on every server it knows (`--server a,b`), so a client's request reaches it through
//! whichever server the client asked, and serves each order in a task of its own through
//! the server that gave it, sending what it reads and asking for what the client typed.
//! Every connection is the agent's: a host behind NAT or a firewall that lets it sync is
//! reachable for logs and exec too.

use crate::runtime::exec::Exec;
use crate::runtime::log_read::{LogReader, NO_LOGS};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tessera_model::agent::streams::{
    ExecRequest, LogRequest, OutputAnswer, OutputBatch, StreamEnd, StreamInput, StreamKind,
    StreamOrder, StreamOrders, Taken,
};
use tessera_model::limits::streams::MAX_CHUNK_BYTES;
use tokio::sync::{mpsc, oneshot, watch};

/// How often a follow looks at its files (and sends what is new, in one piece): a line
/// waits at most this long on the host. Every follow of the agent looks at the same
/// moments (see `Channel::epoch`), so their pieces go to the server in one batch.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);
/// A batch waits for more pieces while they keep coming this close together (the other
/// follows that looked at the same moment)…
const GATHER_GAP: Duration = Duration::from_millis(2);
/// …and for at most this long after its first.
const GATHER_AT_MOST: Duration = Duration::from_millis(20);
/// A batch stops gathering at this size (each piece is at most `MAX_CHUNK_BYTES`, so a
/// batch stays well under the server's bound on an agent's body).
const BATCH_BYTES: usize = 1024 * 1024;
/// A piece whose client has not read what came before is sent again after this long…
const FULL_RETRY: Duration = Duration::from_millis(100);
/// …for at most this long; then the stream is given up.
const SLOW_CLIENT: Duration = Duration::from_secs(10);
/// A quiet follow says it is still there this often (the server gives up on one silent
/// for 20 s).
const HEARTBEAT: Duration = Duration::from_secs(5);

/// The server the agent syncs with and its token there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    pub(crate) server: String,
    pub(crate) token: String,
}

/// A command to start in a task: the runtime (which owns the tasks) starts it and
/// answers.
pub(crate) struct ExecAsk {
    pub(crate) task_id: String,
    pub(crate) request: ExecRequest,
    pub(crate) reply: oneshot::Sender<Result<Exec, String>>,
}

/// The stream side of an agent.
pub(crate) struct Channel {
    pub(crate) http: reqwest::Client,
    /// Every server the agent knows.
    pub(crate) servers: Vec<String>,
    /// The agent's token, once it has one that a server took.
    pub(crate) token: watch::Receiver<Option<String>>,
    /// Where the tasks' directories (and their logs) are.
    pub(crate) tasks_dir: PathBuf,
    /// The tasks this host runs (or whose output is still being copied).
    pub(crate) live: watch::Receiver<BTreeSet<String>>,
    pub(crate) execs: mpsc::Sender<ExecAsk>,
    /// Follows look at their files at whole intervals from this moment: all of this
    /// agent's together (their pieces go in one batch), at times of the agent's own (not
    /// every agent's at once).
    pub(crate) epoch: tokio::time::Instant,
}

/// Why a stream stops sending: the server said it is closed, or cannot be reached.
struct Stop;

/// A moment of this agent's own to count its follows' intervals from: now, less a random
/// part of an interval (agents started together look at different moments).
pub(crate) fn epoch() -> tokio::time::Instant {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let back = Duration::from_nanos(random % FOLLOW_EVERY.as_nanos() as u64);
    let now = tokio::time::Instant::now();
    now.checked_sub(back).unwrap_or(now)
}

/// A task aborted when this is dropped (the channel's waits, when the agent stops).
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A piece of a stream's output on its way, and where to say what became of it.
struct Pending {
    id: String,
    bytes: Vec<u8>,
    told: oneshot::Sender<Taken>,
}

/// Sends the output of every stream served through one server in batches
/// ([`OutputBatch`]): one request for what all of them have at a moment, however many
/// are open. It stops when the last stream holding it has.
#[derive(Clone)]
struct Batcher {
    pieces: mpsc::Sender<Pending>,
}

impl Batcher {
    fn start(http: reqwest::Client, link: Link) -> Batcher {
        // Each stream has one piece on its way at a time.
        let (pieces, rx) = mpsc::channel(128);
        tokio::spawn(Self::run(http, link, rx));
        Batcher { pieces }
    }

    /// What became of `bytes` of stream `id`. A batch the server did not answer is, for
    /// each of its pieces, to be sent again (as for a full stream): a stream ends on its
    /// own bound, not because of one failed request.
    async fn pass(&self, id: &str, bytes: Vec<u8>) -> Taken {
        let (told, answer) = oneshot::channel();
        let pending = Pending {
            id: id.to_owned(),
            bytes,
            told,
        };
        if self.pieces.send(pending).await.is_err() {
            return Taken::Gone;
        }
        answer.await.unwrap_or(Taken::Gone)
    }

    async fn run(http: reqwest::Client, link: Link, mut rx: mpsc::Receiver<Pending>) {
        let url = format!("{}/agent/v1/streams/output", link.server);
        while let Some(first) = rx.recv().await {
            let mut size = OutputBatch::piece_len(&first.id, &first.bytes);
            let mut batch = vec![first];
            let until = tokio::time::Instant::now() + GATHER_AT_MOST;
            while size < BATCH_BYTES && tokio::time::Instant::now() < until {
                match tokio::time::timeout(GATHER_GAP, rx.recv()).await {
                    Ok(Some(p)) => {
                        size += OutputBatch::piece_len(&p.id, &p.bytes);
                        batch.push(p);
                    }
                    _ => break,
                }
            }
            let (told, pieces): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|p| (p.told, (p.id, p.bytes))).unzip();
            let answer = http
                .post(&url)
                .bearer_auth(&link.token)
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .body(OutputBatch { pieces }.encode())
                .timeout(Duration::from_secs(30))
                .send()
                .await;
            let taken = match answer {
                Ok(r) if r.status().is_success() => r
                    .json::<OutputAnswer>()
                    .await
                    .ok()
                    .map(|a| a.pieces)
                    .filter(|p| p.len() == told.len()),
                Ok(r) => {
                    tracing::debug!(status = %r.status(), "a batch of stream output was refused");
                    None
                }
                Err(e) => {
                    tracing::debug!(error = %e, "a batch of stream output failed");
                    None
                }
            };
            let taken = taken.unwrap_or_else(|| vec![Taken::Full; told.len()]);
            for (t, what) in told.into_iter().zip(taken) {
                let _ = t.send(what);
            }
        }
    }
}

/// One stream's way to its server.
#[derive(Clone)]
struct Outlet {
    http: reqwest::Client,
    link: Link,
    batcher: Batcher,
    id: String,
}

impl Outlet {
    fn url(&self, what: &str) -> String {
        format!("{}/agent/v1/streams/{}/{what}", self.link.server, self.id)
    }

    /// Sends `bytes` (in pieces of at most [`MAX_CHUNK_BYTES`]); empty: a heartbeat. A
    /// piece its client has no room for yet is sent again, for up to [`SLOW_CLIENT`].
    async fn send(&self, bytes: &[u8]) -> Result<(), Stop> {
        let pieces: Vec<&[u8]> = if bytes.is_empty() {
            vec![bytes]
        } else {
            bytes.chunks(MAX_CHUNK_BYTES).collect()
        };
        for piece in pieces {
            let first = Instant::now();
            loop {
                match self.batcher.pass(&self.id, piece.to_vec()).await {
                    Taken::Taken => break,
                    Taken::Gone => return Err(Stop),
                    Taken::Full if first.elapsed() >= SLOW_CLIENT => return Err(Stop),
                    Taken::Full => tokio::time::sleep(FULL_RETRY).await,
                }
            }
        }
        Ok(())
    }

    async fn send_lines(&self, lines: Vec<String>) -> Result<(), Stop> {
        if lines.is_empty() {
            return Ok(());
        }
        self.send(lines.concat().as_bytes()).await
    }

    async fn end(&self, reason: String, exit_code: Option<i32>, failed: bool) {
        let _ = self
            .http
            .post(self.url("end"))
            .bearer_auth(&self.link.token)
            .json(&StreamEnd {
                reason,
                exit_code,
                failed,
            })
            .timeout(Duration::from_secs(30))
            .send()
            .await;
    }

    /// What the client typed since the last ask (waits up to about 20 s).
    async fn input(&self) -> Result<StreamInput, Stop> {
        let answer = self
            .http
            .post(self.url("input"))
            .bearer_auth(&self.link.token)
            .timeout(Duration::from_secs(40))
            .send()
            .await;
        match answer {
            Ok(r) if r.status().is_success() => r.json().await.map_err(|_| Stop),
            Ok(r) if r.status() == reqwest::StatusCode::GONE => Err(Stop),
            // The server is busy or restarting: ask again soon.
            Ok(_) | Err(_) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(StreamInput::default())
            }
        }
    }
}

/// A task id that is a plain name (it becomes a directory's).
fn plain_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl Channel {
    /// Waits for orders on every server and serves them, until the agent stops (the task
    /// is aborted).
    pub(crate) async fn run(self) {
        let this = std::sync::Arc::new(self);
        let waits: Vec<_> = this
            .servers
            .iter()
            .map(|server| tokio::spawn(this.clone().wait_on(server.clone())))
            .collect();
        let _aborts: Vec<AbortOnDrop> = waits.into_iter().map(AbortOnDrop).collect();
        std::future::pending::<()>().await;
    }

    /// Waits for orders on `server` and serves them.
    async fn wait_on(self: std::sync::Arc<Self>, server: String) {
        let mut token_rx = self.token.clone();
        // The streams served: they end with the channel (the agent stopping).
        let mut serving = tokio::task::JoinSet::new();
        // The output of the streams served through this server (with the token they
        // were ordered under).
        let mut batcher: Option<(Link, Batcher)> = None;
        loop {
            while serving.try_join_next().is_some() {}
            let Some(token) = token_rx.borrow_and_update().clone() else {
                if token_rx.changed().await.is_err() {
                    return;
                }
                continue;
            };
            let link = Link {
                server: server.clone(),
                token,
            };
            let answer = self
                .http
                .post(format!("{}/agent/v1/streams/wait", link.server))
                .bearer_auth(&link.token)
                .timeout(Duration::from_secs(40))
                .send()
                .await;
            let orders = match answer {
                Ok(r) if r.status().is_success() => r.json::<StreamOrders>().await.ok(),
                Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => {
                    // A server without streams (older): ask again much later.
                    tracing::debug!("the server has no stream orders to give");
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    None
                }
                _ => None,
            };
            let Some(orders) = orders else {
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            };
            for order in orders.orders {
                let batcher = match &batcher {
                    Some((of, b)) if of == &link => b.clone(),
                    _ => {
                        let b = Batcher::start(self.http.clone(), link.clone());
                        batcher = Some((link.clone(), b.clone()));
                        b
                    }
                };
                let outlet = Outlet {
                    http: self.http.clone(),
                    link: link.clone(),
                    batcher,
                    id: order.id.clone(),
                };
                serving.spawn(self.serve(order, outlet));
            }
        }
    }

    fn serve(&self, order: StreamOrder, outlet: Outlet) -> impl Future<Output = ()> + use<> {
        let dir = self.tasks_dir.join(&order.task_id);
        let live = self.live.clone();
        let execs = self.execs.clone();
        let epoch = self.epoch;
        async move {
            if !plain_id(&order.task_id) {
                outlet
                    .end(format!("{:?} is not a task id", order.task_id), None, true)
                    .await;
                return;
            }
            tracing::info!(stream = %order.id, task = %order.task_id, kind = ?std::mem::discriminant(&order.kind), "stream opened");
            match order.kind {
                StreamKind::Logs(request) => {
                    serve_logs(outlet, order.task_id, dir, request, live, epoch).await
                }
                StreamKind::Exec(request) => {
                    serve_exec(outlet, order.task_id, request, execs).await
                }
            }
        }
    }
}

/// Sends the lines `request` asks for; with `follow`, each new one until the task has
/// ended and its output is read, or the client has gone.
async fn serve_logs(
    outlet: Outlet,
    task_id: String,
    dir: PathBuf,
    request: LogRequest,
    live: watch::Receiver<BTreeSet<String>>,
    epoch: tokio::time::Instant,
) {
    let follow = request.follow;
    let opened = tokio::task::spawn_blocking(move || {
        LogReader::open(&dir, &request).map(|mut r| {
            let lines = r.history();
            (r, lines)
        })
    })
    .await;
    let (mut reader, lines) = match opened {
        Ok(Ok(found)) => found,
        Ok(Err(why)) => return outlet.end(why, None, true).await,
        Err(_) => return outlet.end(NO_LOGS.into(), None, true).await,
    };
    if outlet.send_lines(lines).await.is_err() {
        return;
    }
    if !follow {
        return outlet.end("the end of its logs".into(), None, false).await;
    }
    let mut said = Instant::now();
    // The agent's next whole interval from its epoch.
    let offset = {
        let every = FOLLOW_EVERY.as_nanos();
        let into = epoch.elapsed().as_nanos() % every;
        Duration::from_nanos((every - into) as u64)
    };
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + offset, FOLLOW_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let running = live.borrow().contains(&task_id);
        let lines = reader.more(!running);
        if !lines.is_empty() {
            if outlet.send_lines(lines).await.is_err() {
                return;
            }
            said = Instant::now();
        } else if said.elapsed() >= HEARTBEAT {
            if outlet.send(&[]).await.is_err() {
                return;
            }
            said = Instant::now();
        }
        if !running {
            return outlet
                .end(format!("task {task_id} has ended"), None, false)
                .await;
        }
    }
}

/// Runs a command in the task: its output to the client, the client's input to it, and
/// its exit code at the end.
async fn serve_exec(
    outlet: Outlet,
    task_id: String,
    request: ExecRequest,
    execs: mpsc::Sender<ExecAsk>,
) {
    let (reply, answer) = oneshot::channel();
    let asked = execs
        .send(ExecAsk {
            task_id: task_id.clone(),
            request: request.clone(),
            reply,
        })
        .await;
    let started = match (asked, answer.await) {
        (Ok(()), Ok(started)) => started,
        _ => Err("the agent is stopping".into()),
    };
    let mut exec = match started {
        Ok(exec) => exec,
        Err(why) => return outlet.end(why, None, true).await,
    };
    tracing::info!(stream = %outlet.id, task = %task_id, program = %request.command[0], tty = request.tty, "exec started");
    // The client's input, asked for while the command runs.
    let typing = {
        let outlet = outlet.clone();
        let input = exec.input.clone();
        tokio::spawn(async move {
            loop {
                let Ok(got) = outlet.input().await else {
                    return;
                };
                for piece in got.pieces {
                    if input.send(piece).await.is_err() {
                        return;
                    }
                }
            }
        })
    };
    let mut said = Instant::now();
    let mut gone = false;
    loop {
        match tokio::time::timeout(HEARTBEAT, exec.output.recv()).await {
            Ok(Some(mut bytes)) => {
                // What else is there already goes along.
                while bytes.len() < MAX_CHUNK_BYTES
                    && let Ok(more) = exec.output.try_recv()
                {
                    bytes.extend(more);
                }
                if outlet.send(&bytes).await.is_err() {
                    gone = true;
                    break;
                }
                said = Instant::now();
            }
            Ok(None) => break,
            Err(_) if said.elapsed() >= HEARTBEAT => {
                if outlet.send(&[]).await.is_err() {
                    gone = true;
                    break;
                }
                said = Instant::now();
            }
            Err(_) => {}
        }
    }
    typing.abort();
    // The client gone: dropping the command's handles ends it (its input closes; a
    // process is killed when dropped).
    drop(exec.input);
    if gone {
        drop(exec.done);
        return;
    }
    let code = tokio::time::timeout(Duration::from_secs(5), exec.done)
        .await
        .ok()
        .and_then(Result::ok)
        .flatten();
    let reason = match code {
        Some(c) => format!("the command exited with code {c}"),
        None => "the command ended by a signal".into(),
    };
    tracing::info!(stream = %outlet.id, task = %task_id, ?code, "exec ended");
    outlet.end(reason, code, false).await;
}
