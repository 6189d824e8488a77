//! Why a container ended out of memory: the kernel's OOM killer in its cgroup (at its
//! memory limit), or its own error output saying the GPU ran out of memory (CUDA, and the
//! frameworks above it, print that when an allocation fails, at the MPS pinned limit
//! included). The output is the task's own, so it can only mislabel its own end.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// What CUDA and the frameworks above it print when a GPU allocation fails (lowercase).
const GPU_SIGNS: &[&str] = &[
    "cuda out of memory",
    "cuda error: out of memory",
    "cuda_error_out_of_memory",
    "cudaerrormemoryallocation",
    "cublas_status_alloc_failed",
    "oom when allocating tensor",
    "resource_exhausted: out of memory",
];
/// How much of the end of a container's error output is read.
const TAIL_BYTES: u64 = 64 * 1024;
/// How much of the telling line is kept.
const LINE_CHARS: usize = 300;

/// What tells whether a container that failed ran out of memory: its cgroup's word, read
/// as it exited (the cgroup goes with the task), and its error output, read when its end
/// is reported (by then the last of its output has reached the file).
#[derive(Debug, Clone)]
pub(super) struct Evidence {
    pub(super) container: String,
    pub(super) kernel: Option<Option<u64>>,
    pub(super) err_log: std::path::PathBuf,
}

impl Evidence {
    pub(super) fn why(&self) -> Option<String> {
        why(&self.container, self.kernel, &self.err_log)
    }
}

/// Why container `name` ended out of memory, if it did: `kernel` is what its cgroup says
/// (`Some(limit)`: the OOM killer killed it, at that limit in MiB where known), `err_log`
/// its error output.
pub(super) fn why(name: &str, kernel: Option<Option<u64>>, err_log: &Path) -> Option<String> {
    if let Some(limit) = kernel {
        return Some(match limit {
            Some(mib) => format!(
                "container {name} was killed by the kernel's OOM killer at its memory limit of {mib} MiB"
            ),
            None => format!("container {name} was killed by the kernel's OOM killer"),
        });
    }
    let line = gpu_line(err_log)?;
    Some(format!(
        "container {name} ran out of GPU memory; its output says: {line}"
    ))
}

/// The last line of the end of `log` that says the GPU ran out of memory.
fn gpu_line(log: &Path) -> Option<String> {
    let mut f = std::fs::File::open(log).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))
        .ok()?;
    let mut tail = Vec::new();
    f.take(TAIL_BYTES).read_to_end(&mut tail).ok()?;
    let text = String::from_utf8_lossy(&tail);
    text.lines()
        .rev()
        .find(|l| {
            let l = l.to_lowercase();
            GPU_SIGNS.iter().any(|s| l.contains(s))
        })
        .map(|l| {
            super::log_read::unstamped(l)
                .1
                .trim()
                .chars()
                .filter(|c| !c.is_control())
                .take(LINE_CHARS)
                .collect()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_comes_first_then_the_gpu_line_of_its_output() {
        let dir = tempfile::tempdir().expect("dir");
        let log = dir.path().join("main.err.log");
        std::fs::write(
            &log,
            "loading\nTraceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB\nbye\n",
        )
        .expect("write");
        assert_eq!(
            why("main", Some(Some(2048)), &log).as_deref(),
            Some(
                "container main was killed by the kernel's OOM killer at its memory limit of 2048 MiB"
            )
        );
        let gpu = why("main", None, &log).expect("gpu");
        assert!(
            gpu.starts_with("container main ran out of GPU memory; its output says: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
            "{gpu}"
        );
        std::fs::write(&log, "RuntimeError: some other failure\n").expect("write");
        assert_eq!(why("main", None, &log), None);
        assert_eq!(why("main", None, &dir.path().join("missing")), None);
    }

    #[test]
    fn only_the_end_of_a_long_output_is_read_and_the_line_is_cut() {
        let dir = tempfile::tempdir().expect("dir");
        let log = dir.path().join("main.err.log");
        let mut text = "CUDA out of memory (early, long forgotten)\n".to_owned();
        text.push_str(&"x\n".repeat(40_000));
        text.push_str(&format!("cudaErrorMemoryAllocation {}\n", "y".repeat(1000)));
        std::fs::write(&log, text).expect("write");
        let gpu = why("w", None, &log).expect("the late line");
        assert!(gpu.contains("cudaErrorMemoryAllocation"), "{gpu}");
        assert!(gpu.chars().count() < 400, "{gpu}");
        std::fs::write(
            &log,
            format!("CUDA out of memory\n{}", "x\n".repeat(40_000)),
        )
        .expect("write");
        assert_eq!(why("w", None, &log), None, "beyond the tail read");
    }
}
