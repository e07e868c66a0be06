"""Boot a 2-socket, 2-node, SMT virtual machine and run the NUMA tests inside it.

    .venv/bin/python -m tests.numa_vm [--setup-only] [--timeout S] [PYTEST ARGS]

The development and CI machines have one NUMA node; this shows, on a kernel with two, that a
real server pins each worker to its planned CPUs and binds its memory to its node
(tests/test_numa_vm.py). Set-up is idempotent (as root, on Debian): Debian's qemu-system-x86,
kmod, busybox-static and numactl; a Debian kernel unpacked under the cache directory, with its
modules in /lib/modules/<ver>; virtme-ng (`vng`) in this virtual environment; a tiny checkpoint
for the server to load. The guest mounts the host's root filesystem read-only, so it runs this
checkout and this virtual environment as they are. Exits with pytest's exit code from inside
the guest.

Software emulation (TCG): booting with KVM fails on these machines (`failed to set MSR 0x10a`
under `-cpu host`). Haswell-noTSX has AVX2, so the int8 kernels run.
Environment: NUMASERVE_VM_CACHE (default .cache/numa-vm in the checkout; the guest must see it).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.harness.bed import (
    REPO,
    SetupError,
    ensure_debian_packages,
    ensure_tiny_classifier,
    parse_arguments,
    run,
)

# Inside the checkout (git ignores it): the guest sees the host's files, but not /var/cache.
CACHE = Path(os.environ.get("NUMASERVE_VM_CACHE", REPO / ".cache/numa-vm"))
SENTINEL = "NUMASERVE-VM-EXIT="
BOOTS = 3
VENV_BIN = Path(sys.executable).parent  # vng runs virtme-run from PATH: a venv need not be on it
DEBIAN_PACKAGES = {  # a command each package provides -> the package
    "qemu-system-x86_64": "qemu-system-x86",
    "depmod": "kmod",
    "busybox": "busybox-static",
    "numactl": "numactl",
}
# 2 sockets x 2 cores x 2 threads; node 0 is CPUs 0-3 (socket 0), node 1 is CPUs 4-7.
VNG_MACHINE = [
    "--cpus", "8", "--memory", "4G",
    "--numa", "2G,cpus=0-3", "--numa", "2G,cpus=4-7",
    "--disable-microvm", "--disable-kvm", "--verbose",
    "--qemu-opts=-smp 8,sockets=2,cores=2,threads=2 -cpu Haswell-noTSX",
]  # fmt: skip
# What the guest's topology reads of the int8 extensions of Haswell-noTSX: AVX2, no VNNI.
GUEST_ISA = ("avx2",)
# Under emulation the kernel's clocksource watchdog can find the TSC "unstable" and fall back
# to the HPET, which qemu emulates slowly: every clock read then costs an MMIO exit, and the
# guest crawls (seen here: a server that started in 5 minutes took over 20).
KERNEL_ARGS = ["tsc=reliable"]
BOOT_LOG = CACHE / "last-boot.log"  # the kernel's lines of the last boot


def say(message: str) -> None:
    print(f"numa-vm: {message}", flush=True)


def kernel_version() -> str:
    """The version Debian's linux-image-amd64 points at, e.g. 6.1.0-56-amd64."""
    for attempt in range(2):
        out = subprocess.run(
            ["apt-cache", "depends", "linux-image-amd64"], text=True, capture_output=True
        ).stdout
        found = re.search(r"Depends:\s*linux-image-(\S+)", out)
        if found:
            return found.group(1)
        if attempt == 0:  # a fresh machine may have no package lists yet
            run(["apt-get", "update", "-qq"])
    raise SetupError(f"apt-cache names no kernel for linux-image-amd64:\n{out}")


def ensure_kernel() -> Path:
    cached = sorted(CACHE.glob("vmlinuz-*"))
    version = cached[-1].name.removeprefix("vmlinuz-") if cached else kernel_version()
    vmlinuz = CACHE / f"vmlinuz-{version}"
    modules = Path("/lib/modules") / version
    if vmlinuz.exists() and (modules / "modules.dep").exists():
        return vmlinuz
    say(f"fetching Debian's kernel {version}")
    work = CACHE / "download"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        run(["apt-get", "download", f"linux-image-{version}"], cwd=work)
        (deb,) = work.glob("*.deb")
        run(["dpkg-deb", "-x", str(deb), str(work / "root")])
    except (subprocess.CalledProcessError, ValueError) as e:
        raise SetupError(f"cannot fetch or unpack linux-image-{version}: {e}") from None
    if not modules.exists():
        shutil.copytree(work / "root/lib/modules" / version, modules)
    run(["depmod", version])
    tmp = vmlinuz.with_suffix(".tmp")
    shutil.copyfile(work / "root/boot" / f"vmlinuz-{version}", tmp)
    tmp.rename(vmlinuz)  # last, so that a half-done set-up is never taken for a done one
    shutil.rmtree(work)
    return vmlinuz


def ensure_vng() -> str:
    vng = VENV_BIN / "vng"
    if not (vng.exists() and (VENV_BIN / "virtme-run").exists()):
        say("installing virtme-ng from PyPI")
        constraints = REPO / "constraints.txt"
        try:
            run([sys.executable, "-m", "pip", "install", "-q", "-c", str(constraints), "virtme-ng"])
        except subprocess.CalledProcessError as e:
            raise SetupError(f"pip could not install virtme-ng:\n{e.stderr}") from None
    return str(vng)


def ensure_model() -> Path:
    """A tiny classifier saved on the host: the guest sees it, read-only, at the same path."""
    return ensure_tiny_classifier(CACHE / "tiny-classifier", say)


def ensure_artifacts(model: Path) -> Path:
    """The artifacts the guest's servers load (every model of tests/harness/vm_server.py),
    built here as the guest would build them for its CPU model: under emulation each build
    spends minutes importing torch, then minutes more running it. The guest's `numaserve
    prepare` finds them, checks their digests and builds nothing. The guest is told where, as
    $NUMASERVE_VM_ARTIFACTS: tests/conftest.py gives each run a new $NUMASERVE_CACHE, which
    tests/test_numa_vm.py points here (read-only)."""
    cache = CACHE / "artifacts"
    say(f"the guest's artifacts, built or verified, in {cache}")
    script = "from tests.harness.vm_server import *; "
    script += f"prepare_every_model({str(model)!r}, {GUEST_ISA!r})"
    try:
        run(
            [sys.executable, "-c", script],
            cwd=REPO,
            env={**os.environ, "NUMASERVE_CACHE": str(cache)},
        )
    except subprocess.CalledProcessError as e:
        raise SetupError(f"the guest's artifacts could not be built:\n{e.stderr[-3000:]}") from None
    return cache


def guest_command(model: Path, artifacts: Path, pytest_args: list[str]) -> str:
    """What the guest runs: a script in the cache, and a short command that runs it. vng passes
    the command on the kernel's command line, base64 and all, before the --append arguments,
    and the kernel cuts that line at 2,048 bytes: a long command silently cut off the
    arguments after it."""
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "numa_vm"]
    pytest += ["--timeout=1500", "--durations=0"]  # emulation: torch takes minutes to import
    pytest += ["tests/test_numa_vm.py", *pytest_args]  # only this module: imports are slow here
    env = f"PYTHONDONTWRITEBYTECODE=1 HOME=/tmp NUMASERVE_VM_MODEL={shlex.quote(str(model))}"
    env += f" NUMASERVE_VM_ARTIFACTS={shlex.quote(str(artifacts))}"
    script = CACHE / "guest.sh"
    script.write_text(
        f"cd {shlex.quote(str(REPO))} && export {env} && {shlex.join(pytest)}\necho {SENTINEL}$?\n"
    )
    return f"sh {shlex.quote(str(script))}"


def boot(vng: str, vmlinuz: Path, command: str, timeout: float) -> int | None:
    """Boot, stream the guest's own lines (kernel lines go to the log), return its exit code,
    or None when it never reported one. vng's own exit status is not the command's, hence
    the sentinel line."""
    argv = [vng, "--run", str(vmlinuz), *VNG_MACHINE, "--append", " ".join(KERNEL_ARGS)]
    argv += ["--exec", command]
    say(f"booting (software emulation; kernel lines in {BOOT_LOG})")
    began = time.monotonic()
    code = None
    with BOOT_LOG.open("w") as log:
        proc = subprocess.Popen(
            argv,
            env={**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        try:
            for line in proc.stdout:
                log.write(line)
                if exit_code := re.search(re.escape(SENTINEL) + r"\s*(\d+)", line):
                    # digits only: the guest's console may run a kernel message on into the line
                    code = int(exit_code[1])
                elif not line.startswith("["):
                    print(line, end="", flush=True)
                if time.monotonic() - began > timeout:
                    say(f"timed out after {timeout:.0f} s")
                    break
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            proc.wait()
    if code is not None:
        say(f"guest exit code {code} after {time.monotonic() - began:.0f} s")
    return code


def boot_until_it_reports(vng: str, vmlinuz: Path, command: str, timeout: float) -> int:
    """qemu's software emulation now and then dies while booting (seen here: an assertion in
    its MSI-X emulation); that says nothing of numaserve, so boot again, up to BOOTS times."""
    deadline = time.monotonic() + timeout
    for attempt in range(1, BOOTS + 1):
        code = boot(vng, vmlinuz, command, deadline - time.monotonic())
        if code is not None:
            return code
        tail = "".join(BOOT_LOG.read_text().splitlines(True)[-15:])
        say(
            f"boot {attempt} of {BOOTS} ended with no exit code from the guest; last lines:\n{tail}"
        )
        if time.monotonic() >= deadline:
            break
    raise SetupError(f"the guest never reported an exit code in {BOOTS} boots")


def main() -> int:
    args = parse_arguments(__doc__, 2400, "seconds, all boots together")
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        ensure_debian_packages(DEBIAN_PACKAGES, say)
        vmlinuz = ensure_kernel()
        vng = ensure_vng()
        model = ensure_model()
        artifacts = ensure_artifacts(model)
        if args.setup_only:
            say(f"ready: kernel {vmlinuz}, vng {vng}, model {model}")
            return 0
        command = guest_command(model, artifacts, args.pytest_args)
        return boot_until_it_reports(vng, vmlinuz, command, args.timeout)
    except SetupError as e:
        say(f"error: {e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
