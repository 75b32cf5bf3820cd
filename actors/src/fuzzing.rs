//! Entry points for the coverage-guided fuzz targets in `fuzz/`: each runs one parser on
//! untrusted input the way the server does. None may panic, whatever the input.
#![doc(hidden)]

use std::sync::LazyLock;

use crate::links::{Purpose, Signer};
use crate::logs::RawEntry;

/// A webhook delivery: the signature check over the raw body, then the payload as the worker
/// reads it (repository, installation, branch patterns).
pub fn webhook(signature: &str, body: &[u8]) {
    let _ = crate::webhooks::signature_matches(b"fuzz-secret", Some(signature), body);
    if let Ok(p) = serde_json::from_slice::<crate::webhooks::payload::Payload>(body) {
        let name = p.repo_name().unwrap_or_default().to_string();
        let _ = p.installation_id();
        let _ = crate::webhooks::payload::matches(&name, signature);
    }
}

/// A configuration file in each of the five formats.
pub fn config_file(bytes: &[u8]) {
    for format in [".json", ".yaml", ".toml", ".ini", ".env"] {
        let _ = crate::rules::config_files::parse(format, bytes);
    }
}

/// A version and a constraint, and whether one matches the other.
pub fn versions(version: &str, constraint: &str) {
    let v = crate::versions::parse_version("version", version);
    if let (Ok(v), Ok(c)) = (
        v,
        crate::versions::Constraint::parse("constraint", constraint),
    ) {
        let _ = c.matches(&v);
    }
}

pub fn artifact_path(path: &str) {
    let _ = crate::rules::artifact_path(path);
}

/// A signed upload or download link: `data` as a token, and `data` as the claims of a token
/// signed with the right key (so the claims' parsing, purpose and expiry are reached).
pub fn link(data: &[u8]) {
    static SIGNER: LazyLock<Signer> = LazyLock::new(|| Signer::new(vec![7; 32]));
    let as_token = String::from_utf8_lossy(data);
    let signed = SIGNER.sign_claims(data).unwrap_or_default();
    for token in [as_token.as_ref(), signed.as_str()] {
        for purpose in [Purpose::Upload, Purpose::Download] {
            let _ = SIGNER.verify(token, purpose, 1_700_000_000);
        }
    }
}

const JWT_SECRET: &[u8] = b"fuzz-secret-of-at-least-32-bytes!";

/// A bearer value that is neither an API key nor a device token: decoded as a JWT.
pub fn jwt(token: &str) {
    let _ = crate::auth::decode_with(JWT_SECRET, token);
}

/// `claims` as the payload of an HS256 token signed with the right key, decoded (so the
/// claims' parsing and the `exp`/`sub`/`iat` checks are reached), and `claims` as a token.
pub fn jwt_claims(claims: &[u8]) {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let message = format!(
        "{}.{}",
        b64.encode(br#"{"alg":"HS256","typ":"JWT"}"#),
        b64.encode(claims)
    );
    let key = jsonwebtoken::EncodingKey::from_secret(JWT_SECRET);
    if let Ok(sig) =
        jsonwebtoken::crypto::sign(message.as_bytes(), &key, jsonwebtoken::Algorithm::HS256)
    {
        jwt(&format!("{message}.{sig}"));
    }
    jwt(&String::from_utf8_lossy(claims));
}

/// Parsed log entries turned into a stored chunk, and each entry read back.
pub fn log_entries(entries: Vec<RawEntry>) {
    if let Ok(chunk) = crate::logs::build_chunk(entries) {
        for i in 0..chunk.levels.len() {
            let _ = crate::logs::entry(&chunk, i);
        }
    }
}
