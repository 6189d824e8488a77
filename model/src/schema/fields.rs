//! The schemas of single fields (names, references, labels, agent text, policies) that
//! the API's types name with `schema_with`. A leaf: it knows no API type, so those types
//! and the whole-body schemas in [`super`] can both use it.

use crate::ids::{NAME_MAX, NAME_PATTERN};
use serde_json::{Value, json};
use utoipa::openapi::ObjectBuilder;
use utoipa::openapi::schema::{Schema, SchemaType, Type};

/// `family:revision`, e.g. `llm-serve:3`.
pub const TASK_DEF_REF_PATTERN: &str = r"^[A-Za-z0-9_-]{1,255}:[1-9][0-9]{0,8}$";
/// A family, or one revision of it.
pub const FAMILY_OR_REF_PATTERN: &str = r"^[A-Za-z0-9_-]{1,255}(:[1-9][0-9]{0,8})?$";

/// A schema written as JSON. Only keywords utoipa's model knows survive (it has no `not`
/// or `contains`), so the schemas below keep to those.
pub fn from_json(v: Value) -> Schema {
    serde_json::from_value(v).expect("a schema utoipa can read")
}

/// A name that follows [`crate::ids::NAME_RULE`] (pools, hosts, services).
pub fn name() -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::String))
        .pattern(Some(NAME_PATTERN))
        .max_length(Some(NAME_MAX))
        .description(Some(crate::ids::NAME_RULE))
        .into()
}

/// An optional name (see [`name`]).
pub fn optional_name() -> Schema {
    from_json(json!({
        "type": ["string", "null"],
        "pattern": NAME_PATTERN,
        "maxLength": NAME_MAX,
        "description": crate::ids::NAME_RULE,
    }))
}

/// A new password: at least [`crate::limits::accounts::MIN_PASSWORD_LEN`] characters.
pub fn password() -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::String))
        .min_length(Some(crate::limits::accounts::MIN_PASSWORD_LEN))
        .into()
}

/// A `family:revision` reference.
pub fn task_def_ref() -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::String))
        .pattern(Some(TASK_DEF_REF_PATTERN))
        .description(Some("family:revision, e.g. llm-serve:3"))
        .into()
}

/// Host labels a service requires: keys are not empty.
pub fn labels() -> Schema {
    from_json(
        json!({"type": "object", "propertyNames": {"type": "string", "minLength": 1}, "additionalProperties": {"type": "string"}}),
    )
}

/// Text an agent reports: at most 256 characters, no NUL.
pub fn agent_text() -> Schema {
    from_json(
        json!({"type": "string", "minLength": 1, "maxLength": 256, "pattern": "^[^\\u0000]*$"}),
    )
}

/// An agent's host labels: keys and values are agent text.
pub fn agent_labels() -> Schema {
    from_json(json!({"type": "object", "maxProperties": 64,
        "propertyNames": {"type": "string", "minLength": 1, "maxLength": 256, "pattern": "^[^\\u0000]*$"},
        "additionalProperties": {"type": "string", "maxLength": 256, "pattern": "^[^\\u0000]*$"}}))
}

/// An agent's version (`tessera-agent --version`), absent from an agent before 0.2.
pub fn optional_agent_version() -> Schema {
    from_json(json!({
        "type": ["string", "null"],
        "maxLength": crate::version::VERSION_MAX,
        "pattern": crate::version::VERSION_PATTERN,
    }))
}

/// An optional placement policy given as text.
pub fn optional_policy() -> Schema {
    // `null` is listed too: an enum admits only what it lists, whatever `type` says.
    let mut names: Vec<Value> = crate::PlacementPolicy::ALL
        .iter()
        .map(|p| json!(p.as_str()))
        .collect();
    names.push(Value::Null);
    from_json(json!({ "type": ["string", "null"], "enum": names }))
}

/// An optional pool admission given as text.
pub fn optional_admission() -> Schema {
    let mut names: Vec<Value> = crate::Admission::ALL
        .iter()
        .map(|a| json!(a.as_str()))
        .collect();
    names.push(Value::Null);
    from_json(json!({ "type": ["string", "null"], "enum": names }))
}

/// An optional preemption mode given as text.
pub fn optional_preemption() -> Schema {
    let mut names: Vec<Value> = crate::inventory::PreemptionMode::ALL
        .iter()
        .map(|a| json!(a.as_str()))
        .collect();
    names.push(Value::Null);
    from_json(json!({ "type": ["string", "null"], "enum": names }))
}

/// An optional GPU budget mode given as text.
pub fn optional_gpu_budget() -> Schema {
    let mut names: Vec<Value> = crate::inventory::GpuBudget::ALL
        .iter()
        .map(|a| json!(a.as_str()))
        .collect();
    names.push(Value::Null);
    from_json(json!({ "type": ["string", "null"], "enum": names }))
}

/// An optional priority class given as text.
pub fn optional_priority() -> Schema {
    let mut names: Vec<Value> = crate::inventory::PriorityClass::ALL
        .iter()
        .map(|p| json!(p.as_str()))
        .collect();
    names.push(Value::Null);
    from_json(json!({ "type": ["string", "null"], "enum": names }))
}
