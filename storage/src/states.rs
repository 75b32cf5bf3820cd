//! The states records move through, as enums. Each is stored as its name, the same string the
//! API shows, so the record format is unchanged and an unknown name fails to decode instead
//! of passing as an unexpected string.

/// Declares a state enum with its wire names: `as_str`, `parse`, `Display`, and serde as the
/// name.
macro_rules! states {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every state, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            /// The state named `s` (exact, lower-case), if any.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({"type": "string", "enum": [$($text),+]})
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                $name::parse(&s).ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        concat!("unknown ", stringify!($name), " {:?}"),
                        s
                    ))
                })
            }
        }
    };
}

states! {
    /// A capsule's or configuration's validation.
    ValidationStatus {
        Pending = "pending",
        Passed = "passed",
        Failed = "failed",
    }
}

states! {
    /// A deployment package: draft → active → deprecated.
    DeploymentStatus {
        Draft = "draft",
        Active = "active",
        Deprecated = "deprecated",
    }
}

states! {
    /// A device's rollout result.
    RolloutStatus {
        Succeeded = "succeeded",
        Failed = "failed",
    }
}

states! {
    /// What became of an accepted webhook delivery.
    DeliveryOutcome {
        /// Waiting for the worker.
        Queued = "queued",
        /// Applied (an installation change, a repository sync).
        Processed = "processed",
        /// Made or cancelled test runs.
        Dispatched = "dispatched",
        /// Worked and left without effect, with a reason.
        Skipped = "skipped",
        /// An event fleetops does not subscribe to: logged, never parsed.
        Ignored = "ignored",
    }
}

states! {
    /// A source-host installation.
    InstallationState {
        Active = "active",
        Suspended = "suspended",
        Deleted = "deleted",
    }
}

states! {
    /// A test run: queued → running → passed | failed, or cancelled while queued or running.
    RunStatus {
        Queued = "queued",
        Running = "running",
        Passed = "passed",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

states! {
    /// The kind of an alert integration; fixed at creation.
    IntegrationType {
        /// A Slack-compatible incoming webhook.
        Chat = "chat",
        /// PagerDuty Events API v2.
        Incident = "incident",
        Email = "email",
        /// A signed HTTP request to any URL.
        Webhook = "webhook",
    }
}

states! {
    /// How urgent an alert is.
    Severity {
        Critical = "critical",
        Warning = "warning",
        Info = "info",
    }
}

states! {
    /// An alert: firing until its condition stops holding.
    AlertState {
        Firing = "firing",
        Resolved = "resolved",
    }
}

states! {
    /// What a notification tells its integration.
    AlertEvent {
        Firing = "firing",
        Resolved = "resolved",
        /// `POST /integrations/{id}/test` (never stored).
        Test = "test",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_the_codec_as_strings() {
        for s in RunStatus::ALL {
            assert_eq!(RunStatus::parse(s.as_str()), Some(*s));
            // Stored exactly as the string was, so existing records decode unchanged.
            let as_enum = postcard::to_stdvec(s).unwrap_or_default();
            let as_string = postcard::to_stdvec(s.as_str()).unwrap_or_default();
            assert_eq!(as_enum, as_string);
            assert_eq!(postcard::from_bytes::<RunStatus>(&as_string).ok(), Some(*s));
        }
        assert!(
            postcard::from_bytes::<RunStatus>(&postcard::to_stdvec("done").unwrap_or_default())
                .is_err()
        );
        assert_eq!(DeploymentStatus::parse("Draft"), None);
        assert_eq!(DeliveryOutcome::Dispatched.to_string(), "dispatched");
    }
}

states! {
    /// Where a device stands with a package it was assigned: the three intermediate states a
    /// robot passes through, then one of the two final ones (the rollout results).
    UpdateState {
        Downloading = "downloading",
        Installing = "installing",
        Rebooting = "rebooting",
        Succeeded = "succeeded",
        Failed = "failed",
        /// After `failed`: the robot's rollback hook put the previous software back.
        RolledBack = "rolled_back",
        /// After `failed`: the robot's rollback hook failed too.
        RollbackFailed = "rollback_failed",
        /// A member offered the failed package again; no report since.
        Retrying = "retrying",
    }
}

impl UpdateState {
    /// Whether a device may report this state (`retrying` is the service's own).
    pub fn reportable(self) -> bool {
        self != UpdateState::Retrying
    }

    /// The rollout result this state is, if it is a final one.
    pub fn result(self) -> Option<RolloutStatus> {
        match self {
            UpdateState::Succeeded => Some(RolloutStatus::Succeeded),
            UpdateState::Failed => Some(RolloutStatus::Failed),
            _ => None,
        }
    }
}

impl From<RolloutStatus> for UpdateState {
    fn from(s: RolloutStatus) -> Self {
        match s {
            RolloutStatus::Succeeded => UpdateState::Succeeded,
            RolloutStatus::Failed => UpdateState::Failed,
        }
    }
}

states! {
    /// A phased rollout of an active package.
    RolloutState {
        /// Phases start as their gates pass.
        Running = "running",
        /// Held by a gate or by a member; `resume` continues it.
        Paused = "paused",
        /// Every phase started and its last gate passed.
        Completed = "completed",
        /// Stopped for good; the devices already in keep the package.
        Aborted = "aborted",
        /// Stopped for good; the devices already in went back to their previous package.
        RolledBack = "rolled_back",
    }
}
