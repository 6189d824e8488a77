//! What a serving container declares: its ports, its health check and the containers it
//! waits for, read from Tessera's shape and ECS's (`portMappings`, `healthCheck`,
//! `essential`, `dependsOn`) and written back to ECS's.

use super::rules::*;
use super::*;

/// Which shape a document came in: the field names differ, the rules do not.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    Native,
    Ecs,
}

impl Shape {
    fn key(self, native: &'static str, ecs: &'static str) -> &'static str {
        match self {
            Shape::Native => native,
            Shape::Ecs => ecs,
        }
    }
}

fn port_number(
    c: &mut Checker,
    o: &Map<String, Value>,
    key: &str,
    field: &str,
    required: bool,
) -> Option<u16> {
    // ECS's `hostPort: 0` means "dynamic", as its absence does.
    let min = if key == "hostPort" { 0 } else { 1 };
    c.number(o, key, field, min, 65535, required)
        .and_then(|n| u16::try_from(n).ok())
        .filter(|&n| n > 0)
}

/// An optional array of objects at `key`, each read by `item` (given its field path);
/// `None` when anything in it was refused.
fn list_of<T>(
    c: &mut Checker,
    o: &Map<String, Value>,
    prefix: &str,
    key: &str,
    mut item: impl FnMut(&mut Checker, &Map<String, Value>, &str) -> Option<T>,
) -> Option<Vec<T>> {
    let items = match o.get(key) {
        None | Some(Value::Null) => return Some(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(v) => {
            c.err(
                join(prefix, key),
                format!("must be an array, got {}", kind(v)),
            );
            return None;
        }
    };
    let before = c.errors.len();
    let mut out = Vec::new();
    for (i, v) in items.iter().enumerate() {
        let p = format!("{}[{i}]", join(prefix, key));
        if let Some(m) = c.object(v, &p)
            && let Some(t) = item(c, m, &p)
        {
            out.push(t);
        }
    }
    (c.errors.len() == before).then_some(out)
}

/// `ports` (native) or `portMappings` (ECS) of one container.
pub(super) fn parse_ports(
    c: &mut Checker,
    o: &Map<String, Value>,
    prefix: &str,
    shape: Shape,
) -> Option<Vec<PortSpec>> {
    list_of(
        c,
        o,
        prefix,
        shape.key("ports", "portMappings"),
        |c, m, p| {
            let (cport, hport) = match shape {
                Shape::Native => {
                    c.unknown_keys(m, &["name", "container_port", "host_port", "protocol"], p);
                    ("container_port", "host_port")
                }
                Shape::Ecs => ("containerPort", "hostPort"),
            };
            let name = native::optional_string(c, m, "name", &join(p, "name"));
            if let Some(n) = &name
                && !valid_name(n)
            {
                c.err(join(p, "name"), "use 1 to 255 letters, digits, '-' or '_'");
            }
            let container_port = port_number(c, m, cport, &join(p, cport), true);
            let host_port = port_number(c, m, hport, &join(p, hport), false);
            let protocol = match m.get("protocol") {
                None | Some(Value::Null) => Some(Protocol::Tcp),
                Some(Value::String(s)) if s == "tcp" => Some(Protocol::Tcp),
                Some(Value::String(s)) if s == "udp" => Some(Protocol::Udp),
                Some(v) => {
                    c.err(
                        join(p, "protocol"),
                        format!("must be \"tcp\" or \"udp\", got {v}"),
                    );
                    None
                }
            };
            Some(PortSpec {
                name,
                container_port: container_port?,
                host_port,
                protocol: protocol?,
            })
        },
    )
}

fn whole_secs(
    c: &mut Checker,
    o: &Map<String, Value>,
    key: &str,
    field: &str,
    range: (u32, u32, u32),
) -> Option<u32> {
    match o.get(key) {
        None | Some(Value::Null) => Some(range.2),
        Some(_) => c
            .number(o, key, field, u64::from(range.0), u64::from(range.1), false)
            .map(|n| n as u32),
    }
}

/// `health_check` (native) or `healthCheck` (ECS) of one container.
pub(super) fn parse_health_check(
    c: &mut Checker,
    o: &Map<String, Value>,
    prefix: &str,
    shape: Shape,
) -> Option<Option<HealthCheck>> {
    let key = shape.key("health_check", "healthCheck");
    let v = match o.get(key) {
        None | Some(Value::Null) => return Some(None),
        Some(v) => v,
    };
    let p = join(prefix, key);
    let before = c.errors.len();
    let m = c.object(v, &p)?;
    let [interval, timeout, retries, start] = match shape {
        Shape::Native => [
            "interval_secs",
            "timeout_secs",
            "retries",
            "start_period_secs",
        ],
        Shape::Ecs => ["interval", "timeout", "retries", "startPeriod"],
    };
    let http_key = shape.key("http", "tesseraHttp");
    if shape == Shape::Native {
        c.unknown_keys(
            m,
            &["command", "http", interval, timeout, retries, start],
            &p,
        );
    }
    let command = match m.get("command") {
        None | Some(Value::Null) => Vec::new(),
        some => native::parse_command(c, some, &join(&p, "command")).unwrap_or_default(),
    };
    let http = match m.get(http_key) {
        None | Some(Value::Null) => None,
        Some(h) => {
            let hp = join(&p, http_key);
            let h = c.object(h, &hp)?;
            c.unknown_keys(h, &["port", "path"], &hp);
            let port = c.string(h, "port", &join(&hp, "port"));
            let path = match h.get("path") {
                None | Some(Value::Null) => Some("/".to_owned()),
                Some(Value::String(s))
                    if s.starts_with('/')
                        && s.len() <= 1024
                        && !s.chars().any(char::is_whitespace) =>
                {
                    Some(s.clone())
                }
                Some(v) => {
                    c.err(join(&hp, "path"), format!("must be a path starting with '/' without spaces, at most 1024 characters, got {v}"));
                    None
                }
            };
            Some(HttpCheck {
                port: port?,
                path: path?,
            })
        }
    };
    match (command.is_empty(), &http) {
        (true, None) => c.err(
            &p,
            format!("needs command ([\"CMD\", program, args…] or [\"CMD-SHELL\", \"…\"]) or {http_key} {{port, path}}"),
        ),
        (false, Some(_)) => c.err(&p, format!("give command or {http_key}, not both")),
        (false, None) => match command.first().map(String::as_str) {
            Some("CMD") if command.len() >= 2 && !command[1].trim().is_empty() => {}
            Some("CMD-SHELL") if command.len() == 2 && !command[1].trim().is_empty() => {}
            _ => c.err(
                join(&p, "command"),
                "must be [\"CMD\", program, args…] or [\"CMD-SHELL\", \"one shell command\"]",
            ),
        },
        (true, Some(_)) => {}
    }
    let interval_secs = whole_secs(c, m, interval, &join(&p, interval), HealthCheck::INTERVAL);
    let timeout_secs = whole_secs(c, m, timeout, &join(&p, timeout), HealthCheck::TIMEOUT);
    let retries = whole_secs(c, m, retries, &join(&p, retries), HealthCheck::RETRIES);
    let start_period_secs = whole_secs(c, m, start, &join(&p, start), HealthCheck::START_PERIOD);
    let check = HealthCheck {
        command,
        http,
        interval_secs: interval_secs?,
        timeout_secs: timeout_secs?,
        retries: retries?,
        start_period_secs: start_period_secs?,
    };
    (c.errors.len() == before).then_some(Some(check))
}

/// `essential` of one container (default true).
pub(super) fn parse_essential(
    c: &mut Checker,
    o: &Map<String, Value>,
    prefix: &str,
) -> Option<bool> {
    match o.get("essential") {
        None | Some(Value::Null) => Some(true),
        Some(Value::Bool(b)) => Some(*b),
        Some(v) => {
            c.err(
                join(prefix, "essential"),
                format!("must be true or false, got {}", kind(v)),
            );
            None
        }
    }
}

/// `depends_on` (native: `{container, condition}`) or `dependsOn` (ECS: `{containerName,
/// condition}`) of one container.
pub(super) fn parse_depends_on(
    c: &mut Checker,
    o: &Map<String, Value>,
    prefix: &str,
    shape: Shape,
) -> Option<Vec<Dependency>> {
    let name_key = shape.key("container", "containerName");
    list_of(
        c,
        o,
        prefix,
        shape.key("depends_on", "dependsOn"),
        |c, m, p| {
            if shape == Shape::Native {
                c.unknown_keys(m, &["container", "condition"], p);
            }
            let container = c.string(m, name_key, &join(p, name_key));
            let condition = c
                .string(m, "condition", &join(p, "condition"))
                .and_then(|s| {
                    let parsed = DependencyCondition::parse(&s.to_ascii_uppercase());
                    if parsed.is_none() {
                        c.err(
                            join(p, "condition"),
                            format!("must be START, COMPLETE, SUCCESS or HEALTHY, got {s:?}"),
                        );
                    }
                    parsed
                });
            Some(Dependency {
                container: container?,
                condition: condition?,
            })
        },
    )
}

/// The rules across a task's containers: unique port names and numbers, health checks
/// that name a port of their container, dependencies on containers that exist, without
/// cycles, and `HEALTHY` only on a container with a check; at least one essential
/// container.
/// The task-level `work`: where its application publishes the work it completes.
pub(super) fn parse_work(c: &mut Checker, v: Option<&Value>) -> Option<crate::work::WorkSpec> {
    let o = match v {
        None | Some(Value::Null) => return None,
        Some(v) => c.object(v, "work")?,
    };
    c.unknown_keys(
        o,
        &["port", "path", "completed", "errors", "latency"],
        "work",
    );
    let port = c.string(o, "port", "work.port");
    let completed = c.string(o, "completed", "work.completed");
    let mut optional = |key: &str| match o.get(key) {
        None | Some(Value::Null) => None,
        Some(_) => c.string(o, key, &format!("work.{key}")),
    };
    let path = optional("path").unwrap_or_else(crate::work::default_metrics_path);
    let errors = optional("errors");
    let latency = optional("latency");
    Some(crate::work::WorkSpec {
        port: port?,
        path,
        completed: completed?,
        errors,
        latency,
    })
}

pub(super) fn check_serving(c: &mut Checker, spec: &TaskDefinitionSpec) {
    if let Some(w) = &spec.work {
        let names: Vec<&str> = spec
            .containers
            .iter()
            .flat_map(|ct| ct.ports.iter().filter_map(|p| p.name.as_deref()))
            .collect();
        w.check("work", &names, &mut c.errors);
    }
    // The host's PID and IPC namespaces are never a task's: the agent gives MPS clients
    // the IPC they need itself. Taking these fields and running without them would be a
    // setting stored and then ignored.
    for key in ["pidMode", "ipcMode"] {
        match spec.ecs.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(m)) if m == "task" || m == "none" => {}
            Some(_) => c.err(
                key,
                "tasks never share the host's PID or IPC namespace (the agent sets up the IPC that MPS needs); remove it",
            ),
        }
    }
    let host = spec.host_network();
    let mut names = BTreeMap::new();
    let mut host_ports = BTreeMap::new();
    for (i, ct) in spec.containers.iter().enumerate() {
        let mut own = BTreeSet::new();
        for (j, p) in ct.ports.iter().enumerate() {
            let f = format!("containers[{i}].ports[{j}]");
            if let Some(n) = &p.name
                && names.insert(n.clone(), ()).is_some()
            {
                c.err(
                    join(&f, "name"),
                    format!("{n:?} names another port of this task"),
                );
            }
            if !own.insert((p.container_port, p.protocol)) {
                c.err(
                    join(&f, "container_port"),
                    format!(
                        "{}/{} is declared twice in this container",
                        p.container_port,
                        p.protocol.as_str()
                    ),
                );
            }
            if host && p.host_port.is_some_and(|h| h != p.container_port) {
                c.err(
                    join(&f, "host_port"),
                    "must equal container_port (or be left out) with networkMode host",
                );
            }
            let fixed = p.host_port.or(host.then_some(p.container_port));
            if let Some(h) = fixed
                && host_ports.insert((h, p.protocol), ()).is_some()
            {
                c.err(
                    join(&f, "host_port"),
                    format!(
                        "host port {h}/{} is asked for twice in this task",
                        p.protocol.as_str()
                    ),
                );
            }
        }
        if let Some(h) = &ct.health_check
            && let Some(http) = &h.http
            && !ct
                .ports
                .iter()
                .any(|p| p.name.as_deref() == Some(http.port.as_str()))
        {
            c.err(
                format!("containers[{i}].health_check.http.port"),
                format!(
                    "{:?} is not the name of a port of container {:?}",
                    http.port, ct.name
                ),
            );
        }
        for (j, d) in ct.depends_on.iter().enumerate() {
            let f = format!("containers[{i}].depends_on[{j}]");
            match spec.containers.iter().find(|o| o.name == d.container) {
                None => c.err(
                    join(&f, "container"),
                    format!("no container of this task is named {:?}", d.container),
                ),
                Some(o) if o.name == ct.name => {
                    c.err(join(&f, "container"), "a container cannot wait for itself")
                }
                Some(o)
                    if d.condition == DependencyCondition::Healthy && o.health_check.is_none() =>
                {
                    c.err(
                        join(&f, "condition"),
                        format!("HEALTHY needs a health check on container {:?}", o.name),
                    )
                }
                Some(_) => {}
            }
        }
    }
    if let Some(name) = dependency_cycle(spec) {
        c.err(
            "containers",
            format!("depends_on has a cycle through container {name:?}: no container of it could ever start"),
        );
    }
    if !spec.containers.is_empty() && !spec.containers.iter().any(|c| c.essential) {
        c.err("containers", "at least one container must be essential");
    }
}

/// A container on a cycle of `depends_on`, if there is one.
fn dependency_cycle(spec: &TaskDefinitionSpec) -> Option<String> {
    let index: BTreeMap<&str, usize> = spec
        .containers
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.as_str(), i))
        .collect();
    // 0 unvisited, 1 on the path, 2 done.
    let mut mark = vec![0u8; spec.containers.len()];
    fn visit(
        i: usize,
        spec: &TaskDefinitionSpec,
        index: &BTreeMap<&str, usize>,
        mark: &mut [u8],
    ) -> bool {
        if mark[i] == 1 {
            return true;
        }
        if mark[i] == 2 {
            return false;
        }
        mark[i] = 1;
        for d in &spec.containers[i].depends_on {
            if let Some(&j) = index.get(d.container.as_str())
                && j != i
                && visit(j, spec, index, mark)
            {
                return true;
            }
        }
        mark[i] = 2;
        false
    }
    (0..spec.containers.len())
        .find(|&i| visit(i, spec, &index, &mut mark))
        .map(|i| spec.containers[i].name.clone())
}

/// The ECS keys of a container's serving fields whose copy in its `ecs` object (as an ECS
/// import gave it) no longer says what the modelled field says; a key that is absent reads
/// as the field's default.
pub(super) fn stale_ecs_keys(ct: &ContainerSpec) -> Vec<&'static str> {
    let mut c = Checker { errors: Vec::new() };
    let mut stale = Vec::new();
    if parse_ports(&mut c, &ct.ecs, "", Shape::Ecs).as_deref() != Some(&ct.ports[..]) {
        stale.push("portMappings");
    }
    if parse_health_check(&mut c, &ct.ecs, "", Shape::Ecs) != Some(ct.health_check.clone()) {
        stale.push("healthCheck");
    }
    if parse_essential(&mut c, &ct.ecs, "") != Some(ct.essential) {
        stale.push("essential");
    }
    if parse_depends_on(&mut c, &ct.ecs, "", Shape::Ecs).as_deref() != Some(&ct.depends_on[..]) {
        stale.push("dependsOn");
    }
    stale
}

/// ECS's `portMappings` for `ports`; what Tessera does not model of a mapping
/// (`appProtocol`, ...) is kept from `given`'s at the same place.
pub(super) fn ports_to_ecs(ports: &[PortSpec], given: Option<&Value>) -> Value {
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut m = given
                .and_then(|g| g.get(i))
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            for k in ["containerPort", "hostPort", "protocol", "name"] {
                m.remove(k);
            }
            m.insert("containerPort".into(), p.container_port.into());
            m.insert("protocol".into(), p.protocol.as_str().into());
            if let Some(h) = p.host_port {
                m.insert("hostPort".into(), h.into());
            }
            if let Some(n) = &p.name {
                m.insert("name".into(), n.clone().into());
            }
            Value::Object(m)
        })
        .collect()
}

/// ECS's `healthCheck` for `h` (an HTTP check as Tessera's `tesseraHttp`).
pub(super) fn health_to_ecs(h: &HealthCheck) -> Value {
    let mut m = serde_json::json!({
        "interval": h.interval_secs, "timeout": h.timeout_secs,
        "retries": h.retries, "startPeriod": h.start_period_secs,
    });
    if !h.command.is_empty() {
        m["command"] = h.command.clone().into();
    }
    if let Some(http) = &h.http {
        m["tesseraHttp"] = serde_json::json!({"port": http.port, "path": http.path});
    }
    m
}

/// ECS's `dependsOn` for `deps`.
pub(super) fn depends_to_ecs(deps: &[Dependency]) -> Value {
    deps.iter()
        .map(|d| serde_json::json!({"containerName": d.container, "condition": d.condition.as_str()}))
        .collect()
}
