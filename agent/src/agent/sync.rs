//! Talking to the control plane: registration with the join token, and each sync (GPUs,
//! MPS health, tasks with their measured use and work), failing over to the next server.

use super::client::{server_unavailable, with_causes};
use super::{Agent, AgentError, Credentials, SyncFailure, host_resources};
use crate::mps::{MpsDaemons, MpsHealth};
use crate::probe::TaskView;
use std::collections::HashMap;
use tessera_model::agent::{
    MpsReport, RegisterRequest, RegisterResponse, SyncRequest, SyncResponse,
};

impl Agent {
    fn url(&self, path: &str) -> String {
        format!(
            "{}{path}",
            self.servers[self.current].as_str().trim_end_matches('/')
        )
    }

    /// The server in use did not answer (or cannot serve now): the next one is used from
    /// now on.
    fn fail_over(&mut self, why: &str) {
        if self.servers.len() > 1 {
            let from = self.current;
            self.current = (self.current + 1) % self.servers.len();
            tracing::warn!(
                from = %self.servers[from],
                to = %self.servers[self.current],
                error = %why,
                "server unavailable; trying the next"
            );
        }
    }

    pub(super) async fn register(&mut self) -> Result<Credentials, String> {
        let token = self
            .config
            .join_token
            .clone()
            .ok_or_else(|| AgentError::NoJoinToken.to_string())?;
        let inventory = self.probe.inventory().map_err(|e| e.to_string())?;
        let (cpu, memory) = self.config.resources.unwrap_or_else(host_resources);
        let req = RegisterRequest {
            address: self.config.advertise_address.clone(),
            join_token: token,
            pool: self.config.pool.clone(),
            cpu_milli: cpu,
            memory_mib: memory,
            simulated: self.probe.simulated(),
            labels: self.config.labels.clone(),
            gpus: inventory.reports(),
            name: Some(self.config.name.clone()),
            provider_id: self.config.provider_id.clone(),
            agent_version: Some(tessera_model::version::VERSION.to_owned()),
        };
        let resp = match self
            .http
            .post(self.url("/agent/v1/register"))
            .json(&req)
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                let why = with_causes(&e);
                self.fail_over(&why);
                return Err(why);
            }
        };
        if server_unavailable(resp.status()) {
            let why = format!("registration not answered ({})", resp.status());
            self.fail_over(&why);
            return Err(why);
        }
        if !resp.status().is_success() {
            let status = resp.status();
            return Err(format!(
                "registration refused ({status}): {}",
                resp.text().await.unwrap_or_default()
            ));
        }
        let r: RegisterResponse = resp.json().await.map_err(|e| e.to_string())?;
        tracing::info!(host = %r.host_id, "registered with the control plane");
        Ok(Credentials {
            server: self.servers[self.current].to_string(),
            host_id: r.host_id.to_string(),
            agent_token: r.agent_token,
        })
    }

    pub(super) async fn sync(&mut self, creds: &Credentials) -> Result<SyncResponse, SyncFailure> {
        self.runtime.poll();
        let inventory = self
            .probe
            .inventory()
            .map_err(|e| SyncFailure::Other(e.to_string()))?;
        self.runtime.set_gpu_minors(inventory.minors());
        let mps = match &mut self.mps {
            Some(m) => m.supervise(&inventory.uuids()).await,
            None => MpsHealth::Healthy,
        };
        let mut now = HashMap::new();
        for t in self.runtime.processes() {
            if let Some(u) = self.probe.task_usage(&TaskView {
                pids: &t.pids,
                env: &t.env,
            }) {
                let w = self.windows.entry(t.task_id.clone()).or_default();
                w.peak = w.peak.max(u.gpu_memory);
                w.memory_errors = w.memory_errors.saturating_add(u.memory_errors);
                now.insert(t.task_id, u);
            }
        }
        let mut tasks = self.runtime.reports();
        for r in &mut tasks {
            if let (Some(u), Some(w)) = (now.get(&r.task_id), self.windows.get(&r.task_id)) {
                r.gpu_memory_peak_mib = Some(w.peak);
                r.gpu_memory_mib = Some(u.gpu_memory);
                r.sm_percent = u.sm_percent;
                r.memory_errors = (w.memory_errors > 0).then_some(w.memory_errors);
            }
        }
        self.measure_work(&mut tasks).await;
        let req = SyncRequest {
            address: self.config.advertise_address.clone(),
            dynamic_ports_free: Some(self.runtime.dynamic_ports_free()),
            gpus: inventory.reports(),
            mps: MpsReport {
                healthy: mps == MpsHealth::Healthy,
                reason: mps.reason().map(str::to_owned),
                restarts: self.mps.as_ref().map(MpsDaemons::restarts),
            },
            tasks,
            capabilities: self.capabilities.clone(),
            agent_version: Some(tessera_model::version::VERSION.to_owned()),
        };
        // The server's bounds, applied here first: what a task sends through us (its
        // metrics, its checks' output) is cut or dropped with the reason, never a report
        // the server refuses.
        let mut req = req;
        let dropped: Vec<String> = req.sanitize().iter().map(ToString::to_string).collect();
        if dropped != self.dropped {
            for d in &dropped {
                tracing::warn!(item = %d, "part of the report dropped or cut to the protocol's bounds");
            }
            self.dropped = dropped;
        }
        let resp = match self
            .http
            .post(self.url("/agent/v1/sync"))
            .bearer_auth(&creds.agent_token)
            .json(&req)
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                let why = with_causes(&e);
                self.fail_over(&why);
                return Err(SyncFailure::Other(why));
            }
        };
        if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
            return Err(SyncFailure::Unauthorized);
        }
        if server_unavailable(resp.status()) {
            let why = format!("sync not answered ({})", resp.status());
            self.fail_over(&why);
            return Err(SyncFailure::Other(why));
        }
        if !resp.status().is_success() {
            // The server's reason (a version it does not serve names what to upgrade).
            let status = resp.status();
            return Err(SyncFailure::Other(format!(
                "sync refused ({status}): {}",
                resp.text().await.unwrap_or_default()
            )));
        }
        let answer: SyncResponse = resp
            .json()
            .await
            .map_err(|e| SyncFailure::Other(e.to_string()))?;
        if answer.server_version != self.server_version {
            tracing::info!(
                server = %self.servers[self.current],
                server_version = answer.server_version.as_deref().unwrap_or("before 0.2"),
                agent_version = tessera_model::version::VERSION,
                "the server's version"
            );
            self.server_version = answer.server_version.clone();
        }
        self.runtime.converge(&answer.tasks);
        // Reported: the next sync measures a new window.
        self.windows.clear();
        Ok(answer)
    }

    /// Scrapes the work of every task that publishes it, all at once (each within the
    /// scrape timeout), and adds what each completed since its last scrape to its report.
    async fn measure_work(&mut self, reports: &mut [tessera_model::agent::TaskReport]) {
        use crate::runtime::work;
        let targets = self.runtime.work_targets();
        self.work
            .retain(|id, _| targets.iter().any(|(t, _, _)| t == id));
        let client = &self.scraper;
        let scraped =
            futures_util::future::join_all(targets.iter().map(|(id, url, spec)| async move {
                // Fetched within the scrape timeout; read on a blocking thread (one linear
                // pass, bounded by the answer's size), so a task's metrics never hold up
                // the agent's own work, and the whole of it within the timeout again.
                let read = async {
                    let text = work::fetch(client, url).await?;
                    let spec = spec.clone();
                    tokio::task::spawn_blocking(move || work::totals(&text, &spec))
                        .await
                        .map_err(|e| format!("reading the metrics failed: {e}"))?
                };
                let result = tokio::time::timeout(work::SCRAPE_TIMEOUT * 2, read)
                    .await
                    .unwrap_or_else(|_| {
                        Err(format!(
                            "the metrics could not be read within {} s",
                            (work::SCRAPE_TIMEOUT * 2).as_secs()
                        ))
                    });
                (id.clone(), std::time::Instant::now(), result)
            }))
            .await;
        for (id, at, result) in scraped {
            let report = self.work.entry(id.clone()).or_default().observe(at, result);
            if let Some(r) = reports.iter_mut().find(|r| r.task_id == id && r.running) {
                r.work = report;
            }
        }
    }
}
