"""The seccomp filter of the bubblewrap child (x86-64 only), passed to `bwrap --seccomp`.

Why: the child is an unprivileged uid in empty namespaces, but the kernel surface it can reach
is large. The filter:
- kills a process that uses the 32-bit or x32 syscall ABIs (they would get around it);
- allows `socket`/`socketpair` for AF_UNIX only (asyncio's self-pipe, multiprocessing); every
  other family — AF_INET (the netns is empty anyway), AF_NETLINK, AF_PACKET, AF_VSOCK, AF_ALG,
  AF_BLUETOOTH... — gets EAFNOSUPPORT, which Python handles like "no network";
- refuses (EPERM) new namespaces (unshare, setns, clone with any CLONE_NEW* flag; clone3 gets
  ENOSYS so that glibc falls back to clone, whose flags a filter can read), cross-process
  memory and fd access (ptrace, process_vm_readv/writev, pidfd_getfd, kcmp, process_madvise,
  process_mrelease, move_pages, migrate_pages), the mount family, keyrings, bpf, perf events,
  userfaultfd, io_uring, fanotify, handle-based opens, module and kexec loading, and the
  host-administration calls (reboot, swap, clock and hostname setting, acct, quotactl,
  syslog, iopl/ioperm, modify_ldt, chroot, personality...).
The job host's zygote gets a variant (`filter_program(zygote=True)`): `unshare` with only the
flags host_ns.py uses (user, pid, mount, ipc, net) and `mount` are allowed, so that it can give
each job fresh namespaces; the job itself runs under the full filter, stacked on top by
host_ns.py before any job code runs (filters stack: the strictest answer wins).
Everything else is allowed: what an interpreter, verifiers and a rubric need (files, threads,
fork/exec, mmap, futex, epoll, signals). A true allowlist would have to track every libc and
numpy release; the refusals above are the review of the x86-64 table (see docs/sandbox.md).
"""

from __future__ import annotations

import errno
import os
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
CLONE_NEW_ANY = (0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000  # time, ns,
                 | 0x10000000 | 0x20000000 | 0x40000000)  # cgroup, uts, ipc, user, pid, net
AF_UNIX = 1
# What the zygote may unshare (host_ns.FLAGS): user, mount, ipc, pid, net.
ZYGOTE_UNSHARE = 0x10000000 | 0x00020000 | 0x08000000 | 0x20000000 | 0x40000000

NR_CLONE, NR_CLONE3, NR_SOCKET, NR_SOCKETPAIR, NR_UNSHARE = 56, 435, 41, 53, 272
DENIED = {  # x86-64 syscall numbers, refused with EPERM
    # other processes' memory, fds and state
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "pidfd_getfd": 438, "process_madvise": 440, "process_mrelease": 448,
    "move_pages": 279, "migrate_pages": 256,
    # namespaces and mounts
    "unshare": 272, "setns": 308, "pivot_root": 155, "chroot": 161, "mount": 165,
    "umount2": 166, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    # kernel attack surface an interpreter never needs
    "add_key": 248, "request_key": 249, "keyctl": 250, "bpf": 321, "perf_event_open": 298,
    "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "fanotify_init": 300, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "lookup_dcookie": 212, "personality": 135, "modify_ldt": 154,
    "uselib": 134, "ustat": 136, "sysfs": 139, "_sysctl": 156, "vhangup": 153,
    # host administration
    "syslog": 103, "adjtimex": 159, "settimeofday": 164, "clock_settime": 227,
    "clock_adjtime": 305, "acct": 163, "swapon": 167, "swapoff": 168, "reboot": 169,
    "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173, "quotactl": 179,
    "quotactl_fd": 443, "nfsservctl": 180,
    # modules and kexec
    "create_module": 174, "init_module": 175, "delete_module": 176, "get_kernel_syms": 177,
    "query_module": 178, "finit_module": 313, "kexec_load": 246, "kexec_file_load": 320,
}

# classic BPF opcodes and seccomp return values
LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
OFF_NR, OFF_ARCH, OFF_ARG0 = 0, 4, 16  # struct seccomp_data


def supported() -> bool:
    return platform.machine() == "x86_64"


def filter_program(zygote: bool = False) -> bytes:
    """The filter as an array of struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}.
    zygote: the job host's variant (unshare of ZYGOTE_UNSHARE flags, and mount, allowed)."""
    denied = {n: nr for n, nr in DENIED.items() if not (zygote and n in ("unshare", "mount"))}
    # (code, k, jump-if-true label, jump-if-false label); labels resolved below
    prog: list[tuple] = [
        ("arch", LD_ABS, OFF_ARCH, None, None),
        (None, JEQ, AUDIT_ARCH_X86_64, None, "kill"),
        (None, LD_ABS, OFF_NR, None, None),
        (None, JGE, X32_SYSCALL_BIT, "kill", None),
        *[(None, JEQ, nr, "eperm", None) for nr in sorted(denied.values())],
        *([(None, JEQ, NR_UNSHARE, "unshare", None)] if zygote else []),
        (None, JEQ, NR_CLONE3, "enosys", None),
        (None, JEQ, NR_CLONE, "clone", None),
        (None, JEQ, NR_SOCKET, "socket", None),
        (None, JEQ, NR_SOCKETPAIR, "socket", None),
        ("allow", RET, RET_ALLOW, None, None),
        ("clone", LD_ABS, OFF_ARG0, None, None),  # low 32 bits of the flags
        (None, JSET, CLONE_NEW_ANY, "eperm", None),  # BPF jumps only go forward:
        (None, RET, RET_ALLOW, None, None),  # a second "allow"
        *([("unshare", LD_ABS, OFF_ARG0, None, None),  # the flags: only the zygote's set
           (None, JSET, 0xFFFFFFFF & ~ZYGOTE_UNSHARE, "eperm", None),
           (None, RET, RET_ALLOW, None, None)] if zygote else []),
        ("socket", LD_ABS, OFF_ARG0, None, None),  # the address family (an int)
        (None, JEQ, AF_UNIX, None, "eafnosupport"),
        (None, RET, RET_ALLOW, None, None),
        ("eafnosupport", RET, RET_ERRNO | errno.EAFNOSUPPORT, None, None),
        ("eperm", RET, RET_ERRNO | errno.EPERM, None, None),
        ("enosys", RET, RET_ERRNO | errno.ENOSYS, None, None),
        ("kill", RET, RET_KILL_PROCESS, None, None),
    ]
    where = {label: i for i, (label, *_) in enumerate(prog) if label}
    out = bytearray()
    for i, (_, code, k, jt, jf) in enumerate(prog):
        rel = [0 if t is None else where[t] - i - 1 for t in (jt, jf)]
        assert all(0 <= r < 256 for r in rel), "jump out of range"
        out += struct.pack("=HBBI", code, rel[0], rel[1], k)
    return bytes(out)


def filter_fd(zygote: bool = False) -> int | None:
    """A memfd holding the filter, positioned at 0, for `bwrap --seccomp FD` (caller closes)."""
    if not supported():
        return None
    fd = os.memfd_create("nestor-seccomp")  # close-on-exec; Popen(pass_fds=...) hands it on
    os.write(fd, filter_program(zygote))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
