//! TaskHealth checks, run next to the task: an HTTP GET on one of its host ports, a command in
//! the task's environment as the task's user (`CMD`, `CMD-SHELL`), or, for a container
//! with a command check, Docker's own `Healthcheck` read back from the engine. Each check
//! runs on its own tokio task and keeps its verdict where the runtime reads it.
//!
//! The rules (ECS's and Docker's): `unknown` until a check passes; a pass makes the task
//! `healthy`; `retries` failures in a row make it `unhealthy`, counted at most once per
//! `interval` and not during the start period. Until the first pass it is checked every
//! half second (the first 0.2 s after the start), so a healthy task is known as soon as it answers; after that every
//! `interval`. A check that outlives its timeout is killed and counts as a failure.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_model::agent::HealthReport;
use tessera_model::service::TaskHealth;
use tessera_model::taskdef::HealthCheck;
use tokio::task::JoinHandle;

/// How often a task is checked until its first pass: a healthy task gets traffic as soon
/// as it answers, not an interval later.
const FAST: Duration = Duration::from_millis(500);

/// Longest output kept of a check before its secrets are masked: far more than the
/// report's bound ([`tessera_model::limits::report::MAX_HEALTH_OUTPUT_CHARS`]), which is applied
/// after masking, so that a secret cut in two here is cut away there.
const MAX_OUTPUT: usize = 64 * 1024;

/// How one check is made.
#[derive(Clone)]
pub enum Probe {
    /// GET this URL; 2xx and 3xx pass.
    Http(String),
    /// Run this argv (for `CMD-SHELL`, `sh -c`) with this environment, as its container
    /// runs: its user, its working directory, its cgroup.
    Command {
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        confine: super::confine::Confinement,
    },
    /// Docker runs the check itself; read its verdict.
    Docker {
        engine: super::docker::Engine,
        docker_name: String,
    },
}

/// The verdict so far, shared with the checking task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub status: TaskHealth,
    pub output: Option<String>,
}

/// One container's running check.
pub struct Checker {
    verdict: Arc<Mutex<Verdict>>,
    task: JoinHandle<()>,
    /// Woken when the verdict changes, so the agent can tell the server at once.
    pub container: String,
}

impl Checker {
    /// Starts checking now: a container that has just started (`resumed` `None`), or one
    /// a restarted agent re-adopted, whose last verdict it keeps until a check says
    /// otherwise (an agent restart does not take a healthy task out of rotation).
    pub fn start(
        container: String,
        check: HealthCheck,
        probe: Probe,
        changed: Arc<tokio::sync::Notify>,
        resumed: Option<Verdict>,
        redact: Vec<String>,
    ) -> Checker {
        let resumed_healthy = resumed
            .as_ref()
            .is_some_and(|v| v.status == TaskHealth::Healthy);
        let verdict = Arc::new(Mutex::new(resumed.unwrap_or(Verdict {
            status: TaskHealth::Unknown,
            output: None,
        })));
        let task = tokio::spawn(run(
            check,
            probe,
            verdict.clone(),
            changed,
            resumed_healthy,
            redact,
        ));
        Checker {
            verdict,
            task,
            container,
        }
    }

    pub fn verdict(&self) -> Verdict {
        self.verdict.lock().clone()
    }
}

impl Drop for Checker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the task's checks say together: unhealthy if any is, healthy if all are.
pub fn combined(checkers: &[Checker]) -> Option<HealthReport> {
    if checkers.is_empty() {
        return None;
    }
    let verdicts: Vec<Verdict> = checkers.iter().map(Checker::verdict).collect();
    let worst = verdicts
        .iter()
        .find(|v| v.status == TaskHealth::Unhealthy)
        .or_else(|| verdicts.iter().find(|v| v.status == TaskHealth::Unknown))
        .unwrap_or(&verdicts[0]);
    Some(HealthReport {
        status: worst.status,
        output: worst.output.clone(),
    })
}

/// The counting rules, apart from the clock and the probe so they can be tested.
#[derive(Debug)]
pub(crate) struct Counter {
    started: Instant,
    check: HealthCheck,
    failures: u32,
    /// A failure before this does not count (one per interval).
    next_counted: Instant,
    passed_once: bool,
}

impl Counter {
    pub(crate) fn new(check: HealthCheck, started: Instant) -> Counter {
        Counter {
            started,
            next_counted: started,
            check,
            failures: 0,
            passed_once: false,
        }
    }

    /// The verdict after a check that ended at `now`.
    pub(crate) fn record(&mut self, now: Instant, passed: bool, current: TaskHealth) -> TaskHealth {
        if passed {
            self.failures = 0;
            self.passed_once = true;
            return TaskHealth::Healthy;
        }
        let in_start_period =
            now < self.started + Duration::from_secs(u64::from(self.check.start_period_secs));
        if in_start_period || now < self.next_counted {
            return current;
        }
        self.failures += 1;
        self.next_counted = now + Duration::from_secs(u64::from(self.check.interval_secs));
        if self.failures >= self.check.retries {
            TaskHealth::Unhealthy
        } else {
            current
        }
    }

    /// How long until the next check.
    pub(crate) fn next_delay(&self) -> Duration {
        let interval = Duration::from_secs(u64::from(self.check.interval_secs));
        if self.passed_once {
            interval
        } else {
            interval.min(FAST)
        }
    }
}

async fn run(
    check: HealthCheck,
    probe: Probe,
    verdict: Arc<Mutex<Verdict>>,
    changed: Arc<tokio::sync::Notify>,
    resumed_healthy: bool,
    redact: Vec<String>,
) {
    let mut counter = Counter::new(check.clone(), Instant::now());
    counter.passed_once = resumed_healthy;
    let timeout = Duration::from_secs(u64::from(check.timeout_secs));
    // One client per check, for plain HTTP on this machine: no proxy from the agent's
    // environment, no redirects followed (a 3xx passes).
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default();
    // The first check soon after the start: a server that is up at once is known at once.
    let mut delay = Duration::from_millis(200);
    loop {
        tokio::time::sleep(delay).await;
        delay = counter.next_delay();
        let (passed, output, docker_status) = once(&probe, timeout, &client).await;
        let current = verdict.lock().status;
        let status = match docker_status {
            // The engine did not answer: nothing new is known.
            Some(None) => continue,
            // Docker counts by its own rules.
            Some(Some(s)) => {
                counter.passed_once |= s == TaskHealth::Healthy;
                s
            }
            None => counter.record(Instant::now(), passed, current),
        };
        // A check's output reaches the API and events, which viewers read: the task's
        // secret values (a check that prints its environment) never do.
        let output = if passed {
            None
        } else {
            output.map(|o| shown_output(o, &redact))
        };
        let mut v = verdict.lock();
        let before = v.clone();
        v.status = status;
        v.output = output;
        if *v != before && v.status != before.status {
            changed.notify_one();
        }
    }
}

/// What a failing check's output becomes in the report: the task's secret values masked
/// first, then cut to the report's bound (cut first, a secret split at the cut would
/// leave its other half, and masking could grow it past the bound).
pub(crate) fn shown_output(raw: String, redact: &[String]) -> String {
    let masked = redact
        .iter()
        .filter(|s| !s.is_empty())
        .fold(raw, |o, secret| o.replace(secret.as_str(), "***"));
    tessera_model::bounds::cut_text(
        &masked,
        tessera_model::limits::report::MAX_HEALTH_OUTPUT_CHARS,
    )
    .unwrap_or(masked)
}

/// A check command's exit status and output, of which at most [`MAX_OUTPUT`] bytes of
/// each stream are kept: the rest is read and thrown away, so a check that prints without
/// end costs the agent no memory (and is not blocked on a full pipe either).
async fn output_capped(
    mut child: tokio::process::Child,
) -> std::io::Result<(std::process::ExitStatus, Vec<u8>, Vec<u8>)> {
    use tokio::io::{AsyncRead, AsyncReadExt};
    async fn capped(stream: Option<impl AsyncRead + Unpin>) -> std::io::Result<Vec<u8>> {
        let mut kept = Vec::new();
        if let Some(mut s) = stream {
            (&mut s)
                .take(MAX_OUTPUT as u64)
                .read_to_end(&mut kept)
                .await?;
            tokio::io::copy(&mut s, &mut tokio::io::sink()).await?;
        }
        Ok(kept)
    }
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let (out, err, status) = tokio::join!(capped(stdout), capped(stderr), child.wait());
    Ok((status?, out?, err?))
}

fn cut(mut s: String) -> String {
    s = s.trim().to_owned();
    if s.chars().count() > MAX_OUTPUT {
        s = s
            .chars()
            .rev()
            .take(MAX_OUTPUT)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
    }
    s.replace('\0', "")
}

/// One check: whether it passed, its output, and (Docker) the engine's own verdict
/// (`Some(None)`: the engine did not answer).
async fn once(
    probe: &Probe,
    timeout: Duration,
    client: &reqwest::Client,
) -> (bool, Option<String>, Option<Option<TaskHealth>>) {
    match probe {
        Probe::Http(url) => match client.get(url).timeout(timeout).send().await {
            Ok(r) if r.status().is_success() || r.status().is_redirection() => (true, None, None),
            Ok(r) => (false, Some(cut(format!("GET {url}: {}", r.status()))), None),
            Err(e) if e.is_timeout() => (
                false,
                Some(format!(
                    "GET {url}: no answer within {} s",
                    timeout.as_secs()
                )),
                None,
            ),
            Err(e) => (
                false,
                Some(cut(format!("GET {url}: {}", without_url(&e)))),
                None,
            ),
        },
        Probe::Command { argv, env, confine } => {
            let Some((program, args)) = argv.split_first() else {
                return (false, Some("empty command".into()), None);
            };
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args)
                .env_clear()
                .envs(env)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .process_group(0)
                .kill_on_drop(true);
            let child = match confine.apply(&mut cmd).and_then(|()| cmd.spawn()) {
                Ok(c) => c,
                Err(e) => {
                    return (
                        false,
                        Some(cut(format!("cannot run {program:?}: {e}"))),
                        None,
                    );
                }
            };
            let pgid = child.id();
            match tokio::time::timeout(timeout, output_capped(child)).await {
                Ok(Ok((status, stdout, stderr))) => {
                    let mut text = String::from_utf8_lossy(&stdout).into_owned();
                    text.push_str(&String::from_utf8_lossy(&stderr));
                    let passed = status.success();
                    let code = status
                        .code()
                        .map_or("a signal".to_owned(), |c| format!("code {c}"));
                    (
                        passed,
                        Some(cut(format!("exited with {code}: {text}"))),
                        None,
                    )
                }
                Ok(Err(e)) => (false, Some(cut(format!("{e}"))), None),
                Err(_) => {
                    // The whole group: a shell's children too.
                    if let Some(pgid) = pgid.and_then(|p| i32::try_from(p).ok()) {
                        let _ = nix::sys::signal::killpg(
                            nix::unistd::Pid::from_raw(pgid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                    (
                        false,
                        Some(format!(
                            "timed out after {} s and was killed",
                            timeout.as_secs()
                        )),
                        None,
                    )
                }
            }
        }
        Probe::Docker {
            engine,
            docker_name,
        } => match engine.health_of(docker_name).await {
            Some((status, output)) => (
                status == TaskHealth::Healthy,
                output.map(cut),
                Some(Some(status)),
            ),
            None => (false, None, Some(None)),
        },
    }
}

/// A request error's message without the URL (which the output already names).
fn without_url(e: &reqwest::Error) -> String {
    let mut text = String::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&s.to_string());
        source = s.source();
    }
    if text.is_empty() { e.to_string() } else { text }
}

/// The probe of an ECS-style command check run by the agent itself.
pub fn command_argv(check: &HealthCheck) -> Option<Vec<String>> {
    match check.command.split_first()? {
        (first, rest) if first == "CMD" => Some(rest.to_vec()),
        (first, rest) if first == "CMD-SHELL" => {
            Some(vec!["/bin/sh".into(), "-c".into(), rest.join(" ")])
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(interval: u32, retries: u32, start_period: u32) -> HealthCheck {
        HealthCheck {
            command: vec!["CMD".into(), "true".into()],
            http: None,
            interval_secs: interval,
            timeout_secs: 2,
            retries,
            start_period_secs: start_period,
        }
    }

    #[test]
    fn failures_count_once_per_interval_after_the_start_period() {
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let mut c = Counter::new(check(10, 2, 20), t0);
        let mut h = TaskHealth::Unknown;
        // In the start period nothing counts, however often it fails.
        for at in 0..20 {
            h = c.record(s(at), false, h);
        }
        assert_eq!(h, TaskHealth::Unknown);
        assert_eq!(c.next_delay(), FAST, "fast until the first pass");
        h = c.record(s(20), false, h);
        assert_eq!(h, TaskHealth::Unknown, "one failure of two");
        h = c.record(s(21), false, h);
        assert_eq!(
            h,
            TaskHealth::Unknown,
            "the next counts only an interval later"
        );
        h = c.record(s(30), false, h);
        assert_eq!(h, TaskHealth::Unhealthy);
        h = c.record(s(31), true, h);
        assert_eq!(h, TaskHealth::Healthy, "a pass makes it healthy again");
        assert_eq!(c.next_delay(), Duration::from_secs(10));
        h = c.record(s(41), false, h);
        assert_eq!(h, TaskHealth::Healthy, "one failure is not enough");
    }

    #[tokio::test]
    async fn a_command_check_that_hangs_is_killed_at_its_timeout() {
        let probe = Probe::Command {
            argv: vec!["/bin/sh".into(), "-c".into(), "sleep 30".into()],
            env: BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
            confine: Default::default(),
        };
        let started = Instant::now();
        let (passed, output, _) =
            once(&probe, Duration::from_secs(1), &reqwest::Client::new()).await;
        assert!(!passed);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "killed, not waited for"
        );
        assert!(output.unwrap_or_default().contains("timed out"));
        let probe = Probe::Command {
            argv: command_argv(&HealthCheck {
                command: vec!["CMD-SHELL".into(), "echo sick; exit 3".into()],
                ..check(5, 1, 0)
            })
            .expect("argv"),
            env: BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
            confine: Default::default(),
        };
        let (passed, output, _) =
            once(&probe, Duration::from_secs(5), &reqwest::Client::new()).await;
        assert!(!passed);
        assert_eq!(output.as_deref(), Some("exited with code 3: sick"));
    }

    #[tokio::test]
    async fn http_checks_pass_on_2xx_and_fail_on_5xx_or_no_answer() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                let answer = if req.starts_with("GET /health ") {
                    "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
                } else {
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                };
                let _ = s.write_all(answer.as_bytes()).await;
            }
        });
        let ok = once(
            &Probe::Http(format!("http://127.0.0.1:{port}/health")),
            Duration::from_secs(2),
            &reqwest::Client::new(),
        )
        .await;
        assert!(ok.0, "{ok:?}");
        let bad = once(
            &Probe::Http(format!("http://127.0.0.1:{port}/other")),
            Duration::from_secs(2),
            &reqwest::Client::new(),
        )
        .await;
        assert!(!bad.0);
        assert!(bad.1.unwrap_or_default().contains("503"));
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let gone = closed.local_addr().expect("addr").port();
        drop(closed);
        let refused = once(
            &Probe::Http(format!("http://127.0.0.1:{gone}/")),
            Duration::from_secs(2),
            &reqwest::Client::new(),
        )
        .await;
        assert!(!refused.0);
        assert!(refused.1.is_some());
    }
}
