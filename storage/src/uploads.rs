//! Where a blob upload stands (artifacts, capsules, configurations).

use serde::{Deserialize, Serialize};

use crate::states::ValidationStatus;

/// What capsules and configurations share: the uploaded file, where it is, and its verdict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UploadState {
    pub file_format: String,
    /// Bytes actually uploaded (`None` until the upload).
    pub uploaded_bytes: Option<u64>,
    /// Computed by the server at confirm.
    pub checksum_sha256: Option<String>,
    pub validation_status: ValidationStatus,
    pub validation_notes: String,
    /// Built from ids (and, once sealed, the content's SHA-256).
    pub blob_key: String,
    /// Unix milliseconds after which an unconfirmed upload link no longer works.
    pub upload_expires_at: i64,
    pub confirmed: bool,
}

impl UploadState {
    /// A file announced at `upload-url`: nothing uploaded yet, validation pending.
    pub fn pending(file_format: String, upload_expires_at: i64) -> Self {
        Self {
            file_format,
            uploaded_bytes: None,
            checksum_sha256: None,
            validation_status: ValidationStatus::Pending,
            validation_notes: String::new(),
            blob_key: String::new(),
            upload_expires_at,
            confirmed: false,
        }
    }
}
