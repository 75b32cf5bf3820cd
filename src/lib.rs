//! The `fleetops` binary's library half, shared by `main.rs` and by the integration tests,
//! which start the real server in-process on `127.0.0.1:0`: the typed configuration
//! ([`config`]: `config.toml` or `--config PATH`, then `FLEETOPS_*` overrides; unknown keys
//! refused at start-up) and the wiring ([`startup`]: open the store, start the supervision
//! tree, create the first administrator on an empty data directory, bind, serve, and stop in
//! order). It also sets the global allocator.

/// mimalloc rather than glibc's malloc: the request paths allocate and free many small
/// buffers across threads, where glibc's arenas cost a tenth of the webhook path's CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod config;
pub mod startup;
