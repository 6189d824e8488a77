//! A fake Docker engine: the Engine API's HTTP over a unix socket, as much of it as the
//! agent uses (ping, pull with progress, inspect an image, create, start, inspect, wait,
//! stop, kill, remove, logs with the multiplexed stream, list by label, exec with its
//! hijacked connection). It records every request, so tests check exactly what the agent
//! sent.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request the engine received.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// Without the API version prefix.
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub body: Value,
}

#[derive(Debug, Clone)]
pub struct Container {
    pub id: String,
    pub create: Value,
    pub running: bool,
    /// Started once (a created container that never was is listed as `created`).
    pub started: bool,
    pub exit_code: i64,
    /// Killed by the kernel at its memory limit (`State.OOMKilled`).
    pub oom_killed: bool,
    pub pid: i64,
    /// Docker's health verdict (`starting`, `healthy`, `unhealthy`) and the last check's
    /// output, for a container created with a `Healthcheck`.
    pub health: Option<(String, String)>,
}

#[derive(Default)]
pub struct Inner {
    pub requests: Vec<Request>,
    pub containers: BTreeMap<String, Container>,
    /// Images on the engine.
    pub images: BTreeSet<String>,
    /// Images the registry refuses, with its reason.
    pub refused: BTreeMap<String, String>,
    /// How long a pull takes.
    pub pull_time: Duration,
    /// What every container prints: (stream 1 = stdout, 2 = stderr, text).
    pub output: Vec<(u8, String)>,
    /// Execs made: their id, container and the body they were created with; an exec
    /// answers its command's words on stdout, then echoes its stdin back upper-cased, and
    /// exits with code 7 at its end.
    pub execs: BTreeMap<String, (String, Value)>,
    /// Execs whose stdin ended.
    pub execs_done: BTreeSet<String>,
    next_id: u64,
}

#[derive(Clone)]
pub struct Fake {
    pub inner: Arc<Mutex<Inner>>,
    pub socket: PathBuf,
}

impl Fake {
    /// Serves on `dir/docker.sock` until the test's runtime ends.
    pub async fn start(dir: &Path) -> Fake {
        let socket = dir.join("docker.sock");
        let inner = Arc::new(Mutex::new(Inner::default()));
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind the fake socket");
        let app = axum::Router::new()
            .route(
                "/{version}/exec/{id}/start",
                axum::routing::post(start_exec),
            )
            .route("/exec/{id}/start", axum::routing::post(start_exec))
            .fallback(handle)
            .with_state(inner.clone());
        tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("fake engine serves");
        });
        Fake { inner, socket }
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("not poisoned")
    }

    /// The requests with this method whose path ends with `suffix`.
    pub fn requests(&self, method: &str, suffix: &str) -> Vec<Request> {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.method == method && r.path.ends_with(suffix))
            .cloned()
            .collect()
    }

    /// Docker's health check of container `name` now says `status`, with `output`.
    pub fn set_health(&self, name: &str, status: &str, output: &str) {
        let mut g = self.lock();
        let c = g.containers.get_mut(name).expect("a container");
        c.health = Some((status.into(), output.into()));
    }

    /// A container's main process exits on its own with `code`.
    pub fn exit(&self, name: &str, code: i64) {
        if let Some(c) = self.lock().containers.get_mut(name) {
            c.running = false;
            c.exit_code = code;
        }
    }

    /// The kernel kills a container at its memory limit (137, `State.OOMKilled`).
    pub fn oom_kill(&self, name: &str) {
        if let Some(c) = self.lock().containers.get_mut(name) {
            c.running = false;
            c.exit_code = 137;
            c.oom_killed = true;
        }
    }

    /// A container created with these labels and never started (an agent that stopped
    /// between create and start).
    pub fn add_created(&self, name: &str, labels: Value) {
        self.add_running(name, labels);
        let mut g = self.lock();
        let c = g.containers.get_mut(name).expect("just added");
        c.running = false;
        c.started = false;
    }

    /// A container some other agent (or a person) made and started.
    pub fn add_running(&self, name: &str, labels: Value) {
        let mut g = self.lock();
        g.next_id += 1;
        let id = format!("{:064x}", g.next_id);
        g.containers.insert(
            name.to_owned(),
            Container {
                id,
                create: json!({ "Image": "other", "Labels": labels }),
                running: true,
                started: true,
                exit_code: 0,
                oom_killed: false,
                pid: 4242,
                health: None,
            },
        );
    }
}

fn strip_version(path: &str) -> String {
    match path.strip_prefix("/v") {
        Some(rest) if rest.starts_with(|c: char| c.is_ascii_digit()) => rest
            .find('/')
            .map_or_else(|| "/".to_owned(), |i| rest[i..].to_owned()),
        _ => path.to_owned(),
    }
}

fn query_of(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default()
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "message": message }))).into_response()
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    let path = strip_version(uri.path());
    let query = query_of(&uri);
    let body_json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    inner.lock().unwrap().requests.push(Request {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        body: body_json.clone(),
    });
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method.as_str(), parts.as_slice()) {
        ("GET" | "HEAD", ["_ping"]) => "OK".into_response(),
        ("POST", ["images", "create"]) => pull(inner, &query).await,
        ("GET", ["images", rest @ .., "json"]) => {
            let name = rest.join("/");
            if inner.lock().unwrap().images.contains(&name) {
                axum::Json(json!({ "Id": "sha256:1" })).into_response()
            } else {
                error(StatusCode::NOT_FOUND, &format!("No such image: {name}"))
            }
        }
        ("GET", ["containers", "json"]) => list(&inner, &query),
        ("POST", ["containers", "create"]) => create(&inner, &query, body_json),
        ("POST", ["containers", name, "start"]) => {
            let mut g = inner.lock().unwrap();
            match g.containers.get_mut(*name) {
                Some(c) => {
                    c.running = true;
                    c.started = true;
                    c.pid = 30_000 + c.id.len() as i64;
                    StatusCode::NO_CONTENT.into_response()
                }
                None => error(StatusCode::NOT_FOUND, "No such container"),
            }
        }
        ("POST", ["containers", name, "stop" | "kill"]) => {
            let code = if parts[2] == "stop" { 143 } else { 137 };
            let mut g = inner.lock().unwrap();
            match g.containers.get_mut(*name) {
                Some(c) => {
                    if c.running {
                        c.running = false;
                        c.exit_code = code;
                    }
                    StatusCode::NO_CONTENT.into_response()
                }
                None => error(StatusCode::NOT_FOUND, "No such container"),
            }
        }
        ("GET", ["containers", name, "json"]) => {
            let g = inner.lock().unwrap();
            match g.containers.get(*name) {
                Some(c) => {
                    let mut state = json!({
                        "Status": if c.running { "running" } else { "exited" },
                        "Running": c.running,
                        "Pid": if c.running { c.pid } else { 0 },
                        "ExitCode": c.exit_code,
                        "OOMKilled": c.oom_killed,
                    });
                    if let Some((status, output)) = &c.health {
                        let code = if status == "healthy" { 0 } else { 1 };
                        state["Health"] = json!({
                            "Status": status,
                            "FailingStreak": code,
                            "Log": [{"ExitCode": code, "Output": output}],
                        });
                    }
                    axum::Json(json!({"Id": c.id, "Name": format!("/{name}"), "State": state}))
                        .into_response()
                }
                None => error(StatusCode::NOT_FOUND, "No such container"),
            }
        }
        ("POST", ["containers", name, "wait"]) => wait(inner, (*name).to_owned()),
        ("POST", ["containers", name, "exec"]) => {
            let mut g = inner.lock().unwrap();
            match g.containers.get(*name) {
                Some(c) if c.running => {
                    g.next_id += 1;
                    let id = format!("exec{}", g.next_id);
                    g.execs.insert(id.clone(), ((*name).to_owned(), body_json));
                    (StatusCode::CREATED, axum::Json(json!({ "Id": id }))).into_response()
                }
                Some(_) => error(
                    StatusCode::CONFLICT,
                    &format!("Container {name} is not running"),
                ),
                None => error(StatusCode::NOT_FOUND, "No such container"),
            }
        }
        ("GET", ["exec", id, "json"]) => {
            let g = inner.lock().unwrap();
            match g.execs.get(*id) {
                Some((container, _)) => {
                    let done = g.execs_done.contains(*id);
                    axum::Json(json!({
                        "ID": id, "ContainerID": container, "Running": !done,
                        "ExitCode": if done { json!(7) } else { Value::Null },
                    }))
                    .into_response()
                }
                None => error(StatusCode::NOT_FOUND, "No such exec instance"),
            }
        }
        ("GET", ["containers", name, "logs"]) => logs(&inner, name, &query),
        ("DELETE", ["containers", name]) => {
            let mut g = inner.lock().unwrap();
            let force = query.get("force").is_some_and(|v| v == "true" || v == "1");
            match g.containers.get(*name) {
                Some(c) if c.running && !force => error(
                    StatusCode::CONFLICT,
                    "You cannot remove a running container. Stop the container before attempting removal or force remove",
                ),
                Some(_) => {
                    g.containers.remove(*name);
                    StatusCode::NO_CONTENT.into_response()
                }
                None => error(StatusCode::NOT_FOUND, &format!("No such container: {name}")),
            }
        }
        _ => error(
            StatusCode::NOT_FOUND,
            &format!("page not found: {method} {path}"),
        ),
    }
}

async fn pull(inner: Arc<Mutex<Inner>>, query: &BTreeMap<String, String>) -> Response {
    let image = match query.get("tag").filter(|t| !t.is_empty()) {
        Some(tag) => format!("{}:{tag}", query["fromImage"]),
        None => query["fromImage"].clone(),
    };
    let (refused, wait) = {
        let g = inner.lock().unwrap();
        (g.refused.get(&image).cloned(), g.pull_time)
    };
    // As the engine does: a 200 whose lines report progress, or the registry's error.
    let stream = futures_util::stream::unfold(0u8, move |step| {
        let inner = inner.clone();
        let image = image.clone();
        let refused = refused.clone();
        async move {
            let line = match (step, &refused) {
                (0, _) => json!({ "status": format!("Pulling from {image}") }),
                (1, Some(why)) => json!({ "errorDetail": { "message": why }, "error": why }),
                (1, None) => {
                    tokio::time::sleep(wait).await;
                    json!({ "status": "Downloading", "progressDetail": { "current": 1, "total": 2 } })
                }
                (2, None) => {
                    let mut g = inner.lock().unwrap();
                    // As the engine names it: no tag is `latest`.
                    if let Some(bare) = image.strip_suffix(":latest") {
                        g.images.insert(bare.to_owned());
                    }
                    g.images.insert(image.clone());
                    json!({ "status": format!("Status: Downloaded newer image for {image}") })
                }
                _ => return None,
            };
            Some((
                Ok::<_, std::convert::Infallible>(Bytes::from(format!("{line}\r\n"))),
                step + 1,
            ))
        }
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}

fn list(inner: &Arc<Mutex<Inner>>, query: &BTreeMap<String, String>) -> Response {
    let wanted: Vec<(String, String)> = query
        .get("filters")
        .and_then(|f| serde_json::from_str::<BTreeMap<String, Vec<String>>>(f).ok())
        .and_then(|f| f.get("label").cloned())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    let all = query.get("all").is_some_and(|v| v == "true" || v == "1");
    let g = inner.lock().unwrap();
    let items: Vec<Value> = g
        .containers
        .iter()
        .filter(|(_, c)| all || c.running)
        .filter(|(_, c)| {
            wanted
                .iter()
                .all(|(k, v)| c.create["Labels"][k].as_str() == Some(v.as_str()))
        })
        .map(|(name, c)| {
            json!({
                "Id": c.id,
                "Names": [format!("/{name}")],
                "Image": c.create["Image"],
                "Labels": c.create["Labels"],
                "State": match (c.running, c.started) {
                    (true, _) => "running",
                    (false, true) => "exited",
                    (false, false) => "created",
                },
            })
        })
        .collect();
    axum::Json(Value::Array(items)).into_response()
}

fn create(inner: &Arc<Mutex<Inner>>, query: &BTreeMap<String, String>, body: Value) -> Response {
    let Some(name) = query.get("name").cloned() else {
        return error(StatusCode::BAD_REQUEST, "the fake wants a name");
    };
    let mut g = inner.lock().unwrap();
    let image = body["Image"].as_str().unwrap_or_default().to_owned();
    if !g.images.contains(&image) {
        return error(StatusCode::NOT_FOUND, &format!("No such image: {image}"));
    }
    if g.containers.contains_key(&name) {
        return error(
            StatusCode::CONFLICT,
            &format!("Conflict. The container name \"/{name}\" is already in use"),
        );
    }
    g.next_id += 1;
    let id = format!("{:064x}", g.next_id);
    // As Docker: a container with a health check starts `starting`.
    let health = body
        .get("Healthcheck")
        .filter(|h| !h.is_null())
        .map(|_| ("starting".to_owned(), String::new()));
    g.containers.insert(
        name,
        Container {
            id: id.clone(),
            create: body,
            running: false,
            started: false,
            exit_code: 0,
            oom_killed: false,
            pid: 0,
            health,
        },
    );
    (
        StatusCode::CREATED,
        axum::Json(json!({ "Id": id, "Warnings": [] })),
    )
        .into_response()
}

/// Answers at once (headers), then the exit once the container has stopped.
fn wait(inner: Arc<Mutex<Inner>>, name: String) -> Response {
    let stream = futures_util::stream::once(async move {
        loop {
            let state = inner
                .lock()
                .unwrap()
                .containers
                .get(&name)
                .map(|c| (c.running, c.exit_code));
            match state {
                Some((false, code)) => {
                    return Ok::<_, std::convert::Infallible>(Bytes::from(format!(
                        "{}\n",
                        json!({ "StatusCode": code })
                    )));
                }
                None => {
                    return Ok(Bytes::from(format!(
                        "{}\n",
                        json!({ "StatusCode": 0, "Error": { "Message": "removed" } })
                    )));
                }
                Some((true, _)) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// The multiplexed stream of a container without a TTY: each frame is its stream, three
/// zero bytes, its length (big-endian), then the bytes.
fn logs(inner: &Arc<Mutex<Inner>>, name: &str, _query: &BTreeMap<String, String>) -> Response {
    let g = inner.lock().unwrap();
    if !g.containers.contains_key(name) {
        return error(StatusCode::NOT_FOUND, "No such container");
    }
    let mut bytes = Vec::new();
    for (stream, text) in &g.output {
        let line = format!("{text}\n");
        bytes.push(*stream);
        bytes.extend_from_slice(&[0, 0, 0]);
        bytes.extend_from_slice(&(line.len() as u32).to_be_bytes());
        bytes.extend_from_slice(line.as_bytes());
    }
    Response::builder()
        .header("content-type", "application/vnd.docker.multiplexed-stream")
        .body(Body::from(bytes))
        .unwrap()
}

/// One frame of the multiplexed stream: its stream, three zero bytes, its length
/// (big-endian), then the bytes.
fn frame(stream: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![stream, 0, 0, 0];
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
    out
}

/// `POST /exec/{id}/start`: the engine answers `101 UPGRADED` and the connection becomes
/// the exec's: stdin from the client, the multiplexed stream (or a TTY's raw bytes) back.
async fn start_exec(
    State(inner): State<Arc<Mutex<Inner>>>,
    axum::extract::Path(params): axum::extract::Path<BTreeMap<String, String>>,
    mut req: axum::extract::Request,
) -> Response {
    let id = params["id"].clone();
    let Some((_, created)) = inner.lock().unwrap().execs.get(&id).cloned() else {
        return error(StatusCode::NOT_FOUND, "No such exec instance");
    };
    let wants_upgrade = req
        .headers()
        .get("upgrade")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"tcp"));
    inner.lock().unwrap().requests.push(Request {
        method: "POST".into(),
        path: format!("/exec/{id}/start"),
        query: BTreeMap::new(),
        body: json!({ "upgrade": wants_upgrade }),
    });
    if !wants_upgrade {
        return error(
            StatusCode::BAD_REQUEST,
            "this fake answers attached execs only",
        );
    }
    let tty = created["Tty"].as_bool().unwrap_or(false);
    let words: Vec<String> = created["Cmd"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|w| w.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut io = hyper_util::rt::TokioIo::new(upgraded);
        let out = |bytes: &[u8]| if tty { bytes.to_vec() } else { frame(1, bytes) };
        let _ = io
            .write_all(&out(format!("ran: {}\n", words.join(" ")).as_bytes()))
            .await;
        let mut buf = vec![0u8; 4096];
        loop {
            match io.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let upper = buf[..n].to_ascii_uppercase();
                    if io.write_all(&out(&upper)).await.is_err() {
                        break;
                    }
                }
            }
        }
        inner.lock().unwrap().execs_done.insert(id);
        let _ = io.shutdown().await;
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "Upgrade")
        .header("upgrade", "tcp")
        .header("content-type", "application/vnd.docker.raw-stream")
        .body(Body::empty())
        .unwrap()
}
