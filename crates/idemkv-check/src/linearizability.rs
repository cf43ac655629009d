//! A linearizability checker (Wing & Gong's search with Lowe's memoization).
//!
//! A history is a set of completed operations, each with an invocation and a return instant
//! on one logical clock. It is linearizable if some total order of the operations (a) puts
//! `a` before `b` whenever `a` returned before `b` was invoked, and (b) is accepted by the
//! sequential specification, result by result. The search tries, at each step, every
//! operation that may come next (no unlinearized operation returned before it was invoked),
//! and remembers every (set of linearized operations, spec state) pair it has explored, so
//! that each is explored once.
//!
//! Histories are checked per key (the key's operations plus the clock's), which is sound:
//! the projection of a linearizable history onto one object is linearizable.

use std::collections::HashSet;
use std::fmt::{self, Debug};
use std::hash::Hash;

/// A sequential specification: a state that accepts or refuses an (operation, result) pair.
pub trait Spec: Clone + Eq + Hash {
    /// Operations.
    type Op: Debug;
    /// Results.
    type Ret: Debug;
    /// The state after `op` returned `ret`, or why that result is impossible here.
    fn apply(&self, op: &Self::Op, ret: &Self::Ret) -> Result<Self, String>;
}

/// One completed operation of a history.
#[derive(Debug, Clone)]
pub struct Entry<O, R> {
    /// The thread that called it.
    pub thread: usize,
    /// Logical instant of the invocation.
    pub invoke: u64,
    /// Logical instant of the return (greater than `invoke`).
    pub ret_at: u64,
    /// The operation.
    pub op: O,
    /// Its result.
    pub ret: R,
}

/// Why a history is not linearizable.
#[derive(Debug, Clone)]
pub struct NotLinearizable {
    /// A human-readable account: the history, the longest prefix that could be ordered,
    /// and why each candidate for the next place was refused.
    pub report: String,
}

impl fmt::Display for NotLinearizable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.report)
    }
}

/// Most (set, state) pairs explored before giving up; a give-up is reported as a failure,
/// so tests keep their per-key histories small enough never to reach it.
pub const SEARCH_LIMIT: usize = 2_000_000;

struct Search<'a, S: Spec> {
    entries: &'a [Entry<S::Op, S::Ret>],
    seen: HashSet<(Vec<u64>, S)>,
    done: Vec<u64>,
    order: Vec<usize>,
    best: Vec<usize>,
    best_refusals: Vec<(usize, String)>,
    explored: usize,
}

impl<S: Spec> Search<'_, S> {
    fn is_done(&self, i: usize) -> bool {
        self.done[i / 64] & (1 << (i % 64)) != 0
    }

    fn flip(&mut self, i: usize) {
        self.done[i / 64] ^= 1 << (i % 64);
    }

    /// True if the remaining operations can be ordered from `state`.
    fn run(&mut self, state: &S) -> Result<bool, ()> {
        let n = self.entries.len();
        if self.order.len() == n {
            return Ok(true);
        }
        self.explored += 1;
        if self.explored > SEARCH_LIMIT {
            return Err(());
        }
        let min_ret = (0..n)
            .filter(|&i| !self.is_done(i))
            .map(|i| self.entries[i].ret_at)
            .min()
            .unwrap_or(u64::MAX);
        let mut refusals = Vec::new();
        for i in 0..n {
            if self.is_done(i) || self.entries[i].invoke > min_ret {
                continue;
            }
            let e = &self.entries[i];
            match state.apply(&e.op, &e.ret) {
                Ok(next) => {
                    self.flip(i);
                    self.order.push(i);
                    if self.seen.insert((self.done.clone(), next.clone())) && self.run(&next)? {
                        return Ok(true);
                    }
                    self.order.pop();
                    self.flip(i);
                }
                Err(why) => refusals.push((i, why)),
            }
        }
        if self.order.len() >= self.best.len() {
            self.best = self.order.clone();
            self.best_refusals = refusals;
        }
        Ok(false)
    }
}

/// Checks that `entries` (one object's history) is linearizable from `init`. Returns one
/// valid order (indices into `entries`) or a report of why none exists.
pub fn check<S: Spec>(
    init: &S,
    entries: &[Entry<S::Op, S::Ret>],
) -> Result<Vec<usize>, NotLinearizable> {
    for e in entries {
        assert!(e.invoke < e.ret_at, "an entry returns after it is invoked");
    }
    let mut search = Search {
        entries,
        seen: HashSet::new(),
        done: vec![0; entries.len().div_ceil(64).max(1)],
        order: Vec::new(),
        best: Vec::new(),
        best_refusals: Vec::new(),
        explored: 0,
    };
    match search.run(init) {
        Ok(true) => Ok(search.order),
        Ok(false) => Err(NotLinearizable {
            report: report(entries, &search.best, &search.best_refusals, None),
        }),
        Err(()) => Err(NotLinearizable {
            report: report(
                entries,
                &search.best,
                &search.best_refusals,
                Some("search limit reached: make the per-key histories smaller"),
            ),
        }),
    }
}

fn report<O: Debug, R: Debug>(
    entries: &[Entry<O, R>],
    best: &[usize],
    refusals: &[(usize, String)],
    note: Option<&str>,
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "history is not linearizable{}",
        note.map(|n| format!(" ({n})")).unwrap_or_default()
    );
    let mut idx: Vec<usize> = (0..entries.len()).collect();
    idx.sort_by_key(|&i| entries[i].invoke);
    let _ = writeln!(
        s,
        "history ({} operations, [invoke, return] thread: op -> result):",
        entries.len()
    );
    for i in idx {
        let e = &entries[i];
        let _ = writeln!(
            s,
            "  #{i:<3} [{:>5}, {:>5}] t{}: {:?} -> {:?}",
            e.invoke, e.ret_at, e.thread, e.op, e.ret
        );
    }
    let _ = writeln!(s, "longest order the spec accepts: {best:?}");
    for (i, why) in refusals {
        let _ = writeln!(s, "  next could not be #{i}: {why}");
    }
    s
}
