//! Random secrets, their hashes and constant-time comparison.

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{Error, Result};

/// `n` random bytes from the operating system.
pub fn random_bytes(n: usize) -> Result<Vec<u8>> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).map_err(|e| Error::Internal(format!("getrandom: {e}")))?;
    Ok(b)
}

/// URL-safe random text of `bytes` random bytes (43 characters for 32 bytes).
pub fn random_token(bytes: usize) -> Result<String> {
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random_bytes(bytes)?))
}

pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

pub const API_KEY_PREFIX: &str = "fops_";
pub const DEVICE_TOKEN_PREFIX: &str = "fopsd_";

pub fn new_api_key() -> Result<String> {
    Ok(format!("{API_KEY_PREFIX}{}", random_token(32)?))
}

pub fn new_device_token() -> Result<String> {
    Ok(format!("{DEVICE_TOKEN_PREFIX}{}", random_token(32)?))
}

pub fn new_project_secret() -> Result<String> {
    random_token(32)
}

/// argon2id with the crate's default (OWASP-recommended) parameters.
pub fn hash_password(password: &str) -> Result<String> {
    use argon2::password_hash::PasswordHasher;
    argon2::Argon2::default()
        .hash_password_with_salt(password.as_bytes(), &random_bytes(16)?)
        .map(|h| h.to_string())
        .map_err(|e| Error::Internal(format!("argon2: {e}")))
}

pub fn verify_password(password: &str, phc: &str) -> bool {
    use argon2::password_hash::PasswordVerifier;
    argon2::Argon2::default()
        .verify_password(password.as_bytes(), phc)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_prefix_and_entropy() {
        let k = new_api_key().unwrap();
        assert!(k.starts_with("fops_") && k.len() >= 5 + 32);
        assert_ne!(k, new_api_key().unwrap());
        assert!(new_device_token().unwrap().starts_with("fopsd_"));
    }

    #[test]
    fn password_round_trip() {
        let h = hash_password("s3cret").unwrap();
        assert!(h.starts_with("$argon2id$"));
        assert!(verify_password("s3cret", &h));
        assert!(!verify_password("wrong", &h));
        assert!(!verify_password("s3cret", "garbage"));
    }
}
