//! The ranking policies an engine can use, and the outcome of a batch.

use super::*;

/// How the engine ranks hosts and GPUs that can take a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Tessera's fragmentation-aware packing (the default for sharing pools): FGD's
    /// fragmentation measure, plus GPU share stranded by a host's CPU and memory, plus the
    /// change in the touched GPU's gap value (see `crate::gaps`).
    Fragmentation,
    /// Best fit: the GPU, then host, with the least room left that still fits.
    Binpack,
    /// The host with the most free GPU share.
    SpreadHost,
    /// The GPU with the most free share.
    SpreadGpu,
    /// FGD exactly as the published simulator scores it (integer sigmoid score, random
    /// tie-break): a baseline for benchmarks.
    FgdSim,
    /// The published simulator's BestFit (see `shared/anchors/README.md`): a harness check.
    BestFitSim,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Fragmentation => "fragmentation",
            Policy::Binpack => "binpack",
            Policy::SpreadHost => "spread_host",
            Policy::SpreadGpu => "spread_gpu",
            Policy::FgdSim => "fgd-sim",
            Policy::BestFitSim => "bestfit-sim",
        }
    }

    pub fn parse(name: &str) -> Option<Policy> {
        match name {
            "default" | "fragmentation" => Some(Policy::Fragmentation),
            "binpack" | "bestfit" => Some(Policy::Binpack),
            "spread_host" | "spread-host" => Some(Policy::SpreadHost),
            "spread_gpu" | "spread-gpu" => Some(Policy::SpreadGpu),
            "fgd-sim" | "fgd" => Some(Policy::FgdSim),
            "bestfit-sim" => Some(Policy::BestFitSim),
            _ => None,
        }
    }

    pub(super) fn random_ties(self) -> bool {
        matches!(
            self,
            Policy::FgdSim | Policy::BestFitSim | Policy::Fragmentation
        )
    }
}

impl From<PlacementPolicy> for Policy {
    fn from(p: PlacementPolicy) -> Policy {
        match p {
            PlacementPolicy::Fragmentation => Policy::Fragmentation,
            PlacementPolicy::Binpack => Policy::Binpack,
            PlacementPolicy::SpreadHost => Policy::SpreadHost,
            PlacementPolicy::SpreadGpu => Policy::SpreadGpu,
        }
    }
}

/// What a batch placement did with each task, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchOutcome {
    pub results: Vec<Result<Placement, Box<Rejection>>>,
}

impl BatchOutcome {
    pub fn placed(&self) -> usize {
        self.results.iter().filter(|r| r.is_ok()).count()
    }
}
