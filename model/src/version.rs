//! Versions of Tessera's binaries and what each accepts of the others.
//!
//! The compatibility policy (docs/operations.md, *Versions and upgrades*):
//! - a server serves agents of its own minor version and of the one before it, never
//!   newer ones (servers are upgraded first);
//! - migrations only add (tables, columns, rows), so a server of the previous minor
//!   version runs on the schema the newer one wrote ([`oldest_server_for`]);
//! - a major version says the policy does not hold across it.
//!
//! Agents before 0.2 sent no version: they are taken as [`UNVERSIONED_AGENT`].

use serde::{Deserialize, Serialize};
use std::fmt;

/// This build's version (the workspace's, every crate the same).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// This build's revision, as the release build set it (`TESSERA_BUILD`, the commit it was
/// built from); `dev` for a build that did not say.
pub const BUILD: &str = match option_env!("TESSERA_BUILD") {
    Some(b) => b,
    None => "dev",
};

/// What `--version` prints after the binary's name: `0.2.0 (build 1a2b3c4)`.
pub fn long() -> &'static str {
    static LONG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LONG.get_or_init(|| format!("{VERSION} (build {BUILD})"))
}

/// The version an agent that sends none is taken to have: every agent before 0.2.
pub const UNVERSIONED_AGENT: Version = Version {
    major: 0,
    minor: 1,
    patch: 0,
};

/// The most characters a version may have, suffix included.
pub const VERSION_MAX: usize = 64;
/// What a version looks like as text (the API's schema of it): `MAJOR.MINOR.PATCH`, each
/// at most 9 digits, then an optional `-pre-release` or `+build` suffix.
pub const VERSION_PATTERN: &str = r"^[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}([-+][0-9A-Za-z.+-]*)?$";

/// A `MAJOR.MINOR.PATCH` version (a pre-release or build suffix is read and ignored), at
/// most [`VERSION_MAX`] characters in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    /// This build's version.
    pub fn current() -> Version {
        VERSION
            .parse()
            .expect("the crate's version is MAJOR.MINOR.PATCH")
    }

    /// The oldest version of the same major whose minor is one before this one (itself at
    /// minor 0): the oldest agent this server serves, the oldest server its schema keeps.
    pub fn previous_minor(self) -> Version {
        Version {
            major: self.major,
            minor: self.minor.saturating_sub(1),
            patch: 0,
        }
    }

    /// `MAJOR.MINOR`, as the policy speaks of versions.
    pub fn minor_line(self) -> String {
        format!("{}.{}", self.major, self.minor)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl std::str::FromStr for Version {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let core = s.split(['-', '+']).next().unwrap_or_default();
        let parts: Vec<&str> = core.split('.').collect();
        let bad = || format!("{s:?} is not a version (MAJOR.MINOR.PATCH, e.g. 0.2.0)");
        if parts.len() != 3 || s.len() > VERSION_MAX {
            return Err(bad());
        }
        let n = |p: &str| {
            (!p.is_empty() && p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit()))
                .then(|| p.parse::<u32>().ok())
                .flatten()
                .ok_or_else(bad)
        };
        Ok(Version {
            major: n(parts[0])?,
            minor: n(parts[1])?,
            patch: n(parts[2])?,
        })
    }
}

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Whether a server of version `server` serves an agent that says it is `agent` (`None`:
/// it said nothing, an agent before 0.2). The refusal names both versions, the ones
/// served, and what to upgrade.
pub fn serves_agent(server: Version, agent: Option<Version>) -> Result<(), String> {
    let agent_said = agent.is_some();
    let agent = agent.unwrap_or(UNVERSIONED_AGENT);
    let oldest = server.previous_minor();
    let served = if oldest.minor == server.minor {
        format!("agents {}", server.minor_line())
    } else {
        format!("agents {} and {}", oldest.minor_line(), server.minor_line())
    };
    let named = if agent_said {
        format!("tessera-agent {agent}")
    } else {
        format!("a tessera-agent that sends no version (before 0.2, taken as {agent})")
    };
    if agent.major == server.major && agent.minor > server.minor {
        return Err(format!(
            "{named} is newer than this server (tessera {server}), which serves {served}: \
             upgrade the servers first, then the agents"
        ));
    }
    if agent.major != server.major || agent.minor < oldest.minor {
        let direction = if agent.major > server.major {
            format!("upgrade the servers to {}.x first", agent.major)
        } else {
            format!("upgrade tessera-agent on this host (to {server})")
        };
        return Err(format!(
            "{named} is not served by this server (tessera {server}), which serves {served}: \
             {direction}"
        ));
    }
    Ok(())
}

/// The oldest server version that runs on the schema a server of version `writer` made:
/// the previous minor's (migrations only add).
pub fn oldest_server_for(writer: Version) -> Version {
    writer.previous_minor()
}

/// A binary's version as it reports itself (the cluster view, the console's footer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BuildInfo {
    /// `MAJOR.MINOR.PATCH`.
    pub version: String,
    /// The revision it was built from (`dev` when the build did not say).
    pub build: String,
}

impl BuildInfo {
    /// This binary's.
    pub fn this() -> BuildInfo {
        BuildInfo {
            version: VERSION.to_owned(),
            build: BUILD.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    #[test]
    fn versions_parse_and_ignore_their_suffix() {
        assert_eq!(
            v("0.2.1"),
            Version {
                major: 0,
                minor: 2,
                patch: 1
            }
        );
        assert_eq!(
            v("1.10.0-rc.1+abc"),
            Version {
                major: 1,
                minor: 10,
                patch: 0
            }
        );
        for bad in [
            "",
            "1",
            "1.2",
            "1.2.3.4",
            "a.b.c",
            "1..3",
            "-1.2.3",
            "1.2.3456789012",
        ] {
            let e = bad.parse::<Version>().unwrap_err();
            assert!(e.contains("is not a version"), "{bad}: {e}");
        }
        assert!(v("0.10.0") > v("0.9.9"));
        assert_eq!(Version::current().to_string(), VERSION);
        assert!(
            long().starts_with(VERSION) && long().contains("(build "),
            "{}",
            long()
        );
    }

    #[test]
    fn a_server_serves_its_minor_and_the_one_before_and_says_what_to_upgrade() {
        let server = v("0.3.2");
        assert_eq!(serves_agent(server, Some(v("0.3.0"))), Ok(()));
        assert_eq!(serves_agent(server, Some(v("0.3.9"))), Ok(()));
        assert_eq!(serves_agent(server, Some(v("0.2.7"))), Ok(()));

        let old = serves_agent(server, Some(v("0.1.4"))).unwrap_err();
        assert_eq!(
            old,
            "tessera-agent 0.1.4 is not served by this server (tessera 0.3.2), which serves \
             agents 0.2 and 0.3: upgrade tessera-agent on this host (to 0.3.2)"
        );
        let new = serves_agent(server, Some(v("0.4.0"))).unwrap_err();
        assert!(new.contains("tessera-agent 0.4.0 is newer than this server (tessera 0.3.2)"));
        assert!(new.contains("upgrade the servers first"), "{new}");
        let other_major = serves_agent(server, Some(v("1.3.0"))).unwrap_err();
        assert!(
            other_major.ends_with("upgrade the servers to 1.x first"),
            "{other_major}"
        );
        assert!(serves_agent(v("1.0.0"), Some(v("0.9.0"))).is_err());
    }

    #[test]
    fn an_agent_that_sends_no_version_is_one_before_0_2() {
        assert_eq!(serves_agent(v("0.1.0"), None), Ok(()));
        assert_eq!(serves_agent(v("0.2.5"), None), Ok(()));
        let e = serves_agent(v("0.3.0"), None).unwrap_err();
        assert!(
            e.starts_with("a tessera-agent that sends no version (before 0.2, taken as 0.1.0)")
        );
        assert!(e.contains("serves agents 0.2 and 0.3"), "{e}");
    }

    #[test]
    fn a_schema_keeps_the_previous_minors_servers() {
        assert_eq!(oldest_server_for(v("0.2.3")), v("0.1.0"));
        assert_eq!(oldest_server_for(v("1.0.0")), v("1.0.0"));
    }
}
