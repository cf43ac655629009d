//! Recording concurrent histories and checking them against the contract.
//!
//! A [`Recorder`] stamps every call's invocation and return from one global counter (a
//! `SeqCst` fetch-add, taken just before the call and just after it returns), so "`a`
//! returned before `b` was invoked" in the record implies it in real time. [`check`] then
//! verifies the two properties the contract makes global (docs/design.md):
//!
//! - per key, the history is linearizable against [`KeySpec`] (one winner, fencing,
//!   losers see the winner's bytes, visibility);
//! - tokens increase globally: no two acquisitions share a token, and an acquisition that
//!   returned before another was invoked has the smaller token.

use crate::linearizability::{self, Entry, Spec};
use crate::spec::{KeyOp, KeyRet, KeySpec, SpecConfig};
use idemkv::Durability;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// One recorded call.
#[derive(Debug, Clone)]
pub struct Event {
    /// Calling thread.
    pub thread: usize,
    /// The key it was about (`None`: the clock, seen by every key).
    pub key: Option<Vec<u8>>,
    /// Invocation instant.
    pub invoke: u64,
    /// Return instant.
    pub ret_at: u64,
    /// The call.
    pub op: KeyOp,
    /// Its result.
    pub ret: KeyRet,
}

/// Collects the events of a run from any number of threads.
#[derive(Debug, Default)]
pub struct Recorder {
    clock: AtomicU64,
    events: Mutex<Vec<Event>>,
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes an instant; call it just before invoking the engine.
    pub fn now(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    /// Records a call invoked at `invoke` that has just returned `ret`.
    pub fn record(&self, thread: usize, key: Option<&[u8]>, invoke: u64, op: KeyOp, ret: KeyRet) {
        let ret_at = self.now();
        let event = Event {
            thread,
            key: key.map(<[u8]>::to_vec),
            invoke,
            ret_at,
            op,
            ret,
        };
        self.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(event);
    }

    /// Runs `call` as one recorded operation.
    pub fn call(
        &self,
        thread: usize,
        key: Option<&[u8]>,
        op: KeyOp,
        call: impl FnOnce() -> KeyRet,
    ) -> KeyRet {
        let invoke = self.now();
        let ret = call();
        self.record(thread, key, invoke, op, ret.clone());
        ret
    }

    /// The events so far, in no particular order.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// [`KeySpec`] with its configuration, as the checker's [`Spec`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Checked {
    /// The key's spec state.
    pub spec: KeySpec,
    cfg: CfgKey,
}

/// `SpecConfig` is not `Hash`; the checker only needs it carried along.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CfgKey(SpecConfig);

impl std::hash::Hash for CfgKey {
    fn hash<H: std::hash::Hasher>(&self, _state: &mut H) {}
}

impl Spec for Checked {
    type Op = KeyOp;
    type Ret = KeyRet;
    fn apply(&self, op: &KeyOp, ret: &KeyRet) -> Result<Self, String> {
        self.spec
            .step(&self.cfg.0, op, ret)
            .map(|spec| Checked {
                spec,
                cfg: self.cfg,
            })
            .map_err(|m| m.0)
    }
}

/// A violation found in a history.
#[derive(Debug, Clone)]
pub struct Violation(pub String);

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What [`check`] verified.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Keys checked.
    pub keys: usize,
    /// Operations checked.
    pub ops: usize,
    /// Acquisitions whose tokens were compared.
    pub acquisitions: usize,
}

/// Checks a history: per-key linearizability from `init` (every key starts Absent with the
/// clock at `init`'s reading) and global token order.
pub fn check(cfg: &SpecConfig, init: &KeySpec, events: &[Event]) -> Result<Summary, Violation> {
    let mut summary = Summary::default();
    check_tokens(events, &mut summary)?;
    let clock: Vec<&Event> = events.iter().filter(|e| e.key.is_none()).collect();
    let mut by_key: BTreeMap<&[u8], Vec<&Event>> = BTreeMap::new();
    for e in events {
        if let Some(k) = &e.key {
            by_key.entry(k.as_slice()).or_default().push(e);
        }
    }
    for (key, mine) in by_key {
        let mut entries: Vec<Entry<KeyOp, KeyRet>> = Vec::new();
        for e in mine.iter().chain(clock.iter()) {
            entries.push(Entry {
                thread: e.thread,
                invoke: e.invoke,
                ret_at: e.ret_at,
                op: e.op.clone(),
                ret: e.ret.clone(),
            });
            // Under Immediate a completion is published before `complete` returns.
            if cfg.durability == Durability::Immediate {
                if let (KeyOp::Complete { token, .. }, KeyRet::Done) = (&e.op, &e.ret) {
                    entries.push(Entry {
                        thread: e.thread,
                        invoke: e.invoke,
                        ret_at: e.ret_at,
                        op: KeyOp::Publish { token: *token },
                        ret: KeyRet::Done,
                    });
                }
            }
        }
        summary.keys += 1;
        summary.ops += mine.len();
        let start = Checked {
            spec: init.clone(),
            cfg: CfgKey(*cfg),
        };
        if let Err(e) = linearizability::check(&start, &entries) {
            return Err(Violation(format!(
                "key {:?}: {}",
                String::from_utf8_lossy(key),
                e.report
            )));
        }
    }
    Ok(summary)
}

/// Every acquired token is unique, and an acquisition that returned before another was
/// invoked holds the smaller token (tokens strictly increase over the engine's life).
pub fn check_tokens(events: &[Event], summary: &mut Summary) -> Result<(), Violation> {
    let mut acq: Vec<(&Event, u64)> = events
        .iter()
        .filter_map(|e| match e.ret {
            KeyRet::Acquired { token, .. } => Some((e, token)),
            _ => None,
        })
        .collect();
    summary.acquisitions = acq.len();
    let mut tokens: Vec<u64> = acq.iter().map(|(_, t)| *t).collect();
    tokens.sort_unstable();
    if let Some(w) = tokens.windows(2).find(|w| w[0] == w[1]) {
        return Err(Violation(format!("token {} was issued twice", w[0])));
    }
    // Walk acquisitions by invocation; keep the largest token among those that returned
    // before it.
    let mut by_ret = acq.clone();
    by_ret.sort_by_key(|(e, _)| e.ret_at);
    acq.sort_by_key(|(e, _)| e.invoke);
    let mut j = 0;
    let mut max_before: Option<(&Event, u64)> = None;
    for (e, t) in &acq {
        while j < by_ret.len() && by_ret[j].0.ret_at < e.invoke {
            if max_before.is_none_or(|(_, m)| by_ret[j].1 > m) {
                max_before = Some(by_ret[j]);
            }
            j += 1;
        }
        if let Some((before, m)) = max_before {
            if m >= *t {
                return Err(Violation(format!(
                    "tokens went backwards: {before:?} returned token {m} before {e:?} was invoked and got {t}"
                )));
            }
        }
    }
    Ok(())
}
