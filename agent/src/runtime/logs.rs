//! Task logs: files that start over once they reach their cap, a process's output copied
//! to them, and the pruning of log directories of tasks gone.

use super::Runtime;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tessera_model::limits::report::MAX_LAST_OUTPUT_CHARS;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// How many of the last lines of each log file travel with a task's stop report.
const LAST_LINES: usize = 20;
/// How much of the end of a log file is read for them.
const TAIL_BYTES: u64 = 8192;

impl Runtime {
    /// The last lines task `task_id` wrote, for its stop report: each log file's last
    /// [`LAST_LINES`] (standard error before standard output, under a `==> main.err.log
    /// <==` line each; a file that just started over is read on from the one before it),
    /// at most [`MAX_LAST_OUTPUT_CHARS`] characters in all, keeping the end. `None` when
    /// it wrote nothing.
    pub(super) fn last_lines(&self, task_id: &str) -> Option<String> {
        last_lines_in(&self.dir.join(task_id))
    }

    /// Removes the log directories of tasks this runtime no longer has, once nothing in
    /// them changed for `older_than`; returns how many.
    pub fn prune_logs(&self, older_than: Duration) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let newest = |dir: &Path| -> Option<std::time::SystemTime> {
            let own = std::fs::metadata(dir).and_then(|m| m.modified()).ok();
            std::fs::read_dir(dir)
                .ok()?
                .flatten()
                .filter_map(|f| f.metadata().and_then(|m| m.modified()).ok())
                .chain(own)
                .max()
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if self.tasks.contains_key(&id) || self.ended.contains_key(&id) {
                continue;
            }
            let old = newest(&e.path())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= older_than);
            if old && std::fs::remove_dir_all(e.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }
}

/// A task's log file that starts over (keeping one `.1` file) whenever it would exceed
/// its cap; opened on the first write. Readable by the agent and, with `group`, by the
/// task's own group; by no one else (0640).
pub(crate) struct CappedLog {
    path: PathBuf,
    cap: u64,
    file: Option<tokio::fs::File>,
    written: u64,
    group: Option<u32>,
    /// The next byte starts a line, which gets its stamp first.
    at_line_start: bool,
}

impl CappedLog {
    pub(crate) fn new(path: PathBuf, cap: u64) -> CappedLog {
        CappedLog {
            path,
            cap: cap.max(1),
            file: None,
            written: 0,
            group: None,
            at_line_start: true,
        }
    }

    /// The file belongs to this group (its task's own gid) besides the agent.
    pub(crate) fn group(mut self, group: Option<u32>) -> CappedLog {
        self.group = group;
        self
    }

    async fn open(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let f = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .open(&self.path)
            .await?;
        // A file from before (an agent restart) gets the same rights.
        f.set_permissions(std::fs::Permissions::from_mode(0o640))
            .await?;
        if let Some(gid) = self.group {
            std::os::unix::fs::fchown(&f, None, Some(gid))?;
        }
        self.written = f.metadata().await.map_or(0, |m| m.len());
        self.file = Some(f);
        Ok(())
    }

    /// Writes `chunk`, each line that starts in it stamped with the time it was read
    /// ([`super::log_read::stamp`]).
    pub(crate) async fn write(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        let stamp = super::log_read::stamp(super::log_read::now());
        let mut out = Vec::with_capacity(chunk.len() + stamp.len());
        let mut rest = chunk;
        while !rest.is_empty() {
            if self.at_line_start {
                out.extend_from_slice(stamp.as_bytes());
                self.at_line_start = false;
            }
            match rest.iter().position(|b| *b == b'\n') {
                Some(i) => {
                    out.extend_from_slice(&rest[..=i]);
                    rest = &rest[i + 1..];
                    self.at_line_start = true;
                }
                None => {
                    out.extend_from_slice(rest);
                    rest = &[];
                }
            }
        }
        self.write_raw(&out).await
    }

    async fn write_raw(&mut self, mut chunk: &[u8]) -> std::io::Result<()> {
        if self.file.is_none() {
            self.open().await?;
        }
        while !chunk.is_empty() {
            if self.written >= self.cap {
                self.flush().await;
                let _ = tokio::fs::rename(&self.path, self.path.with_extension("log.1")).await;
                self.open().await?;
            }
            let take = chunk.len().min((self.cap - self.written) as usize);
            let Some(file) = &mut self.file else {
                return Ok(());
            };
            file.write_all(&chunk[..take]).await?;
            self.written += take as u64;
            chunk = &chunk[take..];
        }
        Ok(())
    }

    pub(crate) async fn flush(&mut self) {
        if let Some(f) = &mut self.file {
            let _ = f.flush().await;
        }
    }
}

/// Copies a process's output to a capped log at `path`, in `group` (its task's own gid).
pub(super) async fn copy_capped(
    mut from: impl AsyncRead + Unpin,
    path: PathBuf,
    cap: u64,
    group: Option<u32>,
) {
    let mut log = CappedLog::new(path, cap).group(group);
    let mut buf = vec![0u8; 8192];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if log.write(&buf[..n]).await.is_err() {
            return;
        }
    }
    log.flush().await;
}

/// [`Runtime::last_lines`] of the log files in `dir`.
fn last_lines_in(dir: &Path) -> Option<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    // `main.err.log` before `main.log`: why it failed comes first.
    files.sort();
    let parts: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = tail_lines(f, LAST_LINES);
            let name = f.file_name()?.to_string_lossy().into_owned();
            (!text.trim().is_empty()).then(|| format!("==> {name} <==\n{text}"))
        })
        .collect();
    if parts.is_empty() {
        return None;
    }
    let all = parts.join("\n");
    Some(tessera_model::bounds::cut_text(&all, MAX_LAST_OUTPUT_CHARS).unwrap_or(all))
}

/// The last `n` lines of log file `path`, read on from the file before it (`.1`) when
/// the file started over since.
fn tail_lines(path: &Path, n: usize) -> String {
    let end = |p: &Path| -> Vec<u8> {
        let Ok(mut f) = std::fs::File::open(p) else {
            return Vec::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))
            .is_ok()
        {
            let _ = f.take(TAIL_BYTES).read_to_end(&mut buf);
        }
        buf
    };
    let mut bytes = end(path);
    if bytes.iter().filter(|b| **b == b'\n').count() < n {
        let mut before = end(&path.with_extension("log.1"));
        before.extend(bytes);
        bytes = before;
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text
        .trim_end_matches('\n')
        .lines()
        .map(|l| super::log_read::unstamped(l).1)
        .collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
