"""Atomic file writes and output-path checks (reading JSON and content hashes: :mod:`hllm.reading`).

Every artefact hllm writes goes to a temporary name in the destination folder and is renamed into place only when
complete, so an interrupted or failed command never leaves a partial file where a good one was (POSIX
``os.replace`` is atomic within one file system).

Output-path policy, the same for every writer:

* The destination of a file must be absent or a regular file; a directory, character or block device, FIFO or
  socket is refused up front (:class:`OutputError`) — ``os.replace`` would otherwise turn ``/dev/full`` into a
  regular file. The destination of a directory must be absent or a directory (then ``overwrite`` is needed).
* A symbolic link is followed: hllm writes to (atomically replaces) the link's target, which must exist and pass
  the same check, and the link is kept — like a shell's ``>``. A dangling link is refused (it would create a file
  somewhere the user did not name).
* A read-only or missing-permission directory, or a full disk, is found before the work by :func:`check_writable`
  (callers that run long, e.g. ``hllm rank``, call it first); running out of space during the write (ENOSPC,
  EDQUOT, EFBIG) raises :class:`OutputError` and leaves no partial file.
* SIGTERM while a temporary file or staging directory exists removes it (a handler that raises ``SystemExit(143)``
  is installed for the duration, in the main thread, when SIGTERM has its default action), and staging directories
  of the same target left by a killed process (SIGKILL, power loss) are swept by the next :func:`atomic_dir` of
  that target: their names carry the writer's pid and process start time (``.NAME.PID-START.XXXXXXXX.tmp``), so a
  live writer's directory is never touched.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import numbers
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from hllm.errors import OutputError
from hllm.staging import cleanup_on_sigterm, staging_prefix, sweep_stale_staging

#: errno values that mean "the disk (or quota, or file-size limit) is full".
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
#: errno values that mean "this place cannot be written".
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON (sorted keys off, NaN forbidden) to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def json_safe(obj: Any) -> Any:
    """``obj`` made strict-JSON-ready: a non-finite float (Python or NumPy: NaN, ±inf) → None, a NumPy float →
    ``float``, dict keys → ``str``, tuples → lists, a ``Path`` → ``str``; other values unchanged (RFC 8259 has
    no NaN or Infinity, so ``json.dumps(allow_nan=False)`` would refuse them)."""
    if isinstance(obj, numbers.Real) and not isinstance(obj, numbers.Integral):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


MAX_OUTPUT_NAME = 255 - 64  #: longest output name, bytes: the file system's 255 less room for the staging suffix


def output_target(path: str | os.PathLike, kind: str = "file") -> Path:
    """The path hllm really writes for the output ``path`` (module doc: symbolic links are followed),
    after refusing a destination of the wrong kind.

    Args:
        path: the output the user named. kind: ``"file"`` or ``"dir"``.
    Returns: ``path`` itself, or the target of a symbolic link.
    Raises: OutputError (a name over :data:`MAX_OUTPUT_NAME` bytes; dangling link; a directory, device, FIFO
        or socket where a file goes; a non-directory where a directory goes).
    """
    p = Path(path)
    if len(os.fsencode(p.name)) > MAX_OUTPUT_NAME:  # its staging name beside it adds ".PID-START.XXXXXXXX.tmp"
        raise OutputError(f"{p.name[:32]}…: an output's name takes at most {MAX_OUTPUT_NAME} bytes (staged under a longer one)")
    if p.is_symlink():
        target = Path(os.path.realpath(p))
        if not target.exists():
            raise OutputError(f"{p} is a symbolic link to {target}, which does not exist; refusing to create it")
        p = target
    try:
        st = p.stat()
    except FileNotFoundError:
        return p
    except NotADirectoryError:
        raise OutputError(f"cannot write {p}: a part of its parent path is not a directory") from None
    except OSError as e:
        raise OutputError(f"cannot use {p} as an output: {e.strerror}") from None
    if kind == "dir":
        if not stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{p} exists and is not a directory; refusing to replace it with one")
    elif stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{p} is a directory; name a file to write")
    elif not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{p} is a {_kind_name(st.st_mode)}, not a regular file; refusing to replace it")
    return p


def _kind_name(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def check_writable(path: str | os.PathLike, kind: str = "file", overwrite: bool = True,
                   min_free_bytes: int = 1 << 20) -> Path:
    """Check, before long work, that the output ``path`` can be written; returns what will be written
    (:func:`output_target`).

    Checks: the destination's kind (:func:`output_target`); with ``kind="dir"`` and not ``overwrite``,
    that it does not exist yet, and with ``overwrite`` that an existing one is not the working directory or
    one of its ancestors; that the nearest existing ancestor is a directory in which a file can be created (a probe file is created and removed: catches read-only file systems and
    permissions, even for root); that its file system has at least ``min_free_bytes`` available
    (``os.statvfs``: ``f_bavail``, or ``f_bfree`` for root).

    Raises: OutputError naming the path and the problem; FileExistsError (directory exists, no overwrite).
    """
    target = output_target(path, kind)
    if kind == "dir" and not overwrite and target.exists():
        raise FileExistsError(f"{target} already exists (pass --overwrite to replace it)")
    if kind == "dir" and target.exists() and _holds_cwd(target):
        raise OutputError(f"cannot replace {path}: it is the working directory or holds it (the replacement would "
                          "fail after the work, or remove the directory this process works in); write elsewhere")
    parent = target.parent
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: {parent} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".hllm-probe.", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {parent} is not writable ({e.strerror})") from None
    vfs = os.statvfs(parent)
    free = (vfs.f_bfree if _is_root() else vfs.f_bavail) * vfs.f_frsize
    if free < min_free_bytes:
        raise OutputError(f"cannot write {path}: only {free} bytes free on the file system of {parent} "
                          f"(need at least {min_free_bytes})")
    return target


def _holds_cwd(path: Path) -> bool:
    """True when ``path`` (existing) is the working directory or one of its ancestors."""
    try:
        cwd, p = Path.cwd().resolve(), path.resolve()
    except OSError:  # the working directory was removed: nothing to protect
        return False
    return p == cwd or p in cwd.parents


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@contextlib.contextmanager
def _output_errors(path: Path) -> Iterator[None]:
    """Turn a full disk (during the write) or an unwritable place into OutputError naming ``path``."""
    try:
        yield
    except OSError as e:
        if e.errno in NO_SPACE:
            raise OutputError(f"cannot write {path}: {e.strerror or 'no space left'}; nothing was written "
                              f"and {path} is unchanged") from e
        raise


def _mk_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create the directory {path.parent}: {e.strerror}") from None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary file path beside ``path``; on success rename it to ``path``.

    With ``overwrite=False`` the commit is ``os.link`` of the finished file to ``path``, which refuses an
    existing name atomically: a parallel writer that got there first is never replaced (FileExistsError).

    The destination is checked first (:func:`output_target`: a symbolic link's target is written; a
    directory, device, FIFO or socket is refused). On any exception — a full disk, SIGTERM
    (:func:`cleanup_on_sigterm`) — the temporary file is removed and ``path`` is left as it was.
    Raises: OutputError (module doc).
    """
    path = output_target(path, "file")
    _mk_parent(path)
    with cleanup_on_sigterm():
        try:
            fd, tmp = tempfile.mkstemp(prefix=staging_prefix(path), suffix=".tmp", dir=path.parent)
        except OSError as e:
            raise OutputError(f"cannot write {path}: {e.strerror}") from None
        os.close(fd)
        tmp_path = Path(tmp)
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the result is an ordinary file
            with _output_errors(path):
                yield tmp_path
                os.chmod(tmp_path, 0o666 & ~umask)  # again: a writer may have replaced it (safetensors makes 0600)
                output_target(path, "file")  # nothing put a directory or device there meanwhile
                if overwrite:
                    os.replace(tmp_path, path)
                else:
                    try:
                        os.link(tmp_path, path)  # atomic create-if-absent (POSIX link(2))
                    except FileExistsError:
                        raise FileExistsError(f"{path} exists (written by another process meanwhile; use --overwrite)") from None
        finally:
            if tmp_path.exists():
                tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; on success move it to ``path``.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false — checked before any work AND at the
            commit (a parallel writer may have created it meanwhile: the rename refuses to replace it,
            ``renameat2(RENAME_NOREPLACE)``), so a writer without ``overwrite`` never replaces an output.
        OutputError: ``path`` is not a directory, cannot be written, or the disk filled up.
    On failure (an exception, SIGTERM) the temporary directory is deleted and an existing ``path`` is
    untouched; with ``overwrite`` the old directory is replaced only after the new one is complete.
    Each writer's staging and set-aside names are its own (pid, start time, random part), so parallel
    writers of one ``path`` never collide. Staging directories of ``path`` left by killed writers are
    swept first (:func:`sweep_stale_staging`).
    """
    path = output_target(path, "dir")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists (pass --overwrite to replace it)")
    _mk_parent(path)
    sweep_stale_staging(path)
    with cleanup_on_sigterm():
        try:
            tmp = Path(tempfile.mkdtemp(prefix=staging_prefix(path), suffix=".tmp", dir=path.parent))
        except OSError as e:
            raise OutputError(f"cannot write {path}: {e.strerror}") from None
        try:
            os.chmod(tmp, 0o755)  # mkdtemp makes 0700; the result is an ordinary directory
            with _output_errors(path):
                yield tmp
                promote_dir(tmp, output_target(path, "dir"), overwrite=overwrite)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


_RENAME_NOREPLACE = 1  # linux/fs.h
_renameat2: Any = None


def rename_noreplace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Rename ``src`` to ``dst`` only if ``dst`` does not exist, atomically (Linux ``renameat2`` with
    ``RENAME_NOREPLACE``, renameat2(2)); elsewhere, or on a file system without it, a check followed by
    ``os.rename`` (which still refuses a non-empty directory: ENOTEMPTY).

    Raises: FileExistsError naming ``dst`` if it exists (or appeared meanwhile); OSError otherwise.
    """
    global _renameat2
    if _renameat2 is None:
        import ctypes

        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            _renameat2 = fn
        except (AttributeError, OSError):
            _renameat2 = False
    exists = FileExistsError(errno.EEXIST, f"{dst} already exists (another writer created it meanwhile; "
                                           "pass --overwrite to replace it)", str(dst))
    if _renameat2:
        import ctypes

        if _renameat2(-100, os.fsencode(src), -100, os.fsencode(dst), _RENAME_NOREPLACE) == 0:  # AT_FDCWD
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise exists
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(src), None, str(dst))
    if os.path.lexists(dst):
        raise exists
    try:
        os.rename(src, dst)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise exists from None
        raise


def promote_dir(staging: str | os.PathLike, dest: str | os.PathLike, overwrite: bool = True) -> None:
    """Move a finished directory ``staging`` to ``dest``.

    Without ``overwrite`` the rename refuses an existing ``dest`` (:func:`rename_noreplace`: FileExistsError).
    With ``overwrite`` an existing ``dest`` is renamed aside under a name of this writer's own
    (``.NAME.PID-START.XXXXXXXX-old.tmp``), the new one renamed in, the old one deleted; when parallel
    writers overwrite the same ``dest`` the last one to commit wins and none fails (a ``dest`` that
    vanished or reappeared between the steps is retried).
    """
    staging, dest = Path(staging), Path(dest)
    if not overwrite:
        rename_noreplace(staging, dest)
        return
    old = Path((str(staging)[:-4] if str(staging).endswith(".tmp") else str(staging)) + "-old.tmp")
    for _ in range(100):
        try:
            os.rename(dest, old)
        except FileNotFoundError:  # no dest (or a parallel writer moved it aside): put ours in
            pass
        try:
            rename_noreplace(staging, dest)
        except FileExistsError:  # a parallel writer committed meanwhile: move theirs aside too, retry
            if old.exists():
                shutil.rmtree(old, ignore_errors=True)
            continue
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)
        return
    raise OutputError(f"cannot replace {dest}: other writers kept replacing it")


def refuse_overlap(output: str | os.PathLike, inputs: Iterable[str | os.PathLike], kind: str = "file") -> None:
    """Refuse an output that is, or lies inside, one of ``inputs`` — or, for a directory output (replaced
    as a whole), one that contains an input — so no command ever replaces or writes inside what it reads
    (``hllm rank -s t.jsonl -o t.jsonl``, ``-o EXPORT/model.onnx``, ``export CK CK/..``).

    Paths are compared after resolving symbolic links and ``..``; inputs that do not exist are skipped.
    Raises: OutputError naming both paths.
    """
    out = Path(os.path.realpath(output))
    for inp in inputs:
        if inp is None or str(inp) in ("", "-") or not os.path.lexists(inp):
            continue
        src = Path(os.path.realpath(inp))
        if out == src:
            raise OutputError(f"the output {output} is the input {inp}; refusing to replace an input (write elsewhere)")
        if src in out.parents:
            raise OutputError(f"the output {output} is inside the input {inp}; refusing to write into an input")
        if kind == "dir" and out in src.parents:
            raise OutputError(f"the output directory {output} contains the input {inp}; "
                              "replacing it would destroy the input")


def copy_files(src: str | os.PathLike, dst: str | os.PathLike, skip: Iterable[str] = ()) -> list[str]:
    """Give the existing directory ``dst`` a copy of every regular file of the directory ``src`` (not its
    sub-directories, not symbolic links) whose name is not in ``skip``. Returns the names, sorted.

    Copies, never hard links: an output shares no inode with an input, so whatever later writes into a
    file of ``dst`` in place (an editor, ``onnx.save`` over it, ``open(..., "r+b")``) cannot change ``src``
    (docs/hardening.md, "Outputs against inputs"). ``shutil.copy2`` (the kernel's in-kernel copy where
    Linux offers it) keeps the modification times. Raises: OSError from the copy.
    """
    src, dst, skip = Path(src), Path(dst), set(skip)
    names = []
    for f in sorted(src.iterdir()):
        if f.name in skip or not f.is_file() or f.is_symlink():
            continue
        shutil.copy2(f, dst / f.name)
        names.append(f.name)
    return names
