//! What of the GPUs a sync reports becomes capacity. A host is admitted with the GPUs it
//! registered (an admin looked at them, in a pool with manual admission); a sync may then
//! report them healthy or not, missing, or replaced by the same kind at the same index,
//! and nothing more. A GPU that appears, a known one whose model or memory changed, or
//! (in a manual pool) any replacement, waits for an admin's approval in a manual pool and
//! is refused in an automatic one: a compromised host cannot make itself 64 H100s and
//! draw every project's tasks (and their secrets). A GPU UUID that another host has is
//! refused everywhere.
//!
//! Pure: the stored inventory and the report in, what to take out, so the rules are
//! table-tested without a store.

use std::collections::BTreeMap;
use tessera_model::agent::GpuReport;
use tessera_model::{GpuHealth, GpuInfo, GpuUuid, HostId, PendingGpu};

/// What a sync's GPUs come to.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Judged {
    /// What the store takes: known GPUs (as registered, with the reported health and
    /// client limit) and replacements the pool accepts.
    pub gpus: Vec<GpuReport>,
    /// What waits for an admin's approval (manual pools).
    pub pending: Vec<PendingGpu>,
    /// What was refused, each as a sentence for the host's events.
    pub refused: Vec<String>,
}

/// A stored GPU as a report would give it, with `healthy` and `mps_client_limit` as said.
pub(crate) fn stored_as_report(k: &GpuInfo, healthy: bool, mps_client_limit: u32) -> GpuReport {
    GpuReport {
        uuid: k.uuid.clone(),
        index: k.index,
        model: k.model.clone(),
        memory_mib: k.memory,
        mps_client_limit,
        healthy,
    }
}

fn pending(g: &GpuReport, why: String) -> PendingGpu {
    PendingGpu {
        uuid: g.uuid.clone(),
        index: g.index,
        model: g.model.clone(),
        memory: g.memory_mib,
        mps_client_limit: g.mps_client_limit,
        why,
    }
}

/// Judges `reported` against the host's `stored` GPUs. `manual`: the pool holds what is
/// new for approval; `elsewhere`: the other hosts that have any of the reported UUIDs.
pub(crate) fn judge(
    stored: &[GpuInfo],
    reported: &[GpuReport],
    manual: bool,
    elsewhere: &BTreeMap<GpuUuid, HostId>,
) -> Judged {
    let mut out = Judged::default();
    for g in reported {
        if let Some(k) = stored.iter().find(|k| k.uuid == g.uuid) {
            if k.model != g.model || k.memory != g.memory_mib {
                let why = format!(
                    "GPU {} (index {}) reports {} with {} MiB; it was admitted as {} with {} MiB",
                    g.uuid, g.index, g.model, g.memory_mib.0, k.model, k.memory.0
                );
                if manual {
                    out.pending.push(pending(g, why));
                } else {
                    out.refused.push(format!("{why}: kept as admitted"));
                }
            }
            // A known GPU counts as it was admitted, whatever it says now.
            out.gpus
                .push(stored_as_report(k, g.healthy, g.mps_client_limit));
            continue;
        }
        if let Some(other) = elsewhere.get(&g.uuid) {
            out.refused.push(format!(
                "GPU {} (index {}) is a GPU of host {other}: refused",
                g.uuid, g.index
            ));
            continue;
        }
        // A replacement: the GPU this index had is no longer reported.
        let replaced = stored
            .iter()
            .find(|k| k.index == g.index && !reported.iter().any(|r| r.uuid == k.uuid));
        match replaced {
            Some(k) if k.model == g.model && g.memory_mib <= k.memory && !manual => {
                out.gpus.push(g.clone());
            }
            Some(k) => {
                let why = format!(
                    "GPU {} ({} with {} MiB) replaces GPU {} ({} with {} MiB) at index {}",
                    g.uuid, g.model, g.memory_mib.0, k.uuid, k.model, k.memory.0, g.index
                );
                if manual {
                    out.pending.push(pending(g, why));
                } else {
                    out.refused.push(format!(
                        "{why}: not what the host was admitted with, refused (register the host again to change its inventory)"
                    ));
                }
            }
            None => {
                let why = format!(
                    "GPU {} ({} with {} MiB) at index {} is new: the host was admitted with {} GPU(s)",
                    g.uuid,
                    g.model,
                    g.memory_mib.0,
                    g.index,
                    stored.len()
                );
                if manual {
                    out.pending.push(pending(g, why));
                } else {
                    out.refused.push(format!(
                        "{why}: refused (register the host again to change its inventory)"
                    ));
                }
            }
        }
    }
    out
}

/// What the store holds of a host after an admin approved `pending`: the stored GPUs as
/// they stand, with the approved ones added or put in the place of the ones they replace.
pub(crate) fn approved(stored: &[GpuInfo], pending: &[PendingGpu]) -> Vec<GpuReport> {
    let mut gpus: Vec<GpuReport> = stored
        .iter()
        .filter(|k| {
            !pending
                .iter()
                .any(|p| p.uuid == k.uuid || p.index == k.index)
        })
        .map(|k| stored_as_report(k, k.health == GpuHealth::Healthy, k.mps_client_limit))
        .collect();
    gpus.extend(pending.iter().map(|p| GpuReport {
        uuid: p.uuid.clone(),
        index: p.index,
        model: p.model.clone(),
        memory_mib: p.memory,
        mps_client_limit: p.mps_client_limit,
        healthy: true,
    }));
    gpus
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::{MiB, SharingMode};

    fn known(index: u32, uuid: &str) -> GpuInfo {
        GpuInfo {
            uuid: GpuUuid::new(uuid).expect("valid"),
            index,
            model: "NVIDIA L4".into(),
            memory: MiB(24_000),
            mps_client_limit: 48,
            health: GpuHealth::Healthy,
            sharing_mode: SharingMode::Idle,
        }
    }

    fn report(index: u32, uuid: &str, model: &str, memory: u64) -> GpuReport {
        GpuReport {
            uuid: GpuUuid::new(uuid).expect("valid"),
            index,
            model: model.into(),
            memory_mib: MiB(memory),
            mps_client_limit: 48,
            healthy: true,
        }
    }

    #[test]
    fn known_gpus_pass_and_count_as_admitted() {
        let stored = [known(0, "GPU-a"), known(1, "GPU-b")];
        let mut sick = report(1, "GPU-b", "NVIDIA L4", 24_000);
        sick.healthy = false;
        let j = judge(
            &stored,
            &[report(0, "GPU-a", "NVIDIA L4", 24_000), sick.clone()],
            false,
            &BTreeMap::new(),
        );
        assert_eq!(j.gpus, [report(0, "GPU-a", "NVIDIA L4", 24_000), sick]);
        assert!(j.pending.is_empty() && j.refused.is_empty());
        // A known GPU that claims to be bigger, or another model, counts as admitted.
        for manual in [false, true] {
            let j = judge(
                &stored,
                &[report(0, "GPU-a", "NVIDIA H100 80GB HBM3", 81_559)],
                manual,
                &BTreeMap::new(),
            );
            assert_eq!(j.gpus, [report(0, "GPU-a", "NVIDIA L4", 24_000)]);
            assert_eq!(j.pending.len() + j.refused.len(), 1);
            assert_eq!(j.pending.len(), usize::from(manual));
        }
    }

    #[test]
    fn growth_waits_in_manual_pools_and_is_refused_in_automatic_ones() {
        let stored = [known(0, "GPU-a")];
        let many: Vec<GpuReport> = std::iter::once(report(0, "GPU-a", "NVIDIA L4", 24_000))
            .chain((1..64).map(|i| report(i, &format!("GPU-fake-{i}"), "NVIDIA H100", 81_559)))
            .collect();
        let auto = judge(&stored, &many, false, &BTreeMap::new());
        assert_eq!(auto.gpus.len(), 1, "only the admitted GPU is capacity");
        assert_eq!(auto.refused.len(), 63);
        assert!(auto.refused[0].contains("is new"), "{}", auto.refused[0]);
        let manual = judge(&stored, &many, true, &BTreeMap::new());
        assert_eq!(manual.gpus.len(), 1);
        assert_eq!(manual.pending.len(), 63);
        // Approved, they are the host's inventory.
        let after = approved(&stored, &manual.pending);
        assert_eq!(after.len(), 64);
    }

    #[test]
    fn a_like_for_like_replacement_is_taken_where_admission_is_automatic() {
        let stored = [known(0, "GPU-a"), known(1, "GPU-b")];
        let swapped = [
            report(0, "GPU-a", "NVIDIA L4", 24_000),
            report(1, "GPU-new", "NVIDIA L4", 24_000),
        ];
        let auto = judge(&stored, &swapped, false, &BTreeMap::new());
        assert_eq!(auto.gpus, swapped, "the same kind at the same index");
        let manual = judge(&stored, &swapped, true, &BTreeMap::new());
        assert_eq!(manual.gpus.len(), 1);
        assert_eq!(manual.pending.len(), 1);
        assert_eq!(
            approved(&stored, &manual.pending)
                .iter()
                .map(|g| g.uuid.as_str())
                .collect::<Vec<_>>(),
            ["GPU-a", "GPU-new"],
            "approved, it takes the replaced GPU's place"
        );
        let bigger = [report(1, "GPU-new", "NVIDIA H100", 81_559)];
        let auto = judge(&stored, &bigger, false, &BTreeMap::new());
        assert!(auto.gpus.is_empty());
        assert!(
            auto.refused[0].contains("replaces GPU GPU-b"),
            "{}",
            auto.refused[0]
        );
    }

    #[test]
    fn a_uuid_of_another_host_is_refused_everywhere() {
        let stored = [known(0, "GPU-a")];
        let elsewhere = BTreeMap::from([(
            GpuUuid::new("GPU-x").expect("valid"),
            HostId::new("h2").expect("valid"),
        )]);
        for manual in [false, true] {
            let j = judge(
                &stored,
                &[report(1, "GPU-x", "NVIDIA L4", 24_000)],
                manual,
                &elsewhere,
            );
            assert!(j.gpus.is_empty() && j.pending.is_empty());
            assert!(
                j.refused[0].contains("a GPU of host h2"),
                "{}",
                j.refused[0]
            );
        }
    }
}
