"""hllm.files: output-path policy — non-regular destinations refused up front,
symbolic links written through, read-only place / full disk found before the work, no partial file
on ENOSPC, staging cleaned on SIGTERM and swept after SIGKILL."""

from __future__ import annotations

import errno
import os
import stat
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import hllm.files as files
import hllm.reading as reading
import hllm.staging as hstaging
from hllm.errors import HllmError, OutputError
from hllm.files import atomic_dir, atomic_path, atomic_write_text, check_writable, output_target
from hllm.staging import sweep_stale_staging

REPO = Path(__file__).resolve().parents[1]


def _leftovers(d: Path, name: str) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith(f".{name}."))


def test_output_error_is_an_hllm_error():
    assert issubclass(OutputError, HllmError)


def test_character_device_refused_without_touching_it():
    # /dev/null: only the check runs (no write is attempted even if the check were wrong)
    with pytest.raises(OutputError, match="character device"):
        output_target("/dev/null")
    with pytest.raises(OutputError, match="character device"):
        check_writable("/dev/null")


def test_fifo_refused_and_kept(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="FIFO"):
        atomic_write_text(fifo, "x")
    assert fifo.is_fifo()
    assert _leftovers(tmp_path, "out.fifo") == []


def test_socket_refused_and_kept(tmp_path):
    path = tmp_path / "out.sock"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(path))
        with pytest.raises(OutputError, match="socket"):
            atomic_write_text(path, "x")
        assert path.is_socket()
    finally:
        s.close()


def test_directory_where_a_file_goes_and_file_where_a_directory_goes(tmp_path):
    d = tmp_path / "adir"
    d.mkdir()
    (d / "keep").write_text("k")
    with pytest.raises(OutputError, match="is a directory"):
        atomic_write_text(d, "x")
    with pytest.raises(OutputError, match="is a directory"):
        check_writable(d)
    assert (d / "keep").read_text() == "k"
    f = tmp_path / "afile"
    f.write_text("old")
    for overwrite in (False, True):
        with pytest.raises(OutputError, match="not a directory"):
            with atomic_dir(f, overwrite=overwrite):
                pass
    assert f.read_text() == "old"
    assert _leftovers(tmp_path, "afile") == []


def test_symlink_is_written_through_and_kept(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new"
    assert check_writable(link) == target


def test_dangling_symlink_and_symlink_to_device_refused(tmp_path):
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere" / "x.json")
    with pytest.raises(OutputError, match="does not exist"):
        atomic_write_text(dangling, "x")
    assert not (tmp_path / "nowhere").exists()
    to_dev = tmp_path / "to-null"
    to_dev.symlink_to("/dev/null")
    with pytest.raises(OutputError, match="character device"):
        output_target(to_dev)


def test_symlinked_directory_is_replaced_through_the_link(tmp_path):
    real = tmp_path / "real-dir"
    real.mkdir()
    (real / "old").write_text("o")
    link = tmp_path / "link-dir"
    link.symlink_to(real)
    with atomic_dir(link, overwrite=True) as tmp:
        (tmp / "new").write_text("n")
    assert link.is_symlink()
    assert sorted(p.name for p in real.iterdir()) == ["new"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a mode-0555 directory; the EROFS fake below covers it")
def test_read_only_directory_found_before_the_work(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(OutputError, match="not writable"):
            check_writable(ro / "out.jsonl")
    finally:
        ro.chmod(0o755)


def test_read_only_file_system_found_before_the_work(tmp_path, monkeypatch):
    def erofs(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(files.tempfile, "mkstemp", erofs)
    with pytest.raises(OutputError, match="not writable.*Read-only file system"):
        check_writable(tmp_path / "sub" / "out.jsonl")
    with pytest.raises(OutputError, match="Read-only file system"):
        atomic_write_text(tmp_path / "out.jsonl", "x")


def test_check_writable_probes_the_nearest_existing_ancestor(tmp_path):
    deep = tmp_path / "a" / "b" / "c.jsonl"
    assert check_writable(deep) == deep
    assert not (tmp_path / "a").exists()  # nothing created by the check
    assert [p.name for p in tmp_path.iterdir()] == []  # probe removed
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="not a directory"):
        check_writable(tmp_path / "file" / "out.jsonl")
    existing = tmp_path / "d"
    existing.mkdir()
    with pytest.raises(FileExistsError):
        check_writable(existing, kind="dir", overwrite=False)
    assert check_writable(existing, kind="dir", overwrite=True) == existing


def test_full_disk_found_before_the_work(tmp_path, monkeypatch):
    real = os.statvfs(tmp_path)

    class Full:
        f_bavail = f_bfree = 0
        f_frsize = real.f_frsize

    monkeypatch.setattr(files.os, "statvfs", lambda p: Full())
    with pytest.raises(OutputError, match="0 bytes free"):
        check_writable(tmp_path / "out.jsonl")


def test_disk_full_during_the_write_leaves_no_partial_file(tmp_path, monkeypatch):
    out = tmp_path / "out.jsonl"
    out.write_text("the good old file\n")
    real_write = Path.write_text

    def write_half_then_enospc(self, text, *a, **k):
        real_write(self, text[: len(text) // 2], *a, **k)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", write_half_then_enospc)
    with pytest.raises(OutputError, match="No space left on device.*unchanged"):
        atomic_write_text(out, "a new file that does not fit\n" * 100)
    monkeypatch.undo()
    assert out.read_text() == "the good old file\n"
    assert _leftovers(tmp_path, "out.jsonl") == []


def test_disk_full_while_filling_a_directory(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "model.onnx").write_text("old")
    with pytest.raises(OutputError, match="No space left"):
        with atomic_dir(out, overwrite=True) as tmp:
            (tmp / "model.onnx").write_text("partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert (out / "model.onnx").read_text() == "old"
    assert _leftovers(tmp_path, "export") == []


def test_other_os_errors_are_not_relabelled(tmp_path):
    with pytest.raises(PermissionError):
        with atomic_path(tmp_path / "x"):
            raise PermissionError(errno.EACCES, "reading some input")


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from hllm.files import atomic_dir
    with atomic_dir(Path(sys.argv[1]), overwrite=True) as tmp:
        (tmp / "model.onnx").write_bytes(b"new" * 1000)
        print("staging", tmp, flush=True)
        time.sleep(120)
""")


def _start_writer(out: Path) -> tuple[subprocess.Popen, Path]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline().split()
    assert line and line[0] == "staging", line
    staging = Path(line[1])
    assert staging.is_dir()
    return proc, staging


def test_sigterm_during_overwrite_removes_the_staging_directory(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "model.onnx").write_text("old")
    proc, staging = _start_writer(out)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert not staging.exists()
    assert _leftovers(tmp_path, "export") == []
    assert (out / "model.onnx").read_text() == "old"


def test_staging_left_by_sigkill_is_swept_by_the_next_write(tmp_path):
    out = tmp_path / "export"
    proc, staging = _start_writer(out)
    proc.kill()
    proc.wait(timeout=60)
    assert staging.is_dir()  # SIGKILL cannot be handled: the directory stays ...
    mine = tmp_path / f".export.{os.getpid()}-{hstaging._process_start(os.getpid())}.abcdefgh.tmp"
    mine.mkdir()  # ... a live writer's staging directory (this process) ...
    legacy = tmp_path / ".export.abcdefgh.tmp"
    legacy.mkdir()  # ... and one without a pid (older hllm)
    with atomic_dir(out) as tmp:  # ... until the next write of the same target sweeps the dead one
        (tmp / "model.onnx").write_text("new")
    assert not staging.exists()
    assert mine.is_dir() and legacy.is_dir()
    assert (out / "model.onnx").read_text() == "new"
    assert sweep_stale_staging(out) == []


def test_pid_reuse_is_not_mistaken_for_the_writer(tmp_path):
    """A staging directory whose pid is alive but started at another time belongs to a dead writer."""
    reused = tmp_path / f".out.{os.getpid()}-1.abcdefgh.tmp"
    reused.mkdir()
    if hstaging._process_start(os.getpid()) in (0, 1):
        pytest.skip("no /proc start times here")
    assert sweep_stale_staging(tmp_path / "out") == [reused]


@pytest.fixture
def default_sigterm():
    """SIGTERM at its default action for the test (another test's library, e.g. Ray, may have set one)."""
    old = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, old)


def test_sigterm_handler_restored_and_only_installed_when_default(default_sigterm):
    with hstaging.cleanup_on_sigterm():
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGTERM, mine)
    try:
        with hstaging.cleanup_on_sigterm():
            assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)


def test_sigterm_in_process_raises_and_cleans(tmp_path, default_sigterm):
    out = tmp_path / "x.json"
    with pytest.raises(SystemExit) as e:
        with atomic_path(out) as tmp:
            tmp.write_text("partial")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this returns
    assert e.value.code == 128 + signal.SIGTERM
    assert not out.exists() and _leftovers(tmp_path, "x.json") == []


@pytest.mark.parametrize("content, reason", [
    (b'{"a": [1, 2]}', None),
    (b"{not json", "Expecting property name"),
    (b"\xff\xfe{}", "can't decode byte"),
    (b"[" * 100_000 + b"]" * 100_000, "recursion"),
    (b"", "Expecting value"),
])
def test_read_json_raises_the_given_error_with_the_reason(tmp_path, content, reason):
    p = tmp_path / "x.json"
    p.write_bytes(content)
    if reason is None:
        assert reading.read_json(p) == {"a": [1, 2]}
        return
    with pytest.raises(OutputError, match=f"^{p} is bad: .*{reason}"):
        reading.read_json(p, OutputError, "{path} is bad: {reason}")
    with pytest.raises(ValueError, match=f"^cannot read {p}: "):
        reading.read_json(p)


def test_read_json_of_a_missing_file_or_a_directory(tmp_path):
    for p in (tmp_path / "missing.json", tmp_path):
        with pytest.raises(HllmError, match=f"cannot read {p}: .*(No such file|Is a directory)"):
            reading.read_json(p, HllmError)


def test_backbone_config_not_utf8_is_a_checkpoint_error(tmp_path):
    from hllm.errors import CheckpointError
    from hllm.formats.architectures import read_config

    (tmp_path / "config.json").write_bytes(b"\xff{}")
    with pytest.raises(CheckpointError, match="backbone config .* is not valid JSON: .*can't decode"):
        read_config(tmp_path)


def test_atomic_path_without_overwrite_never_replaces_a_file_written_meanwhile(tmp_path):
    from hllm.files import atomic_path

    dst = tmp_path / "x.plan"
    with pytest.raises(FileExistsError, match="another process"):
        with atomic_path(dst, overwrite=False) as tmp:
            tmp.write_bytes(b"mine")
            dst.write_bytes(b"theirs")  # a parallel writer commits first
    assert dst.read_bytes() == b"theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.plan"]  # no staging file left
    with atomic_path(tmp_path / "y.plan", overwrite=False) as tmp:
        tmp.write_bytes(b"ok")
    assert (tmp_path / "y.plan").read_bytes() == b"ok"


def test_copy_files_copies_regular_files_only_and_never_shares_an_inode(tmp_path):
    """``copy_files``: the regular files of a directory (not sub-directories, links or skipped names) appear
    in another one as copies, so writing an output's file in place leaves the input's bytes as they were."""
    from hllm.files import copy_files

    src, a, b = tmp_path / "src", tmp_path / "a", tmp_path / "b"
    for d in (src / "sub", a, b):
        d.mkdir(parents=True)
    (src / "model.onnx").write_bytes(b"graph")
    (src / "export.json").write_text("{}")
    (src / "link").symlink_to(src / "model.onnx")
    assert copy_files(src, a, skip=("export.json",)) == ["model.onnx"]
    assert sorted(os.listdir(a)) == ["model.onnx"]
    assert copy_files(src, b) == ["export.json", "model.onnx"]
    assert not os.path.samefile(b / "model.onnx", src / "model.onnx") and (b / "model.onnx").read_bytes() == b"graph"
    with open(b / "model.onnx", "r+b") as f:  # an in-place write into the output
        f.write(b"GRAPH")
    assert (src / "model.onnx").read_bytes() == b"graph" and os.stat(src / "model.onnx").st_nlink == 1


def test_json_safe_makes_strict_json_of_reports():
    """One converter for the CLI's stdout JSON and the gate report: non-finite floats (NumPy ones too) become
    null, NumPy floats plain floats, keys strings, tuples lists, paths strings; integers and booleans stay."""
    import json

    import numpy as np

    doc = {1: (np.float32("nan"), np.float64(2.5), np.float32(0.5), float("-inf"), 3, True, Path("a/b"))}
    out = files.json_safe(doc)
    assert out == {"1": [None, 2.5, 0.5, None, 3, True, "a/b"]}
    assert type(out["1"][2]) is float and out["1"][5] is True
    assert json.loads(json.dumps(out, allow_nan=False)) == out


def test_atomic_path_result_has_the_umask_mode_even_when_the_writer_replaced_the_file(tmp_path):
    """safetensors' save_file replaces the staging file with a 0600 one; the output still gets 0666 & ~umask."""
    from hllm.files import atomic_path

    old = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "w.bin") as tmp:
            tmp.unlink()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # what a replacing writer leaves
            os.write(fd, b"x")
            os.close(fd)
    finally:
        os.umask(old)
    assert (tmp_path / "w.bin").read_bytes() == b"x"
    assert stat.S_IMODE((tmp_path / "w.bin").stat().st_mode) == 0o644


def test_an_output_name_too_long_for_its_staging_name_is_refused_before_any_work(tmp_path):
    """Every output is first written under ``.NAME.PID-START.XXXXXXXX.tmp`` beside it: a name the file
    system takes but whose staging name it would not is refused up front, naming the limit."""
    ok = tmp_path / ("a" * files.MAX_OUTPUT_NAME)
    assert output_target(ok) == ok
    with atomic_dir(ok) as d:
        (d / "x").write_text("1")
    assert (ok / "x").read_text() == "1"
    long = tmp_path / ("b" * (files.MAX_OUTPUT_NAME + 1))
    for kind in ("file", "dir"):
        with pytest.raises(OutputError, match=f"at most {files.MAX_OUTPUT_NAME} bytes"):
            output_target(long, kind)
    with pytest.raises(OutputError):
        atomic_write_text(long, "x")
    assert not long.exists() and sorted(p.name for p in tmp_path.iterdir()) == [ok.name]
