//! The edge under hostile clients, through the real server: slowloris connections closed by
//! the header timeout while normal requests go on, bodies that stall cut by the body
//! deadline, buffered bodies bounded by the shared budget, and the connection ceiling.

use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::common::*;

mod bodies;
mod connections;
mod uploads;

/// The head of an unsigned `ping` delivery declaring `len` bytes of body.
fn webhook_head(len: usize) -> String {
    format!(
        "POST /api/v1/scm/webhooks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Host-Event: ping\r\nX-Host-Delivery: 0b4e6a2c-9d4f-4c53-9d7e-2a1f3c5b6d7e\r\nContent-Length: {len}\r\n\r\n"
    )
}

fn addr(s: &Srv) -> String {
    s.base.trim_start_matches("http://").to_string()
}

/// Reads until the server closes the connection (or `limit` passes); whether it closed.
async fn closed_within(c: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline.into(), c.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}
