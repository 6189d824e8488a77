//! Streams between a client and a task on its host, through the server: a task's logs
//! (read and followed) and commands run in it (`exec`). The agent opens every connection:
//! it waits for orders (`/agent/v1/streams/wait`), sends what it reads, its streams'
//! pieces together ([`OutputBatch`] to `/agent/v1/streams/output`), asks for what the client typed
//! (`/agent/v1/streams/{id}/input`) and says how it ended (`/agent/v1/streams/{id}/end`).

use crate::limits::streams::{MAX_CHUNK_BYTES, MAX_EXEC_ARG_CHARS, MAX_EXEC_ARGS, MAX_LOG_TAIL};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};

/// Which lines of a task's logs to read.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogRequest {
    /// Only this container's output (all of the task's when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Only the last this many lines written before the request (then, with `follow`,
    /// every new one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 100000))]
    pub tail: Option<u32>,
    /// Only lines written at or after this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub since: Option<Timestamp>,
    /// Go on with each new line until the task has ended and its output is read.
    #[serde(default)]
    pub follow: bool,
    /// Start each line with the time the agent read it.
    #[serde(default)]
    pub timestamps: bool,
}

/// A command to run in a task: as its user, in its environment, working directory and
/// cgroup (for a container, through the engine's exec).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The container to run it in (the task's first when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// With a terminal (`tessera exec -it`): output and input go through a pseudo-terminal.
    #[serde(default)]
    pub tty: bool,
}

/// What a stream carries.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum StreamKind {
    Logs(LogRequest),
    Exec(ExecRequest),
}

/// One stream the server asks an agent to open.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOrder {
    /// The stream's id, in the paths the agent answers on.
    pub id: String,
    /// The task it reads or runs in.
    pub task_id: String,
    pub kind: StreamKind,
}

/// The orders an agent's wait brings back (none when it waited the whole time).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOrders {
    pub orders: Vec<StreamOrder>,
}

/// How a stream ended, as its agent says.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamEnd {
    /// Why, in words (`the task exited with code 1`, `no logs of this task on the host`).
    pub reason: String,
    /// An exec's exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The stream could not do what it was asked (no such container, exec not possible);
    /// the server falls back where it can (a task's stored last lines).
    #[serde(default)]
    pub failed: bool,
}

impl LogRequest {
    /// The request's own rules: a sane tail and a container name.
    pub fn check(&self) -> Result<(), crate::error::FieldError> {
        if let Some(t) = self.tail
            && t > MAX_LOG_TAIL
        {
            return Err(crate::error::FieldError {
                field: "tail".into(),
                message: format!("must be at most {MAX_LOG_TAIL}, got {t}"),
            });
        }
        if let Some(c) = &self.container {
            check_container(c)?;
        }
        Ok(())
    }
}

impl ExecRequest {
    /// The request's own rules: a command of bounded words, a container name.
    pub fn check(&self) -> Result<(), crate::error::FieldError> {
        let field = |message: String| crate::error::FieldError {
            field: "command".into(),
            message,
        };
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err(field("names no program: give `-- PROGRAM [ARGS…]`".into()));
        }
        if self.command.len() > MAX_EXEC_ARGS {
            return Err(field(format!(
                "has {} words; at most {MAX_EXEC_ARGS}",
                self.command.len()
            )));
        }
        if let Some(long) = self
            .command
            .iter()
            .find(|w| w.chars().count() > MAX_EXEC_ARG_CHARS || w.contains('\0'))
        {
            return Err(field(format!(
                "a word is longer than {MAX_EXEC_ARG_CHARS} characters or holds a NUL: {:?}…",
                long.chars().take(20).collect::<String>()
            )));
        }
        if let Some(c) = &self.container {
            check_container(c)?;
        }
        Ok(())
    }
}

/// A container name as task definitions have them.
fn check_container(c: &str) -> Result<(), crate::error::FieldError> {
    if crate::taskdef::valid_container_name(c) {
        return Ok(());
    }
    Err(crate::error::FieldError {
        field: "container".into(),
        message: format!(
            "{c:?} is not a container name (letters, digits, '-' and '_', at most 255)"
        ),
    })
}

/// Output of several of a host's streams in one request: each piece is a stream's id and
/// its bytes (none: a heartbeat, the stream is still served). An agent sends one batch
/// for all the streams that have something at the moment, not one request per stream:
/// what the server does per piece of output no longer grows with the streams open.
///
/// The body is binary (output need not be text): for each piece, the id's length (one
/// byte), the id, the bytes' length (four bytes, big-endian) and the bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputBatch {
    pub pieces: Vec<(String, Vec<u8>)>,
}

/// What the server did with each piece of an [`OutputBatch`], in its order.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Taken {
    /// Passed on to the client.
    Taken,
    /// The client has not read what came before: send it again shortly (a slow client
    /// holds up its own stream, never the batch).
    Full,
    /// The stream is closed (its client went, or it is not this host's): stop it.
    Gone,
}

/// The answer to an [`OutputBatch`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputAnswer {
    pub pieces: Vec<Taken>,
}

impl OutputBatch {
    /// The size of `id` and `bytes` as one piece of the body.
    pub fn piece_len(id: &str, bytes: &[u8]) -> usize {
        1 + id.len() + 4 + bytes.len()
    }

    /// The body.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(
            self.pieces
                .iter()
                .map(|(id, b)| Self::piece_len(id, b))
                .sum(),
        );
        for (id, bytes) in &self.pieces {
            debug_assert!(id.len() <= u8::MAX as usize, "stream ids are short");
            body.push(id.len() as u8);
            body.extend_from_slice(id.as_bytes());
            body.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
            body.extend_from_slice(bytes);
        }
        body
    }

    /// Reads a body: an error naming what is wrong (a cut-off piece, an id that is not
    /// text, a piece longer than [`MAX_CHUNK_BYTES`]).
    pub fn decode(mut body: &[u8]) -> Result<OutputBatch, String> {
        let mut pieces = Vec::new();
        while !body.is_empty() {
            let n = pieces.len();
            let id_len = body[0] as usize;
            let Some(id) = body.get(1..1 + id_len) else {
                return Err(format!("piece {n}: its stream id is cut off"));
            };
            let id = std::str::from_utf8(id)
                .map_err(|_| format!("piece {n}: its stream id is not text"))?
                .to_owned();
            body = &body[1 + id_len..];
            let Some(len) = body.get(..4) else {
                return Err(format!("piece {n}: its length is cut off"));
            };
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
            if len > MAX_CHUNK_BYTES {
                return Err(format!(
                    "piece {n}: {len} bytes; a piece is at most {MAX_CHUNK_BYTES}"
                ));
            }
            let Some(bytes) = body.get(4..4 + len) else {
                return Err(format!("piece {n}: its {len} bytes are cut off"));
            };
            pieces.push((id, bytes.to_vec()));
            body = &body[4 + len..];
        }
        Ok(OutputBatch { pieces })
    }
}

/// What a client typed for an exec, as its agent asks for it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum InputPiece {
    /// Bytes typed (or piped in).
    Data(Vec<u8>),
    /// The end of input.
    Eof,
    /// The client's terminal has a new size.
    Resize { rows: u16, cols: u16 },
}

/// The input an agent's ask brings back (none when nothing came meanwhile).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamInput {
    pub pieces: Vec<InputPiece>,
}

/// `since` as a client gives it: an RFC 3339 time, or a span back from `now` (`90s`,
/// `10m`, `2h`, `1d`).
pub fn parse_since(text: &str, now: Timestamp) -> Result<Timestamp, String> {
    let text = text.trim();
    if let Ok(t) = text.parse::<Timestamp>() {
        return Ok(t);
    }
    let bad = || {
        format!(
            "{text:?} is neither a time (2026-11-30T12:00:00Z) nor a span back from now (90s, 10m, 2h, 1d)"
        )
    };
    let unit = text.chars().last().ok_or_else(bad)?;
    let per = match unit {
        's' => 1_000,
        'm' => 60_000,
        'h' => 3_600_000,
        'd' => 86_400_000,
        _ => return Err(bad()),
    };
    let n: i64 = text[..text.len() - 1].parse().map_err(|_| bad())?;
    if !(0..=3650 * 86_400).contains(&n) {
        return Err(bad());
    }
    Ok(now.plus_millis(-n * per))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_reads_back_as_written_and_a_broken_one_says_where() {
        let batch = OutputBatch {
            pieces: vec![
                ("s-1".into(), b"line\n".to_vec()),
                ("s-2".into(), Vec::new()),
                ("s-3".into(), vec![0, 255, 10]),
            ],
        };
        let body = batch.encode();
        assert_eq!(
            body.len(),
            batch
                .pieces
                .iter()
                .map(|(i, b)| OutputBatch::piece_len(i, b))
                .sum::<usize>()
        );
        assert_eq!(OutputBatch::decode(&body).unwrap(), batch);
        assert_eq!(OutputBatch::decode(&[]).unwrap(), OutputBatch::default());
        let cut = OutputBatch::decode(&body[..body.len() - 1]).unwrap_err();
        assert!(cut.contains("piece 2") && cut.contains("cut off"), "{cut}");
        let mut long = vec![1, b'x'];
        long.extend_from_slice(&((MAX_CHUNK_BYTES as u32) + 1).to_be_bytes());
        let too_long = OutputBatch::decode(&long).unwrap_err();
        assert!(too_long.contains("at most"), "{too_long}");
        assert!(
            OutputBatch::decode(&[2, 0xff, 0xfe, 0, 0, 0, 0])
                .unwrap_err()
                .contains("not text")
        );
    }

    #[test]
    fn since_is_a_time_or_a_span_back() {
        let now: Timestamp = "2026-12-01T12:00:00Z".parse().unwrap();
        assert_eq!(
            parse_since("10m", now).unwrap(),
            "2026-12-01T11:50:00Z".parse().unwrap()
        );
        assert_eq!(
            parse_since("2026-12-01T10:00:00+01:00", now).unwrap(),
            "2026-12-01T09:00:00Z".parse().unwrap()
        );
        assert!(
            parse_since("10 minutes", now)
                .unwrap_err()
                .contains("10 minutes")
        );
        assert!(parse_since("-5m", now).is_err());
    }

    #[test]
    fn exec_needs_a_program_and_bounded_words() {
        let ok = ExecRequest {
            container: None,
            command: vec!["sh".into(), "-c".into(), "ls".into()],
            tty: false,
        };
        assert!(ok.check().is_ok());
        let empty = ExecRequest {
            command: vec![],
            ..ok.clone()
        };
        assert_eq!(empty.check().unwrap_err().field, "command");
        let bad_container = ExecRequest {
            container: Some("../x".into()),
            ..ok
        };
        assert_eq!(bad_container.check().unwrap_err().field, "container");
    }
}
