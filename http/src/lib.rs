//! The fleetops HTTP/WebSocket edge: turns requests into calls on the runtime's handles and
//! replies into responses.
//!
//! Order of checks on every authenticated route: 401 → 429 → 403 → 404 → 413 →
//! 400 → 422 → 409. Bodies are read only after authorization, always under a size cap. This
//! crate never touches sled and holds no business rule.

pub mod app;
pub mod body;
pub mod config;
pub mod console;
pub mod edge;
pub mod error;
pub mod fuzzing;
pub(crate) mod handlers;
pub mod metrics;
pub mod openapi;
pub mod query;
pub mod rate_limit;
pub mod router;
pub mod server;
mod ws;

pub use app::App;
pub use config::{HttpConfig, Tier};
pub use server::serve;
