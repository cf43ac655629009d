//! A stripe's markers: the second tier of retention, kept beside the table by keyed hash.

use super::reclaim::expiry;
use super::Shard;
use crate::index::key::Key;
use crate::model::machine::{self, Step, View};
use crate::model::marker::{Marker, MarkerEnded, Markers};

/// What [`Shard::forget`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forgot {
    /// The key has no completion past its retention with a marker window left.
    Nothing,
    /// The completion was removed and left this marker.
    Marked(Marker),
    /// Its step could not be queued; nothing changed.
    Refused,
}

impl Shard {
    /// The key's marker, if it has one: found by the key's keyed hash, and taken for this
    /// key's only if the second, independent hash matches too (computed only on a hit).
    pub(crate) fn marker(&self, key: Key<'_>) -> Option<Marker> {
        let m = self.markers.get(key.keyed)?;
        (m.check == self.common.hasher.check(key.bytes)).then_some(*m)
    }

    /// Markers held by this stripe.
    pub(crate) fn markers_len(&self) -> usize {
        self.markers.len()
    }

    /// A claim found `key`'s completion past its retention while markers are on: it is
    /// expired now, as the sweeper would expire it, once `send` has queued the step, and
    /// leaves its marker. Nothing is done if the key has no such completion, or if the
    /// marker's window is over too (the claim then replaces the completion as it would
    /// without markers).
    pub(crate) fn forget(
        &mut self,
        key: Key<'_>,
        now: u64,
        send: &mut dyn FnMut(&Step<()>) -> bool,
    ) -> Forgot {
        let View {
            slot: Some(slot),
            extra,
        } = self.view(key)
        else {
            return Forgot::Nothing;
        };
        let step = expiry(&self.common, extra, key.bytes, &slot, now);
        let Some((step, Some(marker))) = step else {
            return Forgot::Nothing;
        };
        if !send(&step) {
            return Forgot::Refused;
        }
        self.remove(key);
        self.markers.insert(marker);
        self.refresh_due();
        Forgot::Marked(marker)
    }

    /// Drops the marker of `hash` left by the completion `token` (a claim acquires its key).
    pub(crate) fn drop_marker(&mut self, hash: u64, token: u64) {
        if self.markers.remove(hash, token).is_some() {
            self.refresh_due();
        }
    }

    /// The writer committed the row of the marker `hash` left by `token`: a pending marker
    /// takes the row's fingerprint, completion time and attempt (`None`: the record was not
    /// in the file, so no row was written and the marker goes). Returns whether a pending
    /// marker was there.
    pub(crate) fn settle_marker(
        &mut self,
        hash: u64,
        token: u64,
        row: Option<&crate::model::codec::MarkerRecord>,
    ) -> bool {
        let Some(marker) = self.markers.pending_mut(hash, token) else {
            return false;
        };
        match row {
            Some(r) => Markers::settle(marker, r.fingerprint, r.completed_wall_ms, r.attempt),
            None => {
                self.markers.remove(hash, token);
                self.refresh_due();
            }
        }
        true
    }

    /// Recovery loads a marker from the file (or from a completion it found past its
    /// retention). The later of two markers of one hash wins.
    pub(crate) fn load_marker(&mut self, marker: Marker) {
        self.markers.insert(marker);
        self.refresh_due();
    }

    /// Removes this stripe's earliest marker if it has ended by `now`, once `send` has
    /// queued the deletion of its row (the state machine's [`machine::end_marker`]).
    pub(crate) fn end_marker(
        &mut self,
        now: u64,
        send: &mut dyn FnMut(&Step<()>) -> bool,
    ) -> MarkerEnded {
        let durable = self.common.markers.is_some_and(|r| r.durable);
        let out = self.markers.end_head(now, &mut |m| {
            machine::end_marker(m, now, durable).is_some_and(|step| send(&step))
        });
        if out != MarkerEnded::Nothing && out != MarkerEnded::Refused {
            self.refresh_due();
        }
        out
    }
}
