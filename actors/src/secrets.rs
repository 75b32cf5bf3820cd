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

pub const ENROLLMENT_TOKEN_PREFIX: &str = "fopse_";

pub fn new_enrollment_token() -> Result<String> {
    Ok(format!("{ENROLLMENT_TOKEN_PREFIX}{}", random_token(32)?))
}

pub fn new_project_secret() -> Result<String> {
    random_token(32)
}

/// argon2id at 7 MiB and five passes, the lowest-memory of OWASP's equivalent settings
/// (19 MiB with two passes is the crate's default): the work area is freed after each hash,
/// and a smaller one is what the allocator keeps cached, so idle memory stays low. A stored
/// hash carries its own parameters, so hashes made with the default still verify.
pub fn hash_password(password: &str) -> Result<String> {
    use argon2::password_hash::PasswordHasher;
    let params = argon2::Params::new(7 * 1024, 5, 1, None)
        .map_err(|e| Error::Internal(format!("argon2: {e}")))?;
    argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
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

/// Seals integration secrets with the data directory's secret-encryption key (AES-256-GCM,
/// a fresh random nonce per value). The record's identity is the associated data, so a
/// sealed value copied onto another record does not open.
#[derive(Clone)]
pub struct Sealer {
    key: std::sync::Arc<aws_lc_rs::aead::LessSafeKey>,
}

const NONCE_LEN: usize = 12;

impl Sealer {
    pub fn new(key: &[u8]) -> Result<Self> {
        let unbound = aws_lc_rs::aead::UnboundKey::new(&aws_lc_rs::aead::AES_256_GCM, key)
            .map_err(|_| Error::Internal("the secret-encryption key must be 32 bytes".into()))?;
        Ok(Self {
            key: std::sync::Arc::new(aws_lc_rs::aead::LessSafeKey::new(unbound)),
        })
    }

    /// nonce ‖ ciphertext ‖ tag.
    pub fn seal(&self, context: &[u8], plain: &[u8]) -> Result<Vec<u8>> {
        let nonce_bytes = random_bytes(NONCE_LEN)?;
        let nonce = aws_lc_rs::aead::Nonce::try_assume_unique_for_key(&nonce_bytes)
            .map_err(|_| Error::Internal("nonce".into()))?;
        let mut buf = plain.to_vec();
        self.key
            .seal_in_place_append_tag(nonce, aws_lc_rs::aead::Aad::from(context), &mut buf)
            .map_err(|_| Error::Internal("sealing failed".into()))?;
        let mut out = nonce_bytes;
        out.extend_from_slice(&buf);
        Ok(out)
    }

    pub fn open(&self, context: &[u8], sealed: &[u8]) -> Result<Vec<u8>> {
        let (Some(nonce), Some(body)) = (sealed.get(..NONCE_LEN), sealed.get(NONCE_LEN..)) else {
            return Err(Error::Internal("a sealed secret is truncated".into()));
        };
        let nonce = aws_lc_rs::aead::Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| Error::Internal("nonce".into()))?;
        let mut buf = body.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, aws_lc_rs::aead::Aad::from(context), &mut buf)
            .map_err(|_| {
                Error::Internal(
                    "a sealed secret does not open with this data directory's key".into(),
                )
            })?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_their_key_and_context() {
        let s = Sealer::new(&[7u8; 32]).unwrap();
        let a = s.seal(b"i/1", b"hunter2").unwrap();
        assert!(!a.windows(7).any(|w| w == b"hunter2"));
        assert_ne!(
            a,
            s.seal(b"i/1", b"hunter2").unwrap(),
            "fresh nonce each time"
        );
        assert_eq!(s.open(b"i/1", &a).unwrap(), b"hunter2");
        assert!(s.open(b"i/2", &a).is_err());
        assert!(Sealer::new(&[8u8; 32]).unwrap().open(b"i/1", &a).is_err());
        assert!(s.open(b"i/1", &a[..5]).is_err());
        assert!(Sealer::new(&[1u8; 5]).is_err());
    }

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
        assert!(h.starts_with("$argon2id$v=19$m=7168,t=5,p=1$"), "{h}");
        assert!(verify_password("s3cret", &h));
        // A hash stored with the crate's default parameters (19 MiB, two passes) verifies.
        let old = {
            use argon2::password_hash::PasswordHasher;
            argon2::Argon2::default()
                .hash_password_with_salt(b"s3cret", &random_bytes(16).unwrap())
                .unwrap()
                .to_string()
        };
        assert!(old.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{old}");
        assert!(verify_password("s3cret", &old));
        assert!(!verify_password("wrong", &old));
        assert!(!verify_password("wrong", &h));
        assert!(!verify_password("s3cret", "garbage"));
    }
}
