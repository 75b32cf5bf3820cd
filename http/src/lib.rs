//! The fleetops HTTP/WebSocket edge: turns requests into calls on the runtime's handles and
//! replies into responses. It owns what is about the wire: the accept loop ([`server`]), the
//! one route table ([`router`]) and the OpenAPI document generated from it ([`openapi`]),
//! credentials, rate limits and authorization ([`app`], [`rate_limit`]), the limits one client
//! can hold ([`edge`]), request bodies, response bodies and the error envelope ([`body`],
//! [`response`], [`error`]), the REST handlers
//! (`handlers`), the live log stream (`ws`), `/metrics` ([`metrics`]) and the operator
//! console ([`console`]).
//!
//! Invariants a change must keep:
//! - Order of checks on every authenticated route: 401 → 429 → 403 → 404 → 413 → 400 → 422 →
//!   409. Bodies are read only after authorization, always under a size cap.
//! - This crate never touches sled (its manifest does not depend on `fleetops-storage`) and
//!   holds no business rule: a handler or a console page parses, authorizes, calls the runtime
//!   and maps the reply.
//! - Every route is listed once, in the route table, so the OpenAPI document cannot miss one;
//!   a known path with another method is 405 with `Allow`.
//! - Every edge limit is an `[http]` key and is counted on `/metrics` when it is hit.
//!
//! Tested through the real server on `127.0.0.1:0` (`tests/api/`): hostile clients
//! (`hostile.rs`), malformed input (`bad_input.rs`), the console in a real browser, and
//! schemathesis against the served document; the `fuzz/` targets that start at the edge
//! enter through [`fuzzing`].

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
pub mod response;
pub mod router;
pub mod server;
mod ws;

pub use app::App;
pub use config::{HttpConfig, Tier};
pub use server::serve;
