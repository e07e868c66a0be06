"""Run a command as a container runtime's default seccomp profile runs a container that lacks
CAP_SYS_NICE: the memory-policy calls refused with EPERM, everything else allowed. Docker's
and containerd's default profiles (what Kubernetes' `seccompProfile: RuntimeDefault` applies)
allow these calls only with that capability, which the Pod Security Standards' baseline does
not let a pod add. Through libseccomp (Debian's libseccomp2, which podman and systemd depend
on), as the runtimes install their filters; inherited by every process the command starts.

    python -m tests.harness.seccomp COMMAND [ARGS...]
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys

# The profile's group of calls allowed only with CAP_SYS_NICE (moby's profiles/seccomp).
REFUSED = ("get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node")
# A command's prefix that runs it so, from the checkout's root (where the tests run).
UNDER_DEFAULT_PROFILE = (sys.executable, "-m", "tests.harness.seccomp")
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_ERRNO = 0x00050000


def refuse_memory_policy() -> None:
    """Install the filter on this process (and so on whatever it executes)."""
    name = ctypes.util.find_library("seccomp")
    if name is None:
        sys.exit("libseccomp is not installed (apt-get install libseccomp2)")
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        sys.exit("seccomp_init failed")
    for call in REFUSED:
        number = lib.seccomp_syscall_resolve_name(call.encode())
        if number < 0:  # a call this libseccomp does not know (newer than it)
            continue
        if lib.seccomp_rule_add(ctx, SCMP_ACT_ERRNO | errno.EPERM, number, 0) != 0:
            sys.exit(f"seccomp_rule_add({call}) failed")
    if lib.seccomp_load(ctx) != 0:
        sys.exit("seccomp_load failed")


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    refuse_memory_policy()
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
