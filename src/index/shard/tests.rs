use super::*;
use crate::base::limits::HASH_SECRET_LEN;
use crate::model::codec::Checkpoint;
use crate::model::marker::MarkerEnded;

const RETENTION: u64 = 1_000;
const GOLDEN_HASH: u64 = 14064908793807524591;
const GOLDEN_CHECK: u64 = 2102196403203803230;

struct Fixture {
    shard: Shard,
    gauges: Arc<Gauges>,
    common: Arc<Common>,
}

/// The change that puts `slot` with `extra`, as the state machine hands it over.
fn put(slot: Slot, extra: Extra) -> Change {
    Change::Put {
        slot,
        extra,
        reap_ns: None,
        adopt: false,
    }
}

fn fixture() -> Fixture {
    fixture_with(None)
}

fn fixture_with(markers: Option<MarkerRules>) -> Fixture {
    let gauges = Arc::new(Gauges::default());
    let board = || -> Box<[AtomicU64]> { vec![AtomicU64::new(u64::MAX)].into() };
    let hasher = KeyHasher::random();
    let common = Arc::new(Common {
        retention_ns: RETENTION,
        hasher: hasher.clone(),
        markers,
        gauges: gauges.clone(),
        lease_due: board(),
        reclaim_due: board(),
        marks: Arc::new(Marks::new()),
        unpublished: vec![AtomicBool::new(false)].into(),
    });
    Fixture {
        shard: Shard::new(&hasher, common.clone(), 0),
        gauges,
        common,
    }
}

impl Fixture {
    /// A new lease, counted live as a claim's reservation would.
    fn claim(&mut self, key: &str, token: u64, deadline: u64) {
        self.gauges.inflight.fetch_add(1, Ordering::AcqRel);
        self.shard.put(
            self.shard.key(key.as_bytes()),
            Slot::inflight(token, deadline, 1),
            Extra::default(),
        );
    }

    /// Completes a lease, with the holder's bookkeeping.
    fn complete(&mut self, key: &str, token: u64, expires: u64) {
        self.shard.put(
            self.shard.key(key.as_bytes()),
            Slot::completed(token, expires, 1, true),
            Extra::default(),
        );
        self.gauges.inflight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Completes a lease with the key's own retention, if any.
    fn complete_kept(&mut self, key: &str, token: u64, expires: u64, own_ms: Option<u64>) {
        self.shard.put(
            self.shard.key(key.as_bytes()),
            Slot::completed(token, expires, 1, true),
            Extra {
                retention_ms: own_ms,
                ..Extra::default()
            },
        );
        self.gauges.inflight.fetch_sub(1, Ordering::AcqRel);
    }

    fn gauges(&self) -> (u64, u64) {
        (
            self.gauges.inflight.load(Ordering::Relaxed),
            self.gauges.abandoned.load(Ordering::Relaxed),
        )
    }

    /// Reclaims everything due at `now`; the tokens removed, in order.
    fn reclaim_all(&mut self, now: u64) -> Vec<(Reclaimed, u64)> {
        let mut out = Vec::new();
        loop {
            let mut sent = 0;
            let r = self.shard.reclaim(now, &mut |step| {
                sent = step.write.as_ref().map_or(0, |w| w.token());
                true
            });
            match r {
                Reclaimed::Nothing => return out,
                Reclaimed::Stale => out.push((r, 0)),
                _ => out.push((r, sent)),
            }
        }
    }

    fn boards(&self) -> (u64, u64) {
        (
            self.common.lease_due[0].load(Ordering::Relaxed),
            self.common.reclaim_due[0].load(Ordering::Relaxed),
        )
    }
}

/// Hashes are persisted (marker rows are keyed by them): for a given secret they must
/// never change, on any platform or version. The values were computed once, and agree
/// with an independent SipHash-1-3 of the same bytes (the length as a little-endian u64,
/// then the key).
#[test]
fn keyed_hashes_are_fixed_by_the_secret() {
    let mut secret = [0u8; HASH_SECRET_LEN];
    for (i, b) in secret.iter_mut().enumerate() {
        *b = i as u8;
    }
    let h = KeyHasher::from_secret(&secret);
    assert_eq!(h.hash(b"order-42"), GOLDEN_HASH);
    assert_eq!(h.check(b"order-42"), GOLDEN_CHECK);
    assert_ne!(
        h.hash(b"order-42"),
        h.check(b"order-42"),
        "independent keys"
    );
    // Length first: a key is not confused with its prefix padded by zeros.
    assert_ne!(h.hash(b"k"), h.hash(b"k\0"));
    let other = KeyHasher::random();
    assert_ne!(
        other.hash(b"order-42"),
        GOLDEN_HASH,
        "another secret, another hash"
    );
}

/// A memory-only stripe keeping markers for 500 ns after a completion's retention.
fn marking() -> Fixture {
    fixture_with(Some(MarkerRules {
        retention: std::time::Duration::from_nanos(500),
        durable: false,
    }))
}

fn complete_with(f: &mut Fixture, key: &str, token: u64, expires: u64, fingerprint: u128) {
    f.claim(key, token, 1);
    let extra = Extra {
        response: Some(Arc::from(&b"r"[..])),
        expires_wall_ms: 77,
        completed_wall_ms: 66,
        ..Extra::default()
    }
    .with_fingerprint(Some(fingerprint));
    f.shard.put(
        f.shard.key(key.as_bytes()),
        Slot::completed(token, expires, 1, true),
        extra,
    );
    f.gauges.inflight.fetch_sub(1, Ordering::AcqRel);
}

#[test]
fn an_expired_completion_leaves_a_marker_that_ends_at_its_instant() {
    let mut f = marking();
    complete_with(&mut f, "k", 1, 10, 9);
    assert_eq!(f.reclaim_all(10), vec![(Reclaimed::Expired, 1)]);
    assert_eq!(f.shard.get(f.shard.key(b"k")), None, "the slot went");
    let m = f.shard.marker(f.shard.key(b"k")).expect("a marker");
    assert_eq!(
        (m.token, m.fingerprint(), m.completed_wall_ms, m.end_ns),
        (1, Some(9), 66, 510)
    );
    assert!(!m.is_pending(), "a memory-only marker is complete at once");
    assert_eq!(f.shard.marker(f.shard.key(b"other")), None);
    assert_eq!(f.boards().1, 510, "the sweeper is told when it ends");
    let mut ended = |now| {
        let mut sent = Vec::new();
        let r = f.shard.end_marker(now, &mut |step| {
            sent.push(step.write.clone());
            true
        });
        (r, sent)
    };
    assert_eq!(ended(509), (MarkerEnded::Nothing, vec![]));
    assert_eq!(
        ended(510),
        (MarkerEnded::Ended, vec![None]),
        "memory only: no row"
    );
    assert_eq!(f.shard.markers_len(), 0);
    assert_eq!(f.boards().1, u64::MAX);
}

#[test]
fn a_claim_forgets_an_expired_completion_only_within_its_marker_window() {
    let mut f = marking();
    complete_with(&mut f, "in", 1, 10, 9);
    complete_with(&mut f, "over", 2, 10, 9);
    let mut sent = 0;
    let forgot = f.shard.forget(f.shard.key(b"in"), 509, &mut |_| {
        sent += 1;
        true
    });
    assert!(matches!(forgot, Forgot::Marked(m) if m.token == 1 && m.end_ns == 510));
    assert_eq!(f.shard.completed, 1);
    // Past the window too: nothing changes, the claim replaces the completion itself.
    let forgot = f.shard.forget(f.shard.key(b"over"), 510, &mut |_| {
        sent += 1;
        true
    });
    assert_eq!(forgot, Forgot::Nothing);
    assert!(f.shard.get(f.shard.key(b"over")).is_some());
    // Refused: nothing changes either.
    complete_with(&mut f, "refused", 3, 10, 9);
    let key = f.shard.key(b"refused");
    assert_eq!(f.shard.forget(key, 11, &mut |_| false), Forgot::Refused);
    assert!(f.shard.get(key).is_some());
    assert_eq!(f.shard.marker(key), None);
    assert_eq!(sent, 1);
}

#[test]
fn a_completed_key_costs_a_48_byte_entry_and_a_16_byte_place_in_line() {
    assert_eq!(std::mem::size_of::<Slot>(), 24);
    // The key's bytes (a fat pointer), the slot, and the pointer to its side data.
    assert_eq!(std::mem::size_of::<Entry>(), 48);
    assert_eq!(std::mem::size_of::<DoneEntry>(), 16);
}

#[test]
fn publish_finds_the_completion_by_keyed_hash_and_token_and_frees_its_side_data() {
    let mut f = fixture();
    let shard = &mut f.shard;
    let done = Extra {
        response: Some(Arc::from(&b"resp"[..])),
        ..Extra::default()
    };
    shard.put(
        shard.key(b"a"),
        Slot::completed(1, 10, 1, false),
        done.clone(),
    );
    shard.put(
        shard.key(b"b"),
        Slot::completed(2, 10, 1, false),
        done.clone(),
    );
    shard.put(shard.key(b"c"), Slot::inflight(3, 10, 1), done.clone());
    let (a, b, c) = (shard.key(b"a"), shard.key(b"b"), shard.key(b"c"));
    // A token the key no longer holds, or a lease's: nothing is published.
    shard.publish(a.keyed, 7, Side::Drop);
    shard.publish(c.keyed, 3, Side::Drop);
    assert!(!shard.get(a).unwrap().is_published());
    assert!(!shard.get(c).unwrap().is_published());
    shard.publish(a.keyed, 1, Side::Drop);
    let slot = shard.get(a).unwrap();
    assert!(slot.is_published());
    assert_eq!(shard.extra(&slot), None, "the file holds it now");
    let other = shard.get(b).unwrap();
    assert!(!other.is_published());
    assert_eq!(shard.extra(&other), Some(&done));
    assert_eq!(shard.heap_bytes, 3 + 2 * boxed_bytes(&done));

    // Published before the file holds it: the side data stays until dropped.
    shard.publish(b.keyed, 2, Side::Keep);
    let kept = shard.get(b).unwrap();
    assert!(kept.is_published());
    assert_eq!(
        shard.extra(&kept),
        Some(&done),
        "replays answer from memory"
    );
    shard.publish(b.keyed, 2, Side::Drop);
    assert_eq!(shard.extra(&shard.get(b).unwrap()), None);
    assert_eq!(shard.heap_bytes, 3 + boxed_bytes(&done));
}

#[test]
fn a_settled_completions_box_is_emptied_and_filled_again_by_the_next_side_data() {
    let mut f = fixture();
    let response: Arc<[u8]> = Arc::from(&b"resp"[..]);
    let shard = &mut f.shard;
    let done = || Extra {
        response: Some(response.clone()),
        ..Extra::default()
    };
    let names: Vec<Vec<u8>> = (0..SPARE_EXTRAS_PER_STRIPE + 2)
        .map(|i| format!("k{i}").into_bytes())
        .collect();
    let keys: Vec<Key<'_>> = names.iter().map(|n| shard.key(n)).collect();
    for (i, &k) in keys.iter().enumerate() {
        let seq = i as u64 + 1;
        shard.apply(k, put(Slot::completed(seq, 10, 1, false), done()), seq);
    }
    let heap_before = shard.heap_bytes;
    let last = keys.len() as u64;
    f.common.marks.raise_applied(last);
    f.common.marks.raise_durable(last);
    shard.catch_up();

    // Settled: every response is freed (the boxes kept hold no reference), the slots
    // have no side data, and the stripe keeps no more boxes than its limit.
    assert_eq!(
        Arc::strong_count(&response),
        1,
        "every response left memory"
    );
    assert_eq!(shard.spare.len(), SPARE_EXTRAS_PER_STRIPE);
    assert!(shard.spare.iter().all(|b| **b == Extra::default()));
    assert!(keys.iter().all(|&k| {
        let slot = shard.get(k).unwrap();
        shard.extra(&slot).is_none()
    }));
    assert_eq!(
        shard.heap_bytes,
        heap_before - keys.len() * boxed_bytes(&done()),
        "the boxes left the slots' count"
    );
    assert!(
        shard.memory_bytes()
            >= shard.heap_bytes + SPARE_EXTRAS_PER_STRIPE * std::mem::size_of::<Extra>(),
        "the kept boxes count in the stripe's memory"
    );

    // The next side data takes a kept box, and holds exactly what it was given.
    let claim = Extra {
        first_claimed_wall_ms: 7,
        ..Extra::default()
    };
    let fresh = shard.key(b"fresh");
    shard.apply(
        fresh,
        put(Slot::inflight(99, 10, 1), claim.clone()),
        last + 1,
    );
    assert_eq!(shard.spare.len(), SPARE_EXTRAS_PER_STRIPE - 1);
    let slot = shard.get(fresh).unwrap();
    assert_eq!(shard.extra(&slot), Some(&claim));
}

#[test]
fn a_queued_completion_is_shown_by_the_durable_watermark_and_settled_by_the_applied_one() {
    let mut f = fixture();
    let done = Extra {
        response: Some(Arc::from(&b"resp"[..])),
        ..Extra::default()
    };
    let complete = |token| put(Slot::completed(token, 10, 1, false), done.clone());
    let shard = &mut f.shard;
    let (a, b) = (shard.key(b"a"), shard.key(b"b"));
    shard.apply(a, complete(1), 4);
    shard.apply(b, complete(2), 6);
    assert_eq!(shard.published_at(a), Some(4));
    assert_eq!(shard.published_at(b), Some(6));
    assert!(f.common.unpublished[0].load(Ordering::Relaxed));
    let marks = &f.common.marks;

    // The commit log synced up to 5: `a` is shown, its response kept for replays.
    marks.raise_durable(5);
    shard.catch_up();
    let slot = shard.get(a).unwrap();
    assert!(slot.is_published());
    assert_eq!(
        shard.extra(&slot),
        Some(&done),
        "the file does not hold it yet"
    );
    assert_eq!(shard.published_at(a), None);
    assert!(!shard.get(b).unwrap().is_published(), "6 is not durable");

    // Applied up to 6 (and so durable): both settle, and nothing is left to publish.
    marks.raise_applied(6);
    marks.raise_durable(6);
    shard.catch_up();
    for k in [a, b] {
        let slot = shard.get(k).unwrap();
        assert!(slot.is_published());
        assert_eq!(shard.extra(&slot), None, "the file holds it now");
    }
    assert_eq!(shard.heap_bytes, 2);
    assert!(!f.common.unpublished[0].load(Ordering::Relaxed));

    // A memory-only completion (nothing queued, 0) or a claim is not queued for
    // publication.
    let c = shard.key(b"c");
    shard.apply(c, put(Slot::inflight(3, 10, 1), Extra::default()), 7);
    shard.apply(shard.key(b"d"), complete(4), 0);
    assert!(!f.common.unpublished[0].load(Ordering::Relaxed));
    assert_eq!(shard.published_at(c), None);

    // A completion whose operation the writer applied before the completion reached
    // its stripe (the writer may have looked for stripes to publish in between) is
    // published by its own call, not left for a lock that may never come.
    let e = shard.key(b"e");
    shard.apply(e, complete(5), 6);
    let slot = shard.get(e).unwrap();
    assert!(slot.is_published());
    assert_eq!(shard.extra(&slot), None);
    assert!(!f.common.unpublished[0].load(Ordering::Relaxed));
}

#[test]
fn side_data_follows_the_token() {
    let mut f = fixture();
    let shard = &mut f.shard;
    let extra = Extra::default().with_fingerprint(Some(1));
    shard.put(shard.key(b"k"), Slot::inflight(1, 10, 1), extra.clone());
    let slot = shard.get(shard.key(b"k")).unwrap();
    assert_eq!(shard.extra(&slot), Some(&extra));
    // Same token, new side data (a completion): the old side data is gone.
    let done = Extra {
        response: Some(Arc::from(&b"resp"[..])),
        ..Extra::default()
    };
    shard.put(
        shard.key(b"k"),
        Slot::completed(1, 10, 1, true),
        done.clone(),
    );
    let slot = shard.get(shard.key(b"k")).unwrap();
    assert_eq!(shard.extra(&slot), Some(&done));
    assert_eq!(shard.heap_bytes, 1 + std::mem::size_of::<Extra>() + 4);
    // A new token replaces the old side data.
    shard.put(shard.key(b"k"), Slot::inflight(2, 10, 2), Extra::default());
    let slot = shard.get(shard.key(b"k")).unwrap();
    assert_eq!(shard.extra(&slot), None);
    assert!(shard.slots.iter().all(|(_, _, side)| side.is_none()));
    assert_eq!(shard.remove(shard.key(b"k")).map(|s| s.token), Some(2));
    assert_eq!(shard.heap_bytes, 0);
    assert_eq!((shard.live, shard.abandoned, shard.completed), (0, 0, 0));
}

#[test]
fn only_completed_slots_expire() {
    assert!(!Slot::inflight(1, 5, 1).is_expired(100));
    assert!(Slot::completed(1, 5, 1, true).is_expired(5));
    assert!(!Slot::completed(1, 5, 1, true).is_expired(4));
}

/// The table rehashes from the tags kept in the slots, without the keys: after many
/// doublings every key is still found under the hash a fresh lookup computes, and every
/// completion is still found by its expiry entry, in deadline order.
#[test]
fn a_growing_table_keeps_finding_every_key_by_its_tag() {
    let mut f = fixture();
    let n = 5_000u64;
    for t in 1..=n {
        let key = format!("key-{t}");
        f.claim(&key, t, 10_000);
        f.complete(&key, t, 2 * t);
    }
    assert!(f.shard.slots.capacity() >= n as usize);
    for t in 1..=n {
        let slot = f.shard.get(f.shard.key(format!("key-{t}").as_bytes()));
        assert_eq!(slot, Some(Slot::completed(t, 2 * t, 1, true)), "key-{t}");
    }
    let removed = f.reclaim_all(n);
    let expected: Vec<_> = (1..=n / 2).map(|t| (Reclaimed::Expired, t)).collect();
    assert_eq!(removed, expected);
    assert_eq!(f.shard.get(f.shard.key(b"key-1")), None);
    assert!(f
        .shard
        .get(f.shard.key(format!("key-{n}").as_bytes()))
        .is_some());
}

#[test]
fn due_prefix_counts_the_due_head_of_any_length() {
    for len in 0..70u64 {
        let done: VecDeque<DoneEntry> = (0..len)
            .map(|i| DoneEntry {
                deadline_ns: i * 2,
                hash: 0,
            })
            .collect();
        for now in 0..(2 * len + 2) {
            let expected = done.iter().filter(|e| e.deadline_ns <= now).count();
            assert_eq!(due_prefix(&done, now), expected, "len {len}, now {now}");
        }
    }
}

#[test]
fn completions_are_reclaimed_earliest_first_and_a_lease_never_is() {
    let mut f = fixture();
    for i in 0..10u64 {
        f.claim(&format!("c{i}"), i + 1, 50);
        f.complete(&format!("c{i}"), i + 1, 91 + i);
    }
    f.claim("lease", 50, 0);
    assert_eq!(f.shard.expired_unswept(95), 5, "deadlines 91..=95");
    assert_eq!(f.boards(), (0, 91));
    let got = f.reclaim_all(95);
    let tokens: Vec<u64> = got.iter().map(|g| g.1).collect();
    assert_eq!(tokens, vec![1, 2, 3, 4, 5]);
    assert!(got.iter().all(|g| g.0 == Reclaimed::Expired));
    assert_eq!(f.shard.expired_unswept(95), 0);
    assert_eq!(f.shard.completed, 5);
    assert_eq!(f.boards(), (0, 96));
    // The lease ended long ago but is only reaped `RETENTION` after its end.
    f.shard.end_leases(95, usize::MAX);
    assert_eq!(f.reclaim_all(RETENTION - 1).len(), 5, "only completions");
    assert!(f.shard.get(f.shard.key(b"lease")).is_some());
    assert_eq!(f.reclaim_all(RETENTION), vec![(Reclaimed::Reaped, 50)]);
    assert!(f.shard.get(f.shard.key(b"lease")).is_none());
    assert_eq!(f.boards(), (u64::MAX, u64::MAX));
}

#[test]
fn a_slot_that_changes_leaves_a_stale_entry_that_is_skipped() {
    let mut f = fixture();
    f.claim("j", 1, 5);
    f.complete("j", 1, 8);
    f.claim("k", 2, 5);
    f.complete("k", 2, 10);
    assert_eq!(f.shard.expired_unswept(10), 2);
    // "k" is claimed again after its retention: its entry in `done` is stale.
    f.claim("k", 3, 500);
    assert_eq!(
        f.shard.expired_unswept(10),
        1,
        "the stale entry is not counted"
    );
    assert_eq!(f.shard.done.len(), 2);
    assert_eq!(
        f.reclaim_all(10),
        vec![(Reclaimed::Expired, 1), (Reclaimed::Stale, 0)]
    );
    assert!(f.shard.done.is_empty());
    assert_eq!(
        f.shard.get(f.shard.key(b"k")).map(|s| s.token),
        Some(3),
        "never removed"
    );
    // An entry at the head is popped at once when its slot changes.
    f.claim("i", 4, 5);
    f.complete("i", 4, 20);
    f.claim("i", 5, 400);
    assert!(f.shard.done.is_empty());
    // A lease that settles while another lease ends first leaves its entry stale below
    // the top: ending leases skips it.
    f.complete("k", 3, 2000);
    assert_eq!(f.shard.leases.len(), 2);
    assert_eq!(f.shard.end_leases(1000, usize::MAX).moved, 1, "only i's");
    assert!(f.shard.leases.is_empty());
    assert!(f.shard.get(f.shard.key(b"i")).unwrap().is_abandoned());
    assert_eq!(
        f.shard.get(f.shard.key(b"k")).map(|s| s.is_inflight()),
        Some(false)
    );
}

#[test]
fn leases_settled_in_order_never_pile_up() {
    let mut f = fixture();
    for i in 0..1000u64 {
        let key = format!("k{i}");
        f.claim(&key, i + 1, 100 + i / 10);
        f.complete(&key, i + 1, 5000);
        assert!(f.shard.leases.is_empty());
    }
}

#[test]
fn out_of_order_completions_wait_in_the_heap_and_leave_in_deadline_order() {
    let mut f = fixture();
    let deadlines = [50u64, 30, 70, 10, 30];
    for (i, deadline) in deadlines.into_iter().enumerate() {
        let key = format!("k{i}");
        f.shard.put(
            f.shard.key(key.as_bytes()),
            Slot::completed(i as u64 + 1, deadline, 1, true),
            Extra::default(),
        );
    }
    // 50 and 70 arrived in order; 30, 10 and 30 would have broken it.
    assert_eq!((f.shard.done.len(), f.shard.kept.len()), (2, 3));
    assert_eq!(
        f.boards().1,
        10,
        "the board is the earlier of the two heads"
    );
    let got: Vec<u64> = f
        .reclaim_all(100)
        .iter()
        .map(|g| deadlines[g.1 as usize - 1])
        .collect();
    assert_eq!(got, vec![10, 30, 30, 50, 70]);
    assert_eq!(f.boards().1, u64::MAX);
}

/// Per-key retention: a completion kept longer than the engine's retention waits in the
/// heap, so the completions of the engine's retention made after it still append to the
/// deque; removal follows deadlines across both, never before one.
#[test]
fn a_key_kept_longer_than_the_engine_never_holds_back_the_deque() {
    let mut f = fixture();
    let ms = 1_000_000;
    // Completed at 0 and kept 2 ms; the engine keeps keys 1,000 ns.
    f.claim("long", 1, 0);
    f.complete_kept("long", 1, 2 * ms, Some(2));
    f.claim("short", 2, 0);
    // A retention of its own no longer than the engine's, in order: the deque.
    f.complete_kept("short", 2, 500, Some(0));
    for i in 0..100u64 {
        let key = format!("d{i}");
        f.claim(&key, 10 + i, i * 10);
        f.complete(&key, 10 + i, i * 10 + RETENTION);
    }
    assert_eq!(f.shard.kept.len(), 1, "only the long one");
    assert_eq!(f.shard.done.len(), 101);
    assert_eq!(f.boards().1, 500);
    assert_eq!(f.shard.expired_unswept(2 * ms - 1), 101);
    let got = f.reclaim_all(2 * ms - 1);
    assert_eq!(got.len(), 101);
    assert!(got.iter().all(|g| g.0 == Reclaimed::Expired && g.1 != 1));
    assert_eq!(f.boards().1, 2 * ms, "only the long one is left");
    assert_eq!(f.shard.expired_unswept(2 * ms - 1), 0);
    assert_eq!(f.reclaim_all(2 * ms), vec![(Reclaimed::Expired, 1)]);
    assert_eq!(f.shard.completed, 0);
}

#[test]
fn an_abandoned_lease_is_reaped_by_its_own_retention() {
    let mut f = fixture();
    let ms = 1_000_000;
    f.gauges.inflight.fetch_add(1, Ordering::AcqRel);
    f.shard.put(
        f.shard.key(b"own"),
        Slot::inflight(1, 10, 1),
        Extra {
            retention_ms: Some(3),
            ..Extra::default()
        },
    );
    f.claim("engine", 2, 10);
    f.shard.end_leases(10, usize::MAX);
    assert_eq!(f.boards().1, 10 + RETENTION);
    assert_eq!(f.reclaim_all(10 + RETENTION), vec![(Reclaimed::Reaped, 2)]);
    assert_eq!(f.boards().1, 10 + 3 * ms);
    assert_eq!(f.reclaim_all(10 + 3 * ms - 1), vec![]);
    assert_eq!(f.reclaim_all(10 + 3 * ms), vec![(Reclaimed::Reaped, 1)]);
}

/// An extension leaves the lease's old entry behind when it is not on top of the heap;
/// that entry must not match the slot (it compares the deadline, not the token alone),
/// or the sweep would end the lease at its old deadline while its holder still holds it.
fn extended_lease_check() -> Result<(), String> {
    let mut f = fixture();
    // "a" ends first, so the entry of "b" is below the top when "b" is extended.
    f.claim("a", 1, 5);
    f.claim("b", 2, 10);
    f.shard.put(
        f.shard.key(b"b"),
        Slot::inflight(2, 50, 1),
        Extra::default(),
    );
    if f.shard.leases.len() != 3 {
        return Err("the old entry of b was not left behind".into());
    }
    let ended = f.shard.end_leases(20, usize::MAX).moved;
    let b = f.shard.get(f.shard.key(b"b")).ok_or("b is gone")?;
    if ended != 1 || b.is_abandoned() || f.gauges() != (1, 1) {
        return Err(format!(
            "b (extended from 10 to 50) was ended at 20 by its old entry: {ended} leases \
             ended, b abandoned: {}, gauges (inflight, abandoned) {:?}",
            b.is_abandoned(),
            f.gauges()
        ));
    }
    if f.shard.end_leases(49, usize::MAX).moved != 0
        || f.shard.end_leases(50, usize::MAX).moved != 1
        || f.gauges() != (0, 2)
    {
        return Err("b did not end at its new deadline".into());
    }
    Ok(())
}

#[test]
fn an_extended_lease_is_not_ended_at_its_old_deadline() {
    extended_lease_check().unwrap_or_else(|e| panic!("{e}"));
}

/// Teeth: the check catches lease entries that match their slot by token alone.
#[cfg(idemkv_sabotage)]
#[test]
fn teeth_extended_lease_check_catches_token_only_entries() {
    crate::base::sabotage::TOKEN_ONLY_LEASE_ENTRIES.with(|on| on.set(true));
    let caught = extended_lease_check();
    crate::base::sabotage::TOKEN_ONLY_LEASE_ENTRIES.with(|on| on.set(false));
    assert!(caught.is_err(), "token-only lease entries were not caught");
}

/// Lazy deletion in the heap: a completion that leaves pops its entry if it is on top,
/// and otherwise leaves it stale, to be dropped when it comes up or by a compaction that
/// keeps the heap within twice its keys plus the slack.
#[test]
fn stale_entries_of_the_heap_are_skipped_and_compacted() {
    let mut f = fixture();
    let ms = 1_000_000;
    f.claim("a", 1, 0);
    f.complete_kept("a", 1, 5 * ms, Some(5));
    f.claim("b", 2, 0);
    f.complete_kept("b", 2, 9 * ms, Some(9));
    // "b" is claimed again after its retention: its entry, below the top, goes stale.
    f.claim("b", 3, 20 * ms);
    assert_eq!(f.shard.kept.len(), 2);
    assert_eq!(
        f.shard.expired_unswept(20 * ms),
        1,
        "the stale entry is not counted"
    );
    assert_eq!(
        f.reclaim_all(20 * ms),
        vec![(Reclaimed::Expired, 1), (Reclaimed::Stale, 0)]
    );
    assert_eq!(f.shard.kept.len(), 0);
    // An entry on top is popped at once when its slot leaves.
    f.complete_kept("b", 3, 30 * ms, Some(10));
    f.claim("b", 4, 30 * ms);
    assert_eq!(f.shard.kept.len(), 0);
    // Keys completed again and again after their retention without a sweep: one stale
    // entry per key and round, far more than the 100 keys; the heap stays bounded.
    let mut f = fixture();
    let mut token = 0;
    for round in 0..60u64 {
        let now = round * 10 * ms;
        for i in 0..100u64 {
            let key = format!("k{i}");
            token += 1;
            f.claim(&key, token, now);
            // Kept 10 ms, minus a little per key: out of order, so in the heap.
            f.complete_kept(&key, token, now + 10 * ms - i, Some(10));
            let total = f.shard.done.len() + f.shard.kept.len();
            assert!(total <= 2 * 100 + EXPIRY_COMPACT_SLACK + 1, "{total}");
        }
    }
    assert_eq!(f.shard.completed, 100);
    assert_eq!(f.shard.expired_unswept(u64::MAX), 100);
    let removed = f.reclaim_all(u64::MAX);
    let expired = removed.iter().filter(|g| g.0 == Reclaimed::Expired).count();
    assert_eq!(expired, 100);
    assert_eq!(f.shard.completed, 0);
    assert_eq!(f.boards().1, u64::MAX);
}

/// The heap against a sorted list: every push, pop, count of the due entries and
/// compaction, on pseudo-random deadlines with many ties.
#[test]
fn the_heap_pops_earliest_first_and_counts_what_is_due() {
    let mut heap = DueHeap::default();
    let mut model: Vec<u64> = Vec::new();
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for step in 0..5_000u64 {
        let r = next();
        match r % 4 {
            0 | 1 => {
                let d = next() % 500;
                heap.push(DoneEntry {
                    deadline_ns: d,
                    hash: step,
                });
                model.push(d);
            }
            2 => {
                model.sort_unstable();
                let expected = (!model.is_empty()).then(|| model.remove(0));
                assert_eq!(heap.pop().map(|e| e.deadline_ns), expected);
            }
            _ => {
                let now = next() % 600;
                let due = model.iter().filter(|&&d| d <= now).count();
                assert_eq!(heap.count_due(now), due, "now {now}");
            }
        }
        if step % 1000 == 999 {
            // Compaction keeps what it is told to, in heap order.
            heap.retain(|e| e.hash % 3 != 0);
            model = heap.entries().iter().map(|e| e.deadline_ns).collect();
        }
        assert_eq!(
            heap.peek().map(|e| e.deadline_ns),
            model.iter().min().copied()
        );
    }
}

/// After a restart, completions due after `now + retention` (a key's own longer
/// retention) wait in the heap, so new completions still find the deque in order.
#[test]
fn recovery_moves_what_outlives_the_engine_retention_to_the_heap() {
    let mut f = fixture();
    f.shard.begin_load();
    for (i, deadline) in [5_000u64, 300, 2_000, 100].into_iter().enumerate() {
        let key = format!("k{i}");
        f.shard.put(
            f.shard.key(key.as_bytes()),
            Slot::completed(i as u64 + 1, deadline, 1, true),
            Extra::default(),
        );
    }
    f.shard.finish_load(500);
    let fifo: Vec<u64> = f.shard.done.iter().map(|e| e.deadline_ns).collect();
    assert_eq!(fifo, vec![100, 300]);
    assert_eq!(f.shard.kept.len(), 2);
    // A completion of the engine's retention made at the reopen goes to the deque.
    f.claim("new", 10, 500);
    f.complete("new", 10, 500 + RETENTION);
    assert_eq!(f.shard.done.len(), 3);
    let got: Vec<u64> = f.reclaim_all(u64::MAX).iter().map(|g| g.1).collect();
    assert_eq!(got, vec![4, 2, 10, 3, 1]);
}

#[test]
fn recovery_sorts_once_and_drops_what_deduplication_left() {
    let mut f = fixture();
    f.shard.begin_load();
    for (i, deadline) in [9u64, 3, 7, 1, 5].into_iter().enumerate() {
        let key = format!("k{i}");
        f.shard.put(
            f.shard.key(key.as_bytes()),
            Slot::completed(i as u64 + 1, deadline, 1, true),
            Extra::default(),
        );
    }
    // A newer record of k0 replaces the older one before its deadline.
    f.shard.put(
        f.shard.key(b"k0"),
        Slot::completed(9, 4, 1, true),
        Extra::default(),
    );
    f.shard.finish_load(0);
    assert_eq!(f.shard.done.len(), 5, "the replaced entry is gone");
    let deadlines: Vec<u64> = f.shard.done.iter().map(|e| e.deadline_ns).collect();
    assert_eq!(deadlines, vec![1, 3, 4, 5, 7]);
    assert_eq!(f.shard.expired_unswept(4), 3);
    assert_eq!(f.boards().1, 1);
}

#[test]
fn stale_entries_are_compacted_when_they_dominate() {
    let mut f = fixture();
    // A lease that ends first and stays: every lease completed behind it leaves a stale
    // entry that trimming cannot reach.
    f.claim("blocker", 100_000, 10);
    for i in 0..10_000u64 {
        let key = format!("k{i}");
        f.claim(&key, i + 1, 1_000_000);
        f.complete(&key, i + 1, 2_000_000 + i);
        assert!(f.shard.leases.len() <= 2 * f.shard.live + EXPIRY_COMPACT_SLACK + 1);
    }
    assert!(f.shard.leases.len() <= 2 + EXPIRY_COMPACT_SLACK + 1);
    assert!(
        f.shard.leases.len() > 2,
        "trimming alone cannot get past the blocker"
    );
    // Completions re-claimed after their retention without a sweep: each round leaves
    // a stale entry per key in `done`, far more than the 100 current ones.
    let mut f = fixture();
    for i in 0..100u64 {
        let key = format!("k{i}");
        f.claim(&key, i + 1, 0);
        f.complete(&key, i + 1, 10);
    }
    let mut token = 1000;
    for round in 0..100u64 {
        let now = 10 + round * 10;
        for i in 0..100u64 {
            let key = format!("k{i}");
            assert!(f
                .shard
                .get(f.shard.key(key.as_bytes()))
                .unwrap()
                .is_expired(now));
            token += 1;
            f.claim(&key, token, now);
            f.complete(&key, token, now + 10);
            assert!(f.shard.done.len() <= 2 * 100 + EXPIRY_COMPACT_SLACK + 1);
        }
    }
    // Without compaction `done` would now hold 10,100 entries.
    assert_eq!(f.shard.completed, 100);
    // Order and counts survive compaction.
    let d: Vec<u64> = f.shard.done.iter().map(|e| e.deadline_ns).collect();
    assert!(d.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(f.shard.expired_unswept(u64::MAX), 100);
    let removed = f.reclaim_all(u64::MAX);
    assert_eq!(
        removed.iter().filter(|g| g.0 == Reclaimed::Expired).count(),
        100
    );
    assert_eq!(f.shard.completed, 0);
}

#[test]
fn an_ended_lease_leaves_the_live_count_and_is_reaped_at_end_plus_retention() {
    let mut f = fixture();
    f.claim("a", 1, 10);
    f.claim("b", 2, 20);
    assert_eq!(f.boards(), (10, u64::MAX));
    assert_eq!(f.shard.end_leases(9, usize::MAX).moved, 0);
    let ended = f.shard.end_leases(10, usize::MAX);
    assert_eq!((ended.moved, ended.more), (1, false));
    assert!(f.shard.get(f.shard.key(b"a")).unwrap().is_abandoned());
    assert_eq!(f.gauges(), (1, 1));
    assert_eq!(f.boards(), (20, 10 + RETENTION));
    // A budget of one entry leaves the rest for later.
    f.claim("c", 3, 15);
    let ended = f.shard.end_leases(30, 1);
    assert_eq!((ended.moved, ended.more), (1, true));
    assert_eq!(f.shard.end_leases(30, usize::MAX).moved, 1);
    assert_eq!(f.gauges(), (0, 3));
    assert_eq!(f.reclaim_all(10 + RETENTION - 1), vec![]);
    assert_eq!(f.reclaim_all(10 + RETENTION), vec![(Reclaimed::Reaped, 1)]);
    assert_eq!(f.gauges(), (0, 2));
    assert!(f.shard.get(f.shard.key(b"a")).is_none());
    assert_eq!((f.shard.live, f.shard.abandoned), (0, 2));
}

#[test]
fn an_abandoned_lease_settled_by_its_holder_counts_as_live_for_its_bookkeeping() {
    let mut f = fixture();
    f.claim("a", 1, 10);
    f.shard.end_leases(10, usize::MAX);
    assert_eq!(f.gauges(), (0, 1));
    // A checkpoint keeps it abandoned (same lease).
    let slot = f.shard.get(f.shard.key(b"a")).unwrap();
    let extra = Extra::default().with_checkpoint(Some(Checkpoint::new(1, b"half")));
    f.shard.put(f.shard.key(b"a"), slot, extra);
    assert!(f.shard.get(f.shard.key(b"a")).unwrap().is_abandoned());
    assert_eq!(f.gauges(), (0, 1));
    // An extend revives it: counted live, its reap entry stale.
    let mut slot = f.shard.get(f.shard.key(b"a")).unwrap();
    slot.deadline_ns = 50;
    f.shard.put(f.shard.key(b"a"), slot, Extra::default());
    assert!(!f.shard.get(f.shard.key(b"a")).unwrap().is_abandoned());
    assert_eq!(f.gauges(), (1, 0));
    assert!(f.shard.ended.is_empty(), "its entry, on top, went with it");
    assert_eq!(f.reclaim_all(10 + RETENTION), vec![]);
    assert!(f.shard.get(f.shard.key(b"a")).is_some());
    // Ended again, then completed: the holder's decrement balances the revival.
    f.shard.end_leases(50, usize::MAX);
    assert_eq!(f.gauges(), (0, 1));
    f.complete("a", 1, 5000);
    assert_eq!(f.gauges(), (0, 0));
    assert_eq!(
        (f.shard.live, f.shard.abandoned, f.shard.completed),
        (0, 0, 1)
    );
    // Released after ending: the same.
    f.claim("b", 2, 60);
    f.shard.end_leases(60, usize::MAX);
    f.shard.remove(f.shard.key(b"b"));
    f.gauges.inflight.fetch_sub(1, Ordering::AcqRel);
    assert_eq!(f.gauges(), (0, 0));
}

#[test]
fn a_takeover_adopts_an_abandoned_lease_without_counting_it_twice() {
    let mut f = fixture();
    f.claim("a", 1, 10);
    f.shard.end_leases(10, usize::MAX);
    assert_eq!(f.gauges(), (0, 1));
    // The claim reserves its place, adopts the slot, and replaces it.
    f.gauges.inflight.fetch_add(1, Ordering::AcqRel);
    f.shard.adopt(f.shard.key(b"a"));
    f.shard.put(
        f.shard.key(b"a"),
        Slot::inflight(2, 100, 2),
        Extra::default(),
    );
    assert_eq!(f.gauges(), (1, 0));
    assert_eq!((f.shard.live, f.shard.abandoned), (1, 0));
    // The old reap entry is stale; the new lease ends at 100.
    assert_eq!(f.reclaim_all(10 + RETENTION), vec![(Reclaimed::Stale, 0)]);
    assert_eq!(f.shard.end_leases(100, usize::MAX).moved, 1);
    assert_eq!(f.gauges(), (0, 1));
}

#[test]
fn a_recovered_lease_is_reaped_at_the_instant_it_was_given() {
    let mut f = fixture();
    f.gauges.inflight.fetch_add(1, Ordering::AcqRel);
    f.shard.put_reaped_at(
        f.shard.key(b"r"),
        Slot::inflight(7, 0, 1),
        Extra::default(),
        5,
    );
    f.shard.end_leases(0, usize::MAX);
    assert_eq!(f.reclaim_all(4), vec![]);
    assert_eq!(f.reclaim_all(5), vec![(Reclaimed::Reaped, 7)]);
}

#[test]
fn a_slot_that_keeps_its_place_takes_the_reap_instant_it_is_given() {
    // Abandoned: the entry in `ended` moves from 50 to 20.
    let mut f = fixture();
    f.gauges.inflight.fetch_add(1, Ordering::AcqRel);
    let slot = Slot::inflight(7, 0, 1);
    f.shard
        .put_reaped_at(f.shard.key(b"r"), slot, Extra::default(), 50);
    f.shard.end_leases(0, usize::MAX);
    f.shard
        .put_reaped_at(f.shard.key(b"r"), slot, Extra::default(), 20);
    assert_eq!(f.reclaim_all(19), vec![]);
    assert_eq!(f.reclaim_all(20), vec![(Reclaimed::Reaped, 7)]);

    // Live: the entry in `leases` carries the new instant into `ended` when it ends.
    let mut f = fixture();
    f.gauges.inflight.fetch_add(1, Ordering::AcqRel);
    let slot = Slot::inflight(8, 10, 1);
    f.shard
        .put_reaped_at(f.shard.key(b"s"), slot, Extra::default(), 90);
    f.shard
        .put_reaped_at(f.shard.key(b"s"), slot, Extra::default(), 40);
    f.shard.end_leases(10, usize::MAX);
    assert_eq!(f.reclaim_all(39), vec![]);
    assert_eq!(f.reclaim_all(40), vec![(Reclaimed::Reaped, 8)]);
}

#[test]
fn a_refused_deletion_changes_nothing() {
    let mut f = fixture();
    f.claim("k", 1, 5);
    f.complete("k", 1, 10);
    assert_eq!(f.shard.reclaim(10, &mut |_| false), Reclaimed::Refused);
    assert!(f.shard.get(f.shard.key(b"k")).is_some());
    assert_eq!(f.shard.expired_unswept(10), 1);
    assert_eq!(f.reclaim_all(10), vec![(Reclaimed::Expired, 1)]);
}
