//! Counters (`--stats`, the `stats` audit event at exit).

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// Monotonic counters of one proxy.
        #[derive(Debug, Default)]
        pub struct Stats { $(pub $name: AtomicU64,)* }

        impl Stats {
            /// The counters as a JSON object.
            pub fn to_json(&self) -> serde_json::Value {
                let mut m = serde_json::Map::new();
                $(m.insert(stringify!($name).into(), self.$name.load(Ordering::Relaxed).into());)*
                serde_json::Value::Object(m)
            }
        }
    };
}

counters!(
    queries,
    answered,
    cache_hits,
    cache_misses,
    upstream_queries,
    upstream_failures,
    servfail,
    refused_not_allowlisted,
    refused_qtype,
    refused_class,
    refused_tunnel,
    refused_cname,
    refused_rebinding,
    refused_other,
    rebinding_records_dropped,
    malformed,
    dropped_rate_limited,
    truncated,
);

impl Stats {
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}
