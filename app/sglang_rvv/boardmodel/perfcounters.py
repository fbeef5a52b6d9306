"""This process's own counters from perf_event_open(2): what ``perf stat`` counts, read in process
so that a reading can be taken at each of the board model's marks. Standard library only (the
counted guest imports it on the board, natively, with no ``perf`` tool in the image).

User space only (exclude_kernel), as the qemu counter counts the guest's user-space instructions,
and inherited by threads started after opening, so an OpenMP pool's work counts too.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

# perf_event_open's syscall number (no libc wrapper exists).
SYSCALL = {"riscv64": 241, "aarch64": 241, "x86_64": 298}
# name: (perf_event_attr.type, .config), from linux/perf_event.h.
EVENTS = {
    "instructions": (0, 1),   # PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS
    "cycles": (0, 0),         # PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES
    "task_clock_ns": (1, 1),  # PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK: any kernel has it
}
HARDWARE = ("instructions", "cycles")
_ATTR_SIZE = 64  # PERF_ATTR_SIZE_VER0: the fields below; newer kernels accept the older size
_INHERIT, _EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 1, 1 << 5, 1 << 6
_TIME_ENABLED, _TIME_RUNNING = 1, 2  # read_format: so a multiplexed count is seen, not hidden
_FD_CLOEXEC = 8
PARANOID = "/proc/sys/kernel/perf_event_paranoid"


class Unavailable(RuntimeError):
    """This process cannot count the event here; the message names why and the fix."""


def _paranoid() -> str:
    try:
        with open(PARANOID) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def _why(name: str, code: int) -> str:
    if code == errno.ENOSYS:
        return "perf_event_open is not implemented here (qemu-user, or a kernel built without perf events)"
    if code in (errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV):
        return (f"this machine exposes no {name} counter (a virtual machine without a PMU, or a kernel "
                "without the CPU's PMU driver)")
    if code in (errno.EACCES, errno.EPERM):
        return (f"refused ({errno.errorcode[code]}): kernel.perf_event_paranoid is {_paranoid()} (a process's "
                "own user-space counts need 2 or less: sysctl -w kernel.perf_event_paranoid=2), or a "
                "container's seccomp profile refuses perf_event_open (podman run --security-opt seccomp=unconfined)")
    return os.strerror(code)


class Counters:
    """The named EVENTS, opened on this process now and counting until it exits."""

    def __init__(self, names):
        unknown = [n for n in names if n not in EVENTS]
        if unknown:
            raise ValueError(f"unknown counter {', '.join(unknown)}: choose from {', '.join(EVENTS)}")
        number = SYSCALL.get(platform.machine())
        if number is None:
            raise Unavailable(f"no perf_event_open syscall number for {platform.machine()} "
                              f"(known: {', '.join(SYSCALL)})")
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        self.fds = {}
        for name in names:
            kind, config = EVENTS[name]
            attr = ctypes.create_string_buffer(struct.pack(
                "IIQQQQQ", kind, _ATTR_SIZE, config, 0, 0, _TIME_ENABLED | _TIME_RUNNING,
                _INHERIT | _EXCLUDE_KERNEL | _EXCLUDE_HV).ljust(_ATTR_SIZE, b"\0"), _ATTR_SIZE)
            fd = libc.syscall(ctypes.c_long(number), attr, ctypes.c_int(0), ctypes.c_int(-1), ctypes.c_int(-1),
                              ctypes.c_ulong(_FD_CLOEXEC))
            if fd < 0:
                self.close()
                raise Unavailable(f"perf_event_open({name}): {_why(name, ctypes.get_errno())}")
            self.fds[name] = fd

    def read(self) -> dict[str, int]:
        """Each event's count so far; ``<name>_multiplexed`` when the kernel shared its counter with
        others for part of the time (the count then covers only that part, and is kept raw)."""
        out = {}
        for name, fd in self.fds.items():
            value, enabled, running = struct.unpack("QQQ", os.read(fd, 24))
            out[name] = value
            if running < enabled:
                out[f"{name}_multiplexed"] = True
        return out

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}
