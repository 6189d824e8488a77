//! Reading a task's log files for a client (`tessera logs`): the stamp each line starts
//! with, the lines a request asks for (its container, `since`, `tail`) in the order they
//! were written, and following the files as they grow and start over.
//!
//! A task's directory holds `{container}.log` (standard output) and `{container}.err.log`
//! (standard error), each with one `.1` file from before it last started over (see
//! [`super::logs::CappedLog`]). Each line starts with the time the agent read it, so the
//! files of a task read back merged in time order.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use tessera_model::agent::streams::LogRequest;
use tessera_model::time::Timestamp;

/// A log file's text without its lines' stamps: what the task wrote.
pub fn unstamped_text(text: &str) -> String {
    text.split_inclusive('\n').map(|l| unstamped(l).1).collect()
}

/// [`unstamped_text`] of the file at `path`.
pub fn read_log(path: impl AsRef<Path>) -> std::io::Result<String> {
    std::fs::read_to_string(path).map(|t| unstamped_text(&t))
}

/// The length of a line's stamp: `2026-11-30T12:00:09.000Z ` (RFC 3339 in UTC to the
/// millisecond, then a space).
const STAMP_LEN: usize = 25;

/// The time now, as a line's stamp carries it.
pub(crate) fn now() -> Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Timestamp::from_millis(ms).unwrap_or_default()
}

/// The stamp a line read at `t` starts with.
pub(crate) fn stamp(t: Timestamp) -> String {
    format!("{t} ")
}

/// A line's stamp (when it has one: lines the agent wrote itself, and files from before
/// stamps, have none) and its text.
pub(crate) fn unstamped(line: &str) -> (Option<Timestamp>, &str) {
    if line.len() >= STAMP_LEN
        && line.as_bytes()[STAMP_LEN - 1] == b' '
        && line.is_char_boundary(STAMP_LEN - 1)
        && let Ok(t) = line[..STAMP_LEN - 1].parse::<Timestamp>()
    {
        return (Some(t), &line[STAMP_LEN..]);
    }
    (None, line)
}

/// Where one log file was read to: its inode (a file that started over is a new one),
/// the offset, and a line begun but not ended.
struct Cursor {
    inode: u64,
    offset: u64,
    partial: Vec<u8>,
}

/// One log file of the task: which container wrote it.
struct Source {
    path: PathBuf,
    container: String,
    cursor: Option<Cursor>,
}

/// A line read, with the time it was written (that of the line before it when it has no
/// stamp) and its container.
struct Line {
    at: Option<Timestamp>,
    container: String,
    text: String,
}

/// A task's logs as one request reads them.
pub(crate) struct LogReader {
    dir: PathBuf,
    request: LogRequest,
    sources: Vec<Source>,
}

/// Why a task's logs cannot be read.
pub(crate) const NO_LOGS: &str =
    "no logs of this task on its host (never written, or removed after the log retention)";

impl LogReader {
    /// The logs in `dir` (a task's directory); `Err` when it is not there, or when the
    /// request's container wrote nothing and is not the task's.
    pub(crate) fn open(dir: &Path, request: &LogRequest) -> Result<LogReader, String> {
        if !dir.is_dir() {
            return Err(NO_LOGS.into());
        }
        let mut reader = LogReader {
            dir: dir.to_owned(),
            request: request.clone(),
            sources: Vec::new(),
        };
        reader.find_sources();
        Ok(reader)
    }

    /// Adds the log files that appeared since the last look (a container that wrote its
    /// first line).
    fn find_sources(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut found: Vec<(PathBuf, String)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let container = name
                    .strip_suffix(".err.log")
                    .or_else(|| name.strip_suffix(".log"))?
                    .to_owned();
                Some((e.path(), container))
            })
            .filter(|(_, c)| self.request.container.as_ref().is_none_or(|want| want == c))
            .collect();
        found.sort();
        for (path, container) in found {
            if !self.sources.iter().any(|s| s.path == path) {
                self.sources.push(Source {
                    path,
                    container,
                    cursor: None,
                });
            }
        }
    }

    /// Whether lines name their container: when the task's files are of several and the
    /// request names none.
    fn prefixed(&self) -> bool {
        self.request.container.is_none()
            && self
                .sources
                .iter()
                .any(|s| s.container != self.sources[0].container)
    }

    /// The lines written before now that the request asks for (`since`, then the last
    /// `tail`), each ending in `\n`; the files are then followed from their ends.
    pub(crate) fn history(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        for s in &mut self.sources {
            let mut bytes = Vec::new();
            let older = s.path.with_extension("log.1");
            if let Ok(mut f) = std::fs::File::open(&older) {
                let _ = f.read_to_end(&mut bytes);
                if !bytes.is_empty() && !bytes.ends_with(b"\n") {
                    bytes.push(b'\n');
                }
            }
            let Ok(mut f) = std::fs::File::open(&s.path) else {
                continue;
            };
            let Ok(meta) = f.metadata() else { continue };
            let mut current = Vec::new();
            let _ = (&mut f).take(meta.len()).read_to_end(&mut current);
            let offset = current.len() as u64;
            bytes.extend(current);
            let mut cursor = Cursor {
                inode: meta.ino(),
                offset,
                partial: Vec::new(),
            };
            // A line being written stays for the follow, which ends it.
            let whole = match bytes.iter().rposition(|b| *b == b'\n') {
                Some(i) => {
                    cursor.partial = bytes.split_off(i + 1);
                    bytes
                }
                None => {
                    cursor.partial = bytes;
                    Vec::new()
                }
            };
            split_lines(&whole, &s.container, &mut lines);
            s.cursor = Some(cursor);
        }
        let mut lines = in_time_order(lines);
        if let Some(since) = self.request.since {
            lines.retain(|l| l.at.is_none_or(|t| t >= since));
        }
        if let Some(tail) = self.request.tail {
            let skip = lines.len().saturating_sub(tail as usize);
            lines.drain(..skip);
        }
        self.format(lines)
    }

    /// The lines written since the last read, each ending in `\n`. With `finish`, lines
    /// begun but not ended are given too (the task has ended).
    pub(crate) fn more(&mut self, finish: bool) -> Vec<String> {
        self.find_sources();
        let mut lines = Vec::new();
        for s in &mut self.sources {
            let cursor = s.cursor.get_or_insert(Cursor {
                inode: 0,
                offset: 0,
                partial: Vec::new(),
            });
            let mut bytes = std::mem::take(&mut cursor.partial);
            if let Ok(meta) = std::fs::metadata(&s.path) {
                if cursor.inode != 0 && meta.ino() != cursor.inode {
                    // It started over: the rest of the file read is now the `.1` one.
                    let older = s.path.with_extension("log.1");
                    if std::fs::metadata(&older).is_ok_and(|m| m.ino() == cursor.inode) {
                        read_from(&older, cursor.offset, &mut bytes);
                    }
                    cursor.offset = 0;
                }
                cursor.inode = meta.ino();
                if meta.len() < cursor.offset {
                    cursor.offset = 0;
                }
                cursor.offset += read_from(&s.path, cursor.offset, &mut bytes);
            }
            if !finish && let Some(i) = bytes.iter().rposition(|b| *b == b'\n') {
                cursor.partial = bytes.split_off(i + 1);
            } else if !finish {
                cursor.partial = bytes;
                continue;
            } else if !bytes.is_empty() && !bytes.ends_with(b"\n") {
                bytes.push(b'\n');
            }
            split_lines(&bytes, &s.container, &mut lines);
        }
        self.format(in_time_order(lines))
    }

    fn format(&self, lines: Vec<Line>) -> Vec<String> {
        let prefixed = self.prefixed();
        lines
            .into_iter()
            .map(|l| {
                let mut out = String::with_capacity(l.text.len() + 40);
                if prefixed {
                    out.push_str(&l.container);
                    out.push_str(" | ");
                }
                if self.request.timestamps
                    && let Some(t) = l.at
                {
                    out.push_str(&stamp(t));
                }
                out.push_str(&l.text);
                out.push('\n');
                out
            })
            .collect()
    }
}

/// Reads `path` from `offset` to its end into `into`; how many bytes.
fn read_from(path: &Path, offset: u64, into: &mut Vec<u8>) -> u64 {
    let Ok(mut f) = std::fs::File::open(path) else {
        return 0;
    };
    if f.seek(SeekFrom::Start(offset)).is_err() {
        return 0;
    }
    let before = into.len();
    let _ = f.read_to_end(into);
    (into.len() - before) as u64
}

/// The whole lines of `bytes` (each ends in `\n`), an unstamped one taking the time of
/// the line before it.
fn split_lines(bytes: &[u8], container: &str, into: &mut Vec<Line>) {
    let text = String::from_utf8_lossy(bytes);
    let mut last = None;
    for raw in text.split_terminator('\n') {
        let (at, line) = unstamped(raw);
        let at = at.or(last);
        last = at;
        into.push(Line {
            at,
            container: container.to_owned(),
            text: line.to_owned(),
        });
    }
}

/// Lines of several files merged by time; each file's own order is kept (a stable sort),
/// lines without a time first.
fn in_time_order(mut lines: Vec<Line>) -> Vec<Line> {
    lines.sort_by_key(|l| l.at);
    lines
}

/// A request's lines by container name: for tests.
#[cfg(test)]
fn by_container(lines: &[String]) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut map: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for l in lines {
        let (c, t) = l.split_once(" | ").unwrap_or(("", l));
        map.entry(c.to_owned())
            .or_default()
            .push(t.trim_end().to_owned());
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::CappedLog;

    fn request() -> LogRequest {
        LogRequest::default()
    }

    #[tokio::test]
    async fn lines_come_back_in_time_order_with_tail_since_and_container() {
        let dir = tempfile::tempdir().unwrap();
        let mut out = CappedLog::new(dir.path().join("main.log"), 1 << 20);
        let mut err = CappedLog::new(dir.path().join("main.err.log"), 1 << 20);
        let mut side = CappedLog::new(dir.path().join("side.log"), 1 << 20);
        out.write(b"one\n").await.unwrap();
        out.flush().await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        err.write(b"two\n").await.unwrap();
        err.flush().await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let cut = now();
        side.write(b"three\nfour").await.unwrap();
        side.flush().await;

        let all = LogReader::open(dir.path(), &request()).unwrap().history();
        assert_eq!(
            all,
            vec!["main | one\n", "main | two\n", "side | three\n"],
            "a line not ended yet waits"
        );
        let mut r = LogReader::open(
            dir.path(),
            &LogRequest {
                container: Some("main".into()),
                tail: Some(1),
                ..request()
            },
        )
        .unwrap();
        assert_eq!(r.history(), vec!["two\n"], "one container, no prefix");
        let since = LogReader::open(
            dir.path(),
            &LogRequest {
                since: Some(cut),
                timestamps: true,
                ..request()
            },
        )
        .unwrap()
        .history();
        assert_eq!(since.len(), 1, "{since:?}");
        let (at, text) = unstamped(since[0].strip_prefix("side | ").unwrap());
        assert!(at.is_some_and(|t| t >= cut));
        assert_eq!(text, "three\n");
        assert!(by_container(&all).contains_key("side"));
    }

    #[tokio::test]
    async fn a_follow_reads_new_lines_across_a_file_starting_over() {
        let dir = tempfile::tempdir().unwrap();
        // A cap of 100 bytes: each stamped line is 25 + 6 bytes or so, so the file starts
        // over within the fourth line.
        let mut log = CappedLog::new(dir.path().join("main.log"), 100);
        log.write(b"first\n").await.unwrap();
        log.flush().await;
        let mut r = LogReader::open(dir.path(), &request()).unwrap();
        assert_eq!(r.history(), vec!["first\n"]);
        assert!(r.more(false).is_empty());
        log.write(b"secon").await.unwrap();
        log.flush().await;
        assert!(r.more(false).is_empty(), "half a line waits");
        log.write(b"d\nthird\nfourth\nlast").await.unwrap();
        log.flush().await;
        assert_eq!(r.more(false), vec!["second\n", "third\n", "fourth\n"]);
        assert_eq!(r.more(true), vec!["last\n"], "the end gives what is left");
    }

    #[test]
    fn a_task_without_a_directory_has_no_logs_and_unstamped_lines_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            LogReader::open(&dir.path().join("gone"), &request())
                .err()
                .as_deref(),
            Some(NO_LOGS)
        );
        std::fs::write(
            dir.path().join("main.err.log"),
            "cannot start: no such file\n",
        )
        .unwrap();
        let lines = LogReader::open(dir.path(), &request()).unwrap().history();
        assert_eq!(lines, vec!["cannot start: no such file\n"]);
        assert_eq!(unstamped("2026-11-30T12:00:09.000Z hello").1, "hello");
        assert_eq!(unstamped("2026-11-30 hello").1, "2026-11-30 hello");
    }
}
