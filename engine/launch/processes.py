"""Which process is which: a pid with its start time, so that a reused pid never passes for the
process it once was (standard library only).

Linux reads /proc/<pid>/stat (start time in clock ticks since boot, with the boot's id); Windows asks
kernel32 for the creation time; other systems (macOS) know only whether the pid exists. Used by the
run-folder lock (engine/launch/run_lock.py), the ranks' watch of the ComfyUI server that started
them (engine/launch/owner.py) and the explanation of a rank that died of a signal.
"""
from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def identity(pid: int | None = None) -> dict:
    """{"pid", "start", "host"} of a live process (this one by default); start is "" where unknown."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start": start_time(pid) or "", "host": socket.gethostname()}


def is_running(ident: dict) -> bool:
    """True while the process `ident` names still runs: same pid and, where known, the same start time.
    A process on another host cannot be checked from here: it counts as running."""
    if ident.get("host", socket.gethostname()) != socket.gethostname():
        return True
    pid, start = int(ident["pid"]), ident.get("start") or ""
    now = start_time(pid)
    if now is not None or start:
        return now is not None and (not start or now == start)
    return _pid_exists(pid)  # no start times on this system


def start_time(pid: int) -> str | None:
    """The start time of a running process as an opaque string; None if it is gone (or a zombie) or
    this system gives no start times."""
    if os.name == "nt":
        return _windows_start(pid)
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    try:
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        boot = ""
    return f"{boot}:{fields[19]}"


def exit_status(pid: int) -> int | None:
    """A finished but not yet reaped child (a zombie, Linux): its returncode as subprocess reports it
    (-9 = killed by SIGKILL). None while it runs, once reaped, or where this cannot be read."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] != "Z" or len(fields) < 50:
        return None
    status = int(fields[49])  # waitpid's status: the signal in the low 7 bits, else the exit code
    return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


def describe_returncode(code: int) -> str:
    """'killed by SIGKILL (signal 9)' for a negative returncode, else 'exited with code N'."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (signal {-code})"
    return f"exited with code {code}"


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces): fields 3.. of proc(5)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return text.rsplit(")", 1)[1].split()


def _pid_exists(pid: int) -> bool:
    if os.name == "nt":
        return _windows_start(pid) is not None  # os.kill(pid, 0) would end the process on Windows
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True


def _windows_start(pid: int) -> str | None:
    """Creation time of a running process (kernel32: OpenProcess, GetExitCodeProcess, GetProcessTimes)."""
    import ctypes
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.OpenProcess.restype = wintypes.HANDLE
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return None
    try:
        code = wintypes.DWORD()
        if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)) or code.value != 259:  # STILL_ACTIVE
            return None
        created, exited, kernel, user = (wintypes.FILETIME() for _ in range(4))
        if not kernel32.GetProcessTimes(handle, ctypes.byref(created), ctypes.byref(exited), ctypes.byref(kernel),
                                        ctypes.byref(user)):
            return None
        return str(created.dwHighDateTime << 32 | created.dwLowDateTime)
    finally:
        kernel32.CloseHandle(handle)
