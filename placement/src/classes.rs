//! Hosts grouped by state. Hosts whose free CPU, free memory and GPU free shares are equal
//! are interchangeable for scoring, so a policy scores each distinct state once, and a
//! score stays valid until that state's last host changes.

use crate::snapshot::{HostIdx, Snapshot};
use std::collections::HashMap;
use tessera_model::{MiB, MilliCpu};

/// A host state: everything a score may depend on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ClassKey {
    pub cpu_free: MilliCpu,
    pub mem_free: MiB,
    /// (GPU kind, free share in thousandths), sorted.
    pub gpus: Box<[(u16, u16)]>,
}

impl ClassKey {
    pub fn of(snap: &Snapshot, h: HostIdx) -> ClassKey {
        let host = &snap.hosts[h as usize];
        let mut gpus: Vec<(u16, u16)> = snap
            .host_gpus(h)
            .map(|g| (snap.gpus[g].model, snap.gpus[g].free_share()))
            .collect();
        gpus.sort_unstable();
        ClassKey {
            cpu_free: host.cpu_free,
            mem_free: host.mem_free,
            gpus: gpus.into_boxed_slice(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Class {
    pub key: ClassKey,
    /// Hosts in this state, ascending, so ties can go to the lowest index.
    pub members: Vec<HostIdx>,
    /// Bumped whenever the slot is reused, so cached scores of an old state are ignored.
    pub generation: u32,
    nonempty_pos: usize,
}

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Default)]
pub(crate) struct Classes {
    pub slots: Vec<Class>,
    free_slots: Vec<u32>,
    by_key: HashMap<ClassKey, u32>,
    /// Slots with at least one member: what a placement scans.
    pub nonempty: Vec<u32>,
    host_class: Vec<u32>,
}

impl Classes {
    pub fn build(snap: &Snapshot) -> Classes {
        let mut classes = Classes {
            host_class: vec![NONE; snap.hosts.len()],
            ..Classes::default()
        };
        for h in 0..snap.hosts.len() as HostIdx {
            classes.refresh(snap, h);
        }
        classes
    }

    /// Moves host `h` to the class of its current state (or out, if it is not active).
    pub fn refresh(&mut self, snap: &Snapshot, h: HostIdx) {
        let old = self.host_class[h as usize];
        if old != NONE {
            self.remove_member(old, h);
        }
        if !snap.hosts[h as usize].active {
            self.host_class[h as usize] = NONE;
            return;
        }
        let key = ClassKey::of(snap, h);
        let slot = match self.by_key.get(&key) {
            Some(&slot) => slot,
            None => self.new_slot(key),
        };
        let class = &mut self.slots[slot as usize];
        let at = class.members.binary_search(&h).unwrap_or_else(|i| i);
        class.members.insert(at, h);
        if class.members.len() == 1 {
            class.nonempty_pos = self.nonempty.len();
            self.nonempty.push(slot);
        }
        self.host_class[h as usize] = slot;
    }

    fn new_slot(&mut self, key: ClassKey) -> u32 {
        let slot = if let Some(slot) = self.free_slots.pop() {
            let class = &mut self.slots[slot as usize];
            class.key = key.clone();
            class.generation += 1;
            slot
        } else {
            self.slots.push(Class {
                key: key.clone(),
                members: Vec::new(),
                generation: 0,
                nonempty_pos: 0,
            });
            (self.slots.len() - 1) as u32
        };
        self.by_key.insert(key, slot);
        slot
    }

    fn remove_member(&mut self, slot: u32, h: HostIdx) {
        let class = &mut self.slots[slot as usize];
        if let Ok(at) = class.members.binary_search(&h) {
            class.members.remove(at);
        }
        if class.members.is_empty() {
            let pos = class.nonempty_pos;
            self.nonempty.swap_remove(pos);
            if let Some(&moved) = self.nonempty.get(pos) {
                self.slots[moved as usize].nonempty_pos = pos;
            }
            let key = self.slots[slot as usize].key.clone();
            self.by_key.remove(&key);
            self.free_slots.push(slot);
        }
    }
}
