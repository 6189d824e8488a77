//! The rules: limits, names, and the checks that hold whatever shape the input came in;
//! `Checker` collects every error with its field while the parsers walk a document.

use super::*;
use crate::limits::task_definition::*;

/// What [`valid_name`] accepts, as a JSON Schema pattern (families and container names).
pub const FAMILY_PATTERN: &str = r"^[A-Za-z0-9_-]{1,255}$";

/// Collects errors while walking a JSON document.
pub(super) struct Checker {
    pub(super) errors: Vec<FieldError>,
}

impl Checker {
    pub(super) fn err(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    pub(super) fn object<'a>(
        &mut self,
        v: &'a Value,
        field: &str,
    ) -> Option<&'a Map<String, Value>> {
        match v.as_object() {
            Some(o) => Some(o),
            None => {
                self.err(field, format!("must be an object, got {}", kind(v)));
                None
            }
        }
    }

    pub(super) fn string(
        &mut self,
        o: &Map<String, Value>,
        key: &str,
        field: &str,
    ) -> Option<String> {
        match o.get(key) {
            None | Some(Value::Null) => {
                self.err(field, "is required");
                None
            }
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => {
                self.err(field, format!("must be a string, got {}", kind(v)));
                None
            }
        }
    }

    /// A whole number in `min..=max`; `required` decides whether absence is an error.
    pub(super) fn number(
        &mut self,
        o: &Map<String, Value>,
        key: &str,
        field: &str,
        min: u64,
        max: u64,
        required: bool,
    ) -> Option<u64> {
        match o.get(key) {
            None | Some(Value::Null) => {
                if required {
                    self.err(field, "is required");
                }
                None
            }
            Some(v) => match v.as_u64() {
                Some(n) if (min..=max).contains(&n) => Some(n),
                Some(n) => {
                    self.err(field, format!("must be between {min} and {max}, got {n}"));
                    None
                }
                None => {
                    self.err(
                        field,
                        format!("must be a whole number between {min} and {max}, got {v}"),
                    );
                    None
                }
            },
        }
    }

    /// The family name, checked at once so its error comes with the others.
    pub(super) fn family(&mut self, o: &Map<String, Value>) -> Option<String> {
        let family = self.string(o, "family", "family")?;
        if !valid_name(&family) {
            self.err("family", "use 1 to 255 letters, digits, '-' or '_'");
        }
        Some(family)
    }

    pub(super) fn unknown_keys(&mut self, o: &Map<String, Value>, allowed: &[&str], prefix: &str) {
        for key in o.keys() {
            if !allowed.contains(&key.as_str()) {
                // An empty key still gets a field that names it.
                let shown = if key.is_empty() { "\"\"" } else { key };
                self.err(
                    join(prefix, shown),
                    format!(
                        "is not a known field (expected one of: {})",
                        allowed.join(", ")
                    ),
                );
            }
        }
    }
}

/// What a JSON value is, in words, for error messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A field that is given: present and not null (a null reads as left out).
pub(super) fn given<'a>(o: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    o.get(key).filter(|v| !v.is_null())
}

pub(super) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

/// A family or container name: letters, digits, `-` and `_`, 1 to 255 of them.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

pub(super) fn valid_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Rules that hold whatever the input shape was.
pub(super) fn check_spec(c: &mut Checker, spec: &TaskDefinitionSpec) {
    if spec.containers.is_empty() {
        c.err("containers", "needs at least one container");
    }
    if spec.containers.len() > MAX_CONTAINERS {
        c.err(
            "containers",
            format!("at most {MAX_CONTAINERS} containers per task"),
        );
    }
    let mut names = BTreeSet::new();
    let (mut whole, mut mps) = (false, false);
    for (i, ct) in spec.containers.iter().enumerate() {
        let p = format!("containers[{i}]");
        if !valid_name(&ct.name) {
            c.err(join(&p, "name"), "use 1 to 255 letters, digits, '-' or '_'");
        } else if !names.insert(ct.name.as_str()) {
            c.err(
                join(&p, "name"),
                format!("{:?} is used by another container of this task", ct.name),
            );
        }
        let program = ct.entry_point.first().or(ct.command.first());
        if ct.image.is_none() && program.is_none_or(|p| p.trim().is_empty()) {
            c.err(
                join(&p, "command"),
                "must name a program: a non-empty first element (or give an image)",
            );
        }
        for k in ct.env.keys() {
            if !valid_env_name(k) {
                c.err(format!("{p}.env.{k}"), "is not a valid variable name (letters, digits, '_', not starting with a digit)");
            } else if RESERVED_ENV.contains(&k.as_str()) {
                c.err(
                    format!("{p}.env.{k}"),
                    "is set by the agent from the placement; remove it",
                );
            }
        }
        for (k, v) in &ct.secrets {
            let f = format!("{p}.secrets.{k}");
            if !valid_env_name(k) {
                c.err(f, "is not a valid variable name (letters, digits, '_', not starting with a digit)");
            } else if RESERVED_ENV.contains(&k.as_str()) {
                c.err(f, "is set by the agent from the placement; remove it");
            } else if ct.env.contains_key(k) {
                c.err(f, "is also in env; a variable is either plain or secret");
            } else if v.expose().is_some_and(|v| v.len() > MAX_SECRET_BYTES) {
                c.err(f, format!("is longer than {MAX_SECRET_BYTES} bytes"));
            }
        }
        super::security::check_security(c, &p, ct);
        match ct.gpu {
            Some(GpuRequirement::Gpus(_)) => whole = true,
            Some(GpuRequirement::Mps { .. }) => mps = true,
            None => {}
        }
    }
    super::serving::check_serving(c, spec);
    if whole && mps {
        c.err(
            "containers",
            "a task uses either whole GPUs or MPS slots, not both",
        );
    }
    if let TaskGpu::Whole { count } = spec.gpu()
        && u64::from(count) > MAX_GPUS
    {
        c.err(
            "containers",
            format!("the task asks for {count} whole GPUs; at most {MAX_GPUS} fit on one host"),
        );
    }
    if let TaskGpu::Shared {
        compute: Some(cm), ..
    } = spec.gpu()
        && cm > ComputeMilli::FULL
    {
        c.err(
            "containers",
            format!("the MPS compute caps add up to {cm}, more than one GPU"),
        );
    }
}
