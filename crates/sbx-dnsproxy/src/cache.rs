//! The answer cache: filtered outcomes keyed by (name, type), kept for
//! their TTL.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::Record;

/// What the proxy decided for a (name, type) after asking upstream.
#[derive(Debug)]
pub enum Outcome {
    /// Answer with these records (already filtered).
    Answer {
        rcode: ResponseCode,
        answers: Vec<Record>,
        authority: Vec<Record>,
        ttl: u32,
        /// The same as wire bytes, for the fast path.
        template: Option<crate::wire::Template>,
    },
    /// Refuse (the chain left the allowlist, or only internal addresses).
    Refused {
        reason: &'static str,
        detail: String,
        ttl: u32,
    },
}

impl Outcome {
    pub fn ttl(&self) -> u32 {
        match self {
            Outcome::Answer { ttl, .. } | Outcome::Refused { ttl, .. } => *ttl,
        }
    }
}

struct Entry {
    hash: u64,
    name: Box<str>,
    qtype: u16,
    outcome: Arc<Outcome>,
    at: Instant,
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.at).as_secs() < u64::from(self.outcome.ttl())
    }
}

/// Independent parts of the cache, each with its own lock (chosen by the
/// key's hash): the receiving threads do not wait for one another.
const SHARDS: usize = 16;

/// A bounded map (name, type) -> outcome; lookups do not allocate.
pub struct Cache {
    /// Entries per shard at most (the whole cache holds SHARDS times it).
    cap: usize,
    hasher: foldhash::fast::RandomState,
    shards: Vec<Mutex<hashbrown::HashTable<Entry>>>,
}

impl Cache {
    pub fn new(cap: usize) -> Self {
        Cache {
            cap: cap.div_ceil(SHARDS),
            hasher: foldhash::fast::RandomState::default(),
            shards: (0..SHARDS)
                .map(|_| Mutex::new(hashbrown::HashTable::new()))
                .collect(),
        }
    }

    fn hash(&self, name: &str, qtype: u16) -> u64 {
        self.hasher.hash_one((name, qtype))
    }

    fn shard(&self, h: u64) -> std::sync::MutexGuard<'_, hashbrown::HashTable<Entry>> {
        // The top bits: hashbrown uses the low ones inside a table.
        self.shards[(h >> 60) as usize % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The outcome and the whole seconds since it was stored, if still
    /// within its TTL.
    pub fn get(&self, name: &str, qtype: u16) -> Option<(Arc<Outcome>, u32)> {
        if self.cap == 0 {
            return None;
        }
        let h = self.hash(name, qtype);
        let m = self.shard(h);
        let e = m.find(h, |e| e.qtype == qtype && &*e.name == name)?;
        let age = e.at.elapsed().as_secs();
        if age >= u64::from(e.outcome.ttl()) {
            return None;
        }
        Some((e.outcome.clone(), age as u32))
    }

    pub fn put(&self, name: &str, qtype: u16, o: Arc<Outcome>) {
        if self.cap == 0 || o.ttl() == 0 {
            return;
        }
        let now = Instant::now();
        let h = self.hash(name, qtype);
        let mut m = self.shard(h);
        if let Ok(occ) = m.find_entry(h, |e| e.qtype == qtype && &*e.name == name) {
            occ.remove();
        }
        if m.len() >= self.cap {
            m.retain(|e| e.live(now));
            // Still full of live entries: drop about one in eight.
            let mut n = 0u32;
            while m.len() >= self.cap {
                m.retain(|_| {
                    n = n.wrapping_add(1);
                    !n.is_multiple_of(8)
                });
            }
        }
        m.insert_unique(
            h,
            Entry {
                hash: h,
                name: name.into(),
                qtype,
                outcome: o,
                at: now,
            },
            |e| e.hash,
        );
    }

    pub fn clear(&self) {
        for s in &self.shards {
            s.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    #[cfg(test)]
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(ttl: u32) -> Arc<Outcome> {
        Arc::new(Outcome::Refused {
            reason: "x",
            detail: String::new(),
            ttl,
        })
    }

    #[test]
    fn bounded_and_keyed_by_name_and_type() {
        let c = Cache::new(16);
        c.put("a.test", 1, o(60));
        assert!(c.get("a.test", 1).is_some());
        assert!(c.get("a.test", 28).is_none());
        assert!(c.get("b.test", 1).is_none());
        c.put("a.test", 1, o(60));
        assert_eq!(c.len(), 1);
        for i in 0..100 {
            c.put(&format!("n{i}.test"), 1, o(60));
        }
        assert!(c.len() <= 16 + SHARDS, "{}", c.len());
        c.put("zero.test", 1, o(0));
        assert!(c.get("zero.test", 1).is_none());
    }
}
