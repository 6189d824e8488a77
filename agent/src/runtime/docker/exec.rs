//! Commands run in a container through the engine's exec (`tessera exec`).

use super::Engine;
use futures_util::StreamExt;

impl Engine {
    /// Runs `request`'s command in container `docker_name` through the engine's exec
    /// (as the container's user, in its environment): its output to `out`, `input` to it,
    /// until it ends; its exit code.
    pub(crate) async fn exec(
        &self,
        docker_name: &str,
        request: &tessera_model::agent::streams::ExecRequest,
        out: tokio::sync::mpsc::Sender<Vec<u8>>,
        input: &mut tokio::sync::mpsc::Receiver<tessera_model::agent::streams::InputPiece>,
    ) -> Result<Option<i32>, bollard::errors::Error> {
        use bollard::exec::{
            CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults,
        };
        use tessera_model::agent::streams::InputPiece;
        use tokio::io::AsyncWriteExt;
        let created = self
            .docker
            .create_exec(
                docker_name,
                CreateExecOptions {
                    cmd: Some(request.command.clone()),
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(request.tty),
                    ..Default::default()
                },
            )
            .await?;
        let started = self
            .docker
            .start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: request.tty,
                    output_capacity: None,
                }),
            )
            .await?;
        if let StartExecResults::Attached {
            mut output,
            input: mut writer,
        } = started
        {
            let mut typing = true;
            loop {
                tokio::select! {
                    item = output.next() => match item {
                        Some(Ok(piece)) => {
                            if out.send(piece.into_bytes().to_vec()).await.is_err() {
                                break;
                            }
                        }
                        _ => break,
                    },
                    piece = input.recv(), if typing => match piece {
                        Some(InputPiece::Data(d)) => {
                            if writer.write_all(&d).await.is_err() {
                                typing = false;
                            }
                            let _ = writer.flush().await;
                        }
                        Some(InputPiece::Eof) | None => {
                            let _ = writer.shutdown().await;
                            typing = false;
                        }
                        Some(InputPiece::Resize { rows, cols }) => {
                            let _ = self
                                .docker
                                .resize_exec(&created.id, ResizeExecOptions { height: rows, width: cols })
                                .await;
                        }
                    },
                }
            }
        }
        let inspected = self.docker.inspect_exec(&created.id).await?;
        Ok(inspected.exit_code.and_then(|c| i32::try_from(c).ok()))
    }
}
