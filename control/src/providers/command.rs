//! The `command` capacity provider: an operator's executable (for racks, other clouds,
//! Terraform) called with one JSON request on stdin, answering one JSON object on stdout.
//!
//! Requests:
//! - `{"action": "create", "pool": P, "names": [N…], "shape": {…}|null}`: make one machine
//!   per name. Answer `{"machines": [{"name": N, "provider_id": ID}…]}` (a machine whose
//!   id is not known yet may be left out; its agent joins with `--provider-id`).
//! - `{"action": "delete", "pool": P, "name": N, "provider_id": ID|null}`: remove it.
//!   Answer `{}`.
//!
//! Either may answer `{"error": "why"}`. A run that exits non-zero, says what is not JSON,
//! or does not answer within the timeout failed; failures are tried again with backoff (1,
//! then 2 s), and the last one's words (its stderr, cut) are what the event says.

use super::Machines;
use async_trait::async_trait;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;
use tessera_model::PoolName;
use tessera_model::provider::Provider;
use tokio::io::AsyncWriteExt;

/// The most an answer or its error output may be (what is kept of it).
const MAX_OUTPUT: usize = 64 * 1024;
/// How much of a failed run's error output an event keeps.
const SAID: usize = 500;

/// Runs each pool's provider command.
pub struct CommandMachines {
    /// How long one run may take.
    timeout: Duration,
    /// Tries of a request (the first included).
    tries: u32,
}

impl Default for CommandMachines {
    fn default() -> Self {
        CommandMachines {
            timeout: Duration::from_secs(60),
            tries: 3,
        }
    }
}

#[derive(Debug, Deserialize)]
struct Answer {
    #[serde(default)]
    machines: Vec<Made>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Made {
    name: String,
    provider_id: String,
}

impl CommandMachines {
    /// With another timeout per run and number of tries (tests).
    pub fn with(timeout: Duration, tries: u32) -> CommandMachines {
        CommandMachines {
            timeout,
            tries: tries.max(1),
        }
    }

    /// `request` to `provider`'s command, tried again on failure; its answer.
    async fn call(
        &self,
        provider: &Provider,
        request: &serde_json::Value,
    ) -> Result<Answer, String> {
        let path = provider
            .path
            .as_deref()
            .ok_or("the command provider has no path")?;
        let mut last = String::new();
        for attempt in 0..self.tries {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_secs(1 << (attempt - 1).min(4))).await;
            }
            match self.run(path, request).await {
                Ok(answer) => match answer.error {
                    // The provider's own refusal is its answer: not tried again.
                    Some(why) => return Err(cut(&why)),
                    None => return Ok(answer),
                },
                Err(why) => last = why,
            }
        }
        Err(format!(
            "{path} failed {} time(s); the last: {last}",
            self.tries
        ))
    }

    async fn run(&self, path: &str, request: &serde_json::Value) -> Result<Answer, String> {
        let mut child = tokio::process::Command::new(path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run {path}: {e}"))?;
        let mut stdin = child.stdin.take().expect("piped");
        let body = serde_json::to_vec(request).expect("a request serializes");
        let ran = tokio::time::timeout(self.timeout, async move {
            // A command that does not read its request still gets to answer.
            let _ = stdin.write_all(&body).await;
            drop(stdin);
            child.wait_with_output().await
        })
        .await;
        let out = match ran {
            Err(_) => {
                return Err(format!(
                    "no answer within {} s (killed)",
                    self.timeout.as_secs()
                ));
            }
            Ok(Err(e)) => return Err(format!("cannot wait for {path}: {e}")),
            Ok(Ok(out)) => out,
        };
        let stderr = String::from_utf8_lossy(&out.stderr[..out.stderr.len().min(MAX_OUTPUT)]);
        if !out.status.success() {
            return Err(format!(
                "exited with {}: {}",
                out.status,
                cut(stderr.trim())
            ));
        }
        if out.stdout.len() > MAX_OUTPUT {
            return Err(format!("answered more than {MAX_OUTPUT} bytes"));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "answered what is not the expected JSON ({e}): {}",
                cut(String::from_utf8_lossy(&out.stdout).trim())
            )
        })
    }
}

/// At most [`SAID`] characters of `text`, without control characters.
fn cut(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_control())
        .take(SAID)
        .collect()
}

#[async_trait]
impl Machines for CommandMachines {
    async fn launch(
        &self,
        pool: &PoolName,
        provider: &Provider,
        names: &[String],
    ) -> Result<BTreeMap<String, String>, String> {
        let request = serde_json::json!({
            "action": "create",
            "pool": pool,
            "names": names,
            "shape": provider.shape,
        });
        let answer = self.call(provider, &request).await?;
        let mut ids = BTreeMap::new();
        for m in answer.machines {
            // An answer that makes no sense is refused whole.
            if !names.contains(&m.name) {
                return Err(format!(
                    "answered a machine it was not asked for: {:?}",
                    cut(&m.name)
                ));
            }
            if !tessera_model::agent::provider_id_ok(&m.provider_id) {
                return Err(format!(
                    "answered a provider id that is not 1 to 256 letters, digits and ._:/-: {:?}",
                    cut(&m.provider_id)
                ));
            }
            if ids.insert(m.name.clone(), m.provider_id).is_some() {
                return Err(format!("answered machine {} twice", m.name));
            }
        }
        Ok(ids)
    }

    async fn terminate(
        &self,
        pool: &PoolName,
        provider: &Provider,
        name: &str,
        provider_id: Option<&str>,
    ) -> Result<(), String> {
        let request = serde_json::json!({
            "action": "delete",
            "pool": pool,
            "name": name,
            "provider_id": provider_id,
        });
        self.call(provider, &request).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::provider::{ProviderInput, validate};

    /// A provider whose command is the shell script `script` (written to `dir`).
    fn provider(dir: &std::path::Path, script: &str) -> Provider {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("provider.sh");
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        validate(&ProviderInput {
            kind: "command".into(),
            path: Some(path.display().to_string()),
            max_hosts: 4,
            ..Default::default()
        })
        .expect("valid")
    }

    fn pool() -> PoolName {
        PoolName::new("rack").expect("valid")
    }

    fn names() -> Vec<String> {
        vec!["m-rack-1".into(), "m-rack-2".into()]
    }

    #[tokio::test]
    async fn the_request_goes_in_on_stdin_and_the_machines_come_back() {
        let dir = tempfile::tempdir().expect("dir");
        let log = dir.path().join("requests");
        let p = provider(
            dir.path(),
            &format!(
                "cat >> {log}; echo >> {log}\necho '{{\"machines\": [{{\"name\": \"m-rack-1\", \"provider_id\": \"node-17\"}}]}}'",
                log = log.display()
            ),
        );
        let m = CommandMachines::with(Duration::from_secs(10), 1);
        let ids = m.launch(&pool(), &p, &names()).await.expect("made");
        assert_eq!(
            ids,
            BTreeMap::from([("m-rack-1".to_owned(), "node-17".to_owned())])
        );
        m.terminate(&pool(), &p, "m-rack-1", Some("node-17"))
            .await
            .expect("removed");
        let sent = std::fs::read_to_string(&log).expect("requests");
        let requests: Vec<serde_json::Value> = sent
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON"))
            .collect();
        assert_eq!(requests[0]["action"], "create");
        assert_eq!(requests[0]["pool"], "rack");
        assert_eq!(requests[0]["names"], serde_json::json!(names()));
        assert_eq!(requests[1]["action"], "delete");
        assert_eq!(requests[1]["provider_id"], "node-17");
    }

    #[tokio::test]
    async fn failures_are_tried_again_and_their_words_kept() {
        let dir = tempfile::tempdir().expect("dir");
        let count = dir.path().join("count");
        // Fails twice, then answers.
        let p = provider(
            dir.path(),
            &format!(
                "echo x >> {c}\nif [ $(wc -l < {c}) -lt 3 ]; then echo 'rack 4 is full' >&2; exit 2; fi\necho '{{}}'",
                c = count.display()
            ),
        );
        let m = CommandMachines::with(Duration::from_secs(10), 3);
        assert_eq!(m.launch(&pool(), &p, &names()).await, Ok(BTreeMap::new()));
        // Always failing: the last failure's words.
        let p = provider(dir.path(), "echo 'no capacity in rack 4' >&2; exit 1");
        let m = CommandMachines::with(Duration::from_secs(10), 2);
        let e = m.launch(&pool(), &p, &names()).await.expect_err("failed");
        assert!(
            e.contains("failed 2 time(s)") && e.contains("no capacity in rack 4"),
            "{e}"
        );
        // Its own refusal is not tried again.
        let p = provider(
            dir.path(),
            "echo x >> {c}; echo '{\"error\": \"quota exceeded\"}'"
                .replace("{c}", &count.display().to_string())
                .as_str(),
        );
        std::fs::remove_file(&count).expect("reset");
        let e = m.launch(&pool(), &p, &names()).await.expect_err("refused");
        assert_eq!(e, "quota exceeded");
        assert_eq!(
            std::fs::read_to_string(&count)
                .expect("count")
                .lines()
                .count(),
            1
        );
    }

    #[tokio::test]
    async fn a_slow_or_senseless_answer_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let m = CommandMachines::with(Duration::from_millis(300), 1);
        let p = provider(dir.path(), "sleep 5");
        let e = m.launch(&pool(), &p, &names()).await.expect_err("slow");
        assert!(e.contains("no answer within"), "{e}");
        let p = provider(dir.path(), "echo 'made them'");
        let e = m.launch(&pool(), &p, &names()).await.expect_err("not JSON");
        assert!(
            e.contains("not the expected JSON") && e.contains("made them"),
            "{e}"
        );
        let p = provider(
            dir.path(),
            "echo '{\"machines\": [{\"name\": \"m-other\", \"provider_id\": \"x\"}]}'",
        );
        let e = m.launch(&pool(), &p, &names()).await.expect_err("unknown");
        assert!(e.contains("not asked for"), "{e}");
        let p = provider(
            dir.path(),
            "echo '{\"machines\": [{\"name\": \"m-rack-1\", \"provider_id\": \"bad id\"}]}'",
        );
        let e = m.launch(&pool(), &p, &names()).await.expect_err("bad id");
        assert!(e.contains("provider id"), "{e}");
    }
}
