//! The server's relay between a client and a task on its host, for a task's
//! logs and for commands run in it (exec). The agent opens every connection: a client's
//! request becomes an order that its host's agent picks up on its wait
//! ([`Streams::wait`]); the agent then sends what it reads ([`Streams::output`]), asks
//! for what the client typed ([`Streams::input`]) and says how the stream ended
//! ([`Streams::end`]).
//!
//! Each stream belongs to one host: an agent reaches only its own host's streams, and an
//! unknown or foreign stream answers as gone. What a stream holds is bounded (orders
//! waiting, pieces in flight, streams per host and in all), so a host or a client that
//! reads slowly or not at all holds up its own stream only.

use crate::error::ControlError;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_model::HostId;
use tessera_model::agent::streams::{StreamEnd, StreamKind, StreamOrder, Taken};
use tokio::sync::{Notify, mpsc};

/// Most streams open on one host at once.
pub const MAX_STREAMS_PER_HOST: usize = 64;
/// Most streams open on this server at once.
pub const MAX_STREAMS: usize = 1024;
/// Pieces of output in flight to one client before its agent waits (at most 1 MiB with
/// pieces of at most `MAX_CHUNK_BYTES`).
const OUTPUT_DEPTH: usize = 16;
/// Pieces of input in flight to one exec before its client waits.
const INPUT_DEPTH: usize = 64;
/// How long an agent's piece of output waits for a client that reads slowly before the
/// stream is given up.
const SLOW_CLIENT: Duration = Duration::from_secs(10);

/// What flows to the client.
#[derive(Debug)]
pub enum Piece {
    Data(Vec<u8>),
    /// The agent's heartbeat: it still serves the stream, with nothing new (a quiet task
    /// or command is not a lost host).
    Alive,
    End(StreamEnd),
}

/// What flows to an exec: bytes typed, the end of input, a terminal's new size.
pub use tessera_model::agent::streams::InputPiece as Input;

/// A stream as its client holds it: what comes from the agent, and where its input goes.
/// Dropping it closes the stream (the agent's next piece is answered as gone).
pub struct Opened {
    id: String,
    output: mpsc::Receiver<Piece>,
    input: mpsc::Sender<Input>,
    /// Told once the agent picked the order up.
    picked: Arc<Notify>,
    closer: Closer,
}

impl Opened {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The next piece from the agent; `None` once the stream is closed.
    pub async fn next(&mut self) -> Option<Piece> {
        self.output.recv().await
    }

    /// Input for the command (waits while the agent has not taken what came before).
    pub async fn send(&self, piece: Input) -> Result<(), Gone> {
        self.input
            .send(piece)
            .await
            .map_err(|_| Gone(self.id.clone()))
    }

    /// Whether the host's agent picks the order up within `at_most`.
    pub async fn picked_within(&self, at_most: Duration) -> bool {
        // Listening before looking: a pick between the two is not missed.
        let told = self.picked.notified();
        tokio::pin!(told);
        told.as_mut().enable();
        if self.is_picked() {
            return true;
        }
        tokio::time::timeout(at_most, told).await.is_ok()
    }

    /// Whether the host's agent has picked the order up.
    fn is_picked(&self) -> bool {
        self.closer
            .streams
            .open
            .lock()
            .get(&self.id)
            .is_some_and(|o| o.picked)
    }
}

struct Closer {
    streams: Arc<Inner>,
    id: String,
}

impl Drop for Closer {
    fn drop(&mut self) {
        let mut open = self.streams.open.lock();
        if let Some(o) = open.remove(&self.id) {
            let mut waiting = self.streams.waiting.lock();
            if let Some(orders) = waiting.get_mut(&o.host) {
                orders.retain(|order| order.id != self.id);
            }
        }
    }
}

/// A stream's ends on the agent's side: where its output goes, where its input comes from.
type AgentEnds = (
    mpsc::Sender<Piece>,
    Arc<tokio::sync::Mutex<mpsc::Receiver<Input>>>,
);

/// One open stream, as the agent's side reaches it.
struct Open {
    host: HostId,
    output: mpsc::Sender<Piece>,
    input: Arc<tokio::sync::Mutex<mpsc::Receiver<Input>>>,
    picked: bool,
    picked_notify: Arc<Notify>,
    opened: Instant,
}

#[derive(Default)]
struct Inner {
    open: Mutex<HashMap<String, Open>>,
    /// Orders each host's agent has not picked up yet.
    waiting: Mutex<HashMap<HostId, Vec<StreamOrder>>>,
    /// Wakes a host's waiting agent.
    wake: Mutex<HashMap<HostId, Arc<Notify>>>,
}

/// The relay (cheap to clone: the clones share it).
#[derive(Clone, Default)]
pub struct Streams {
    inner: Arc<Inner>,
}

/// A stream the agent's side names that is not open (or not its host's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stream {0} is closed")]
pub struct Gone(pub String);

impl Streams {
    fn wake_of(&self, host: &HostId) -> Arc<Notify> {
        self.inner
            .wake
            .lock()
            .entry(host.clone())
            .or_default()
            .clone()
    }

    /// Opens a stream to `task_id` on `host`: its order waits for the host's agent.
    /// Refused (busy) past [`MAX_STREAMS_PER_HOST`] on the host or [`MAX_STREAMS`] in all.
    pub fn open(
        &self,
        host: &HostId,
        task_id: &str,
        kind: StreamKind,
    ) -> Result<Opened, ControlError> {
        let id = uuid::Uuid::new_v4().to_string();
        let (out_tx, out_rx) = mpsc::channel(OUTPUT_DEPTH);
        let (in_tx, in_rx) = mpsc::channel(INPUT_DEPTH);
        let picked = Arc::new(Notify::new());
        {
            let mut open = self.inner.open.lock();
            if open.len() >= MAX_STREAMS {
                return Err(ControlError::Busy {
                    what: "log and exec streams on this server".into(),
                    retry_after: 5,
                });
            }
            if open.values().filter(|o| &o.host == host).count() >= MAX_STREAMS_PER_HOST {
                return Err(ControlError::Busy {
                    what: format!("log and exec streams on host {host}"),
                    retry_after: 5,
                });
            }
            open.insert(
                id.clone(),
                Open {
                    host: host.clone(),
                    output: out_tx,
                    input: Arc::new(tokio::sync::Mutex::new(in_rx)),
                    picked: false,
                    picked_notify: picked.clone(),
                    opened: Instant::now(),
                },
            );
            self.inner
                .waiting
                .lock()
                .entry(host.clone())
                .or_default()
                .push(StreamOrder {
                    id: id.clone(),
                    task_id: task_id.to_owned(),
                    kind,
                });
        }
        self.wake_of(host).notify_one();
        Ok(Opened {
            id: id.clone(),
            output: out_rx,
            input: in_tx,
            picked,
            closer: Closer {
                streams: self.inner.clone(),
                id,
            },
        })
    }

    /// The orders for `host`, waiting up to `at_most` for one when there are none.
    pub async fn wait(&self, host: &HostId, at_most: Duration) -> Vec<StreamOrder> {
        let wake = self.wake_of(host);
        let deadline = tokio::time::Instant::now() + at_most;
        loop {
            let notified = wake.notified();
            let orders = self.take_orders(host);
            if !orders.is_empty() {
                return orders;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Vec::new();
            }
        }
    }

    fn take_orders(&self, host: &HostId) -> Vec<StreamOrder> {
        let orders = self.inner.waiting.lock().remove(host).unwrap_or_default();
        let mut open = self.inner.open.lock();
        for o in &orders {
            if let Some(s) = open.get_mut(&o.id) {
                s.picked = true;
                s.picked_notify.notify_waiters();
            }
        }
        orders
    }

    /// Stream `id` of `host` as its agent reaches it.
    fn of_host(&self, host: &HostId, id: &str) -> Result<AgentEnds, Gone> {
        let open = self.inner.open.lock();
        match open.get(id) {
            Some(o) if &o.host == host => Ok((o.output.clone(), o.input.clone())),
            _ => Err(Gone(id.to_owned())),
        }
    }

    /// A piece of output from `host`'s agent for stream `id` (empty: a heartbeat), passed
    /// on without waiting: `Full` while the client has not read what came before, so one
    /// slow client never holds up the other streams of an agent's batch.
    pub fn offer(&self, host: &HostId, id: &str, data: Vec<u8>) -> Taken {
        let Ok((tx, _)) = self.of_host(host, id) else {
            return Taken::Gone;
        };
        if data.is_empty() {
            // Passed on when there is room: a full queue has news enough.
            return match tx.try_send(Piece::Alive) {
                Err(mpsc::error::TrySendError::Closed(_)) => Taken::Gone,
                _ => Taken::Taken,
            };
        }
        match tx.try_send(Piece::Data(data)) {
            Ok(()) => Taken::Taken,
            Err(mpsc::error::TrySendError::Full(_)) => Taken::Full,
            Err(mpsc::error::TrySendError::Closed(_)) => Taken::Gone,
        }
    }

    /// A piece of output from `host`'s agent for stream `id`; waits (up to
    /// [`SLOW_CLIENT`]) while the client has not read what came before.
    pub async fn output(&self, host: &HostId, id: &str, data: Vec<u8>) -> Result<(), Gone> {
        let (tx, _) = self.of_host(host, id)?;
        if data.is_empty() {
            // A heartbeat: the stream is still wanted.
            return match tx.try_send(Piece::Alive) {
                Err(mpsc::error::TrySendError::Closed(_)) => Err(Gone(id.to_owned())),
                _ => Ok(()),
            };
        }
        match tokio::time::timeout(SLOW_CLIENT, tx.send(Piece::Data(data))).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(Gone(id.to_owned())),
        }
    }

    /// How stream `id` of `host` ended, as its agent says.
    pub async fn end(&self, host: &HostId, id: &str, end: StreamEnd) -> Result<(), Gone> {
        let (tx, _) = self.of_host(host, id)?;
        match tokio::time::timeout(SLOW_CLIENT, tx.send(Piece::End(end))).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(Gone(id.to_owned())),
        }
    }

    /// What the client of exec stream `id` of `host` typed, waiting up to `at_most`:
    /// `None` when nothing came.
    pub async fn input(
        &self,
        host: &HostId,
        id: &str,
        at_most: Duration,
    ) -> Result<Option<Vec<Input>>, Gone> {
        let (_, rx) = self.of_host(host, id)?;
        let mut rx = match tokio::time::timeout(at_most, rx.lock_owned()).await {
            Ok(rx) => rx,
            // Another of the agent's asks holds it.
            Err(_) => return Ok(None),
        };
        match tokio::time::timeout(at_most, rx.recv()).await {
            Err(_) => Ok(None),
            // The client went away.
            Ok(None) => Err(Gone(id.to_owned())),
            Ok(Some(first)) => {
                let mut all = vec![first];
                while all.len() < INPUT_DEPTH
                    && let Ok(more) = rx.try_recv()
                {
                    all.push(more);
                }
                Ok(Some(all))
            }
        }
    }

    /// How many streams are open on this server (for the metrics and tests).
    pub fn open_count(&self) -> usize {
        self.inner.open.lock().len()
    }

    /// How long stream `id` has been open; `None` once it is closed.
    pub fn age(&self, id: &str) -> Option<Duration> {
        self.inner.open.lock().get(id).map(|o| o.opened.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::agent::streams::LogRequest;

    fn host(id: &str) -> HostId {
        HostId::new(id.to_owned()).unwrap()
    }

    #[tokio::test]
    async fn an_order_reaches_its_hosts_agent_and_output_its_client_only() {
        let s = Streams::default();
        let (a, b) = (host("h-a"), host("h-b"));
        let mut opened = s
            .open(&a, "t1", StreamKind::Logs(LogRequest::default()))
            .unwrap();
        assert!(s.wait(&b, Duration::from_millis(20)).await.is_empty());
        let orders = s.wait(&a, Duration::from_secs(1)).await;
        assert_eq!(orders.len(), 1);
        assert_eq!(orders[0].task_id, "t1");
        assert!(opened.picked_within(Duration::ZERO).await);
        // Another host cannot write to it, nor read its input.
        assert!(s.output(&b, opened.id(), b"x".to_vec()).await.is_err());
        assert!(
            s.input(&b, opened.id(), Duration::from_millis(10))
                .await
                .is_err()
        );
        s.output(&a, opened.id(), b"line\n".to_vec()).await.unwrap();
        match opened.next().await {
            Some(Piece::Data(d)) => assert_eq!(d, b"line\n"),
            other => panic!("{other:?}"),
        }
        let id = opened.id().to_owned();
        drop(opened);
        assert_eq!(
            s.output(&a, &id, b"more".to_vec()).await,
            Err(Gone(id.clone()))
        );
        assert_eq!(s.open_count(), 0);
    }

    #[tokio::test]
    async fn an_offer_to_a_client_that_does_not_read_is_full_and_holds_up_nothing_else() {
        let s = Streams::default();
        let (a, b) = (host("h-a"), host("h-b"));
        let slow = s
            .open(&a, "t1", StreamKind::Logs(LogRequest::default()))
            .unwrap();
        let mut quick = s
            .open(&a, "t2", StreamKind::Logs(LogRequest::default()))
            .unwrap();
        for _ in 0..OUTPUT_DEPTH {
            assert_eq!(s.offer(&a, slow.id(), b"x".to_vec()), Taken::Taken);
        }
        assert_eq!(s.offer(&a, slow.id(), b"x".to_vec()), Taken::Full);
        assert_eq!(
            s.offer(&a, slow.id(), Vec::new()),
            Taken::Taken,
            "still wanted"
        );
        assert_eq!(s.offer(&a, quick.id(), Vec::new()), Taken::Taken);
        assert_eq!(s.offer(&a, quick.id(), b"y".to_vec()), Taken::Taken);
        assert!(
            matches!(quick.next().await, Some(Piece::Alive)),
            "a heartbeat reaches the client's side: a quiet stream is not a silent host"
        );
        assert!(matches!(quick.next().await, Some(Piece::Data(d)) if d == b"y"));
        assert_eq!(
            s.offer(&b, quick.id(), b"z".to_vec()),
            Taken::Gone,
            "not its host's"
        );
        let id = slow.id().to_owned();
        drop(slow);
        assert_eq!(s.offer(&a, &id, b"x".to_vec()), Taken::Gone);
        assert_eq!(s.offer(&a, &id, Vec::new()), Taken::Gone);
    }

    #[tokio::test]
    async fn a_host_holds_at_most_its_share_of_streams() {
        let s = Streams::default();
        let a = host("h-a");
        let held: Vec<Opened> = (0..MAX_STREAMS_PER_HOST)
            .map(|i| {
                s.open(
                    &a,
                    &format!("t{i}"),
                    StreamKind::Logs(LogRequest::default()),
                )
                .unwrap()
            })
            .collect();
        let refused = s.open(&a, "t", StreamKind::Logs(LogRequest::default()));
        assert!(matches!(refused, Err(ControlError::Busy { .. })));
        assert!(
            s.open(&host("h-b"), "t", StreamKind::Logs(LogRequest::default()))
                .is_ok(),
            "another host's streams are not held up"
        );
        drop(held);
        assert!(
            s.open(&a, "t", StreamKind::Logs(LogRequest::default()))
                .is_ok()
        );
    }

    #[tokio::test]
    async fn input_reaches_the_exec_and_a_closed_client_is_gone() {
        let s = Streams::default();
        let a = host("h-a");
        let opened = s
            .open(&a, "t1", StreamKind::Logs(LogRequest::default()))
            .unwrap();
        opened.send(Input::Data(b"ls\n".to_vec())).await.unwrap();
        opened.send(Input::Eof).await.unwrap();
        let got = s
            .input(&a, opened.id(), Duration::from_secs(1))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, vec![Input::Data(b"ls\n".to_vec()), Input::Eof]);
        assert_eq!(
            s.input(&a, opened.id(), Duration::from_millis(20)).await,
            Ok(None)
        );
    }
}
