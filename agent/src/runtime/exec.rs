//! Commands run in a running task (`tessera exec`): for a process container, as its
//! process runs (its user, working directory, environment and cgroup), with a
//! pseudo-terminal when asked; for a container with an image, through the engine's exec.
//! Nothing of the agent's own (its mark, its environment) reaches the command, so it is
//! never taken for the task's own process.

use super::Runtime;
use super::docker::Engine;
use std::process::Stdio;
use tessera_model::agent::streams::{ExecRequest, InputPiece};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// A command started in a task: its output (standard output and error together, or the
/// terminal's), where its input goes, and its exit code once it ended.
pub struct Exec {
    pub output: mpsc::Receiver<Vec<u8>>,
    pub input: mpsc::Sender<InputPiece>,
    pub done: oneshot::Receiver<Option<i32>>,
}

impl Runtime {
    /// Starts `request`'s command in running task `task_id`; `Err` says why not.
    pub fn exec(&self, task_id: &str, request: &ExecRequest) -> Result<Exec, String> {
        let task = self
            .tasks
            .get(task_id)
            .filter(|t| t.ending.is_none())
            .ok_or_else(|| format!("task {task_id} is not running on this host"))?;
        let w = task
            .spec
            .as_ref()
            .ok_or_else(|| format!("task {task_id} is not running on this host"))?;
        let i = match &request.container {
            Some(name) => w
                .containers
                .iter()
                .position(|c| &c.name == name)
                .ok_or_else(|| {
                    let names: Vec<&str> = w.containers.iter().map(|c| c.name.as_str()).collect();
                    format!(
                        "task {task_id} has no container {name:?} (it has {})",
                        names.join(", ")
                    )
                })?,
            None => 0,
        };
        let c = &w.containers[i];
        if let Some(b) = task.boxes.iter().find(|b| b.name == c.name) {
            let (engine, docker_name) = b.probe_target();
            return Ok(exec_in_container(engine, docker_name, request.clone()));
        }
        if !task
            .procs
            .iter()
            .any(|p| p.name == c.name && p.exit.is_none())
        {
            return Err(format!(
                "container {} of task {task_id} is not running",
                c.name
            ));
        }
        let confine = self.readopted_confinement(task_id, c, task)?;
        let mut env = super::task_environment(w, i, self.mps_root.as_deref());
        env.extend(super::port_environment(&c.name, &task.ports));
        let (program, args) = request
            .command
            .split_first()
            .ok_or_else(|| "no program given".to_owned())?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args).env_clear().envs(env).kill_on_drop(true);
        confine.apply(&mut cmd).map_err(|e| e.to_string())?;
        if request.tty {
            with_terminal(cmd)
        } else {
            with_pipes(cmd)
        }
    }
}

/// Output pieces in flight from a command before its reader waits.
const OUTPUT_DEPTH: usize = 64;

/// Copies `from` to `to` in pieces until it ends.
async fn pump(mut from: impl AsyncRead + Unpin, to: mpsc::Sender<Vec<u8>>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.send(buf[..n].to_vec()).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Writes what the client types to `to`; ends it at the client's end of input.
fn feed(
    mut to: impl AsyncWrite + Unpin + Send + 'static,
    resize: impl Fn(u16, u16) + Send + 'static,
) -> mpsc::Sender<InputPiece> {
    let (tx, mut rx) = mpsc::channel::<InputPiece>(64);
    tokio::spawn(async move {
        while let Some(piece) = rx.recv().await {
            match piece {
                InputPiece::Data(d) => {
                    if to.write_all(&d).await.is_err() || to.flush().await.is_err() {
                        return;
                    }
                }
                InputPiece::Eof => {
                    let _ = to.shutdown().await;
                    return;
                }
                InputPiece::Resize { rows, cols } => resize(rows, cols),
            }
        }
    });
    tx
}

/// Waits for `child`, then for `drained` (its output read to the end), and answers its
/// exit code; kills it when the answer is no longer wanted (its client gone).
fn watch(
    mut child: tokio::process::Child,
    drained: impl Future<Output = ()> + Send + 'static,
) -> oneshot::Receiver<Option<i32>> {
    let (mut done_tx, done) = oneshot::channel();
    tokio::spawn(async move {
        let code = tokio::select! {
            status = child.wait() => status.ok().and_then(|s| s.code()),
            () = done_tx.closed() => {
                let _ = child.kill().await;
                return;
            }
        };
        drained.await;
        let _ = done_tx.send(code);
    });
    done
}

/// A command with its standard input, output and error as pipes (output and error go
/// to the client together).
fn with_pipes(mut cmd: tokio::process::Command) -> Result<Exec, String> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    let (out_tx, output) = mpsc::channel(OUTPUT_DEPTH);
    let mut pumps = Vec::new();
    if let Some(out) = child.stdout.take() {
        pumps.push(tokio::spawn(pump(out, out_tx.clone())));
    }
    if let Some(err) = child.stderr.take() {
        pumps.push(tokio::spawn(pump(err, out_tx)));
    }
    let stdin = child.stdin.take().ok_or("no standard input")?;
    let input = feed(stdin, |_, _| {});
    let done = watch(child, async move {
        for p in pumps {
            let _ = p.await;
        }
    });
    Ok(Exec {
        output,
        input,
        done,
    })
}

/// A command on a pseudo-terminal of its own: it leads a new session whose controlling
/// terminal that is; what the client types goes to the terminal, and so do its sizes.
fn with_terminal(mut cmd: tokio::process::Command) -> Result<Exec, String> {
    use std::os::fd::AsRawFd;
    let pty = nix::pty::openpty(None, None).map_err(|e| format!("no pseudo-terminal: {e}"))?;
    let slave = std::fs::File::from(pty.slave);
    let stdio = |f: &std::fs::File| f.try_clone().map(Stdio::from).map_err(|e| e.to_string());
    cmd.stdin(stdio(&slave)?)
        .stdout(stdio(&slave)?)
        .stderr(stdio(&slave)?);
    // SAFETY: in the forked child only setsid(2) and ioctl(2) on standard input (the
    // terminal, set up before the fork) run: both async-signal-safe, nothing allocated.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| e.to_string())?;
    drop(slave);
    let master = std::fs::File::from(pty.master);
    let fd = master.as_raw_fd();
    let writer = master.try_clone().map_err(|e| e.to_string())?;
    let (out_tx, output) = mpsc::channel(OUTPUT_DEPTH);
    // Once the command and all it started have closed the terminal, reading it fails
    // (EIO): the end of its output.
    let reader = tokio::spawn(pump(tokio::fs::File::from_std(master), out_tx));
    let input = feed(tokio::fs::File::from_std(writer), move |rows, cols| {
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which lives across the
        // call; the descriptor is the terminal's, kept open by the writer that owns it.
        #[allow(unsafe_code)]
        unsafe {
            libc::ioctl(fd, libc::TIOCSWINSZ, &size);
        }
    });
    let done = watch(child, async move {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), reader).await;
    });
    Ok(Exec {
        output,
        input,
        done,
    })
}

/// A command in a container with an image, through the engine's exec: as the container's
/// user, in its environment and cgroup.
fn exec_in_container(engine: Engine, docker_name: String, request: ExecRequest) -> Exec {
    let (out_tx, output) = mpsc::channel(OUTPUT_DEPTH);
    let (in_tx, mut in_rx) = mpsc::channel::<InputPiece>(64);
    let (done_tx, done) = oneshot::channel();
    tokio::spawn(async move {
        let code = match engine
            .exec(&docker_name, &request, out_tx.clone(), &mut in_rx)
            .await
        {
            Ok(code) => code,
            Err(e) => {
                let _ = out_tx
                    .send(
                        format!("tessera: the engine could not run the command: {e}\n")
                            .into_bytes(),
                    )
                    .await;
                None
            }
        };
        let _ = done_tx.send(code);
    });
    Exec {
        output,
        input: in_tx,
        done,
    }
}
