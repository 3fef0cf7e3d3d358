//! braid-lb: the load balancer's policy, with no I/O: backend tables and selection algorithms
//! (including Maglev), health state machines, the flow table, and DSR frame handling.
//!
//! - [`hash`]: the fixed hash every instance shares ([`hash::hash_bytes`]).
//! - [`maglev`]: Maglev lookup tables ([`maglev::Maglev`]).
//! - [`algo`]: selection algorithms ([`algo::Algorithm`], [`algo::Selector`]).
//! - [`health`]: fall/rise state machine ([`health::HealthMachine`]).
//! - [`backend`]: the backend table ([`backend::BackendTable`]) combining the above.
//! - [`flow`]: 5-tuples ([`flow::FlowKey`], its hash) and the bounded flow table ([`flow::FlowTable`]).
//! - [`fuzzing`]: the bodies of the fuzz targets (DSR frames, health-check HTTP), shared by
//!   `fuzz/` and `tests/fuzz_corpus.rs`.
//! - [`limit`]: admission limits of a proxy listener ([`limit::ConnLimiter`]).
#![deny(unsafe_code)]

pub mod algo;
pub mod backend;
pub mod dsr;
pub mod flow;
pub mod fuzzing;
pub mod hash;
pub mod health;
pub mod limit;
pub mod maglev;

pub use algo::{Algorithm, PickKey, Selector};
pub use backend::{AdminState, Backend, BackendId, BackendState, BackendTable, TableError};
pub use flow::{FlowKey, FlowTable};
pub use health::{CheckKind, Health, HealthMachine, HealthParams};
pub use limit::{ConnLimiter, Refused};
pub use maglev::{Maglev, DEFAULT_TABLE_SIZE};
