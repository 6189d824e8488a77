//! Reading the Alibaba GPU cluster trace v2023 ("openb") format: node lists and task lists
//! as CSV. GPUs become 1000 units of memory and 1000 of compute, so a task needs
//! `gpu_milli` of each, which makes the problem the published one.

use std::collections::HashMap;
use tessera_model::{ComputeMilli, GpuUuid, HostId, MiB, MilliCpu};
use tessera_placement::request::{Constraints, GpuDemand, TaskRequest};
use tessera_placement::rng::Rng;
use tessera_placement::snapshot::{GpuSpec, HostSpec};

/// Memory of one GPU in trace units: a GPU is 1000 milli.
pub const GPU_UNITS: u64 = 1000;

/// A row of a task list, as the benchmark needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceTask {
    /// 0-based data row in the file.
    pub row: usize,
    pub request: TaskRequest,
    pub num_gpu: u32,
    pub gpu_milli: u32,
    /// When the task arrived and left, in trace seconds, where the file says (the
    /// `creation_time` and `deletion_time` columns).
    pub created: Option<u64>,
    pub deleted: Option<u64>,
}

impl TraceTask {
    /// GPU demand in milli-GPUs (`num_gpu × gpu_milli`).
    pub fn gpu_request_milli(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }
}

/// Reads and parses a node list and a task list (what the benchmark programs take as
/// `--nodes` and `--tasks`); the error names the file.
pub fn load(nodes: &str, tasks: &str) -> Result<(Vec<HostSpec>, Vec<TraceTask>), String> {
    let read =
        |path: &str| std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"));
    let hosts = parse_nodes(nodes, &read(nodes)?).map_err(|e| e.to_string())?;
    let tasks = parse_tasks(tasks, &read(tasks)?).map_err(|e| e.to_string())?;
    Ok((hosts, tasks))
}

/// The cluster's GPUs in thousandths (1000 per GPU).
pub fn capacity_milli(hosts: &[HostSpec]) -> u64 {
    hosts.iter().map(|h| h.gpus.len() as u64 * GPU_UNITS).sum()
}

/// The FGD protocol's arrivals for a seed (indices into `tasks`): the tasks shuffled, then
/// tasks drawn with replacement until the GPU requests reach `target` thousandths.
pub fn arrival_order(tasks: &[TraceTask], seed: u64, target: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed);
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    rng.shuffle(&mut order);
    let mut total: u64 = order.iter().map(|&i| tasks[i].gpu_request_milli()).sum();
    while total < target {
        let i = rng.below(tasks.len());
        order.push(i);
        total += tasks[i].gpu_request_milli();
    }
    order
}

/// A malformed trace file; names the line and column.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{file}: missing column {column:?} in the header")]
    MissingColumn { file: String, column: &'static str },
    #[error("{file}:{line}: column {column:?}: {message}")]
    Bad {
        file: String,
        line: usize,
        column: &'static str,
        message: String,
    },
}

struct Csv<'a> {
    file: &'a str,
    header: HashMap<&'a str, usize>,
}

impl<'a> Csv<'a> {
    fn new(file: &'a str, header_line: &'a str) -> Self {
        Csv {
            file,
            header: header_line
                .trim()
                .split(',')
                .enumerate()
                .map(|(i, c)| (c, i))
                .collect(),
        }
    }

    fn col(&self, column: &'static str) -> Result<usize, TraceError> {
        self.header
            .get(column)
            .copied()
            .ok_or(TraceError::MissingColumn {
                file: self.file.to_owned(),
                column,
            })
    }

    fn num(&self, fields: &[&str], line: usize, column: &'static str) -> Result<u64, TraceError> {
        let i = self.col(column)?;
        let raw = fields.get(i).copied().unwrap_or("");
        raw.trim().parse().map_err(|_| TraceError::Bad {
            file: self.file.to_owned(),
            line,
            column,
            message: format!("{raw:?} is not a whole number"),
        })
    }
}

/// Parses a node list (`sn,cpu_milli,memory_mib,gpu,model`).
pub fn parse_nodes(file: &str, text: &str) -> Result<Vec<HostSpec>, TraceError> {
    let mut lines = text.lines();
    let csv = Csv::new(file, lines.next().unwrap_or(""));
    let (sn, model) = (csv.col("sn")?, csv.col("model")?);
    let mut hosts = Vec::new();
    for (i, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let line_no = i + 2;
        let fields: Vec<&str> = line.trim().split(',').collect();
        let name = fields.get(sn).copied().unwrap_or("");
        let id = HostId::new(name.to_ascii_lowercase()).map_err(|e| TraceError::Bad {
            file: file.to_owned(),
            line: line_no,
            column: "sn",
            message: e.to_string(),
        })?;
        let gpus = csv.num(&fields, line_no, "gpu")?;
        let model_name = fields.get(model).copied().unwrap_or("").to_owned();
        hosts.push(HostSpec {
            cpu: MilliCpu(csv.num(&fields, line_no, "cpu_milli")?),
            memory: MiB(csv.num(&fields, line_no, "memory_mib")?),
            labels: Default::default(),
            active: true,
            gpus: (0..gpus)
                .map(|g| GpuSpec {
                    uuid: GpuUuid::new(format!("{name}/{g}")).expect("non-empty"),
                    model: model_name.clone(),
                    memory: MiB(GPU_UNITS),
                    mps_client_limit: 1000,
                    healthy: true,
                })
                .collect(),
            id,
        });
    }
    Ok(hosts)
}

/// Parses a task list (`cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec]`).
pub fn parse_tasks(file: &str, text: &str) -> Result<Vec<TraceTask>, TraceError> {
    let mut lines = text.lines();
    let csv = Csv::new(file, lines.next().unwrap_or(""));
    let spec = csv.header.get("gpu_spec").copied();
    let time = |fields: &[&str], column: &str| {
        csv.header
            .get(column)
            .and_then(|&i| fields.get(i))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let mut tasks = Vec::new();
    for (row, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let line_no = row + 2;
        let fields: Vec<&str> = line.trim().split(',').collect();
        let cpu = MilliCpu(csv.num(&fields, line_no, "cpu_milli")?);
        let memory = MiB(csv.num(&fields, line_no, "memory_mib")?);
        let num_gpu = csv.num(&fields, line_no, "num_gpu")? as u32;
        let gpu_milli = csv.num(&fields, line_no, "gpu_milli")? as u32;
        if gpu_milli > 1000 || (num_gpu > 1 && gpu_milli < 1000) {
            return Err(TraceError::Bad {
                file: file.to_owned(),
                line: line_no,
                column: "gpu_milli",
                message: format!(
                    "{gpu_milli} with num_gpu {num_gpu}: a share below 1000 needs num_gpu 1"
                ),
            });
        }
        let gpu = match (num_gpu, gpu_milli) {
            (0, _) | (_, 0) => GpuDemand::None,
            (1, m) if m < 1000 => GpuDemand::Shared {
                memory: MiB(u64::from(m)),
                compute: Some(ComputeMilli(m)),
            },
            (n, _) => GpuDemand::Whole { count: n },
        };
        let gpu_models = spec
            .and_then(|i| fields.get(i))
            .map(|s| {
                s.split('|')
                    .filter(|m| !m.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        tasks.push(TraceTask {
            row,
            request: TaskRequest {
                cpu,
                memory,
                gpu,
                constraints: Constraints {
                    gpu_models,
                    ..Constraints::default()
                },
            },
            num_gpu: if gpu == GpuDemand::None { 0 } else { num_gpu },
            gpu_milli: if gpu == GpuDemand::None { 0 } else { gpu_milli },
            created: time(&fields, "creation_time"),
            deleted: time(&fields, "deletion_time"),
        });
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nodes_and_tasks_with_and_without_gpu_spec() {
        let nodes = parse_nodes(
            "n.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nnode-1,64000,262144,2,T4\n",
        )
        .expect("valid");
        assert_eq!(nodes[0].gpus.len(), 2);
        assert_eq!(nodes[0].gpus[1].model, "T4");
        let tasks = parse_tasks(
            "t.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,10,1,460,T4|P100\np1,1000,10,2,1000,\np2,1000,10,0,0,\n",
        )
        .expect("valid");
        assert_eq!(tasks[0].request.constraints.gpu_models, vec!["T4", "P100"]);
        assert!(matches!(
            tasks[0].request.gpu,
            GpuDemand::Shared {
                memory: MiB(460),
                ..
            }
        ));
        assert_eq!(tasks[1].request.gpu, GpuDemand::Whole { count: 2 });
        assert_eq!(tasks[2].request.gpu, GpuDemand::None);
        assert_eq!(tasks[1].gpu_request_milli(), 2000);
        assert_eq!((tasks[0].created, tasks[0].deleted), (None, None));
        let timed = parse_tasks(
            "t.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\np0,1000,10,1,460,5,90\n",
        )
        .expect("valid");
        assert_eq!((timed[0].created, timed[0].deleted), (Some(5), Some(90)));
    }

    #[test]
    fn bad_rows_name_line_and_column() {
        let err = parse_tasks(
            "t.csv",
            "cpu_milli,memory_mib,num_gpu,gpu_milli\n1000,10,x,5\n",
        )
        .expect_err("bad");
        assert_eq!(
            err.to_string(),
            "t.csv:2: column \"num_gpu\": \"x\" is not a whole number"
        );
    }
}
