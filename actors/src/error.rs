//! The domain error every handle returns. `http` maps each kind to one status and `detail`;
//! 5xx causes go to tracing, never into the response.

use fleetops_storage::StorageError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Missing, invalid or expired credentials.
    #[error("Could not validate credentials")]
    Unauthorized,
    /// A 401 with its own reason (a webhook's bad signature or repeated delivery).
    #[error("{0}")]
    Rejected(String),
    /// Valid credentials without the needed role or organization.
    #[error("Not enough permissions")]
    Forbidden,
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// Parsed input that breaks a rule; the text names the field.
    #[error("{0}")]
    Unprocessable(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    TooLarge(String),
    /// A request body that stalled or came slower than the minimum rate (408).
    #[error("{0}")]
    BodyTimeout(String),
    /// The owning actor is restarting, overloaded or did not answer in time.
    #[error("Service temporarily unavailable")]
    Unavailable { retry_after_secs: u64 },
    /// The data directory's file system is below `[storage] min_free_bytes`, or full (507).
    #[error("{0}")]
    InsufficientStorage(String),
    /// Stored data that cannot be read back (a log chunk failing its checksum): a 500 whose
    /// detail says what is damaged, for the operator who restores it.
    #[error("Stored data is damaged: {0}")]
    Damaged(String),
    #[error("Internal server error")]
    Internal(String),
    /// A storage failure, kept whole (with its source chain) for the log.
    #[error("Internal server error")]
    Storage(#[source] StorageError),
}

impl Error {
    pub fn not_found(what: &str) -> Self {
        Error::NotFound(format!("{what} not found"))
    }
    pub fn unprocessable(field: &str, why: impl std::fmt::Display) -> Self {
        Error::Unprocessable(format!("{field}: {why}"))
    }

    /// A streamed request body that could not be read: 408 when it stalled or trickled
    /// (the edge ends it with `TimedOut`), 503 when the edge had no room for its buffer
    /// (`ResourceBusy`), else 400.
    pub fn unreadable_body(e: &std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::TimedOut => {
                Error::BodyTimeout(format!("The request body was not received in time: {e}"))
            }
            std::io::ErrorKind::ResourceBusy => Error::Unavailable {
                retry_after_secs: 1,
            },
            _ => Error::BadRequest(format!("Could not read the request body: {e}")),
        }
    }
}

impl From<StorageError> for Error {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::FlushFailed | StorageError::Unavailable(_) => Error::Unavailable {
                retry_after_secs: 1,
            },
            // Another writer (another process on the same database) took the key first.
            StorageError::Conflict(what) => Error::Conflict(what),
            StorageError::Damaged(what) => Error::Damaged(what),
            e if e.is_disk_full() => Error::InsufficientStorage(
                "The data directory's disk is full: nothing was written".into(),
            ),
            other => Error::Storage(other),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
