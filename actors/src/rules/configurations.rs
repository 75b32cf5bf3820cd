//! Configuration rules: the inheritance chain, the schema that applies, and what the quota
//! counts. They read the store and never write it.

use fleetops_storage::{Configuration, Store};
use serde_json::Value;

use crate::error::Result;
use crate::rules::config_files::MAX_CONFIG_BYTES;

/// Inheritance chains are at most this deep.
pub const MAX_DEPTH: usize = 32;

/// What the quota counts for a configuration: its bytes once uploaded, else what it declared,
/// else 1 MiB.
pub(crate) fn reserved(c: &Configuration) -> u64 {
    c.upload
        .uploaded_bytes
        .or(c.declared_size)
        .unwrap_or(MAX_CONFIG_BYTES)
}

/// The chain from the root ancestor to `c` (included). A missing ancestor, a cycle or a chain
/// deeper than [`MAX_DEPTH`] is an error naming it.
pub(crate) fn lineage(
    store: &Store,
    pid: u64,
    c: &Configuration,
) -> Result<std::result::Result<Vec<Configuration>, String>> {
    let mut chain = vec![c.clone()];
    let mut next = c.parent_config_id;
    while let Some(id) = next {
        if chain.iter().any(|x| x.id == id) {
            return Ok(Err(format!(
                "parent chain has a cycle at configuration {id}"
            )));
        }
        if chain.len() >= MAX_DEPTH {
            return Ok(Err(format!(
                "parent chain is deeper than {MAX_DEPTH} configurations"
            )));
        }
        let Some(p) = store.configuration(pid, id)? else {
            return Ok(Err(format!(
                "parent configuration {id} does not exist in this project"
            )));
        };
        next = p.parent_config_id;
        chain.push(p);
    }
    chain.reverse();
    Ok(Ok(chain))
}

/// The schema that applies to the last of `chain` (its own, else the nearest ancestor's).
pub(crate) fn effective_schema(chain: &[Configuration]) -> Option<(&Configuration, Value)> {
    chain.iter().rev().find_map(|c| {
        c.validation_schema_json
            .as_ref()
            .and_then(|s| serde_json::from_slice(s).ok())
            .map(|s| (c, s))
    })
}
