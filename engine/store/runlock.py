"""One writer per run folder.

The writer holds an OS lock (flock, exclusive) on RUN_DIR/.writer.lock for its whole
lifetime. The file holds JSON {pid, host, started} so a refusal can say who holds it; the
lock itself is the kernel's, so it goes when the process goes — a SIGKILLed or crashed run
never leaves a stale lock, and nothing here ever guesses from a pid whether a run is live.

    lock = runlock.acquire(run_dir)   # RunFolderBusy (a ConfigError) names the holder
    ...                               # write run.db and checkpoints
    lock.release()                    # or let the process end

`holder(run_dir)` tells a reader (the app) whether a run is live, and who writes it.

The lock file is never deleted (deleting a flock'ed file lets a second writer lock a new
file of the same name). Children forked while the lock is held (DataLoader workers) close
their copy of the descriptor at once, so a dead writer's lingering worker cannot keep the
folder locked. Torch-free.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import threading
import time
import weakref
from typing import Any, Optional

from engine.declarations.config import ConfigError

LOCK_NAME = ".writer.lock"

# What a writer puts in a run folder: each is a regular file (checkpoints a folder) the engine
# made, never a symbolic link or a device someone put there (written through, it would change a
# file outside the folder). `check_own_files` is the one check, run by `acquire` before any write.
OWN_FILES = (LOCK_NAME, "run.db", "run.db-wal", "run.db-shm", "run.db-journal")
OWN_FOLDERS = ("checkpoints",)


class RunFolderBusy(ConfigError):
    """Another live process writes this run folder. `holder` is what it wrote, if readable."""

    def __init__(self, message: str, holder: Optional[dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.holder = holder or {}


def lock_path(run_dir: str) -> str:
    return os.path.join(run_dir, LOCK_NAME)


_live: "weakref.WeakSet[RunLock]" = weakref.WeakSet()
_live_guard = threading.Lock()


def _close_in_child() -> None:
    """After fork, in the child: drop our copies of the lock descriptors. Closing (never
    LOCK_UN, which would release the parent's lock too) leaves the parent the only holder."""
    for lk in list(_live):
        fd, lk._fd = lk._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class RunLock:
    """The held lock. release() is idempotent; the lock also goes with the process."""

    def __init__(self, run_dir: str, fd: Optional[int], info: dict[str, Any], note: str = "") -> None:
        self.run_dir = run_dir
        self._fd = fd
        self.info = info
        self.note = note  # why the lock could not be taken on this file system, if so

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                pass
            os.close(fd)

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:  # a dropped lock object must not keep the folder locked
        try:
            self.release()
        except Exception:
            pass


def _read_info(fd: int) -> dict[str, Any]:
    for _ in range(5):  # the holder may be between truncate and write
        try:
            data = os.pread(fd, 4096, 0)
            info = json.loads(data.decode("utf-8", "replace")) if data.strip() else None
            if isinstance(info, dict):
                return info
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    return {}


def describe(run_dir: str, info: dict[str, Any]) -> str:
    pid, host, started = info.get("pid"), info.get("host"), info.get("started")
    who = f"pid {pid}" if pid is not None else "another process"
    where = f" on host {host}" if host else ""
    when = ""
    if isinstance(started, (int, float)):
        try:
            when = f" (started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))})"
        except (OverflowError, ValueError, OSError):
            pass
    return f"run folder {run_dir} is being written by {who}{where}{when}"


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def check_own_files(run_dir: str) -> None:
    """Refuse (ConfigError, one line) a run folder where a file the engine writes is a
    symbolic link, a folder or a device, or where checkpoints/ is not a plain folder or holds a
    link: nothing there is followed or written through. Changes nothing."""
    for name in OWN_FILES + OWN_FOLDERS:
        path = os.path.join(run_dir, name)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as e:
            raise ConfigError(f"run folder {run_dir}: cannot check {name} ({e.strerror or e})") from None
        want_dir = name in OWN_FOLDERS
        if (stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode)):
            continue
        what = "a symbolic link" if stat.S_ISLNK(mode) else ("not a folder" if want_dir else _kind(mode))
        raise ConfigError(f"run folder {run_dir}: {path} is {what}; the engine writes only its own files "
                          f"inside the run folder and never through a link (move it away to continue)")
    folder = os.path.join(run_dir, OWN_FOLDERS[0])
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if entry.is_symlink():
            raise ConfigError(f"run folder {run_dir}: {entry.path} is a symbolic link; the engine writes only "
                              "its own files inside the run folder and never through a link (move it away to "
                              "continue)")


def acquire(run_dir: str, wait: float = 0.5) -> RunLock:
    """Take the run folder for writing (the folder must exist). Raises RunFolderBusy naming
    the holder if another live process (or another RunLock in this one) has it; ConfigError
    if the lock file cannot be opened, or if a file the engine writes there is a link or a
    device (check_own_files: nothing is written through one). `wait` covers a reader's probe (holder()), which
    takes the lock shared for a moment. On a file system without flock the run goes on
    unlocked, with `note` saying so."""
    path = lock_path(run_dir)
    check_own_files(run_dir)
    try:  # O_NOFOLLOW: a link put there since the check is refused too (ELOOP), never written through
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"run folder {run_dir}: {path} is a symbolic link; the engine writes only its own "
                              "files inside the run folder and never through a link") from None
        raise ConfigError(f"run folder {run_dir}: cannot open {LOCK_NAME} ({e.strerror or e})") from None
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                info = _read_info(fd)
                os.close(fd)
                raise RunFolderBusy(describe(run_dir, info), info) from None
            time.sleep(0.02)
        except OSError as e:
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                os.close(fd)
                return RunLock(run_dir, None, {}, note=f"{run_dir}: the file system cannot lock files "
                                                       f"({e.strerror}); a second writer would not be refused")
            os.close(fd)
            raise ConfigError(f"run folder {run_dir}: cannot lock {LOCK_NAME} ({e.strerror or e})") from None
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    try:
        data = json.dumps(info).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError:
        pass  # the lock is what counts; the note about who holds it is a courtesy
    lock = RunLock(run_dir, fd, info)
    with _live_guard:
        _live.add(lock)
    return lock


def holder(run_dir: str) -> Optional[dict[str, Any]]:
    """{pid, host, started} of the live writer of run_dir, or None if nobody writes it now.
    Never creates or changes anything (the app calls it on any folder it shows)."""
    try:
        fd = os.open(lock_path(run_dir), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None  # no lock file (not a run folder, or never written by an engine that locks), or a link
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_info(fd) or {"pid": None, "host": None, "started": None}
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def pid_alive(pid: Any) -> bool:
    """Whether a process with this id exists on this host (a run.db's writer, say)."""
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, not ours
    return True


def writer(run_dir: str, info: Optional[dict[str, Any]] = None) -> Optional[dict[str, Any]]:
    """{pid, host, ...} of the live writer of a run folder, or None. The lock alone decides (the
    kernel's, so it goes with the process): run.db's status and pid (`info`, kept for the
    callers' sake) never do, since a folder copied from a live run, or a crashed run whose pid
    is now another process, says running with a pid that exists."""
    del info  # never a pid alone: see above
    held = holder(run_dir)
    return dict(held) if held is not None else None
