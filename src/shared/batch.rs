//! A process's claims go to the database as a group commit: at most
//! `PostgresConfig::batch_lanes` claim statements are in flight (one by default), and the
//! claims asked while they are busy go together in the next one.
//!
//! A call that finds a lane free leads: it sends its own ask at once, with every ask queued
//! behind the busy lanes (up to `PG_BATCH_MAX`), as one statement (`Sql::claim_batch`),
//! and then hands its lane to the oldest ask still queued, which leads the next batch. So
//! an idle process sends each claim alone, without a hop, and a busy one sends fewer,
//! larger statements: the server's work per statement (parse, plan, function call, commit
//! and its WAL flush) is shared by the batch, and fewer transactions of the process
//! contend for the WAL and for each other's rows.
//!
//! A batch is one transaction, so its writes are held until its commit. Its keys are sorted
//! and locked in that order, so two batches never wait on each other in a cycle; a deadlock
//! the server reports anyway (SQLSTATE 40P01) rolled everything back, and every key of the
//! batch asks again. A key appears at most once in a batch.
//!
//! The queue is generic over the ask: completions without writes use it too, with lanes of
//! their own (`PG_COMPLETE_LANES`), so concurrent completions of a process share one commit
//! and its WAL flush (docs/shared.md, "Batches"); so do acquisitions waiting for the WAL
//! flush past their early commit, which a batch's commit gives them (`Db::flush`).
//!
//! Architecture Invariant: a batch changes how many claims share a statement, never what one
//! claim decides: each key's claim is the same function call as a lone claim's.

use super::error::{DatabaseError, DatabaseErrorKind};
use super::rows::Fail;
use crate::shared::constants::PG_BATCH_MAX;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// What a batch needs of an ask: the key, so that a key appears once per batch.
pub(crate) trait Keyed {
    fn key(&self) -> &[u8];
}

/// What a queued ask receives: its answer, or a lane (with its ask back) to lead the next
/// batch.
enum Turn<A, R> {
    Answer(Result<R, Fail>),
    Lead(A, Lane<A, R>),
}

struct Queued<A, R> {
    id: u64,
    ask: A,
    turn: oneshot::Sender<Turn<A, R>>,
}

struct Lanes<A, R> {
    busy: usize,
    queue: VecDeque<Queued<A, R>>,
    next_id: u64,
}

/// The queue and lanes of one kind of statement.
pub(crate) struct Batcher<A, R> {
    lanes: Arc<Mutex<Lanes<A, R>>>,
    lanes_max: usize,
    /// The longest an ask stays queued; past it, an ask still queued leaves the queue
    /// refused (nothing was sent).
    queued_max: Duration,
    /// Asks that waited for a lane, ever.
    queued: AtomicU64,
}

/// One busy lane. Dropped (its leader done, or gone with a dropped future, or a lead that
/// was never read), it passes to the oldest queued ask whose caller still waits, or back
/// to the free lanes: a lane is never lost.
struct Lane<A, R> {
    lanes: Arc<Mutex<Lanes<A, R>>>,
    /// Cleared on a lane whose hand-over failed, which the dropping one hands on instead.
    armed: bool,
}

impl<A, R> Drop for Lane<A, R> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        loop {
            // The lock is not held while sending: a refused lead drops a `Lane`.
            let next = {
                let mut lanes = self.lanes.lock();
                match lanes.queue.pop_front() {
                    Some(q) => q,
                    None => {
                        lanes.busy = lanes.busy.saturating_sub(1);
                        return;
                    }
                }
            };
            let lane = Lane {
                lanes: self.lanes.clone(),
                armed: true,
            };
            match next.turn.send(Turn::Lead(next.ask, lane)) {
                Ok(()) => return,
                Err(Turn::Lead(_, mut refused)) => refused.armed = false,
                Err(Turn::Answer(_)) => {}
            }
        }
    }
}

impl<A: Keyed, R> Batcher<A, R> {
    /// `lanes_max` statements in flight at most (at least one); an ask queued longer than
    /// `queued_max` is refused.
    pub(crate) fn new(lanes_max: usize, queued_max: Duration) -> Self {
        Batcher {
            lanes: Arc::new(Mutex::new(Lanes {
                busy: 0,
                queue: VecDeque::new(),
                next_id: 0,
            })),
            lanes_max: lanes_max.max(1),
            queued_max,
            queued: AtomicU64::new(0),
        }
    }

    /// Asks that waited for a lane so far.
    pub(crate) fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    /// The answer to `ask`, sent by `send` alone or in a batch. `send` gets the asks of
    /// one batch, the leader's first, and answers each in that order.
    pub(crate) async fn ask(
        &self,
        ask: A,
        send: impl AsyncFnOnce(&[&A]) -> Vec<Result<R, Fail>>,
    ) -> Result<R, Fail> {
        // `Ok`: a free lane, taken; `Err`: queued behind the busy ones.
        let start = {
            let mut lanes = self.lanes.lock();
            if lanes.busy < self.lanes_max {
                lanes.busy += 1;
                Ok(ask)
            } else {
                let (turn, waiting) = oneshot::channel();
                let id = lanes.next_id;
                lanes.next_id += 1;
                lanes.queue.push_back(Queued { id, ask, turn });
                // Counted under the lock: once it shows, the ask is in the queue.
                self.queued.fetch_add(1, Ordering::Relaxed);
                Err((id, waiting))
            }
        };
        let (ask, lane) = match start {
            Err((id, mut waiting)) => {
                let turn = match tokio::time::timeout(self.queued_max, &mut waiting).await {
                    Ok(turn) => turn,
                    Err(_) if self.withdraw(id) => {
                        return Err(Fail::Refused(DatabaseError::new(
                            DatabaseErrorKind::Unavailable,
                            "no lane came free within the call timeout; nothing was sent",
                        )))
                    }
                    // Taken into a batch (whose statement has its own timeout), or handed
                    // the lane: its answer comes.
                    Err(_) => waiting.await,
                };
                match turn {
                    Ok(Turn::Answer(answer)) => return answer,
                    Ok(Turn::Lead(ask, lane)) => (ask, lane),
                    // The batch's leader was dropped, its statement sent or not: unknown.
                    Err(_) => {
                        return Err(Fail::Unknown(Arc::from(
                            "the call's batch was abandoned before its answer arrived",
                        )))
                    }
                }
            }
            Ok(ask) => (
                ask,
                Lane {
                    lanes: self.lanes.clone(),
                    armed: true,
                },
            ),
        };
        let followers = self.followers(ask.key());
        let mut asks: Vec<&A> = Vec::with_capacity(followers.len() + 1);
        asks.push(&ask);
        asks.extend(followers.iter().map(|q| &q.ask));
        let mut answers = send(&asks).await.into_iter();
        // The lane goes on before the answers: the next batch's leader is woken first, so
        // that it is not queued for a core behind the callers this batch answers, and the
        // next statement is sent while they run.
        drop(lane);
        let abandoned = || {
            Err(Fail::Unknown(Arc::from(
                "the batch's statement gave no answer for this call",
            )))
        };
        let mine = answers.next().unwrap_or_else(abandoned);
        for q in followers {
            let _ = q
                .turn
                .send(Turn::Answer(answers.next().unwrap_or_else(abandoned)));
        }
        mine
    }

    /// Takes the ask `id` out of the queue: whether it was still there (not yet taken into
    /// a batch, nor handed a lane).
    fn withdraw(&self, id: u64) -> bool {
        let mut lanes = self.lanes.lock();
        match lanes.queue.iter().position(|q| q.id == id) {
            Some(at) => lanes.queue.remove(at).is_some(),
            None => false,
        }
    }

    /// Takes the queued asks that join a batch led by `key`'s call: the oldest first, up
    /// to `PG_BATCH_MAX` in all, one per key; asks of callers gone are dropped, and a
    /// second ask of a key stays queued for the next batch.
    fn followers(&self, key: &[u8]) -> Vec<Queued<A, R>> {
        let mut lanes = self.lanes.lock();
        if lanes.queue.is_empty() {
            return Vec::new();
        }
        let mut taken: Vec<Queued<A, R>> = Vec::new();
        let mut kept = VecDeque::new();
        while taken.len() + 1 < PG_BATCH_MAX {
            let Some(q) = lanes.queue.pop_front() else {
                break;
            };
            if q.turn.is_closed() {
                continue;
            }
            let k = q.ask.key();
            if k == key || taken.iter().any(|t| t.ask.key() == k) {
                kept.push_back(q);
            } else {
                taken.push(q);
            }
        }
        while let Some(q) = kept.pop_back() {
            lanes.queue.push_front(q);
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::{Batcher, Keyed};
    use crate::shared::error::DatabaseErrorKind;
    use crate::shared::rows::Fail;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::{oneshot, Mutex};

    #[derive(Debug)]
    struct Ask(&'static [u8]);

    impl Keyed for Ask {
        fn key(&self) -> &[u8] {
            self.0
        }
    }

    /// The batches sent, as their keys; a send whose gate is given waits for it.
    type Sent = Arc<std::sync::Mutex<Vec<Vec<&'static [u8]>>>>;
    /// The receiving end of a gate, taken by the first send that holds it.
    type Gate = Arc<Mutex<Option<oneshot::Receiver<()>>>>;

    async fn ask(
        b: &Batcher<Ask, usize>,
        key: &'static [u8],
        sent: &Sent,
        gate: Option<Gate>,
    ) -> Result<usize, Fail> {
        b.ask(Ask(key), async |asks: &[&Ask]| {
            sent.lock()
                .unwrap()
                .push(asks.iter().map(|a| a.0).collect());
            if let Some(gate) = gate {
                if let Some(rx) = gate.lock().await.take() {
                    let _ = rx.await;
                }
            }
            // Each ask is answered with its position in the batch.
            (0..asks.len()).map(Ok).collect()
        })
        .await
    }

    fn gate() -> (oneshot::Sender<()>, Gate) {
        let (tx, rx) = oneshot::channel();
        (tx, Arc::new(Mutex::new(Some(rx))))
    }

    /// Asks queued behind the busy lane go in one batch, led by the oldest, each answered
    /// in its own place; a second ask of a key waits for the next batch; the lane is free
    /// again afterwards.
    #[tokio::test(start_paused = true)]
    async fn queued_asks_share_the_next_batch_and_each_gets_its_answer() {
        let b = Batcher::new(1, Duration::from_secs(10));
        let sent: Sent = Arc::default();
        let (open, g) = gate();
        let first = ask(&b, b"a", &sent, Some(g));
        let (x, y, x_again) = (
            ask(&b, b"x", &sent, None),
            ask(&b, b"y", &sent, None),
            ask(&b, b"x", &sent, None),
        );
        let release = async {
            // `join!` has polled every ask once: the three behind the lane are queued.
            tokio::task::yield_now().await;
            assert_eq!(b.queued(), 3);
            let _ = open.send(());
        };
        let (first, x, y, x_again, ()) = tokio::join!(first, x, y, x_again, release);
        assert_eq!(first.ok(), Some(0));
        assert_eq!((x.ok(), y.ok()), (Some(0), Some(1)));
        assert_eq!(x_again.ok(), Some(0));
        let batches = sent.lock().unwrap().clone();
        assert_eq!(batches, vec![vec![&b"a"[..]], vec![b"x", b"y"], vec![b"x"]]);
        assert_eq!(ask(&b, b"z", &sent, None).await.ok(), Some(0));
    }

    /// An ask still queued at its deadline leaves the queue refused (nothing was sent),
    /// and the lane is not lost: the leader's answer arrives, and a later ask leads.
    #[tokio::test(start_paused = true)]
    async fn an_ask_queued_past_its_deadline_is_refused_and_the_lane_survives() {
        let b = Batcher::new(1, Duration::from_secs(10));
        let sent: Sent = Arc::default();
        let (open, g) = gate();
        let leader = ask(&b, b"a", &sent, Some(g));
        let queued = async {
            let r = ask(&b, b"q", &sent, None).await;
            let _ = open.send(());
            r
        };
        let (leader, queued) = tokio::join!(leader, queued);
        assert_eq!(leader.ok(), Some(0));
        match queued {
            Err(Fail::Refused(e)) => assert_eq!(e.kind, DatabaseErrorKind::Unavailable),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            sent.lock().unwrap().len(),
            1,
            "the refused ask was never sent"
        );
        assert_eq!(ask(&b, b"z", &sent, None).await.ok(), Some(0));
    }

    /// A queued ask whose caller is gone is left out of the batch, and a lead refused by a
    /// gone caller passes to the next queued ask.
    #[tokio::test(start_paused = true)]
    async fn asks_of_callers_gone_are_skipped() {
        let b = Batcher::new(1, Duration::from_secs(10));
        let sent: Sent = Arc::default();
        let (open, g) = gate();
        let leader = ask(&b, b"a", &sent, Some(g));
        let rest = async {
            {
                // Queued, then dropped with its caller.
                let gone = std::pin::pin!(ask(&b, b"gone", &sent, None));
                let _ = futures::poll!(gone);
            }
            let kept = ask(&b, b"kept", &sent, None);
            let release = async {
                tokio::task::yield_now().await;
                let _ = open.send(());
            };
            tokio::join!(kept, release).0
        };
        let (leader, kept) = tokio::join!(leader, rest);
        assert_eq!((leader.ok(), kept.ok()), (Some(0), Some(0)));
        let batches = sent.lock().unwrap().clone();
        assert_eq!(batches, vec![vec![&b"a"[..]], vec![b"kept"]]);
    }
}
