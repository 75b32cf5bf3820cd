//! Integration configs (their shape per type, validation, which fields are secret and how
//! they are masked) and the wire formats notifications are sent in: Slack incoming-webhook
//! JSON, PagerDuty Events API v2, e-mail, and signed webhooks (`X-Fleetops-Signature-256` and
//! the Standard Webhooks headers). Pure: the sender does the I/O.

use std::collections::BTreeMap;

use base64::Engine;
use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::clock::fmt_ms;
use crate::error::{Error, Result};
use crate::rules::targets::outbound_url;
use fleetops_storage::{AlertEvent, IntegrationType, RelatedDeployment, Severity};

/// PagerDuty's severities, the values `severity_mapping` may map to.
const PD_SEVERITIES: [&str; 4] = ["critical", "error", "warning", "info"];
const MAX_RECIPIENTS: usize = 50;

/// An integration's whole config, secrets included (in memory only).
#[derive(Debug, Clone, PartialEq)]
pub enum IntegrationConfig {
    Chat {
        webhook_url: String,
        channel: Option<String>,
    },
    Incident {
        integration_key: String,
        severity_mapping: BTreeMap<String, String>,
        service_id: Option<String>,
    },
    Email {
        recipients: Vec<String>,
        subject_prefix: String,
    },
    Webhook {
        url: String,
        method: String,
        signing_secret: String,
    },
}

/// What [`IntegrationConfig::parse`] takes for each type, as JSON Schemas keyed by type name,
/// for the OpenAPI document. The URL rules past the scheme (a host, no credentials, no private
/// networks unless allowed) and the signing secret's encoding are left to the parser.
pub fn config_schemas() -> Vec<(&'static str, Value)> {
    let text = |max: usize| serde_json::json!({"type": ["string", "null"], "maxLength": max});
    let url = serde_json::json!({"type": "string", "maxLength": 2048, "pattern": "^[\\t\\n\\r ]*[Hh][Tt][Tt][Pp][Ss]?://"});
    vec![
        (
            "chat",
            serde_json::json!({
                "type": "object", "additionalProperties": false, "required": ["webhook_url"],
                "properties": {"webhook_url": url, "channel": text(2048)}
            }),
        ),
        (
            "incident",
            serde_json::json!({
                "type": "object", "additionalProperties": false, "required": ["integration_key"],
                "properties": {
                    "integration_key": {"type": "string", "minLength": 1, "maxLength": 2048, "pattern": "[^\\t\\n\\u000B\\f\\r \\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000]"},
                    "severity_mapping": {
                        "type": ["object", "null"], "additionalProperties": false,
                        "properties": {
                            "critical": {"enum": PD_SEVERITIES},
                            "warning": {"enum": PD_SEVERITIES},
                            "info": {"enum": PD_SEVERITIES}
                        }
                    },
                    "service_id": text(2048)
                }
            }),
        ),
        (
            "email",
            serde_json::json!({
                "type": "object", "additionalProperties": false, "required": ["recipients"],
                "properties": {
                    "recipients": {"type": "array", "minItems": 1, "maxItems": MAX_RECIPIENTS,
                                   "items": {"type": "string", "format": "email"}},
                    "subject_prefix": {"type": ["string", "null"], "maxLength": 200, "pattern": "^[^\\r\\n]*$"}
                }
            }),
        ),
        (
            "webhook",
            serde_json::json!({
                "type": "object", "additionalProperties": false, "required": ["url", "signing_secret"],
                "properties": {
                    "url": url,
                    "method": {"type": ["string", "null"], "pattern": "^([Pp][Oo][Ss][Tt]|[Pp][Uu][Tt]|[Pp][Aa][Tt][Cc][Hh])$"},
                    "signing_secret": {"type": "string", "minLength": 1, "maxLength": 2048}
                }
            }),
        ),
    ]
}

/// The secret field of each type (the one masked and sealed).
pub fn secret_field(kind: IntegrationType) -> Option<&'static str> {
    match kind {
        IntegrationType::Chat => Some("webhook_url"),
        IntegrationType::Incident => Some("integration_key"),
        IntegrationType::Webhook => Some("signing_secret"),
        IntegrationType::Email => None,
    }
}

/// How a secret is shown: a chat URL as its scheme and host, anything else as its last four
/// characters at most (none when it is short).
pub fn mask(kind: IntegrationType, secret: &str) -> String {
    if kind == IntegrationType::Chat {
        return match url::Url::parse(secret) {
            Ok(u) => format!("{}://{}/****", u.scheme(), u.host_str().unwrap_or("")),
            Err(_) => "****".into(),
        };
    }
    let n = secret.chars().count();
    if n >= 16 {
        let tail: String = secret.chars().skip(n - 4).collect();
        format!("****{tail}")
    } else {
        "****".into()
    }
}

fn string(m: &Map<String, Value>, field: &str, required: bool) -> Result<Option<String>> {
    match m.get(field) {
        None | Some(Value::Null) if !required => Ok(None),
        None | Some(Value::Null) => Err(Error::unprocessable(
            &format!("config.{field}"),
            "is required",
        )),
        Some(Value::String(s)) if s.chars().count() <= 2048 => Ok(Some(s.clone())),
        Some(Value::String(_)) => Err(Error::unprocessable(
            &format!("config.{field}"),
            "at most 2048 characters",
        )),
        Some(_) => Err(Error::unprocessable(
            &format!("config.{field}"),
            "must be a string",
        )),
    }
}

fn no_other_keys(m: &Map<String, Value>, allowed: &[&str]) -> Result<()> {
    match m.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(Error::unprocessable(
            &format!("config.{k}"),
            format!(
                "is not a field of this type (expected {})",
                allowed.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

impl IntegrationConfig {
    /// Validates a whole config object for `kind`.
    pub fn parse(kind: IntegrationType, v: &Value, allow_private: bool) -> Result<Self> {
        let Value::Object(m) = v else {
            return Err(Error::unprocessable("config", "must be an object"));
        };
        Ok(match kind {
            IntegrationType::Chat => {
                no_other_keys(m, &["webhook_url", "channel"])?;
                let url = string(m, "webhook_url", true)?.unwrap_or_default();
                outbound_url("config.webhook_url", &url, allow_private)?;
                IntegrationConfig::Chat {
                    webhook_url: url.trim().to_string(),
                    channel: string(m, "channel", false)?,
                }
            }
            IntegrationType::Incident => {
                no_other_keys(m, &["integration_key", "severity_mapping", "service_id"])?;
                let key = string(m, "integration_key", true)?.unwrap_or_default();
                if key.trim().is_empty() {
                    return Err(Error::unprocessable(
                        "config.integration_key",
                        "must not be empty",
                    ));
                }
                let mut mapping = BTreeMap::new();
                match m.get("severity_mapping") {
                    None | Some(Value::Null) => {}
                    Some(Value::Object(sm)) => {
                        for (k, v) in sm {
                            if Severity::parse(k).is_none() {
                                return Err(Error::unprocessable(
                                    &format!("config.severity_mapping.{k}"),
                                    "keys are critical, warning and info",
                                ));
                            }
                            match v.as_str() {
                                Some(s) if PD_SEVERITIES.contains(&s) => {
                                    mapping.insert(k.clone(), s.to_string());
                                }
                                _ => {
                                    return Err(Error::unprocessable(
                                        &format!("config.severity_mapping.{k}"),
                                        "must be critical, error, warning or info",
                                    ));
                                }
                            }
                        }
                    }
                    Some(_) => {
                        return Err(Error::unprocessable(
                            "config.severity_mapping",
                            "must be an object",
                        ));
                    }
                }
                IntegrationConfig::Incident {
                    integration_key: key,
                    severity_mapping: mapping,
                    service_id: string(m, "service_id", false)?,
                }
            }
            IntegrationType::Email => {
                no_other_keys(m, &["recipients", "subject_prefix"])?;
                let Some(Value::Array(list)) = m.get("recipients") else {
                    return Err(Error::unprocessable(
                        "config.recipients",
                        "must be a list of e-mail addresses",
                    ));
                };
                if list.is_empty() || list.len() > MAX_RECIPIENTS {
                    return Err(Error::unprocessable(
                        "config.recipients",
                        format!("must hold 1-{MAX_RECIPIENTS} addresses"),
                    ));
                }
                let mut recipients = Vec::with_capacity(list.len());
                for (i, r) in list.iter().enumerate() {
                    let field = format!("config.recipients[{i}]");
                    let s = r
                        .as_str()
                        .ok_or_else(|| Error::unprocessable(&field, "must be a string"))?;
                    let addr = crate::rules::email(&field, s)?;
                    if addr.parse::<lettre::Address>().is_err() {
                        return Err(Error::unprocessable(
                            &field,
                            "is not a valid e-mail address",
                        ));
                    }
                    recipients.push(addr);
                }
                let prefix = string(m, "subject_prefix", false)?.unwrap_or_default();
                if prefix.chars().count() > 200 || prefix.contains(['\r', '\n']) {
                    return Err(Error::unprocessable(
                        "config.subject_prefix",
                        "at most 200 characters on one line",
                    ));
                }
                IntegrationConfig::Email {
                    recipients,
                    subject_prefix: prefix,
                }
            }
            IntegrationType::Webhook => {
                no_other_keys(m, &["url", "method", "signing_secret"])?;
                let url = string(m, "url", true)?.unwrap_or_default();
                outbound_url("config.url", &url, allow_private)?;
                let method = string(m, "method", false)?
                    .unwrap_or_else(|| "POST".into())
                    .to_ascii_uppercase();
                if !matches!(method.as_str(), "POST" | "PUT" | "PATCH") {
                    return Err(Error::unprocessable(
                        "config.method",
                        "must be POST, PUT or PATCH",
                    ));
                }
                let secret = string(m, "signing_secret", true)?.unwrap_or_default();
                if secret.is_empty() {
                    return Err(Error::unprocessable(
                        "config.signing_secret",
                        "must not be empty",
                    ));
                }
                standard_key(&secret)
                    .map_err(|why| Error::unprocessable("config.signing_secret", why))?;
                IntegrationConfig::Webhook {
                    url: url.trim().to_string(),
                    method,
                    signing_secret: secret,
                }
            }
        })
    }

    /// The config as stored: (the fields that are not secret, the secret field's value).
    pub fn split(&self) -> (Value, Option<String>) {
        match self {
            IntegrationConfig::Chat {
                webhook_url,
                channel,
            } => (json!({"channel": channel}), Some(webhook_url.clone())),
            IntegrationConfig::Incident {
                integration_key,
                severity_mapping,
                service_id,
            } => (
                json!({"severity_mapping": severity_mapping, "service_id": service_id}),
                Some(integration_key.clone()),
            ),
            IntegrationConfig::Email {
                recipients,
                subject_prefix,
            } => (
                json!({"recipients": recipients, "subject_prefix": subject_prefix}),
                None,
            ),
            IntegrationConfig::Webhook {
                url,
                method,
                signing_secret,
            } => (
                json!({"url": url, "method": method}),
                Some(signing_secret.clone()),
            ),
        }
    }

    /// The whole config object (secret included): `public` with the secret field put back.
    pub fn join(kind: IntegrationType, public: &Value, secret: Option<&str>) -> Value {
        let mut m = public.as_object().cloned().unwrap_or_default();
        if let (Some(f), Some(s)) = (secret_field(kind), secret) {
            m.insert(f.into(), Value::String(s.into()));
        }
        Value::Object(m)
    }
}

/// The Standard Webhooks key: the base64-decoded remainder of a `whsec_` secret, else the
/// secret's UTF-8 bytes.
pub fn standard_key(secret: &str) -> std::result::Result<Vec<u8>, &'static str> {
    match secret.strip_prefix("whsec_") {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| "a whsec_ secret must be followed by base64"),
        None => Ok(secret.as_bytes().to_vec()),
    }
}

/// What a notification says, whatever the integration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AlertMessage {
    pub event: AlertEvent,
    pub alert_id: Option<u64>,
    pub rule_id: Option<u64>,
    pub rule_name: String,
    pub severity: Severity,
    pub project: String,
    pub device_id: Option<u64>,
    pub device_name: Option<String>,
    pub summary: String,
    pub fired_at: i64,
    pub resolved_at: Option<i64>,
    /// Pairs an incident's trigger and resolve.
    pub dedup_key: String,
    pub related_deployment: Option<RelatedDeployment>,
}

impl AlertMessage {
    fn details(&self) -> Value {
        json!({
            "alert_id": self.alert_id,
            "rule_id": self.rule_id,
            "rule_name": self.rule_name,
            "severity": self.severity,
            "state": match self.event {
                AlertEvent::Resolved => "resolved",
                AlertEvent::Firing => "firing",
                AlertEvent::Test => "test",
            },
            "project": self.project,
            "device_id": self.device_id,
            "device_name": self.device_name,
            "summary": self.summary,
            "fired_at": fmt_ms(self.fired_at),
            "resolved_at": self.resolved_at.map(fmt_ms),
            "related_deployment": self.related_deployment.as_ref().map(|d| json!({
                "id": d.id,
                "name": d.name,
                "activated_at": fmt_ms(d.activated_at),
            })),
        })
    }

    fn headline(&self) -> String {
        let what = match self.event {
            AlertEvent::Firing => "FIRING",
            AlertEvent::Resolved => "RESOLVED",
            AlertEvent::Test => "TEST",
        };
        let mut s = format!("[{what}] [{}] {}", self.severity, self.summary);
        if let Some(d) = &self.related_deployment {
            s.push_str(&format!(
                " (deployment {} \"{}\" activated {})",
                d.id,
                d.name,
                fmt_ms(d.activated_at)
            ));
        }
        s
    }
}

/// One thing to send.
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    Http {
        method: String,
        url: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    Mail {
        to: Vec<String>,
        subject: String,
        body: String,
    },
}

/// The request for `cfg` telling `msg`. `delivery_id` is a fresh UUID; `now_secs` the
/// Standard Webhooks timestamp.
pub fn render(
    cfg: &IntegrationConfig,
    msg: &AlertMessage,
    pagerduty_url: &str,
    delivery_id: &str,
    now_secs: i64,
) -> Outbound {
    let json_headers = || vec![("content-type".to_string(), "application/json".to_string())];
    match cfg {
        IntegrationConfig::Chat { webhook_url, .. } => Outbound::Http {
            method: "POST".into(),
            url: webhook_url.clone(),
            headers: json_headers(),
            body: serde_json::to_vec(&json!({"text": msg.headline()})).unwrap_or_default(),
        },
        IntegrationConfig::Incident {
            integration_key,
            severity_mapping,
            ..
        } => {
            let body = if msg.event == AlertEvent::Resolved {
                json!({
                    "routing_key": integration_key,
                    "event_action": "resolve",
                    "dedup_key": msg.dedup_key,
                })
            } else {
                let severity = severity_mapping
                    .get(msg.severity.as_str())
                    .cloned()
                    .unwrap_or_else(|| msg.severity.as_str().to_string());
                json!({
                    "routing_key": integration_key,
                    "event_action": "trigger",
                    "dedup_key": msg.dedup_key,
                    "payload": {
                        // PagerDuty refuses (400, final) a summary over 1024 characters.
                        "summary": msg.headline().chars().take(1024).collect::<String>(),
                        "source": msg.device_name.clone().unwrap_or_else(|| format!("fleetops/{}", msg.project)),
                        "severity": severity,
                        "timestamp": fmt_ms(msg.fired_at),
                        "custom_details": msg.details(),
                    },
                })
            };
            Outbound::Http {
                method: "POST".into(),
                url: pagerduty_url.into(),
                headers: json_headers(),
                body: serde_json::to_vec(&body).unwrap_or_default(),
            }
        }
        IntegrationConfig::Email {
            recipients,
            subject_prefix,
        } => {
            let mut body = msg.headline();
            body.push_str("\n\n");
            body.push_str(&serde_json::to_string_pretty(&msg.details()).unwrap_or_default());
            body.push('\n');
            let mut subject = format!("{subject_prefix}{}", msg.summary);
            subject.retain(|c| c != '\r' && c != '\n');
            Outbound::Mail {
                to: recipients.clone(),
                subject,
                body,
            }
        }
        IntegrationConfig::Webhook {
            url,
            method,
            signing_secret,
        } => {
            let event = match msg.event {
                AlertEvent::Firing => "alert.firing",
                AlertEvent::Resolved => "alert.resolved",
                AlertEvent::Test => "alert.test",
            };
            let body = serde_json::to_vec(&json!({
                "event": event,
                "alert": msg.details(),
            }))
            .unwrap_or_default();
            let mut headers = json_headers();
            headers.push(("x-fleetops-event".into(), event.into()));
            headers.push(("x-fleetops-delivery".into(), delivery_id.into()));
            headers.push((
                "x-fleetops-signature-256".into(),
                format!(
                    "sha256={}",
                    hex::encode(hmac256(signing_secret.as_bytes(), &[&body]))
                ),
            ));
            let key =
                standard_key(signing_secret).unwrap_or_else(|_| signing_secret.as_bytes().to_vec());
            let ts = now_secs.to_string();
            let sig = hmac256(
                &key,
                &[delivery_id.as_bytes(), b".", ts.as_bytes(), b".", &body],
            );
            headers.push(("webhook-id".into(), delivery_id.into()));
            headers.push(("webhook-timestamp".into(), ts));
            headers.push((
                "webhook-signature".into(),
                format!(
                    "v1,{}",
                    base64::engine::general_purpose::STANDARD.encode(sig)
                ),
            ));
            Outbound::Http {
                method: method.clone(),
                url: url.clone(),
                headers,
                body,
            }
        }
    }
}

fn hmac256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    // HMAC takes keys of any length; this cannot fail.
    let Ok(mut m) = hmac::Hmac::<sha2::Sha256>::new_from_slice(key) else {
        return Vec::new();
    };
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests;
