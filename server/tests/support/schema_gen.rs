//! A generator of instances of JSON Schemas, for the schema-driven fuzzer in
//! `openapi.rs`: the subset of JSON Schema the API's document uses (`$ref`, `allOf`,
//! `anyOf`, `oneOf`, `enum`, `const`, types, bounds, `pattern`, `prefixItems`,
//! `propertyNames`). Approximate on purpose: the fuzzer checks every instance against its
//! schema before sending it, so the generator only has to hit valid ones often.

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

/// A small deterministic generator (xorshift), so a failing case can be replayed.
pub struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// Generates instances of JSON Schemas (the subset the document uses). Approximate on
/// purpose: every instance is checked against the schema before it is sent.
pub struct Generator {
    pub doc: &'static Value,
    pub rng: Rng,
    pub runner: TestRunner,
}

impl Generator {
    fn deref<'a>(&self, schema: &'a Value) -> &'a Value {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => self.deref(
                self.doc
                    .pointer(r.trim_start_matches('#'))
                    .unwrap_or_else(|| panic!("{r} resolves")),
            ),
            None => schema,
        }
    }

    /// `allOf`, and a chosen branch of each `anyOf`, merged into one schema.
    fn flatten(&mut self, schema: &Value) -> Map<String, Value> {
        let schema = self.deref(schema);
        let Some(mut out) = schema.as_object().cloned() else {
            return Map::new();
        };
        for key in ["allOf", "anyOf"] {
            let Some(Value::Array(parts)) = out.remove(key) else {
                continue;
            };
            let parts = if key == "anyOf" {
                vec![self.rng.pick(&parts).clone()]
            } else {
                parts
            };
            for part in parts {
                let part = self.flatten(&part);
                merge(&mut out, part);
            }
        }
        out
    }

    fn string_from(&mut self, pattern: &str) -> Option<String> {
        let p = pattern.trim_start_matches('^').trim_end_matches('$');
        let strategy = proptest::string::string_regex(p).ok()?;
        Some(strategy.new_tree(&mut self.runner).ok()?.current())
    }

    fn plain_string(&mut self, min: u64, max: u64) -> String {
        const ALPHABET: &[char] = &['a', 'b', 'z', 'A', 'Q', '0', '7', '-', '_', ' ', 'é', '字'];
        let len = min + self.rng.below(max.min(min + 12) - min + 1);
        (0..len).map(|_| *self.rng.pick(ALPHABET)).collect()
    }

    pub fn value(&mut self, schema: &Value, depth: u32) -> Value {
        let s = self.flatten(schema);
        if let Some(Value::Array(items)) = s.get("oneOf") {
            let chosen = self.rng.pick(items).clone();
            return self.value(&chosen, depth);
        }
        if let Some(Value::Array(options)) = s.get("enum") {
            return self.rng.pick(options).clone();
        }
        if let Some(c) = s.get("const") {
            return c.clone();
        }
        let types: Vec<String> = match s.get("type") {
            Some(Value::String(t)) => vec![t.clone()],
            Some(Value::Array(ts)) => ts
                .iter()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect(),
            _ if s.contains_key("properties") => vec!["object".into()],
            _ => vec!["string".into()],
        };
        let non_null: Vec<String> = types.iter().filter(|t| *t != "null").cloned().collect();
        if non_null.is_empty() || (types.len() > non_null.len() && self.rng.chance(15)) {
            return Value::Null;
        }
        let num = |k: &str| s.get(k).and_then(Value::as_f64);
        match self.rng.pick(&non_null).as_str() {
            "boolean" => json!(self.rng.chance(50)),
            "integer" => {
                let lo = num("minimum").unwrap_or(0.0) as i64;
                let hi = num("maximum").unwrap_or(lo as f64 + 1000.0) as i64;
                let span = (hi - lo) as u64;
                json!(match self.rng.below(4) {
                    0 => lo,
                    1 => hi,
                    _ => lo + self.rng.below(span + 1) as i64,
                })
            }
            "number" => {
                let lo = num("minimum").unwrap_or(0.0);
                let hi = num("maximum").unwrap_or(lo + 1000.0);
                json!(lo + (hi - lo) * (self.rng.below(1001) as f64 / 1000.0))
            }
            "array" => {
                let min = num("minItems").unwrap_or(0.0) as u64;
                let max = (num("maxItems").unwrap_or(3.0).min(3.0) as u64).max(min);
                let n = min + self.rng.below(max - min + 1);
                let prefix = s
                    .get("prefixItems")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let items = s.get("items").cloned().unwrap_or(json!({}));
                (0..n as usize)
                    .map(|i| self.value(prefix.get(i).unwrap_or(&items), depth + 1))
                    .collect()
            }
            "object" => {
                let mut out = Map::new();
                let required: BTreeSet<String> = s
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| {
                        r.iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let props = s
                    .get("properties")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                for (k, p) in &props {
                    if required.contains(k) || (depth < 4 && self.rng.chance(50)) {
                        out.insert(k.clone(), self.value(p, depth + 1));
                    }
                }
                if let Some(extra) = s.get("additionalProperties").filter(|a| a.is_object()) {
                    let names = s
                        .get("propertyNames")
                        .cloned()
                        .unwrap_or(json!({"type": "string", "minLength": 1}));
                    for _ in 0..self.rng.below(3) {
                        let key = match self.value(&names, depth + 1) {
                            Value::String(k) => k,
                            other => other.to_string(),
                        };
                        out.insert(key, self.value(extra, depth + 1));
                    }
                }
                Value::Object(out)
            }
            _ => {
                let min = num("minLength").unwrap_or(0.0) as u64;
                let max = (num("maxLength").unwrap_or(24.0).min(64.0) as u64).max(min);
                if let Some(p) = s.get("pattern").and_then(Value::as_str)
                    && let Some(v) = self.string_from(p)
                {
                    return json!(v);
                }
                json!(self.plain_string(min, max))
            }
        }
    }
}

/// `b` into `a`: properties merged key by key (`b`'s keywords win), `required` unioned.
fn merge(a: &mut Map<String, Value>, b: Map<String, Value>) {
    for (k, v) in b {
        match (k.as_str(), a.get_mut(&k), v) {
            ("properties", Some(Value::Object(mine)), Value::Object(theirs)) => {
                for (name, schema) in theirs {
                    match (mine.get_mut(&name), schema) {
                        (Some(Value::Object(m)), Value::Object(t)) => m.extend(t),
                        (_, schema) => {
                            mine.insert(name, schema);
                        }
                    }
                }
            }
            ("required", Some(Value::Array(mine)), Value::Array(theirs)) => {
                for r in theirs {
                    if !mine.contains(&r) {
                        mine.push(r);
                    }
                }
            }
            (_, _, v) => {
                a.insert(k, v);
            }
        }
    }
}
