//! Identifiers. Each is its own type so a host id can never be passed where a GPU UUID is
//! expected; names that operators type are validated where they enter the system.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A name or id that breaks the naming rule; the message names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} is invalid: {rule}")]
pub struct IdError {
    pub what: &'static str,
    pub value: String,
    pub rule: &'static str,
}

/// The naming rule shared by pools and hosts: what fits in a DNS label, so names can be
/// used in URLs and logs without quoting.
/// The rule operator-chosen names follow (pools, services): DNS-label-like, so they fit
/// in URLs, metrics labels and host names.
pub const NAME_RULE: &str =
    "use 1 to 63 lowercase letters, digits or '-', starting with a letter or digit";

/// [`NAME_RULE`] as a JSON Schema pattern (with [`NAME_MAX`]).
pub const NAME_PATTERN: &str = "^[a-z0-9][a-z0-9-]*$";
/// The longest name [`NAME_RULE`] allows.
pub const NAME_MAX: usize = 63;

/// Whether `value` follows [`NAME_RULE`].
pub fn is_valid_name(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= NAME_MAX
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !value.starts_with('-')
}

fn check_name(what: &'static str, value: &str) -> Result<(), IdError> {
    let ok = is_valid_name(value);
    if ok {
        Ok(())
    } else {
        Err(IdError {
            what,
            value: value.to_owned(),
            rule: NAME_RULE,
        })
    }
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $what:literal, $validated:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                if $validated {
                    check_name($what, &value)?;
                } else if value.trim().is_empty() {
                    return Err(IdError { what: $what, value, rule: "must not be empty" });
                }
                Ok(Self(value))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

string_id!(
    /// A pool's name (ECS: capacity provider), chosen by the operator.
    PoolName, "pool name", true
);
string_id!(
    /// A host's id, assigned by the control plane when the host first registers.
    HostId, "host id", true
);
string_id!(
    /// A GPU's UUID as NVML reports it (`GPU-8f5c…`); stable across reboots and slots.
    GpuUuid, "GPU UUID", false
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_names_follow_the_dns_label_rule() {
        assert!(PoolName::new("gpu-a").is_ok());
        assert!(PoolName::new("a1").is_ok());
        for bad in ["", "GPU", "-a", "a b", &"x".repeat(64)] {
            let err = PoolName::new(bad).expect_err(bad);
            assert!(err.to_string().contains("pool name"), "{err}");
        }
    }

    #[test]
    fn gpu_uuid_only_needs_to_be_non_empty() {
        assert!(GpuUuid::new("GPU-8f5c2a1e-0000").is_ok());
        assert!(GpuUuid::new("  ").is_err());
    }

    #[test]
    fn ids_deserialize_through_validation() {
        assert!(serde_json::from_str::<PoolName>("\"Bad Name\"").is_err());
        let ok: PoolName = serde_json::from_str("\"default\"").expect("valid name");
        assert_eq!(ok.as_str(), "default");
    }
}
