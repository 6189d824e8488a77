//! The one cache type of the control plane: a map with a bound on its entries (the oldest
//! insertion goes first) and, optionally, an age past which an entry is not returned.
//! Every cache in `Control` is one of these, so each evicts the same way and none grows
//! without bound.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A bounded map shared between tasks. Values are cloned out (use `Arc` for large ones).
pub(crate) struct Cache<K, V> {
    inner: Mutex<Inner<K, V>>,
    capacity: usize,
    max_age: Option<Duration>,
}

struct Inner<K, V> {
    entries: HashMap<K, (V, Instant)>,
    /// Keys in the order they were inserted; a key inserted again is found again later
    /// (entries whose insertion time does not match are skipped when evicting).
    order: VecDeque<(K, Instant)>,
}

impl<K: Eq + Hash + Clone, V> Cache<K, V> {
    /// At most `capacity` entries, kept until evicted.
    pub(crate) fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "a cache holds at least one entry");
        Cache {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                order: VecDeque::new(),
            }),
            capacity,
            max_age: None,
        }
    }

    /// At most `capacity` entries, none returned once older than `max_age`.
    pub(crate) fn with_max_age(capacity: usize, max_age: Duration) -> Self {
        Cache {
            max_age: Some(max_age),
            ..Cache::new(capacity)
        }
    }

    fn fresh(&self, at: Instant) -> bool {
        self.max_age.is_none_or(|age| at.elapsed() < age)
    }
}

impl<K: Eq + Hash + Clone, V: Clone> Cache<K, V> {
    /// The value of `key`, if cached and not too old.
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        let inner = self.inner.lock();
        inner
            .entries
            .get(key)
            .filter(|(_, at)| self.fresh(*at))
            .map(|(v, _)| v.clone())
    }

    /// The cached values of `keys`, and the keys that were not cached (each once).
    pub(crate) fn get_many(&self, keys: impl IntoIterator<Item = K>) -> (HashMap<K, V>, Vec<K>) {
        let inner = self.inner.lock();
        let mut found = HashMap::new();
        let mut missing = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for k in keys {
            if !seen.insert(k.clone()) {
                continue;
            }
            match inner.entries.get(&k).filter(|(_, at)| self.fresh(*at)) {
                Some((v, _)) => {
                    found.insert(k, v.clone());
                }
                None => missing.push(k),
            }
        }
        (found, missing)
    }
}

impl<K: Eq + Hash + Clone, V> Cache<K, V> {
    /// Removes `key` and returns its value (to change it and insert it again).
    pub(crate) fn take(&self, key: &K) -> Option<V> {
        let mut inner = self.inner.lock();
        let (v, at) = inner.entries.remove(key)?;
        self.fresh(at).then_some(v)
    }

    /// Caches `value` for `key`, evicting the oldest entries past the bound.
    pub(crate) fn insert(&self, key: K, value: V) {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        inner.entries.insert(key.clone(), (value, now));
        inner.order.push_back((key, now));
        while inner.entries.len() > self.capacity {
            let Some((oldest, at)) = inner.order.pop_front() else {
                break;
            };
            // Only the key's latest insertion evicts it.
            if inner.entries.get(&oldest).is_some_and(|(_, t)| *t == at) {
                inner.entries.remove(&oldest);
            }
        }
        // Stale order entries (keys inserted again or taken) are dropped once they pile up.
        if inner.order.len() > 2 * self.capacity {
            let Inner { entries, order } = &mut *inner;
            order.retain(|(k, at)| entries.get(k).is_some_and(|(_, t)| t == at));
        }
    }

    /// Forgets every entry (what they said may no longer hold).
    pub(crate) fn clear(&self) {
        let mut inner = self.inner.lock();
        inner.entries.clear();
        inner.order.clear();
    }

    /// How many entries are held (fresh or not).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_insertion_is_evicted_past_the_bound() {
        let c = Cache::new(3);
        for i in 0..5 {
            c.insert(i, i * 10);
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&0), None);
        assert_eq!(c.get(&1), None);
        assert_eq!(c.get(&4), Some(40));
        // Inserting a key again makes it the newest.
        c.insert(2, 21);
        c.insert(5, 50);
        assert_eq!(c.get(&2), Some(21));
        assert_eq!(c.get(&3), None);
    }

    #[test]
    fn many_reinsertions_keep_the_order_queue_bounded() {
        let c = Cache::new(4);
        for i in 0..10_000 {
            c.insert(i % 2, i);
        }
        assert!(c.inner.lock().order.len() <= 8);
        assert_eq!(c.get(&1), Some(9_999));
    }

    #[test]
    fn an_entry_past_its_age_is_not_returned() {
        let c = Cache::with_max_age(2, Duration::from_millis(20));
        c.insert("a", 1);
        assert_eq!(c.get(&"a"), Some(1));
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(c.get(&"a"), None);
        assert_eq!(c.take(&"a"), None);
    }

    #[test]
    fn get_many_splits_cached_from_missing_once_each() {
        let c = Cache::new(8);
        c.insert(1, "one");
        let (found, missing) = c.get_many([1, 2, 2, 3, 1]);
        assert_eq!(found, HashMap::from([(1, "one")]));
        assert_eq!(missing, [2, 3]);
    }
}
