//! The login `tessera login` keeps: where it lives (the user's config directory), reading
//! it, and writing it owner-only (mode 0600).

use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// What `tessera login` keeps (never printed: it holds the token).
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Login {
    pub(crate) url: String,
    pub(crate) token: String,
    /// The token's id on the server (to delete it at logout).
    pub(crate) token_id: Option<String>,
    /// Who signed in.
    pub(crate) user: String,
    pub(crate) ca_cert: Option<PathBuf>,
    /// Signed in over plain http:// to a remote server on purpose (`--insecure-http`).
    #[serde(default)]
    pub(crate) insecure_http: bool,
}

/// `$TESSERA_CONFIG_DIR`, else `$XDG_CONFIG_HOME/tessera`, else `~/.config/tessera`.
fn config_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os("TESSERA_CONFIG_DIR") {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CONFIG_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("tessera"));
    }
    let home = std::env::var_os("HOME").context(
        "no HOME to keep the login in: set TESSERA_CONFIG_DIR, or pass --url and --token",
    )?;
    Ok(PathBuf::from(home).join(".config/tessera"))
}

pub(crate) fn login_file() -> anyhow::Result<PathBuf> {
    Ok(config_dir()?.join("login.json"))
}

pub(crate) fn load_login() -> anyhow::Result<Option<Login>> {
    let path = login_file()?;
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{} is not a login this tessera wrote: run `tessera login URL` again",
                path.display()
            )
        })?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

pub(crate) fn save_login(login: &Login) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let path = login_file()?;
    let dir = path.parent().expect("a file in a directory");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let bytes = serde_json::to_vec_pretty(login)?;
    // Owner-only from the start, then renamed over: never readable by others, never half
    // written.
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}
