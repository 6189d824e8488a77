//! Only its own GPUs: a task's cgroup may not open the device nodes of the host's other
//! GPUs (`/dev/nvidia<N>`, character devices of major 195). The control nodes CUDA needs
//! (`/dev/nvidiactl`, `/dev/nvidia-uvm`, ...) and every other device stay as they were.
//!
//! On cgroup v1 the `devices` controller holds the rules (`devices.deny`, one line per
//! node, written on the task's cgroup before its containers' are made: they inherit it).
//! cgroup v2 has no such files: a device program (`BPF_PROG_TYPE_CGROUP_DEVICE`) attached
//! to the task's cgroup answers each open, beside whatever programs its ancestors carry
//! (`BPF_F_ALLOW_MULTI`: every program must allow). The program is a few instructions
//! written here, with no BPF toolchain: for each denied node, "a character device of this
//! major and minor: refuse"; otherwise "allow".

use std::collections::BTreeSet;
use std::path::Path;

/// The major number of NVIDIA's GPU and control nodes.
pub const NVIDIA_MAJOR: u32 = 195;
/// Minors of NVIDIA's control nodes on major 195 (`nvidia-modeset`, `nvidiactl`): never a
/// GPU.
const NVIDIA_CONTROL_MINORS: [u32; 2] = [254, 255];

/// A character device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Node {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "c {}:{}", self.major, self.minor)
    }
}

/// A device number's major and minor, as glibc's `major(3)` and `minor(3)` split it.
fn split(rdev: u64) -> Node {
    Node {
        major: (((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff)) as u32,
        minor: ((rdev & 0xff) | ((rdev >> 12) & !0xff)) as u32,
    }
}

/// The host's GPU nodes: the character devices `dev/nvidia<N>` (`N` digits), by what
/// their inode says (a node is known by its numbers, not its name).
pub fn gpu_nodes(dev: &Path) -> BTreeSet<Node> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(entries) = std::fs::read_dir(dev) else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.strip_prefix("nvidia")
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .filter_map(|e| std::fs::metadata(e.path()).ok())
        .filter(|m| m.file_type().is_char_device())
        .map(|m| split(m.rdev()))
        .filter(|n| n.major == NVIDIA_MAJOR && !NVIDIA_CONTROL_MINORS.contains(&n.minor))
        .collect()
}

/// The nodes a task given the GPUs of `own_minors` may not open: every GPU node of the
/// host but those.
pub fn denied(host: &BTreeSet<Node>, own_minors: &BTreeSet<u32>) -> Vec<Node> {
    host.iter()
        .filter(|n| !own_minors.contains(&n.minor))
        .copied()
        .collect()
}

/// One BPF instruction, as the kernel reads it (`struct bpf_insn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    code: u8,
    /// `dst_reg` in the low four bits, `src_reg` in the high four.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

// Opcodes used (see the kernel's `include/uapi/linux/bpf.h`).
const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const ALU64_AND_K: u8 = 0x57; // BPF_ALU64 | BPF_AND | BPF_K
const JMP_JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const ALU64_MOV_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const JMP_EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT
/// `BPF_DEVCG_DEV_CHAR`: the device type of a character device.
const DEV_CHAR: i32 = 2;

/// The device program refusing `nodes`: `struct bpf_cgroup_dev_ctx { u32 access_type;
/// u32 major; u32 minor; }` is read into r2 (the type, low 16 bits of `access_type`), r4
/// and r5; each node is three comparisons that skip to the next one on a difference, then
/// "return 0" (refuse); past them all, "return 1" (allow).
pub fn program(nodes: &[Node]) -> Vec<Insn> {
    let mut p = vec![
        insn(LDX_MEM_W, 2, 1, 0, 0),
        insn(ALU64_AND_K, 2, 0, 0, 0xffff),
        insn(LDX_MEM_W, 4, 1, 4, 0),
        insn(LDX_MEM_W, 5, 1, 8, 0),
    ];
    for n in nodes {
        p.extend([
            insn(JMP_JNE_K, 2, 0, 4, DEV_CHAR),
            insn(JMP_JNE_K, 4, 0, 3, n.major as i32),
            insn(JMP_JNE_K, 5, 0, 2, n.minor as i32),
            insn(ALU64_MOV_K, 0, 0, 0, 0),
            insn(JMP_EXIT, 0, 0, 0, 0),
        ]);
    }
    p.extend([insn(ALU64_MOV_K, 0, 0, 0, 1), insn(JMP_EXIT, 0, 0, 0, 0)]);
    p
}

/// What the program above answers for a character device `node` (the kernel's verdict,
/// computed the same way; for tests and for saying what a rule does).
pub fn allows(program: &[Insn], node: Node) -> bool {
    let mut regs = [0i64; 11];
    regs[2] = i64::from(DEV_CHAR);
    regs[4] = i64::from(node.major);
    regs[5] = i64::from(node.minor);
    let mut pc = 4; // the loads are done above
    while let Some(i) = program.get(pc) {
        let dst = usize::from(i.regs & 0xf);
        match i.code {
            JMP_JNE_K if regs[dst] != i64::from(i.imm) => pc += i.off as usize,
            ALU64_MOV_K => regs[dst] = i64::from(i.imm),
            JMP_EXIT => return regs[0] != 0,
            _ => {}
        }
        pc += 1;
    }
    false
}

/// Attaches the program refusing `nodes` to the cgroup v2 directory `cgroup`, beside the
/// programs already there. The cgroup keeps it (and it applies to every cgroup made
/// inside) until the cgroup is removed.
#[allow(unsafe_code)]
pub fn attach(cgroup: &Path, nodes: &[Node]) -> Result<(), String> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_ATTACH: libc::c_long = 8;
    const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
    const BPF_CGROUP_DEVICE: u32 = 6;
    const BPF_F_ALLOW_MULTI: u32 = 2;

    /// `union bpf_attr` for `BPF_PROG_LOAD`, up to the fields used.
    #[repr(C)]
    #[derive(Default)]
    struct ProgLoad {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        prog_name: [u8; 16],
        prog_ifindex: u32,
        expected_attach_type: u32,
    }
    /// `union bpf_attr` for `BPF_PROG_ATTACH`.
    #[repr(C)]
    #[derive(Default)]
    struct ProgAttach {
        target_fd: u32,
        attach_bpf_fd: u32,
        attach_type: u32,
        attach_flags: u32,
    }

    let dir = std::fs::File::open(cgroup).map_err(|e| format!("{}: {e}", cgroup.display()))?;
    let insns = program(nodes);
    let license = c"GPL";
    let mut name = [0u8; 16];
    name[..14].copy_from_slice(b"tessera_devdny");
    // Loaded without the verifier's log first (a log too small for a long program fails
    // the load with ENOSPC); only a refused program is loaded again to say why.
    let load = |log: &mut Vec<u8>| {
        let attr = ProgLoad {
            prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: u32::from(!log.is_empty()),
            log_size: log.len() as u32,
            log_buf: if log.is_empty() {
                0
            } else {
                log.as_mut_ptr() as u64
            },
            prog_name: name,
            expected_attach_type: BPF_CGROUP_DEVICE,
            ..Default::default()
        };
        // SAFETY: bpf(2) reads `attr` (a `union bpf_attr` prefix of the size given) and
        // the instructions, license and log buffer it points to, all alive until it
        // returns; the log buffer's length is the size given (none: no log). A
        // non-negative return is a new descriptor that nothing else owns.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_LOAD,
                &attr as *const ProgLoad,
                std::mem::size_of::<ProgLoad>(),
            )
        };
        (fd, std::io::Error::last_os_error())
    };
    let (fd, err) = load(&mut Vec::new());
    if fd < 0 {
        let mut log = vec![0u8; 1 << 20];
        load(&mut log);
        let said = String::from_utf8_lossy(&log);
        return Err(format!(
            "loading the device program: {err} {}",
            said.trim_end_matches('\0').trim()
        ));
    }
    // SAFETY: `fd` was just returned by the kernel and is owned here alone.
    let prog = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let attach = ProgAttach {
        target_fd: dir.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
    };
    // SAFETY: bpf(2) reads `attach` (of the size given); both descriptors are open.
    let done = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_ATTACH,
            &attach as *const ProgAttach,
            std::mem::size_of::<ProgAttach>(),
        )
    };
    if done < 0 {
        return Err(format!(
            "attaching the device program to {}: {}",
            cgroup.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(minor: u32) -> Node {
        Node {
            major: NVIDIA_MAJOR,
            minor,
        }
    }

    /// glibc's `makedev(3)`.
    fn makedev(major: u64, minor: u64) -> u64 {
        ((major & 0xfff) << 8) | ((major & !0xfff) << 32) | (minor & 0xff) | ((minor & !0xff) << 12)
    }

    #[test]
    fn device_numbers_split_as_glibc_splits_them() {
        assert_eq!(split(0xc303), n(3), "makedev(195, 3)");
        for (major, minor) in [(195, 0), (511, 300_000), (4097, 255), (1, 3)] {
            assert_eq!(
                split(makedev(major, minor)),
                Node {
                    major: major as u32,
                    minor: minor as u32
                }
            );
        }
    }

    #[test]
    fn a_task_is_denied_the_other_gpus_only() {
        let host: BTreeSet<Node> = [n(0), n(1), n(2), n(3)].into();
        assert_eq!(denied(&host, &[1].into()), vec![n(0), n(2), n(3)]);
        assert_eq!(denied(&host, &[].into()), vec![n(0), n(1), n(2), n(3)]);
        assert_eq!(denied(&host, &[0, 1, 2, 3].into()), vec![]);
    }

    #[test]
    fn the_program_refuses_exactly_the_denied_nodes() {
        let p = program(&[n(0), n(2)]);
        assert_eq!(p.len(), 4 + 2 * 5 + 2);
        assert!(!allows(&p, n(0)));
        assert!(allows(&p, n(1)), "its own GPU");
        assert!(!allows(&p, n(2)));
        assert!(allows(&p, n(255)), "nvidiactl");
        assert!(
            allows(&p, Node { major: 1, minor: 3 }),
            "/dev/null and the rest"
        );
        assert!(allows(&program(&[]), n(0)), "nothing denied");
    }

    /// The program on a real cgroup v2 (root, and a v2 hierarchy here): a process in the
    /// cgroup opens a fake node of a denied GPU (EPERM) and one of its own (ENXIO: no
    /// driver behind it, but past the program).
    #[test]
    fn the_program_holds_on_a_real_cgroup() {
        let v2 = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .iter()
            .map(Path::new)
            .find(|p| p.join("cgroup.subtree_control").is_file());
        let (true, Some(v2)) = (nix::unistd::geteuid().is_root(), v2) else {
            println!("skipped: needs root and a cgroup v2 hierarchy");
            return;
        };
        let cg = v2.join(format!("tessera-devices-test-{}", std::process::id()));
        std::fs::create_dir(&cg).expect("cgroup");
        let dir = tempfile::tempdir().expect("dir");
        for minor in [0, 1, 16] {
            let made = std::process::Command::new("mknod")
                .arg(dir.path().join(format!("nvidia{minor}")))
                .args(["c", "195", &minor.to_string()])
                .status()
                .expect("mknod");
            assert!(made.success());
        }
        // Fifteen other GPUs denied (a 16-GPU host), minor 1 its own.
        let denied: Vec<Node> = (0..17).filter(|m| *m != 1).map(n).collect();
        let attached = attach(&cg, &denied);
        let out = attached.as_ref().ok().map(|()| {
            std::process::Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "echo $$ > {}/cgroup.procs && cat {d}/nvidia0; cat {d}/nvidia1; cat {d}/nvidia16",
                    cg.display(),
                    d = dir.path().display()
                ))
                .output()
                .expect("sh")
        });
        let _ = std::fs::remove_dir(&cg);
        attached.expect("the program attaches");
        let said = String::from_utf8_lossy(&out.expect("ran").stderr).into_owned();
        println!("{said}");
        assert!(said.contains("nvidia0: Operation not permitted"), "{said}");
        assert!(
            said.contains("nvidia1: No such device or address"),
            "{said}"
        );
        assert!(said.contains("nvidia16: Operation not permitted"), "{said}");
    }

    #[test]
    fn gpu_nodes_are_known_by_their_numbers() {
        let dir = tempfile::tempdir().expect("dir");
        // Not character devices (no privilege needed to make these): none is a GPU node.
        std::fs::write(dir.path().join("nvidia0"), "").expect("file");
        std::fs::write(dir.path().join("nvidiactl"), "").expect("file");
        assert!(gpu_nodes(dir.path()).is_empty());
        assert!(gpu_nodes(&dir.path().join("missing")).is_empty());
    }
}
