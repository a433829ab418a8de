"""Atomic writes: a file or folder appears whole under its name, or not at all.

Data goes to a temporary name in the destination's folder, is fsynced and renamed over the destination. A failed
write leaves the destination as it was, removes the partial data and raises `WriteFailedError`.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_NEARLY_FULL = 1 << 20  # free bytes under which a write failure that gives no errno is a full disk


class WriteFailedError(OSError):
    """A write that did not happen: the destination is as it was and the partial data removed."""

    def __init__(self, message: str, *, path: Path | None = None, code: int | None = None,
                 disk_full: bool = False, needed: int | None = None, free: int | None = None):
        super().__init__(message)
        self.errno = code
        self.path, self.disk_full, self.needed, self.free = path, disk_full, needed, free

    def __reduce__(self) -> tuple:
        """Pickled whole (errno included), to share one rank's failure with the others."""
        return type(self), (str(self),), {**self.__dict__, "errno": self.errno}


def temp_path(path: Path) -> Path:
    """The temporary file a write of ``path`` goes through (this process's own name)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def temp_folder(dest: Path) -> Path:
    """The temporary folder a folder ``dest`` is assembled in."""
    return dest.with_name(f".{dest.name}.tmp")


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any], *, size: int | None = None,
                 what: str = "") -> Path:
    """Make ``path`` atomically by ``write(file)``; ``size`` and ``what`` go into the `WriteFailedError` message."""
    path = Path(path)
    tmp = temp_path(path)

    def to_temp() -> None:
        with open(tmp, "wb") as f:
            out = _RecordingFile(f)
            try:
                write(out)  # type: ignore[arg-type]
            except Exception as e:
                if out.error is not None and e is not out.error and e.__cause__ is None:
                    raise e from out.error  # torch.save's RuntimeError: the OSError is why
                raise
            f.flush()
            os.fsync(f.fileno())

    return _commit(path, tmp, to_temp, size, what)


def atomic_write_path(path: str | os.PathLike, write: Callable[[Path], Any], *, size: int | None = None,
                      what: str = "") -> Path:
    """Make ``path`` by ``write(tmp)`` (a writer taking a file name), atomically, as :func:`atomic_write`."""
    path = Path(path)
    tmp = temp_path(path)

    def to_temp() -> None:
        write(tmp)
        _fsync_file(tmp)

    return _commit(path, tmp, to_temp, size, what)


def atomic_write_text(path: str | os.PathLike, text: str, *, what: str = "") -> Path:
    data = text.encode("utf-8")
    return atomic_write(path, lambda f: f.write(data), size=len(data), what=what)


@contextlib.contextmanager
def atomic_folder(dest: str | os.PathLike, *, what: str = "") -> Iterator[Path]:
    """A fresh temporary folder next to ``dest`` to fill in the ``with`` block; it then replaces ``dest``
    (an old one removed). A write error in the block removes it and raises :class:`WriteFailedError`."""
    dest = Path(dest)
    tmp = temp_folder(dest)
    try:
        remove_quietly(tmp)
        tmp.mkdir(parents=True)
        yield tmp
        replace_folder(tmp, dest)
    except BaseException as e:
        if not is_write_error(e):
            remove_quietly(tmp)
            raise
        raise write_failure(dest, e, what=what, partial=tmp) from e


def replace_folder(tmp: Path, dest: Path) -> None:
    """Put the complete folder ``tmp`` in the place of ``dest`` (an old ``dest`` removed first)."""
    fsync_dir(tmp)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)


def is_write_error(exc: BaseException) -> bool:
    """Whether ``exc`` from a writer means the write failed (an OSError or RuntimeError, itself or behind it)."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        return False
    return any(isinstance(e, (OSError, RuntimeError)) for e in _chain(exc))


def write_failure(path: Path, exc: BaseException, *, size: int | None = None, what: str = "",
                  partial: Path | None = None) -> WriteFailedError:
    """The :class:`WriteFailedError` for ``exc`` while writing ``path``; removes ``partial`` first."""
    code = _errno_of(exc)
    free_left = free_bytes(path.parent)
    if isinstance(exc, WriteFailedError):  # a file of the folder being written: its verdict stands
        full = exc.disk_full
    else:
        full = code in DISK_FULL_ERRNOS or (code is None and _no_room(free_left, size))
    if partial is not None:
        remove_quietly(partial)
    free = free_bytes(path.parent)
    label = f"{what} {path.name}" if what else path.name
    message = f"cannot write {label} in {path.parent}: {_reason(exc, code, full)}{_amounts(size, free)}"
    return WriteFailedError(message, path=path, code=code, disk_full=full, needed=size, free=free)


def _no_room(free: int | None, size: int | None) -> bool:
    """Whether a failure that gave no errno is a full disk (under 1 MiB or fewer bytes than needed free)."""
    return free is not None and (free < _NEARLY_FULL or (size is not None and free < size))


def _amounts(size: int | None, free: int | None) -> str:
    """``; it needs about 5.1 MiB, 2.5 MiB free`` (the parts known), or nothing."""
    parts = ([f"it needs about {format_bytes(size)}"] if size else []) + \
        ([f"{format_bytes(free)} free"] if free is not None else [])
    return f"; {', '.join(parts)}" if parts else ""


def _reason(exc: BaseException, code: int | None, full: bool) -> str:
    """``disk full (No space left on device)``, or the OS's words, or the first line of the writer's."""
    words = os.strerror(code) if code is not None else None
    if full:
        return f"disk full ({words})" if words else "disk full"
    if words:
        return words
    if isinstance(exc, WriteFailedError):
        return str(exc).split(": ", 1)[-1]
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised from or while handling, and the failures a DCP exception wraps."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        context = None if e.__suppress_context__ else e.__context__
        todo += [c for c in (e.__cause__, context) if c is not None]
        failures = getattr(e, "failures", None)  # torch.distributed.checkpoint's CheckpointException
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values() if f is not None]


def _errno_of(exc: BaseException) -> int | None:
    """The ``OSError.errno`` behind ``exc``: its own or its causes' (:func:`_chain`); None without one."""
    return next((e.errno for e in _chain(exc) if isinstance(e, OSError) and e.errno), None)


def free_bytes(folder: Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``folder``'s filesystem (None: not known)."""
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):  # AttributeError: no statvfs (Windows)
        return None
    return st.f_bavail * st.f_frsize


def format_bytes(n: int) -> str:
    """``512 B``, ``4.0 KiB``, ``19.8 MiB``, ``1.2 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def remove_quietly(path: Path) -> None:
    """Remove a file or folder if it is there; a failure to remove is not an error of its own."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename in it) to disk; a filesystem that cannot is left as it is."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _commit(path: Path, tmp: Path, to_temp: Callable[[], None], size: int | None, what: str) -> Path:
    """Run ``to_temp`` (which writes and fsyncs ``tmp``), rename ``tmp`` to ``path``, fsync the folder."""
    try:
        to_temp()
        os.replace(tmp, path)
    except BaseException as e:
        if not is_write_error(e):
            remove_quietly(tmp)
            raise
        raise write_failure(path, e, size=size, what=what, partial=tmp) from e
    fsync_dir(path.parent)
    return path


class _RecordingFile:
    """A binary file that remembers the OSError its ``write`` raised (everything else is the file's)."""

    def __init__(self, f: BinaryIO):
        self._f, self.error = f, None

    def write(self, data: Any) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            self.error = e
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)
