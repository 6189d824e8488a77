//! A task's work, read from its application's own metrics: the agent GETs the endpoint its
//! task definition's `work` names (Prometheus text, as Triton, vLLM, TGI and TorchServe
//! serve it), sums the configured counters and latency histogram over their series, and
//! turns two scrapes into one interval's [`WorkSample`]. A scrape that fails, or a counter
//! that went backwards (the application restarted), is reported as unknown with the
//! reason, never as zero work.

use std::time::{Duration, Instant};
use tessera_model::limits::report::MAX_LATENCY_BUCKETS;
use tessera_model::work::{LatencyBucket, WorkReport, WorkSample, WorkSpec};

/// How long one scrape may take, connecting included: a stuck application must not hold
/// up the agent's sync.
pub(crate) const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

pub(crate) use tessera_model::limits::work::MAX_SCRAPE_BYTES;

/// Two scrapes closer than this give no rate worth reporting.
const MIN_INTERVAL: Duration = Duration::from_millis(50);

const TOO_LARGE: &str = "the metrics answer is larger than 4 MiB";

const RESTARTED: &str = "a counter went backwards (the application restarted): work is measured again from the next scrape";

/// The client for scrapes, plain HTTP on this machine: no proxy from the agent's
/// environment, no redirects followed, and never longer than [`SCRAPE_TIMEOUT`].
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(SCRAPE_TIMEOUT)
        .timeout(SCRAPE_TIMEOUT)
        .build()
        .unwrap_or_default()
}

/// The metrics text at `url`, or why there is none, in a short sentence that never
/// repeats the URL (it may carry credentials, and the reason reaches the API).
pub(crate) async fn fetch(client: &reqwest::Client, url: &str) -> Result<String, String> {
    let mut response = client
        .get(url)
        .timeout(SCRAPE_TIMEOUT)
        .send()
        .await
        .map_err(request_error)?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("the metrics endpoint answered {status}"));
    }
    if response
        .content_length()
        .is_some_and(|n| n > MAX_SCRAPE_BYTES as u64)
    {
        return Err(TOO_LARGE.into());
    }
    // Read in chunks: an answer without a length is cut off at the limit too.
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(request_error)? {
        if body.len() + chunk.len() > MAX_SCRAPE_BYTES {
            return Err(TOO_LARGE.into());
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|_| "the metrics answer is not UTF-8 text".to_owned())
}

/// A request error as a short sentence: its causes, which never name the URL.
fn request_error(e: reqwest::Error) -> String {
    if e.is_timeout() {
        return format!(
            "the metrics endpoint did not answer within {} s",
            SCRAPE_TIMEOUT.as_secs()
        );
    }
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        if s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return "the metrics endpoint refused the connection".into();
        }
        causes.push(s.to_string());
        source = s.source();
    }
    if causes.is_empty() {
        causes.push(e.without_url().to_string());
    }
    format!(
        "the metrics endpoint could not be read: {}",
        causes.join(": ")
    )
}

/// One scrape's totals since the application started: what two scrapes are compared by.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Totals {
    pub completed: f64,
    pub errors: Option<f64>,
    /// Cumulative bucket counts summed over the histogram's series, sorted by bound
    /// (`+Inf` last, as `le: None`); empty when no latency is configured.
    pub latency: Vec<LatencyBucket>,
}

pub(crate) use tessera_model::limits::work::MAX_SERIES;

/// The totals `spec` asks for in a scrape's `text`: one pass over its lines, in time linear
/// in its length, keeping nothing but the sums. Lines of other metrics are skipped unread;
/// lines it cannot read are skipped too, so text that is not Prometheus at all shows up
/// as a missing counter.
pub(crate) fn totals(text: &str, spec: &WorkSpec) -> Result<Totals, String> {
    let bucket_name = spec.latency.as_ref().map(|l| format!("{l}_bucket"));
    let mut completed = None;
    let mut errors = None;
    let mut sums: Vec<(f64, f64)> = Vec::new();
    let mut series = 0usize;
    for line in text.lines() {
        let line = line.trim_start();
        if line.starts_with('#') {
            continue;
        }
        let end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
        let (name, rest) = line.split_at(end);
        let target = if name == spec.completed {
            Target::Completed
        } else if spec.errors.as_deref() == Some(name) {
            Target::Errors
        } else if bucket_name.as_deref() == Some(name) {
            Target::Bucket
        } else {
            continue;
        };
        let Some((labels, value)) = sample(rest) else {
            continue;
        };
        series += 1;
        if series > MAX_SERIES {
            return Err(format!(
                "the metrics answer has more than {MAX_SERIES} series of the configured metrics"
            ));
        }
        match target {
            Target::Completed | Target::Errors => {
                let metric = if matches!(target, Target::Completed) {
                    &spec.completed
                } else {
                    spec.errors.as_deref().unwrap_or_default()
                };
                if !value.is_finite() || value < 0.0 {
                    return Err(format!(
                        "the counter `{metric}` has the value {value}, not a count"
                    ));
                }
                let total = if matches!(target, Target::Completed) {
                    &mut completed
                } else {
                    &mut errors
                };
                *total.get_or_insert(0.0) += value;
            }
            Target::Bucket => {
                let name = spec.latency.as_deref().unwrap_or_default();
                let Some(le) = label(labels, "le").and_then(parse_float) else {
                    continue;
                };
                add_bucket(&mut sums, name, le, value)?;
            }
        }
    }
    let missing = |name: &str| {
        format!("the scrape has no counter `{name}` (is the endpoint Prometheus text?)")
    };
    let completed = completed.ok_or_else(|| missing(&spec.completed))?;
    let errors = match spec.errors.as_deref() {
        Some(name) => Some(errors.ok_or_else(|| missing(name))?),
        None => None,
    };
    let latency = match spec.latency.as_deref() {
        Some(name) if sums.is_empty() => {
            return Err(format!(
                "the scrape has no histogram `{name}` (its `{name}_bucket` series)"
            ));
        }
        Some(_) => {
            sums.sort_by(|a, b| a.0.total_cmp(&b.0));
            sums.into_iter()
                .map(|(le, count)| LatencyBucket {
                    le: le.is_finite().then_some(le),
                    count,
                })
                .collect()
        }
        None => Vec::new(),
    };
    Ok(Totals {
        completed,
        errors,
        latency,
    })
}

/// Which configured metric a line belongs to.
#[derive(Clone, Copy)]
enum Target {
    Completed,
    Errors,
    Bucket,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// A sample line after its metric name: its labels (the text between the braces, if any)
/// and its value (a timestamp after it is ignored). `None` if it is not a sample.
fn sample(rest: &str) -> Option<(&str, f64)> {
    let (labels, after) = match rest.strip_prefix('{') {
        Some(inner) => {
            let close = labels_end(inner)?;
            (&inner[..close], &inner[close + 1..])
        }
        None => ("", rest),
    };
    if !after.starts_with([' ', '\t']) {
        return None;
    }
    let value = after.split_whitespace().next()?;
    Some((labels, parse_float(value)?))
}

/// Where the label set that `inner` starts ends (its `}`), skipping quoted values with
/// their escapes.
fn labels_end(inner: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in inner.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// The value of label `key` in a label set (`a="x",le="0.5"`), unescaped enough to read a
/// number.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        let eq = rest.find('=')?;
        let name = rest[..eq].trim();
        let after = rest[eq + 1..].trim_start().strip_prefix('"')?;
        let close = closing_quote(after)?;
        if name == key {
            return Some(&after[..close]);
        }
        rest = &after[close + 1..];
    }
}

fn closing_quote(s: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i),
            _ => {}
        }
    }
    None
}

/// A Prometheus value: a float, `+Inf`, `-Inf` or `NaN`.
fn parse_float(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// Adds a bucket line to the histogram's sums by bound. A bound of zero or less holds no
/// latency (it is left out: the counts are cumulative, so nothing is lost); more than
/// [`MAX_LATENCY_BUCKETS`] bounds is not a latency histogram the server takes.
fn add_bucket(sums: &mut Vec<(f64, f64)>, name: &str, le: f64, count: f64) -> Result<(), String> {
    if le.is_nan() {
        return Err(format!("the histogram `{name}` has a bucket bound NaN"));
    }
    if !count.is_finite() || count < 0.0 {
        return Err(format!(
            "the histogram `{name}` has the bucket count {count}, not a count"
        ));
    }
    if le <= 0.0 {
        return Ok(());
    }
    if let Some((_, sum)) = sums.iter_mut().find(|(l, _)| l.total_cmp(&le).is_eq()) {
        *sum += count;
        return Ok(());
    }
    if sums.len() == MAX_LATENCY_BUCKETS {
        return Err(format!(
            "the histogram `{name}` has more than {MAX_LATENCY_BUCKETS} bucket bounds"
        ));
    }
    sums.push((le, count));
    Ok(())
}

/// One task's previous scrape, so each new one yields the work done in between.
#[derive(Debug, Default)]
pub(crate) struct WorkTracker {
    prev: Option<(Instant, Totals)>,
}

impl WorkTracker {
    /// What the scrape made at `at` tells: `None` until there are two good scrapes to
    /// compare (or while they are too close together to give a rate).
    pub(crate) fn observe(
        &mut self,
        at: Instant,
        scraped: Result<Totals, String>,
    ) -> Option<WorkReport> {
        let now = match scraped {
            Ok(totals) => totals,
            Err(reason) => {
                // Work done while the scrape failed is not attributed to the next interval.
                self.prev = None;
                return Some(WorkReport::Unknown { reason });
            }
        };
        let Some((then, before)) = self.prev.take() else {
            self.prev = Some((at, now));
            return None;
        };
        let interval = at.saturating_duration_since(then);
        if interval < MIN_INTERVAL {
            self.prev = Some((then, before));
            return None;
        }
        let sample = delta(&before, &now, interval.as_secs_f64());
        self.prev = Some((at, now));
        Some(match sample {
            Some(sample) => WorkReport::Measured(sample),
            None => WorkReport::Unknown {
                reason: RESTARTED.into(),
            },
        })
    }
}

/// The work between two scrapes, or `None` when a counter went backwards (or the buckets
/// changed): the application restarted and its counts began again.
fn delta(before: &Totals, now: &Totals, interval_secs: f64) -> Option<WorkSample> {
    if now.completed < before.completed || now.latency.len() != before.latency.len() {
        return None;
    }
    let errors = match (before.errors, now.errors) {
        (Some(b), Some(n)) if n < b => return None,
        (Some(b), Some(n)) => Some(n - b),
        _ => None,
    };
    let mut latency = Vec::with_capacity(now.latency.len());
    for (b, n) in before.latency.iter().zip(&now.latency) {
        if b.le != n.le || n.count < b.count {
            return None;
        }
        // Differences of cumulative counts are cumulative counts of the interval.
        latency.push(LatencyBucket {
            le: n.le,
            count: n.count - b.count,
        });
    }
    if latency.last().is_none_or(|b| b.count <= 0.0) {
        latency.clear();
    }
    Some(WorkSample {
        interval_secs,
        completed: now.completed - before.completed,
        errors,
        latency,
    })
}

/// The URL of a task's metrics on this machine: `address` (IPv6 in brackets), the task's
/// host port, `path`.
pub(crate) fn metrics_url(address: &str, host_port: u16, path: &str) -> String {
    if address.contains(':') && !address.starts_with('[') {
        format!("http://[{address}]:{host_port}{path}")
    } else {
        format!("http://{address}:{host_port}{path}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::work::histogram_quantile;

    const TRITON: &str = r#"# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="resnet50",version="1"} 100
nv_inference_request_success{model="densenet",version="2"} 50
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="resnet50",version="1",reason="BACKEND"} 2
nv_inference_request_failure{model="densenet",version="2",reason="REJECTED"} 1
# A plain comment.

# HELP request_duration_seconds Request latency.
# TYPE request_duration_seconds histogram
request_duration_seconds_bucket{model="resnet50",le="0.1"} 40
request_duration_seconds_bucket{model="resnet50",le="0.5"} 90
request_duration_seconds_bucket{model="resnet50",le="+Inf"} 100
request_duration_seconds_sum{model="resnet50"} 21.5
request_duration_seconds_count{model="resnet50"} 100
request_duration_seconds_bucket{model="densenet",le="0.1"} 10
request_duration_seconds_bucket{model="densenet",le="0.5"} 45
request_duration_seconds_bucket{model="densenet",le="+Inf"} 50
request_duration_seconds_sum{model="densenet"} 14
request_duration_seconds_count{model="densenet"} 50
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B"} 4096
vllm:generation_tokens_total{model_name="other"} 4
process_cpu_seconds_total 12.5
"#;

    fn spec(completed: &str, errors: Option<&str>, latency: Option<&str>) -> WorkSpec {
        WorkSpec {
            port: "metrics".into(),
            path: "/metrics".into(),
            completed: completed.into(),
            errors: errors.map(Into::into),
            latency: latency.map(Into::into),
        }
    }

    fn buckets(b: &[(Option<f64>, f64)]) -> Vec<LatencyBucket> {
        b.iter()
            .map(|&(le, count)| LatencyBucket { le, count })
            .collect()
    }

    fn t(completed: f64, errors: Option<f64>, latency: &[(Option<f64>, f64)]) -> Totals {
        Totals {
            completed,
            errors,
            latency: buckets(latency),
        }
    }

    #[test]
    fn totals_sum_counters_and_histograms_over_their_series() {
        let s = spec(
            "nv_inference_request_success",
            Some("nv_inference_request_failure"),
            Some("request_duration_seconds"),
        );
        let got = totals(TRITON, &s).expect("totals");
        let want = t(
            150.0,
            Some(3.0),
            &[(Some(0.1), 50.0), (Some(0.5), 135.0), (None, 150.0)],
        );
        assert_eq!(got, want);
        let vllm = totals(TRITON, &spec("vllm:generation_tokens_total", None, None))
            .expect("a name with colons");
        assert_eq!(vllm, t(4100.0, None, &[]));
    }

    #[test]
    fn undeclared_counters_and_buckets_are_read_as_untyped() {
        let text = "requests_total 7\nrequests_total{code=\"500\"} 3\nrequests_total{} 1\n\
                    latency_seconds_bucket{le=\"1\"} 4\nlatency_seconds_bucket{le=\"+Inf\"} 10\n";
        let got =
            totals(text, &spec("requests_total", None, Some("latency_seconds"))).expect("totals");
        assert_eq!(got, t(11.0, None, &[(Some(1.0), 4.0), (None, 10.0)]));
    }

    #[test]
    fn missing_garbage_or_negative_counters_are_errors_naming_the_metric() {
        let missing = totals(TRITON, &spec("requests_total", None, None)).expect_err("missing");
        assert!(missing.contains("`requests_total`"), "{missing}");
        let html = "<html><body><h1>Not Found</h1>\nNot Found\n</body></html>\n";
        let garbage = totals(html, &spec("requests_total", None, None)).expect_err("garbage");
        assert!(garbage.contains("no counter `requests_total`"), "{garbage}");
        let errors = totals(
            TRITON,
            &spec("nv_inference_request_success", Some("oops"), None),
        )
        .expect_err("missing errors");
        assert!(errors.contains("`oops`"), "{errors}");
        let latency = totals(
            TRITON,
            &spec("nv_inference_request_success", None, Some("lat")),
        )
        .expect_err("missing histogram");
        assert!(latency.contains("`lat`"), "{latency}");
        let negative = totals("x_total -1\n", &spec("x_total", None, None)).expect_err("negative");
        assert!(negative.contains("`x_total`"), "{negative}");
    }

    #[test]
    fn two_scrapes_give_the_work_in_between() {
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let mut w = WorkTracker::default();
        let first = t(
            100.0,
            Some(2.0),
            &[(Some(0.1), 10.0), (Some(0.5), 20.0), (None, 20.0)],
        );
        assert_eq!(
            w.observe(at(0), Ok(first)),
            None,
            "a rate needs two scrapes"
        );
        let second = t(
            150.0,
            Some(3.0),
            &[(Some(0.1), 20.0), (Some(0.5), 60.0), (None, 70.0)],
        );
        assert_eq!(
            w.observe(at(0) + Duration::from_millis(10), Ok(second.clone())),
            None,
            "too soon"
        );
        let Some(WorkReport::Measured(sample)) = w.observe(at(5), Ok(second.clone())) else {
            panic!("measured");
        };
        let want_latency = buckets(&[(Some(0.1), 10.0), (Some(0.5), 40.0), (None, 50.0)]);
        assert_eq!(
            sample,
            WorkSample {
                interval_secs: 5.0,
                completed: 50.0,
                errors: Some(1.0),
                latency: want_latency,
            }
        );
        let p50 = histogram_quantile(0.5, &sample.latency).expect("p50");
        assert!((0.1..=0.5).contains(&p50), "{p50}");
        assert_eq!(histogram_quantile(0.99, &sample.latency), Some(0.5));
        // Nothing observed: no latency, not a histogram of zeros.
        let Some(WorkReport::Measured(idle)) = w.observe(at(10), Ok(second)) else {
            panic!("measured");
        };
        assert_eq!((idle.completed, idle.errors), (0.0, Some(0.0)));
        assert!(idle.latency.is_empty());
    }

    #[test]
    fn a_reset_or_a_failed_scrape_starts_again_from_the_next() {
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let mut w = WorkTracker::default();
        assert_eq!(w.observe(at(0), Ok(t(100.0, None, &[]))), None);
        let Some(WorkReport::Unknown { reason }) = w.observe(at(5), Ok(t(20.0, None, &[]))) else {
            panic!("unknown");
        };
        assert!(reason.contains("restarted"), "{reason}");
        let Some(WorkReport::Measured(s)) = w.observe(at(10), Ok(t(30.0, None, &[]))) else {
            panic!("measured from the new baseline");
        };
        assert_eq!((s.completed, s.interval_secs), (10.0, 5.0));
        assert_eq!(
            w.observe(
                at(15),
                Err("the metrics endpoint refused the connection".into())
            ),
            Some(WorkReport::Unknown {
                reason: "the metrics endpoint refused the connection".into()
            })
        );
        assert_eq!(
            w.observe(at(20), Ok(t(80.0, None, &[]))),
            None,
            "a baseline only"
        );
        let Some(WorkReport::Measured(s)) = w.observe(at(25), Ok(t(90.0, None, &[]))) else {
            panic!("measured");
        };
        assert_eq!(s.completed, 10.0);
        // Changed buckets count as a restart too.
        let mut w = WorkTracker::default();
        let first = t(1.0, None, &[(Some(0.1), 1.0), (None, 1.0)]);
        assert_eq!(w.observe(at(0), Ok(first)), None);
        let changed = w.observe(at(5), Ok(t(2.0, None, &[(Some(0.2), 2.0), (None, 2.0)])));
        assert!(
            matches!(changed, Some(WorkReport::Unknown { .. })),
            "{changed:?}"
        );
    }

    #[test]
    fn urls_bracket_ipv6() {
        assert_eq!(
            metrics_url("10.0.0.5", 8080, "/metrics"),
            "http://10.0.0.5:8080/metrics"
        );
        assert_eq!(metrics_url("::1", 9400, "/m"), "http://[::1]:9400/m");
    }

    /// A local server answering every request with `answer`, or never (`None`).
    async fn serve(answer: Option<Vec<u8>>) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    match answer {
                        Some(a) => {
                            let _ = s.write_all(&a).await;
                            let _ = s.shutdown().await;
                        }
                        None => tokio::time::sleep(Duration::from_secs(30)).await,
                    }
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn fetch_reads_the_text_and_refuses_errors_and_floods() {
        let c = client();
        let body = "# TYPE x counter\nx 1\n";
        let ok = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let port = serve(Some(ok.into_bytes())).await;
        let url = format!("http://127.0.0.1:{port}/metrics");
        assert_eq!(fetch(&c, &url).await, Ok(body.to_owned()));

        let failed =
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        let port = serve(Some(failed.to_vec())).await;
        let err = fetch(&c, &format!("http://127.0.0.1:{port}/"))
            .await
            .expect_err("500");
        assert!(err.contains("500"), "{err}");

        // Without a length (read until the limit) and with one (refused at once).
        let five_mib: usize = 5 << 20;
        for head in [
            "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".to_owned(),
            format!("HTTP/1.1 200 OK\r\ncontent-length: {five_mib}\r\nconnection: close\r\n\r\n"),
        ] {
            let mut answer = head.into_bytes();
            answer.extend(std::iter::repeat_n(b'#', five_mib));
            let port = serve(Some(answer)).await;
            let err = fetch(&c, &format!("http://127.0.0.1:{port}/"))
                .await
                .expect_err("flood");
            assert!(err.contains("4 MiB"), "{err}");
        }

        let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let gone = closed.local_addr().expect("addr").port();
        drop(closed);
        let err = fetch(&c, &format!("http://user:secret@127.0.0.1:{gone}/"))
            .await
            .expect_err("refused");
        assert!(err.contains("refused") && !err.contains("secret"), "{err}");
    }

    #[tokio::test]
    async fn fetch_gives_up_on_a_silent_endpoint_after_the_timeout() {
        let port = serve(None).await;
        let started = Instant::now();
        let err = fetch(&client(), &format!("http://127.0.0.1:{port}/metrics"))
            .await
            .expect_err("silent");
        assert!(err.contains("within 2 s"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
}
