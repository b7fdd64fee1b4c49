//! The answer cache: filtered outcomes keyed by (name, type), kept for
//! their TTL.

use std::collections::HashMap;
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

type Key = (Box<str>, u16);

pub struct Cache {
    cap: usize,
    map: Mutex<HashMap<Key, (Arc<Outcome>, Instant), foldhash::fast::RandomState>>,
}

impl Cache {
    pub fn new(cap: usize) -> Self {
        Cache {
            cap,
            map: Mutex::new(HashMap::default()),
        }
    }

    /// The outcome and the whole seconds since it was stored, if still
    /// within its TTL.
    pub fn get(&self, name: &str, qtype: u16) -> Option<(Arc<Outcome>, u32)> {
        if self.cap == 0 {
            return None;
        }
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        // A borrowed key without allocating: the map is keyed by Box<str>.
        let (o, at) = m.get(&(Box::<str>::from(name), qtype))?;
        let age = at.elapsed().as_secs();
        if age >= u64::from(o.ttl()) {
            return None;
        }
        Some((o.clone(), age as u32))
    }

    pub fn put(&self, name: &str, qtype: u16, o: Arc<Outcome>) {
        if self.cap == 0 || o.ttl() == 0 {
            return;
        }
        let now = Instant::now();
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= self.cap {
            m.retain(|_, (o, at)| now.duration_since(*at).as_secs() < u64::from(o.ttl()));
            while m.len() >= self.cap {
                let Some(k) = m.keys().next().cloned() else {
                    break;
                };
                m.remove(&k);
            }
        }
        m.insert((name.into(), qtype), (o, now));
    }

    pub fn clear(&self) {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
