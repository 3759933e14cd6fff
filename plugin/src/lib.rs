//! nri-resize: a containerd NRI plugin that makes in-place pod resize (KEP-1287) safe and
//! observable on the node.
//!
//! One resize walks: [`nri`] (event in) → [`model`] (what we know) → policy (what to do) →
//! cgroup writes or NRI updates → observer confirmation → metrics and the status [`api`].
//! [`daemon`] is the only module that knows them all, and only `main.rs` imports it. [`state`] is
//! what the handler, the engine, the capacity watcher and the API share; it sits below them.
//! `tests/architecture.rs` keeps the module graph free of cycles.

pub mod api;
pub mod arena;
pub mod backoff;
#[doc(hidden)]
pub mod bench_table;
pub mod capacity;
pub mod cgroup;
pub mod clock;
pub mod config;
pub mod config_check;
pub mod daemon;
pub mod metrics;
pub mod model;
pub mod nri;
pub mod observer;
pub mod policy;
pub mod resize;
pub mod state;
pub mod sync;
pub mod trim;
