"""The sandbox's seccomp filter: syscalls a code check never needs fail with EPERM.

Built with libseccomp (the library bubblewrap's own documentation uses; `libseccomp.so.2`,
on Debian/Ubuntu package `libseccomp2`) through ctypes, exported as a BPF program that
bubblewrap installs (`--seccomp FD`) just before it runs the sandboxed command. The filter
allows everything by default and denies:
- process inspection and kernel surfaces: ptrace, process_vm_*, kcmp, perf_event_open, bpf,
  userfaultfd, io_uring_*, keyctl / add_key / request_key, syslog, personality;
- changing the system: mount / umount / pivot_root / chroot / fsopen..., swapon/off, reboot,
  kexec_*, (init|finit|delete)_module, acct, quotactl, settimeofday / clock_settime /
  adjtimex, sethostname, iopl / ioperm, name_to_handle_at / open_by_handle_at;
- new namespaces: unshare, setns, clone with any CLONE_NEW* flag, and clone3 (whose flags
  live in memory a filter cannot read: it fails with ENOSYS, so libc falls back to clone);
- network: socket() and socketpair() of any family but AF_UNIX (no IP, raw, packet, netlink
  or vsock sockets).
Syscalls of a foreign architecture (x32, i386 on x86_64) kill the process (libseccomp's
default for a bad architecture). Names this kernel's libseccomp does not know are skipped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from functools import cache

DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "perf_event_open", "bpf",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key",
    "request_key", "syslog", "personality", "mount", "umount", "umount2", "pivot_root", "chroot",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    "swapon", "swapoff", "reboot", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "acct", "quotactl", "quotactl_fd", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "iopl",
    "ioperm", "name_to_handle_at", "open_by_handle_at", "unshare", "setns", "lookup_dcookie",
    "fanotify_init", "vhangup", "nfsservctl", "uselib",
)
CLONE_NEW_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                   0x40000000, 0x00000080)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
AF_UNIX = 1

_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_NE, _SCMP_CMP_MASKED_EQ = 1, 7


def _act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


class SeccompUnavailable(RuntimeError):
    """libseccomp cannot be loaded or refused the filter."""


@cache
def _lib():
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as err:
        raise SeccompUnavailable(f"libseccomp not found ({err}); install libseccomp2") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _rule(lib, ctx, action: int, name: str, *cmps: tuple[int, int, int, int]) -> None:
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    if nr < 0:  # not a syscall of this architecture / libseccomp version
        return
    arr = (_ArgCmp * max(len(cmps), 1))(*[_ArgCmp(*c) for c in cmps])
    rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr)
    if rc < 0:
        raise SeccompUnavailable(f"libseccomp refused the rule for {name}: {os.strerror(-rc)}")


@cache
def filter_bpf() -> bytes:
    """The filter as a BPF program (bytes of `struct sock_filter`), for `bwrap --seccomp`."""
    lib = _lib()
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:
        deny = _act_errno(errno.EPERM)
        for name in DENIED:
            _rule(lib, ctx, deny, name)
        for flag in CLONE_NEW_FLAGS:  # clone(flags, ...): any namespace flag set
            _rule(lib, ctx, deny, "clone", (0, _SCMP_CMP_MASKED_EQ, flag, flag))
        _rule(lib, ctx, _act_errno(errno.ENOSYS), "clone3")
        for name in ("socket", "socketpair"):
            _rule(lib, ctx, _act_errno(errno.EAFNOSUPPORT), name, (0, _SCMP_CMP_NE, AF_UNIX, 0))
        read_fd, write_fd = os.pipe()
        try:
            rc = lib.seccomp_export_bpf(ctx, write_fd)
            os.close(write_fd)
            write_fd = -1
            if rc < 0:
                raise SeccompUnavailable(f"seccomp_export_bpf failed: {os.strerror(-rc)}")
            chunks = []
            while chunk := os.read(read_fd, 65536):
                chunks.append(chunk)
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)
        return b"".join(chunks)
    finally:
        lib.seccomp_release(ctx)


def filter_fd() -> int:
    """A fresh readable fd holding `filter_bpf()` at offset 0 (the caller passes it to
    bubblewrap and closes it)."""
    data = filter_bpf()
    fd = os.memfd_create("mlxio-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
