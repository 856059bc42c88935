"""A small seccomp filter for the bubblewrap child (x86-64 only), passed to `bwrap --seccomp`.

Why: the child is an unprivileged uid, but unprivileged user namespaces are enabled on most
kernels, and inside one it would regain (namespaced) capabilities and reach much more kernel
surface. The filter refuses: creating user namespaces (clone with CLONE_NEWUSER, unshare,
clone3 — the latter with ENOSYS so that glibc falls back to clone), mounting, setns, ptrace,
keyrings, bpf, perf events, userfaultfd, io_uring, module and kexec loading, personality;
and kills a process that uses the 32-bit or x32 syscall ABIs to get around the filter.
Everything else is allowed: this is a seatbelt on top of namespaces and rlimits, not a
whitelist.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
CLONE_NEWUSER = 0x10000000

NR_CLONE, NR_CLONE3 = 56, 435
DENIED = {  # x86-64 syscall numbers
    "ptrace": 101, "personality": 135, "pivot_root": 155, "mount": 165, "umount2": 166,
    "init_module": 175, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
    "unshare": 272, "perf_event_open": 298, "setns": 308, "finit_module": 313, "bpf": 321,
    "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
}

# classic BPF opcodes and seccomp return values
LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
OFF_NR, OFF_ARCH, OFF_ARG0 = 0, 4, 16  # struct seccomp_data


def supported() -> bool:
    return platform.machine() == "x86_64"


def filter_program() -> bytes:
    """The filter as an array of struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}."""
    # (code, k, jump-if-true label, jump-if-false label); labels resolved below
    prog: list[tuple] = [
        ("arch", LD_ABS, OFF_ARCH, None, None),
        (None, JEQ, AUDIT_ARCH_X86_64, None, "kill"),
        (None, LD_ABS, OFF_NR, None, None),
        (None, JGE, X32_SYSCALL_BIT, "kill", None),
        *[(None, JEQ, nr, "eperm", None) for nr in sorted(DENIED.values())],
        (None, JEQ, NR_CLONE3, "enosys", None),
        (None, JEQ, NR_CLONE, "clone", None),
        ("allow", RET, RET_ALLOW, None, None),
        ("clone", LD_ABS, OFF_ARG0, None, None),  # low 32 bits of the flags
        (None, JSET, CLONE_NEWUSER, "eperm", None),  # BPF jumps only go forward:
        (None, RET, RET_ALLOW, None, None),  # a second "allow"
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


def filter_fd() -> int | None:
    """A memfd holding the filter, positioned at 0, for `bwrap --seccomp FD` (caller closes)."""
    if not supported():
        return None
    fd = os.memfd_create("nestor-seccomp")  # close-on-exec; Popen(pass_fds=...) hands it on
    os.write(fd, filter_program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
