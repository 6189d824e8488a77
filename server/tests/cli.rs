//! The command line against a real server: the `tessera` binary serving the demo fleet
//! (real agents running real processes), and the same binary as the client.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const PASSWORD: &str = "cli-test-admin-password";

struct Server {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM: the demo's agents stop their tasks on the way out.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
    }
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tessera")
}

/// `tessera serve --demo` on a free port, once it answers.
fn serve() -> Server {
    let dir = tempfile::tempdir().expect("dir");
    let mut child = Command::new(bin())
        .args([
            "serve",
            "--demo",
            "--bind",
            "127.0.0.1:0",
            "--sync-interval-secs",
            "1",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("TESSERA_ADMIN_PASSWORD", PASSWORD)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the server");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if !sent && let Some(i) = line.find("listening on ") {
                let url = line[i + "listening on ".len()..].trim().to_owned();
                let _ = tx.send(url);
                sent = true;
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the server says where it listens");
    Server { child, url, dir }
}

impl Server {
    fn config(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    /// The client, with the login kept in this test's config directory.
    fn cli(&self, args: &[&str]) -> Output {
        self.cli_in(args, None)
    }

    fn cli_in(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = Command::new(bin())
            .args(args)
            .current_dir(self.dir.path())
            .env("TESSERA_CONFIG_DIR", self.config())
            .env_remove("TESSERA_URL")
            .env_remove("TESSERA_TOKEN")
            .env("COLUMNS", "200")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the client");
        if let Some(text) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())
                .expect("write stdin");
        }
        drop(child.stdin.take());
        child.wait_with_output().expect("client ends")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "tessera {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).expect("JSON")
    }

    fn login(&self) {
        let out = self.cli_in(
            &[
                "login",
                &self.url,
                "--username",
                "admin",
                "--password-stdin",
            ],
            Some(&format!("{PASSWORD}\n")),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    /// Waits until `check` holds of `tessera get ARGS -o json`.
    fn until(&self, args: &[&str], what: &str, check: impl Fn(&Value) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut full = args.to_vec();
            full.extend(["-o", "json"]);
            if check(&self.json(&full)) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: not reached");
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const CHAT: &str = r#"
# ECS's shape, as a person would keep it in a repository.
kind: TaskDefinition
family: chat
cpu: "1024"
memory: "2048"
containerDefinitions:
  - name: server
    command: ["sleep", "infinity"]
    essential: true
    portMappings:
      - containerPort: 8000
    environment:
      - name: MODEL
        value: MODEL_NAME
    resourceRequirements:
      - type: GPU
        value: "1"
        sharingStrategy:
          nvidiaMps:
            memory: 4096
            maxComputePercent: 20
---
kind: Service
name: chat
task_definition: chat
pool: inference
desired_count: COUNT
"#;

fn chat(model: &str, count: u32, command: &str) -> String {
    CHAT.replace("MODEL_NAME", model)
        .replace("COUNT", &count.to_string())
        .replace(r#"["sleep", "infinity"]"#, command)
}

fn revisions(s: &Server, family: &str) -> usize {
    s.json(&["get", "task-definitions", "-o", "json"])["task_definitions"]
        .as_array()
        .expect("list")
        .iter()
        .find(|d| d["family"] == family)
        .map_or(0, |d| d["revision"].as_u64().unwrap_or(0) as usize)
}

fn deployments(s: &Server, service: &str) -> usize {
    s.json(&["get", "services", "-o", "json"])["services"]
        .as_array()
        .expect("list")
        .iter()
        .find(|d| d["name"] == service)
        .map_or(0, |d| d["deployments"].as_array().map_or(0, Vec::len))
}

#[test]
fn login_reads_the_fleet_acts_on_it_and_logout_ends_the_token() {
    let s = serve();
    // Before any login, every command says what to do.
    let out = s.cli(&["get", "hosts"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("tessera login URL"), "{}", text(&out));
    // A wrong password is refused with the server's reason.
    let out = s.cli_in(
        &["login", &s.url, "-u", "admin", "--password-stdin"],
        Some("wrong-password\n"),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("401"), "{}", text(&out));
    s.login();
    let kept = s.config().join("login.json");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&kept).expect("kept").permissions().mode() & 0o777,
        0o600
    );
    let token =
        serde_json::from_str::<Value>(&std::fs::read_to_string(&kept).unwrap()).unwrap()["token"]
            .as_str()
            .unwrap()
            .to_owned();

    // Every one but `ocr-preview`, which crashes on purpose.
    s.until(&["get", "services"], "the demo's services run", |v| {
        v["services"].as_array().is_some_and(|l| {
            l.len() == 8
                && l.iter()
                    .filter(|s| s["name"] != "ocr-preview")
                    .all(|s| s["running"] == s["desired_count"])
        })
    });
    // Projects: the demo's services are all in `default`, which uses GPU memory somewhere.
    let projects = s.ok(&["get", "projects"]);
    assert!(projects.starts_with("PROJECT"), "{projects}");
    assert!(
        projects.lines().any(|l| l.starts_with("default")
            && l.contains("no limit")
            && l.contains("GPU memory")),
        "{projects}"
    );
    let mine = s.json(&["get", "services", "--project", "default", "-o", "json"]);
    assert_eq!(mine["services"].as_array().map(Vec::len), Some(8), "{mine}");
    let none = s.json(&["get", "services", "--project", "nobody", "-o", "json"]);
    assert_eq!(none["services"], serde_json::json!([]), "{none}");
    let all_tasks = s.json(&["get", "tasks", "-o", "json"]);
    let default_tasks = s.json(&["get", "tasks", "--project", "default", "-o", "json"]);
    assert!(
        all_tasks["tasks"].as_array().is_some_and(|t| !t.is_empty()),
        "{all_tasks}"
    );
    // The same tasks (their measured figures move between the two reads).
    let ids = |v: &Value| -> std::collections::BTreeSet<String> {
        v["tasks"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        ids(&default_tasks),
        ids(&all_tasks),
        "every demo task is in default"
    );
    let no_tasks = s.json(&["get", "tasks", "--project", "nobody", "-o", "json"]);
    assert_eq!(no_tasks["tasks"], serde_json::json!([]), "{no_tasks}");
    let out = s.cli(&["get", "hosts", "--project", "default"]);
    assert!(!out.status.success(), "--project does not filter hosts");
    let hosts = s.ok(&["get", "hosts"]);
    assert!(hosts.starts_with("HOST"), "{hosts}");
    for h in ["sim-l4-1", "sim-l4-2", "sim-h100-1", "sim-h100-2"] {
        assert!(hosts.contains(h), "{hosts}");
    }
    let services = s.ok(&["get", "services", "-o", "wide"]);
    assert!(
        services.contains("embeddings") && services.contains("DEPLOYMENTS"),
        "{services}"
    );
    let tasks = s.json(&["get", "tasks", "--service", "embeddings", "-o", "json"]);
    assert!(
        tasks["tasks"]
            .as_array()
            .is_some_and(|t| !t.is_empty() && t.iter().all(|t| t["service"] == "embeddings"))
    );
    assert!(s.ok(&["get", "task-definitions"]).contains("MPS 6 GiB 25%"));
    let described = s.ok(&["describe", "service", "embeddings"]);
    assert!(
        described.contains("Deployments:") && described.contains("Events:"),
        "{described}"
    );
    let host = s.ok(&["describe", "host", "sim-l4-1"]);
    assert!(host.contains("GPUs:") && host.contains("L4"), "{host}");
    // The demo's crash-looping service: its latest failure, described with where it ran,
    // its deployment's failures and the last lines it wrote.
    let failed = |v: &Value| -> Option<String> {
        v["tasks"]
            .as_array()?
            .iter()
            .rev()
            .find(|t| t["exit_code"] == 1)?["id"]
            .as_str()
            .map(str::to_owned)
    };
    s.until(
        &["get", "tasks", "--service", "ocr-preview"],
        "a task of ocr-preview failed",
        |v| failed(v).is_some(),
    );
    let id = failed(&s.json(&["get", "tasks", "--service", "ocr-preview", "-o", "json"]))
        .expect("a failed task");
    let task = s.ok(&["describe", "task", &id]);
    for said in [
        "State:            stopped",
        "exit code 1",
        "Crash-looping:",
        "Last lines:",
        "RuntimeError: CUDA error: out of memory",
    ] {
        assert!(task.contains(said), "{said}: {task}");
    }
    let none = s.cli(&["describe", "task", "no-such-task"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(text(&none).contains("404"), "{}", text(&none));

    assert!(s.ok(&["scale", "vision", "1"]).contains("desired count 1"));
    s.until(&["get", "services"], "vision scaled in", |v| {
        v["services"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["name"] == "vision" && s["running"] == 1)
    });
    assert!(s.ok(&["drain", "sim-l4-1"]).contains("draining"));
    assert!(s.ok(&["activate", "sim-l4-1"]).contains("active"));
    let events = s.ok(&["events", "--service", "vision", "--limit", "50"]);
    assert!(
        events.contains("desired count changed from 3 to 1"),
        "{events}"
    );
    // Refusals name the problem.
    let out = s.cli(&["scale", "no-such-service", "2"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("404"), "{}", text(&out));
    assert!(s.ok(&["completion", "bash"]).contains("_tessera"));
    // A pool's capacity provider, set from a YAML file and taken away; bad settings are
    // named and change nothing.
    let good = s.write(
        "provider.yaml",
        "kind: demo\nmin_hosts: 0\nmax_hosts: 2\ntarget_capacity_percent: 80\n",
    );
    let said = s.ok(&[
        "pool",
        "set-provider",
        "elastic",
        "-f",
        good.to_str().unwrap(),
    ]);
    assert!(
        said.contains("pool elastic: demo provider, 0 to 2 hosts, target capacity 80 %"),
        "{said}"
    );
    let pools = s.ok(&["get", "pools", "-o", "wide"]);
    assert!(pools.contains("elastic"), "{pools}");
    let bad = s.write("bad.yaml", "kind: demo\nmax_hosts: 0\n");
    let out = s.cli(&[
        "pool",
        "set-provider",
        "elastic",
        "-f",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("provider.max_hosts"), "{}", text(&out));
    let typo = s.write("typo.json", r#"{"kind": "demo", "max_host": 3}"#);
    let out = s.cli(&[
        "pool",
        "set-provider",
        "elastic",
        "-f",
        typo.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("unknown field `max_host`"),
        "{}",
        text(&out)
    );
    let pool = s.json(&["get", "pools", "-o", "json"]);
    let elastic = pool["pools"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "elastic"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(elastic["provider"]["max_hosts"], 2, "{pool}");
    let said = s.ok(&["pool", "remove-provider", "elastic"]);
    assert!(said.contains("no capacity provider"), "{said}");

    assert!(s.ok(&["logout"]).contains("no longer works"));
    assert!(!kept.exists());
    // The token itself is gone on the server.
    let out = s.cli(&["get", "hosts", "--url", &s.url, "--token", &token]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("401"), "{}", text(&out));
}

#[test]
fn apply_changes_only_what_differs_waits_for_steady_and_fails_on_a_rollback() {
    let s = serve();
    s.login();
    let file = s.write(
        "chat.yaml",
        &chat("llama-3-8b", 2, r#"["sleep", "infinity"]"#),
    );
    let f = file.to_str().unwrap();

    // A dry run plans and changes nothing.
    let plan = s.ok(&["apply", "-f", f, "--dry-run"]);
    assert!(
        plan.contains("+ task definition chat") && plan.contains("+ service chat"),
        "{plan}"
    );
    assert_eq!(revisions(&s, "chat"), 0);

    let first = s.ok(&["apply", "-f", f, "--wait"]);
    assert!(first.contains("registered chat:1"), "{first}");
    assert!(
        first.contains("steady, 2 tasks of chat:1 running"),
        "{first}"
    );
    // The same files again: nothing changes.
    let again = s.ok(&["apply", "-f", s.dir.path().to_str().unwrap()]);
    assert!(again.contains("nothing to change"), "{again}");
    assert_eq!(revisions(&s, "chat"), 1);
    assert_eq!(deployments(&s, "chat"), 1);
    // Its ECS fields come back as they were written.
    let ecs: Value =
        serde_json::from_str(&s.ok(&["get", "task-definitions", "-o", "json"])).unwrap();
    let spec = &ecs["task_definitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["family"] == "chat")
        .unwrap()["spec"];
    assert_eq!(
        spec["containers"][0]["ecs"]["portMappings"][0]["containerPort"],
        8000
    );

    // One change: exactly one new revision and one rolling deployment.
    std::fs::write(&file, chat("llama-3.1-8b", 2, r#"["sleep", "infinity"]"#)).unwrap();
    let changed = s.ok(&["apply", "-f", f, "--wait"]);
    assert!(
        changed.contains("changed: containers[0].env.MODEL"),
        "{changed}"
    );
    assert!(
        changed.contains("steady, 2 tasks of chat:2 running"),
        "{changed}"
    );
    assert_eq!(revisions(&s, "chat"), 2);
    assert_eq!(deployments(&s, "chat"), 2);
    assert!(s.ok(&["apply", "-f", f]).contains("nothing to change"));

    // A revision whose tasks keep failing is rolled back, and --wait says so.
    std::fs::write(&file, chat("llama-3.1-8b", 2, r#"["sh", "-c", "exit 3"]"#)).unwrap();
    let out = s.cli(&["apply", "-f", f, "--wait", "--timeout-secs", "120"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("rolled back"), "{}", text(&out));

    // Bad input: the field is named and nothing is registered.
    let bad = s.write(
        "bad.json",
        r#"{"family": "broken", "containers": [{"name": "m", "command": ["true"], "cpu_milli": 0, "memory_mib": 0}]}"#,
    );
    let out = s.cli(&["apply", "-f", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("containers[0]"), "{}", text(&out));
    assert_eq!(revisions(&s, "broken"), 0);
    std::fs::remove_file(&bad).unwrap();

    // What cannot change in place is refused before anything changes.
    std::fs::write(
        &file,
        chat("llama-3.1-8b", 2, r#"["sleep", "infinity"]"#)
            .replace("pool: inference", "pool: training"),
    )
    .unwrap();
    let out = s.cli(&["apply", "-f", f]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("its pool cannot change in place (inference → training)"),
        "{}",
        text(&out)
    );
    assert_eq!(
        revisions(&s, "chat"),
        3,
        "the failed revision stays; no new one"
    );

    // Settings change in place: no new revision, no deployment.
    std::fs::write(
        &file,
        chat("llama-3.1-8b", 2, r#"["sleep", "infinity"]"#).replace(
            "desired_count: 2",
            "desired_count: 2\nstop_timeout_secs: 45\nconstraints:\n  max_per_gpu: 1",
        ),
    )
    .unwrap();
    let settings = s.ok(&["apply", "-f", f, "--dry-run"]);
    assert!(
        settings.contains("constraints") && settings.contains("stop timeout 30 → 45 s"),
        "{settings}"
    );
    assert!(
        s.ok(&["describe", "service", "chat"])
            .contains("stop timeout 30 s")
    );
    // For real (the definition differs from the rolled-back chat:3 too: chat:4).
    let applied = s.ok(&["apply", "-f", f, "--wait"]);
    assert!(
        applied.contains("steady, 2 tasks of chat:4 running"),
        "{applied}"
    );
    assert!(
        s.ok(&["describe", "service", "chat"])
            .contains("stop timeout 45 s")
    );
    let settled = s.ok(&["apply", "-f", f]);
    assert!(settled.contains("nothing to change"), "{settled}");

    // The placement preview of the file's service commits nothing.
    std::fs::write(&file, chat("llama-3.1-8b", 2, r#"["sleep", "infinity"]"#)).unwrap();
    let preview = s.ok(&["preview", "-f", f, "--count", "1"]);
    assert!(
        preview.contains("1 of 1 tasks of chat:4 would be placed"),
        "{preview}"
    );
}

#[test]
fn a_token_from_the_environment_needs_no_login() {
    let s = serve();
    s.login();
    // The demo's four hosts (the elastic pool's come and go with its provider).
    let fleet = |v: &Value| {
        v["hosts"].as_array().map(|h| {
            h.iter()
                .filter(|h| h["pool"] != tessera_server::demo::ELASTIC)
                .count()
        })
    };
    s.until(&["get", "hosts"], "the demo's hosts registered", |v| {
        fleet(v) == Some(4)
    });
    // Pools with their capacity providers: the elastic pool's machines.
    let pools = s.ok(&["get", "pools", "-o", "wide"]);
    let elastic = pools
        .lines()
        .find(|l| l.starts_with("elastic"))
        .unwrap_or_else(|| panic!("{pools}"));
    assert!(
        elastic.contains("demo") && elastic.contains("100 %"),
        "{pools}"
    );
    assert!(
        pools.lines().next().is_some_and(|h| h.contains("BOOTING")),
        "{pools}"
    );
    let token = serde_json::from_str::<Value>(
        &std::fs::read_to_string(s.config().join("login.json")).unwrap(),
    )
    .unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = Command::new(bin())
        .args(["get", "hosts", "-o", "json"])
        .env("TESSERA_CONFIG_DIR", Path::new("/nonexistent/tessera"))
        .env("TESSERA_URL", &s.url)
        .env("TESSERA_TOKEN", &token)
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(fleet(&v), Some(4));
}

/// `tessera backup` onto a disk that fills mid-copy (a file size limit stands in for a full
/// disk: writes past it fail as they would with ENOSPC): an error naming the file and what
/// failed, no backup under its name and no partial copy beside it. The same backup then
/// succeeds where there is room.
#[test]
fn a_backup_that_runs_out_of_room_says_so_and_leaves_no_file() {
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    let password = dir.path().join("password");
    std::fs::write(&password, "backup-test-password").expect("password file");
    // A database with the whole schema (some hundreds of KiB).
    let made = Command::new(bin())
        .args(["user", "add", "ops", "--role", "viewer"])
        .arg("--data-dir")
        .arg(&data)
        .arg("--password-file")
        .arg(&password)
        .output()
        .expect("tessera user add");
    assert!(made.status.success(), "{}", text(&made));
    let to = dir.path().join("tessera-backup.db");
    // 64 KiB at most per file; SIGXFSZ ignored, so a write past it fails with EFBIG.
    let full = Command::new("bash")
        .arg("-c")
        .arg(r#"trap '' XFSZ; ulimit -f 64; exec "$0" backup "$1" --data-dir "$2""#)
        .arg(bin())
        .arg(&to)
        .arg(&data)
        .output()
        .expect("tessera backup");
    let said = text(&full);
    assert!(!full.status.success(), "{said}");
    assert!(said.contains("tessera-backup.db"), "{said}");
    assert!(said.contains("nothing was left"), "{said}");
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tessera-backup"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let room = Command::new(bin())
        .arg("backup")
        .arg(&to)
        .arg("--data-dir")
        .arg(&data)
        .output()
        .expect("tessera backup");
    assert!(room.status.success(), "{}", text(&room));
    assert!(to.is_file());
}
