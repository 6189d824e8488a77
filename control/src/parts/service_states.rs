//! What the passes last said of each service (why its tasks wait, its last failure, its
//! crash-loop backoff, its rollout's progress, whether it is steady), so that an event is
//! written when one of them changes rather than on every pass. The scheduler says why tasks
//! wait; the deployments component says the rest.

use parking_lot::Mutex;
use std::collections::HashMap;

/// What the reconcile passes last reported of one service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServiceState {
    /// Why its pending tasks could not be placed.
    pub pending: Option<String>,
    /// Why the last pass could not reconcile it.
    pub failure: Option<String>,
    /// Failures of the primary deployment already answered with a restart delay.
    pub backoff: Option<u32>,
    /// During a rollout: (deployment, its running tasks) as last reported.
    pub progress: Option<(i64, usize)>,
    /// Every desired task runs the primary revision.
    pub steady: bool,
}

/// Each service's last state, behind one lock that does not poison.
#[derive(Default)]
pub(crate) struct ServiceStates {
    states: Mutex<HashMap<String, ServiceState>>,
}

impl ServiceStates {
    /// Changes what is remembered of service `name` with `change`; true when that changed
    /// anything (then it is news worth an event).
    pub(crate) fn changed(&self, name: &str, change: impl FnOnce(&mut ServiceState)) -> bool {
        let mut states = self.states.lock();
        let state = states.entry(name.to_owned()).or_default();
        let before = state.clone();
        change(state);
        *state != before
    }

    /// Whether service `name`'s last state passes `test` (false when none is remembered).
    pub(crate) fn is(&self, name: &str, test: impl FnOnce(&ServiceState) -> bool) -> bool {
        self.states.lock().get(name).is_some_and(test)
    }

    /// Forgets a deleted service.
    pub(crate) fn forget(&self, name: &str) {
        self.states.lock().remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_news_once() {
        let states = ServiceStates::default();
        assert!(states.changed("a", |s| s.pending = Some("no room".into())));
        assert!(!states.changed("a", |s| s.pending = Some("no room".into())));
        assert!(states.is("a", |s| s.pending.is_some()));
        assert!(!states.is("b", |_| true), "nothing remembered of b");
        states.forget("a");
        assert!(!states.is("a", |_| true));
    }
}
