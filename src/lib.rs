//! The `fleetops` binary's library half: configuration and wiring, shared by `main.rs` and by
//! the integration tests, which start the real server in-process.

/// mimalloc rather than glibc's malloc: the request paths allocate and free many small
/// buffers across threads, where glibc's arenas cost a tenth of the webhook path's CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod config;
pub mod startup;
