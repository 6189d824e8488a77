//! Reading a JSON body into a request type as its published schema reads it.
//!
//! serde's derived `Deserialize` is more lenient than JSON Schema in one way and stricter in
//! another, and both made the API accept or refuse what its schema says otherwise:
//! - it reads a struct from an array of its fields in order (`[3, "llm:2"]` as a body, or
//!   `"constraints": [false, []]`), where the schema says `type: object`;
//! - it refuses `5.0` for an integer field, where JSON Schema counts a number whose fraction
//!   is zero as an integer.
//!
//! [`from_value`] reads through [`Strict`], a deserializer over `serde_json::Value` that
//! reads structs from objects only and hands integral floats to visitors as integers, at
//! every depth. Error messages keep the field's path (`alarms[0].for_secs: ...`).

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess,
    Unexpected, Visitor,
};
use serde_json::{Map, Number, Value};

/// `T` read from `v` as its schema reads it; errors name the field's path.
pub fn from_value<T: DeserializeOwned>(v: Value) -> Result<T, String> {
    serde_path_to_error::deserialize(Strict(v)).map_err(|e| e.to_string())
}

/// A JSON value read the way JSON Schema reads it (see the module's documentation).
pub struct Strict(pub Value);

fn unexpected(v: &Value) -> Unexpected<'_> {
    match v {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => Unexpected::Unsigned(u),
            (_, Some(i), _) => Unexpected::Signed(i),
            (_, _, Some(f)) => Unexpected::Float(f),
            _ => Unexpected::Other("number"),
        },
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

/// A number as a visitor of integers expects it: `5.0` is the integer 5.
fn visit_number<'de, V: Visitor<'de>>(
    n: Number,
    visitor: V,
) -> Result<V::Value, serde_json::Error> {
    if let Some(u) = n.as_u64() {
        return visitor.visit_u64(u);
    }
    if let Some(i) = n.as_i64() {
        return visitor.visit_i64(i);
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    // Within ±2^53 every integral float is exact; beyond it, leave it a float.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if f.fract() == 0.0 && f.abs() <= EXACT {
        if f >= 0.0 {
            return visitor.visit_u64(f as u64);
        }
        return visitor.visit_i64(f as i64);
    }
    visitor.visit_f64(f)
}

impl<'de> Deserializer<'de> for Strict {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(b),
            Value::Number(n) => visit_number(n, visitor),
            Value::String(s) => visitor.visit_string(s),
            Value::Array(items) => visit_seq(items, visitor),
            Value::Object(map) => visit_map(map, visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            other => visitor.visit_some(Strict(other)),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Object(map) => visit_map(map, visitor),
            other => Err(de::Error::invalid_type(unexpected(&other), &visitor)),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        // Unit variants are strings; the API has no other externally tagged enum.
        self.0.deserialize_enum(name, variants, visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

impl<'de> IntoDeserializer<'de, serde_json::Error> for Strict {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

fn visit_seq<'de, V: Visitor<'de>>(
    items: Vec<Value>,
    visitor: V,
) -> Result<V::Value, serde_json::Error> {
    let len = items.len();
    let mut seq = Seq(items.into_iter());
    let out = visitor.visit_seq(&mut seq)?;
    match seq.0.len() {
        0 => Ok(out),
        left => Err(de::Error::invalid_length(
            len - left,
            &"fewer elements in the array",
        )),
    }
}

fn visit_map<'de, V: Visitor<'de>>(
    map: Map<String, Value>,
    visitor: V,
) -> Result<V::Value, serde_json::Error> {
    visitor.visit_map(Entries {
        entries: map.into_iter(),
        value: None,
    })
}

struct Seq(std::vec::IntoIter<Value>);

impl<'de> SeqAccess<'de> for Seq {
    type Error = serde_json::Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        self.0
            .next()
            .map(|v| seed.deserialize(Strict(v)))
            .transpose()
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Entries {
    entries: serde_json::map::IntoIter,
    value: Option<Value>,
}

impl<'de> MapAccess<'de> for Entries {
    type Error = serde_json::Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        match self.entries.next() {
            Some((k, v)) => {
                self.value = Some(v);
                seed.deserialize(Strict(Value::String(k))).map(Some)
            }
            None => Ok(None),
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        let v = self
            .value
            .take()
            .ok_or_else(|| <serde_json::Error as de::Error>::custom("a value before its key"))?;
        seed.deserialize(Strict(v))
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::from_value;
    use serde::Deserialize;
    use serde_json::json;
    use std::collections::BTreeMap;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        count: u32,
        #[serde(default)]
        ratio: f64,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        name: String,
        #[serde(default)]
        inner: Option<Inner>,
        #[serde(default)]
        items: Vec<Inner>,
        #[serde(default)]
        labels: BTreeMap<String, String>,
        #[serde(default)]
        raw: Option<serde_json::Value>,
    }

    #[test]
    fn a_struct_is_read_from_an_object_only_at_any_depth() {
        let whole = from_value::<Outer>(json!(["x", null, [], {}, null])).unwrap_err();
        assert!(
            whole.contains("invalid type: sequence, expected struct Outer"),
            "{whole}"
        );
        let nested = from_value::<Outer>(json!({"name": "x", "inner": [3, 0.5]})).unwrap_err();
        assert!(
            nested.starts_with("inner: invalid type: sequence"),
            "{nested}"
        );
        let in_list = from_value::<Outer>(json!({"name": "x", "items": [[3, 0.5]]})).unwrap_err();
        assert!(
            in_list.starts_with("items[0]: invalid type: sequence"),
            "{in_list}"
        );
    }

    #[test]
    fn an_integral_float_is_an_integer_and_other_floats_are_not() {
        let v: Outer =
            from_value(json!({"name": "x", "inner": {"count": 5.0, "ratio": 2}})).unwrap();
        assert_eq!(
            v.inner,
            Some(Inner {
                count: 5,
                ratio: 2.0
            })
        );
        let half = from_value::<Outer>(json!({"name": "x", "inner": {"count": 5.5}})).unwrap_err();
        assert!(
            half.starts_with("inner.count: invalid type: floating point `5.5`"),
            "{half}"
        );
        let negative =
            from_value::<Outer>(json!({"name": "x", "inner": {"count": -1.0}})).unwrap_err();
        assert!(
            negative.contains("invalid value: integer `-1`"),
            "{negative}"
        );
        let huge =
            from_value::<Outer>(json!({"name": "x", "inner": {"count": 1e300}})).unwrap_err();
        assert!(huge.contains("floating point"), "{huge}");
        // A free-form value keeps what it was given, integral floats as integers.
        let raw: Outer =
            from_value(json!({"name": "x", "raw": {"a": [1.0, 1.5, "s", null]}})).unwrap();
        assert_eq!(raw.raw, Some(json!({"a": [1, 1.5, "s", null]})));
    }

    #[test]
    fn unknown_fields_nulls_and_maps_read_as_before() {
        let unknown = from_value::<Outer>(json!({"name": "x", "extra": 1})).unwrap_err();
        assert!(unknown.contains("unknown field `extra`"), "{unknown}");
        let v: Outer =
            from_value(json!({"name": "x", "inner": null, "labels": {"a": "b"}})).unwrap();
        assert_eq!(v.inner, None);
        assert_eq!(v.labels.get("a").map(String::as_str), Some("b"));
        let missing = from_value::<Outer>(json!({})).unwrap_err();
        assert!(missing.contains("missing field `name`"), "{missing}");
    }
}
