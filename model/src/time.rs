//! Moments in time as the API, the store and the console carry them: [`Timestamp`], one
//! UTC instant to the millisecond, compared as a time and written as RFC 3339
//! (`2026-11-30T12:00:09.000Z`), the form the store keeps and every answer shows.

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// One instant (UTC, millisecond precision). Ordered as time; parsed from any RFC 3339
/// offset and written in UTC with milliseconds and `Z`, so two written forms of one
/// instant read back equal.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(DateTime<Utc>);

impl Default for Timestamp {
    /// The Unix epoch: the time of a value not stored yet.
    fn default() -> Self {
        Timestamp::EPOCH
    }
}

/// Text that is not an RFC 3339 time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an RFC 3339 time (like 2026-11-30T12:00:09.000Z)")]
pub struct TimestampError(pub String);

impl Timestamp {
    /// 1970-01-01T00:00:00.000Z.
    pub const EPOCH: Timestamp = Timestamp(DateTime::<Utc>::UNIX_EPOCH);

    /// Milliseconds since the Unix epoch; `None` outside the representable range.
    pub fn from_millis(ms: i64) -> Option<Timestamp> {
        Utc.timestamp_millis_opt(ms).single().map(Timestamp)
    }

    pub fn millis(self) -> i64 {
        self.0.timestamp_millis()
    }

    /// From chrono's time, to the millisecond.
    pub fn from_utc(t: DateTime<Utc>) -> Timestamp {
        Timestamp::from_millis(t.timestamp_millis()).unwrap_or(Timestamp(t))
    }

    pub fn to_utc(self) -> DateTime<Utc> {
        self.0
    }

    /// This instant `ms` milliseconds later (earlier when negative), saturating at the
    /// ends of the range.
    pub fn plus_millis(self, ms: i64) -> Timestamp {
        Timestamp::from_millis(self.millis().saturating_add(ms)).unwrap_or(self)
    }

    /// As the console shows a moment: `2026-11-30 12:00:09` (UTC).
    pub fn short(self) -> String {
        self.0.format("%Y-%m-%d %H:%M:%S").to_string()
    }

    /// The time of day only, `12:00:09` (UTC): for lists of the last hours.
    pub fn clock(self) -> String {
        self.0.format("%H:%M:%S").to_string()
    }

    /// Milliseconds from `earlier` to this instant (negative when `earlier` is later).
    pub fn millis_since(self, earlier: Timestamp) -> i64 {
        self.millis() - earlier.millis()
    }
}

impl FromStr for Timestamp {
    type Err = TimestampError;
    fn from_str(s: &str) -> Result<Self, TimestampError> {
        DateTime::parse_from_rfc3339(s.trim())
            .map(|t| Timestamp::from_utc(t.with_timezone(&Utc)))
            .map_err(|_| TimestampError(s.to_owned()))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.to_rfc3339_opts(SecondsFormat::Millis, true))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Timestamp {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::DateTime,
            )))
            .description(Some("RFC 3339, UTC, e.g. 2026-11-30T12:00:09.000Z"))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Timestamp {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("Timestamp")
    }
}

/// A text column (`TEXT` in both stores), written as [`Timestamp`]'s `Display`.
#[cfg(feature = "sqlx")]
mod column {
    use super::Timestamp;
    use sqlx::encode::IsNull;
    use sqlx::error::BoxDynError;
    use sqlx::{Database, Decode, Encode, Type};

    impl<DB: Database> Type<DB> for Timestamp
    where
        String: Type<DB>,
    {
        fn type_info() -> DB::TypeInfo {
            <String as Type<DB>>::type_info()
        }

        fn compatible(ty: &DB::TypeInfo) -> bool {
            <String as Type<DB>>::compatible(ty)
        }
    }

    impl<'r, DB: Database> Decode<'r, DB> for Timestamp
    where
        String: Decode<'r, DB>,
    {
        fn decode(value: <DB as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
            Ok(<String as Decode<'r, DB>>::decode(value)?.parse()?)
        }
    }

    impl<'q, DB: Database> Encode<'q, DB> for Timestamp
    where
        String: Encode<'q, DB>,
    {
        fn encode_by_ref(
            &self,
            buf: &mut <DB as Database>::ArgumentBuffer<'q>,
        ) -> Result<IsNull, BoxDynError> {
            <String as Encode<'q, DB>>::encode(self.to_string(), buf)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("a time")
    }

    #[test]
    fn times_compare_as_times_not_as_text() {
        // As text, "…T12:00:09Z" sorts after "…T12:00:09.5Z" ('Z' > '.'); as times it is
        // earlier. And an offset is the same instant written otherwise.
        assert!(at("2026-11-30T12:00:09Z") < at("2026-11-30T12:00:09.500Z"));
        assert_eq!(
            at("2026-11-30T13:00:09+01:00"),
            at("2026-11-30T12:00:09.000Z")
        );
        assert!(at("2026-11-30T12:00:10.000+00:00") > at("2026-11-30T12:00:09.999Z"));
    }

    #[test]
    fn written_in_one_form_and_read_back() {
        let t = at("2026-11-30T13:00:09.1234+01:00");
        assert_eq!(t.to_string(), "2026-11-30T12:00:09.123Z");
        assert_eq!(at(&t.to_string()), t);
        let json = serde_json::to_value(t).expect("serialises");
        assert_eq!(json, serde_json::json!("2026-11-30T12:00:09.123Z"));
        assert_eq!(
            serde_json::from_value::<Timestamp>(json).expect("reads back"),
            t
        );
        assert_eq!(t.plus_millis(877).to_string(), "2026-11-30T12:00:10.000Z");
        assert_eq!(t.plus_millis(877).millis_since(t), 877);
        assert_eq!(
            (t.short().as_str(), t.clock().as_str()),
            ("2026-11-30 12:00:09", "12:00:09")
        );
    }

    #[test]
    fn what_is_not_a_time_is_refused_by_name() {
        for bad in ["", "yesterday", "2026-11-30", "2026-13-01T00:00:00Z"] {
            let e = bad.parse::<Timestamp>().expect_err(bad);
            assert!(e.to_string().contains("RFC 3339"), "{e}");
        }
        assert!(serde_json::from_value::<Timestamp>(serde_json::json!("soon")).is_err());
    }
}
