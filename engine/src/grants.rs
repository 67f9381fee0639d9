//! The engine's grants: a slab of entries addressed by a slot number, and a map from container
//! id to slot. The shared-grant index names its members by slot, so refreshing a hundred
//! shared cpusets after an exclusive create goes straight to each grant (no hash of the id, no
//! compare of the key per update).

use crate::grant::Grant;
use crate::types::IdHasher;
use std::collections::HashMap;
use std::sync::Arc;

/// A grant's place in [`Grants`]: stable while the grant is held; reused after it goes.
pub(crate) type Slot = u32;

#[derive(Debug, Clone, Default)]
pub struct Grants {
    slots: Vec<Option<Entry>>,
    /// Slots of removed grants, taken again first.
    free: Vec<Slot>,
    /// Each grant's slot. Iterating the grants goes through this map, so they come in the order
    /// a map of the grants themselves would give (the same keys, inserted and removed alike).
    at: HashMap<Arc<str>, Slot, IdHasher>,
}

#[derive(Debug, Clone)]
struct Entry {
    id: Arc<str>,
    grant: Grant,
}

impl Grants {
    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.at.contains_key(id)
    }

    pub fn get(&self, id: &str) -> Option<&Grant> {
        let slot = *self.at.get(id)?;
        self.at_slot(slot).map(|(_, g)| g)
    }

    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut Grant> {
        let slot = *self.at.get(id)?;
        self.slot_mut(slot).map(|(_, g)| g)
    }

    /// The id and grant in `slot`.
    pub(crate) fn at_slot(&self, slot: Slot) -> Option<(&Arc<str>, &Grant)> {
        let e = self.slots.get(slot as usize)?.as_ref()?;
        Some((&e.id, &e.grant))
    }

    /// The id and grant in `slot`, the grant writable.
    pub(crate) fn slot_mut(&mut self, slot: Slot) -> Option<(&Arc<str>, &mut Grant)> {
        let e = self.slots.get_mut(slot as usize)?.as_mut()?;
        Some((&e.id, &mut e.grant))
    }

    /// Adds a grant, or replaces the one `id` has (keeping its slot). Returns the slot.
    pub(crate) fn insert(&mut self, id: Arc<str>, grant: Grant) -> Slot {
        if let Some(&slot) = self.at.get(&*id) {
            if let Some(Some(e)) = self.slots.get_mut(slot as usize) {
                e.grant = grant;
                return slot;
            }
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                // More than 4 billion grants is no node's case: saturate rather than wrap.
                Slot::try_from(self.slots.len() - 1).unwrap_or(Slot::MAX)
            }
        };
        // The entry is written in its place (a grant is about 700 bytes: not built aside and
        // copied).
        if let Some(place) = self.slots.get_mut(slot as usize) {
            *place = Some(Entry {
                id: Arc::clone(&id),
                grant,
            });
        }
        self.at.insert(id, slot);
        slot
    }

    /// Removes the grant of `id`, returning its slot and the grant.
    pub(crate) fn remove(&mut self, id: &str) -> Option<(Slot, Grant)> {
        let slot = self.at.remove(id)?;
        let place = self.slots.get_mut(slot as usize)?;
        // Copied once, straight out of its place (taking the whole entry first copied it
        // twice), then the place emptied.
        let grant = place.as_ref()?.grant.clone();
        *place = None;
        self.free.push(slot);
        Some((slot, grant))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Grant)> {
        self.at.values().filter_map(|&slot| self.at_slot(slot))
    }

    pub fn values(&self) -> impl Iterator<Item = &Grant> {
        self.iter().map(|(_, g)| g)
    }
}

/// Two sets of grants are equal when they give the same ids the same grants, whatever the
/// slots.
impl PartialEq for Grants {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().all(|(id, g)| other.get(id) == Some(g))
    }
}

impl Eq for Grants {}
