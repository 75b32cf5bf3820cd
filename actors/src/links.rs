//! Signed, expiring, single-purpose links for the local blob backend: the presigned upload
//! URL (`PUT /api/v1/uploads/{token}`) and download URL (`GET /api/v1/downloads/{token}`)
//! that S3 would otherwise give.
//!
//! A token is `base64url(claims) "." base64url(HMAC-SHA256(key, claims))`; the key is
//! generated once and kept in the data directory. Verification is constant-time; a token for
//! one purpose or object never passes for another.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::error::{Error, Result};
use crate::secrets::ct_eq;

/// What a link allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Purpose {
    Upload,
    Download,
}

/// What a link is for: one purpose on one object of one project, until `exp`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub purpose: Purpose,
    /// `capsule` or `configuration`.
    pub kind: String,
    pub project_id: u64,
    pub id: u64,
    /// Unix seconds.
    pub exp: i64,
}

pub struct Signer {
    key: Vec<u8>,
}

impl Signer {
    pub fn new(key: Vec<u8>) -> Self {
        Self { key }
    }

    fn mac(&self, data: &[u8]) -> Result<Vec<u8>> {
        let mut m = hmac::Hmac::<Sha256>::new_from_slice(&self.key)
            .map_err(|e| Error::Internal(format!("hmac key: {e}")))?;
        m.update(data);
        Ok(m.finalize().into_bytes().to_vec())
    }

    pub fn sign(&self, link: &Link) -> Result<String> {
        let claims = serde_json::to_vec(link).map_err(|e| Error::Internal(e.to_string()))?;
        self.sign_claims(&claims)
    }

    /// A token over raw claim bytes (the fuzz targets sign what they generate, so verification
    /// gets past the MAC to the claims).
    pub(crate) fn sign_claims(&self, claims: &[u8]) -> Result<String> {
        let sig = self.mac(claims)?;
        Ok(format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(claims),
            URL_SAFE_NO_PAD.encode(sig)
        ))
    }

    /// The link a token stands for: 403 when it was not signed here (or was altered, or is
    /// for another purpose), 401 when it has expired.
    pub fn verify(&self, token: &str, purpose: Purpose, now_secs: i64) -> Result<Link> {
        let (claims, sig) = token.split_once('.').ok_or(Error::Forbidden)?;
        let claims = URL_SAFE_NO_PAD
            .decode(claims)
            .map_err(|_| Error::Forbidden)?;
        let sig = URL_SAFE_NO_PAD.decode(sig).map_err(|_| Error::Forbidden)?;
        if !ct_eq(&self.mac(&claims)?, &sig) {
            return Err(Error::Forbidden);
        }
        let link: Link = serde_json::from_slice(&claims).map_err(|_| Error::Forbidden)?;
        if link.purpose != purpose {
            return Err(Error::Forbidden);
        }
        if link.exp <= now_secs {
            return Err(Error::Unauthorized);
        }
        Ok(link)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(purpose: Purpose, exp: i64) -> Link {
        Link {
            purpose,
            kind: "capsule".into(),
            project_id: 3,
            id: 42,
            exp,
        }
    }

    #[test]
    fn sign_verify_tamper_expire_and_purpose() {
        let s = Signer::new(b"k".repeat(32));
        let t = s.sign(&link(Purpose::Upload, 1000)).unwrap();
        assert_eq!(
            s.verify(&t, Purpose::Upload, 999).unwrap(),
            link(Purpose::Upload, 1000)
        );
        assert!(matches!(
            s.verify(&t, Purpose::Upload, 1000),
            Err(Error::Unauthorized)
        ));
        assert!(matches!(
            s.verify(&t, Purpose::Download, 999),
            Err(Error::Forbidden)
        ));
        // Another key, a flipped byte, a forged claim, garbage.
        assert!(matches!(
            Signer::new(b"x".repeat(32)).verify(&t, Purpose::Upload, 999),
            Err(Error::Forbidden)
        ));
        let mut bytes = t.clone().into_bytes();
        bytes[3] ^= 1;
        assert!(
            s.verify(&String::from_utf8_lossy(&bytes), Purpose::Upload, 999)
                .is_err()
        );
        let (_, sig) = t.split_once('.').unwrap();
        let forged = format!(
            "{}.{sig}",
            URL_SAFE_NO_PAD.encode(
                serde_json::to_vec(&Link {
                    id: 43,
                    ..link(Purpose::Upload, 1000)
                })
                .unwrap()
            )
        );
        assert!(matches!(
            s.verify(&forged, Purpose::Upload, 999),
            Err(Error::Forbidden)
        ));
        for junk in ["", ".", "abc", "a.b", "..."] {
            assert!(
                matches!(s.verify(junk, Purpose::Upload, 0), Err(Error::Forbidden)),
                "{junk}"
            );
        }
    }
}
