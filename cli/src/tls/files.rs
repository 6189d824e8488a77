//! The files `tessera tls` writes: where they go, and writing them without ever
//! overwriting one (keys owner-only).

use anyhow::{Context, anyhow, bail};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// `dir/name`, or just `name` in the current directory (for shorter messages).
pub(super) fn out_path(dir: &Path, name: &str) -> PathBuf {
    if dir == Path::new(".") || dir.as_os_str().is_empty() {
        PathBuf::from(name)
    } else {
        dir.join(name)
    }
}

pub(super) fn create_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.as_os_str().is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Stops before anything is made if one of `paths` is there already.
pub(super) fn refuse_existing(paths: &[&Path]) -> anyhow::Result<()> {
    for path in paths {
        match std::fs::symlink_metadata(path) {
            Ok(_) => bail!(
                "{} already exists; not overwriting it (move it away, or pass another --dir)",
                path.display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("checking {}", path.display())),
        }
    }
    Ok(())
}

/// Writes the key (mode 0600), then the certificate (0644); a failure on the certificate
/// removes the key just written.
pub(super) fn write_pair(
    cert_path: &Path,
    cert: &str,
    key_path: &Path,
    key: &str,
) -> anyhow::Result<()> {
    write_new(key_path, key, 0o600)?;
    if let Err(e) = write_new(cert_path, cert, 0o644) {
        let _ = std::fs::remove_file(key_path);
        return Err(e);
    }
    Ok(())
}

/// Creates `path` with `mode` (less the umask) and writes `contents`; never replaces a
/// file (`O_EXCL`), so nothing is overwritten nor a key left readable through one that was
/// there.
pub(super) fn write_new(path: &Path, contents: &str, mode: u32) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                anyhow!(
                    "{} already exists; not overwriting it (move it away, or pass another --dir)",
                    path.display()
                )
            } else {
                anyhow::Error::new(e).context(format!("creating {}", path.display()))
            }
        })?;
    let written = file
        .write_all(contents.as_bytes())
        .and_then(|()| file.sync_all());
    if let Err(e) = written {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}
