//! A host's status as a state machine, decided without I/O: what a sync, an operator's
//! drain or activate, or a silence past the lost timeout does to it. The callers write
//! the transition with a compare-and-set on the status they read, so a change that came
//! in between wins; these rules are table-tested here without a database.
//!
//! ```text
//!            sync reports a problem              sync reports none
//!   active ───────────────────────► impaired ─────────────────────► active
//!   lost ──── sync (problem: impaired, none: active)
//!   any ── drain ──► draining          any but lost ── activate ──► active
//! ```
//!
//! Silence past the lost timeout makes any host but a lost one lost, with its tasks stopped:
//! that one is written by the store in a single transaction (`HostStore::mark_host_lost`),
//! with [`lost_reason`].

use tessera_model::HostStatus;
use tessera_model::agent::SyncRequest;

/// What happens to a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostEvent<'a> {
    /// Its agent synced, reporting `problem` (none when healthy); the host's stored
    /// reason was `reason`.
    Synced {
        problem: Option<&'a str>,
        reason: Option<&'a str>,
    },
    /// An operator drains it.
    Drain,
    /// An operator makes it take tasks again.
    Activate,
}

/// A status change, with the reason stored beside it and the event's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transition {
    pub to: HostStatus,
    pub reason: Option<String>,
    pub message: String,
}

/// The transition `event` makes from `status` for host `id`: `Ok(None)` when nothing
/// changes, `Err` with why when an operator asked for something that cannot be.
pub(crate) fn next(
    id: &str,
    status: HostStatus,
    event: HostEvent<'_>,
) -> Result<Option<Transition>, String> {
    use HostStatus::{Active, Draining, Impaired, Lost};
    let to = |to, reason: Option<&str>, message: String| {
        Ok(Some(Transition {
            to,
            reason: reason.map(str::to_owned),
            message,
        }))
    };
    match (status, event) {
        (Lost, HostEvent::Synced { problem: None, .. }) => {
            to(Active, None, format!("host {id} is back after being lost"))
        }
        (
            Lost | Active,
            HostEvent::Synced {
                problem: Some(p), ..
            },
        ) => to(Impaired, Some(p), format!("host {id} impaired: {p}")),
        (Impaired, HostEvent::Synced { problem: None, .. }) => {
            to(Active, None, format!("host {id} recovered"))
        }
        (
            Impaired,
            HostEvent::Synced {
                problem: Some(p),
                reason,
            },
        ) if reason != Some(p) => to(Impaired, Some(p), format!("host {id} impaired: {p}")),
        (_, HostEvent::Synced { .. }) => Ok(None),
        (_, HostEvent::Drain) => to(
            Draining,
            Some("drained by an operator"),
            format!("host {id} is draining"),
        ),
        (Lost, HostEvent::Activate) => Err(format!(
            "host {id} is lost; it becomes active again when its agent syncs"
        )),
        (_, HostEvent::Activate) => to(Active, None, format!("host {id} activated")),
    }
}

/// What is wrong with a host, from its agent's report: its MPS daemon first, then its
/// GPUs; `None` when all is well.
pub(crate) fn problem(req: &SyncRequest) -> Option<String> {
    let sick: Vec<String> = req
        .gpus
        .iter()
        .filter(|g| !g.healthy)
        .map(|g| format!("GPU {}", g.index))
        .collect();
    if !req.mps.healthy {
        Some(format!(
            "MPS control daemon unhealthy: {}",
            req.mps.reason.as_deref().unwrap_or("no reason given")
        ))
    } else if !sick.is_empty() {
        Some(format!("{} unhealthy", sick.join(", ")))
    } else {
        None
    }
}

/// The reason stored for a host lost after `secs` of silence.
pub(crate) fn lost_reason(secs: f64) -> String {
    format!("no agent sync for {secs:.0} s")
}

#[cfg(test)]
mod tests {
    use super::*;
    use HostStatus::{Active, Draining, Impaired, Lost};

    fn synced(problem: Option<&'static str>, reason: Option<&'static str>) -> HostEvent<'static> {
        HostEvent::Synced { problem, reason }
    }

    #[test]
    fn every_status_and_event() {
        let mps = Some("MPS control daemon unhealthy: gone");
        let gpu = Some("GPU 1 unhealthy");
        // (from, event, to; None: unchanged)
        let table: &[(HostStatus, HostEvent, Option<HostStatus>)] = &[
            (Active, synced(None, None), None),
            (Active, synced(mps, None), Some(Impaired)),
            (Impaired, synced(mps, mps), None),
            (Impaired, synced(gpu, mps), Some(Impaired)),
            (Impaired, synced(None, mps), Some(Active)),
            (Lost, synced(None, None), Some(Active)),
            (Lost, synced(gpu, None), Some(Impaired)),
            // An operator's drain is not undone by a sync, healthy or not.
            (Draining, synced(None, None), None),
            (Draining, synced(mps, None), None),
            (Active, HostEvent::Drain, Some(Draining)),
            (Impaired, HostEvent::Drain, Some(Draining)),
            (Lost, HostEvent::Drain, Some(Draining)),
            (Draining, HostEvent::Activate, Some(Active)),
            (Impaired, HostEvent::Activate, Some(Active)),
        ];
        for (from, event, to) in table {
            let got = next("h", *from, *event)
                .unwrap_or_else(|e| panic!("{from:?} + {event:?}: {e}"))
                .map(|t| t.to);
            assert_eq!(got, *to, "{from:?} + {event:?}");
        }
        assert!(next("h", Lost, HostEvent::Activate).is_err());
    }

    #[test]
    fn the_reason_stored_is_the_problem_reported() {
        let t = next("h", Active, synced(Some("GPU 0 unhealthy"), None))
            .expect("allowed")
            .expect("a change");
        assert_eq!(t.reason.as_deref(), Some("GPU 0 unhealthy"));
        assert_eq!(t.message, "host h impaired: GPU 0 unhealthy");
        let t = next("h", Impaired, synced(None, Some("GPU 0 unhealthy")))
            .expect("allowed")
            .expect("a change");
        assert_eq!((t.to, t.reason), (Active, None));
    }
}
