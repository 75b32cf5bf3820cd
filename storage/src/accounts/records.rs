//! Users, organizations, their members, projects and API keys.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Role {
    Viewer,
    Member,
    Admin,
    Owner,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Member => "member",
            Role::Admin => "admin",
            Role::Owner => "owner",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "viewer" => Role::Viewer,
            "member" => Role::Member,
            "admin" => Role::Admin,
            "owner" => Role::Owner,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct User {
    pub id: u64,
    /// Lower-cased; unique.
    pub email: String,
    /// argon2id PHC string.
    pub password_hash: String,
    pub is_superuser: bool,
    pub created_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Organization {
    pub id: u64,
    pub slug: String,
    pub name: String,
    pub tier: String,
    pub created_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Membership {
    pub org_id: u64,
    pub user_id: u64,
    pub role: Role,
    pub created_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Project {
    pub id: u64,
    pub org_id: u64,
    pub slug: String,
    pub name: String,
    /// SHA-256 of the current project secret; the secret itself is never stored.
    pub secret_hash: [u8; 32],
    pub created_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiKey {
    pub id: u64,
    pub user_id: u64,
    pub name: String,
    /// The first characters of the key (`fops_` and a few more), shown in lists.
    pub prefix: String,
    pub hash: [u8; 32],
    pub created_at: i64,
    pub last_used_at: Option<i64>,
}
