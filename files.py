"""
Writing a file so that a crash at any moment leaves the old file or the new one, never half of one:
checkpoints, metrics.jsonl, loss.png, the attention page, meta.json and benchmark results; and
finding out, before the work, whether a file can be written at all.
"""
import os
import tempfile


def atomic_write(path, write):
    """write(f) into a temporary file beside path, flush it to disk, then rename it over path:
    readers, and a crash at any moment, see the old file or the new one, never half of one."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX and Windows
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable
        fd = os.open(directory, os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_writable(path):
    """ValueError, before any work is done, if path cannot be written: it is a directory, or a file
    cannot be created beside it (a read-only place, no permission). A probe file, removed at once."""
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory; name a file in it, e.g. {os.path.join(path, 'attn.html')}")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ValueError(f"cannot write {path}: {e.strerror or e} in {folder}; pick another place") from None
