//! `tessera-agent check` on the real binary: each prerequisite with a verdict, and an exit
//! status that says whether the agent can run.

use std::io::{Read, Write};
use std::process::Command;

/// A server that answers every request `200` (what `/healthz` answers), on a thread.
fn healthy_server() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\nconnection: close\r\n\r\n{\"status\":\"ok\"}",
            );
        }
    });
    format!("http://{addr}")
}

fn check(server: &str, more: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera-agent"))
        .args(["check", "--server", server, "--simulate", "2xL4-24GB"])
        .args(["--runtime", "process"])
        .args(more)
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn check_says_each_prerequisite_and_fails_only_when_the_agent_cannot_run() {
    let server = healthy_server();
    let (code, out) = check(&server, &["--no-mps"]);
    assert_eq!(code, 0, "{out}");
    for line in [
        "skip  gpus: simulated (2 GPUs",
        "skip  mps: --no-mps",
        "skip  docker: --runtime process",
        &format!("ok    server: {server}/ answers"),
        "the agent can run on this host",
    ] {
        assert!(out.contains(line), "{line:?} in:\n{out}");
    }
    assert!(out.contains("cgroups: "), "{out}");

    // No server there, and an MPS program that does not exist: each fails, saying what to do.
    let (code, out) = check(
        "http://127.0.0.1:1",
        &["--mps-control", "/no/such/mps-control"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  server: http://127.0.0.1:1/") && out.contains("check the address"),
        "{out}"
    );
    assert!(
        out.contains("FAIL  mps: /no/such/mps-control not found") && out.contains("--no-mps"),
        "{out}"
    );
    assert!(
        out.contains("cannot run on this host as configured"),
        "{out}"
    );

    // Plain http to another machine is refused before anything is sent.
    let (code, out) = check("http://192.0.2.1:3000", &["--no-mps"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("--insecure-http"), "{out}");
}
