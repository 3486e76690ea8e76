"""
Writing a file so that a crash at any moment leaves the old file or the new one, never half of one:
checkpoints, loss.png, the attention page, meta.json, benchmark results, and metrics.jsonl where a resume
starts it again (its lines are appended one by one; a crash may tear the last, which its reader skips); finding
out, before the work, whether a file can be written at all; reading a text file a user named, with
errors that say which flag named it and what to give instead; reading back what torch.save wrote;
and standard output whose reader may leave (`python train.py | head -3`) or whose disk fills up; and
where a user's cache folder is (cache_home).
"""
import contextlib
import errno
import glob
import os
import sys
import tempfile
import zipfile
import zlib


def cache_home():
    """The user's cache folder: XDG_CACHE_HOME where it is set (Linux's own setting for it) to an absolute
    path, as its specification asks, else ~/.cache; where no home is known (no HOME, a user id with no entry
    in /etc/passwd: a container's), .cache in the temporary folder, not a folder named ~ where the run starts."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    home = os.path.expanduser("~")  # "~" itself where there is none
    return xdg if os.path.isabs(xdg) else os.path.join(home if os.path.isabs(home) else tempfile.gettempdir(), ".cache")


def atomic_write(path, write):
    """write(f) into a temporary file beside path, flush it to disk, then rename it over path:
    readers, and a crash at any moment, see the old file or the new one, never half of one. First
    clears the temporary files of earlier writes of path that were killed (SIGKILL leaves them), never
    one whose process is still alive (another run writing the same file). A path that is a symbolic link
    is written through: its target gets the new content (out_dir/ckpt.pt linked to a larger disk, say), and
    the link stays; a rename over the link had replaced it, and left its target as it was."""
    path = os.path.realpath(path)
    directory = os.path.dirname(path)
    clear_stale_temporaries(path)
    tmp = temporary_path(path, os.getpid())
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
        except OSError as e:
            # network and shared folders (SMB, sshfs, a VM's) refuse a folder's fsync; the file, flushed and
            # renamed, is whole there all the same
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
                raise
        finally:
            os.close(fd)


def temporary_path(path, pid):
    """Where process pid's atomic_write holds path's new content until it is whole: beside it, hidden."""
    return os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.tmp{pid}")


def clear_stale_temporaries(path, locked=False):
    """Remove the temporary files (temporary_path) of earlier writes of path whose process was killed
    (SIGKILL leaves them, and data/prepare.py's may be gigabytes), never one whose process is still alive.
    locked: the caller alone may write path (out_dir's lock), so every one is stale, whatever process its name
    gives (pids are reused: a container that starts again gives out its first ones again)."""
    for stale in glob.glob(temporary_path(glob.escape(os.path.abspath(path)), "*")):
        pid = stale.rsplit(".tmp", 1)[1]
        if pid.isdigit() and (locked or not process_alive(int(pid))):
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove: the write says if it matters
                os.remove(stale)


def process_alive(pid):
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def new_directories(path):
    """os.makedirs(path) for the block, which gets the directories made, deepest first; where the block
    raises (a probe that finds the disk full, a run stopped halfway), they are removed again
    (remove_empty_directories)."""
    made, parent = [], path
    while parent and not os.path.lexists(parent):  # the directories this makes, deepest first
        made.append(parent)
        parent = os.path.dirname(parent)
    try:
        os.makedirs(path, exist_ok=True)
        yield made
    except BaseException:
        remove_empty_directories(made)
        raise


def remove_empty_directories(directories):
    """Remove each of these directories, deepest first, that is empty: not one in which something has
    since put a file."""
    for directory in directories:
        with contextlib.suppress(OSError):  # not empty: what is in it is kept
            os.rmdir(directory)


def write_probe(folder, size=0):
    """Write `size` bytes to a new file in folder, to the disk, and let the file go: the OSError that a real
    write there would meet (a read-only place, no permission; given a size, a full disk), before any work is
    done. The file has no name (O_TMPFILE where Linux has it), so not even a kill leaves it behind."""
    with tempfile.TemporaryFile(dir=folder) as f:
        if size:  # only written bytes need a disk's room: the file's creation alone asks for none
            f.write(bytes(size))
            f.flush()
            os.fsync(f.fileno())


@contextlib.contextmanager
def writable_directory(path, setting, room=0, instead=None):
    """new_directories(path) for the block, once a file of `room` bytes can be written in it (write_probe).
    Where it cannot (a parent that is a file, a read-only place, no permission, a full disk), a ValueError
    that names the setting (out_dir, data_dir) and says what to change (instead: other than another folder),
    and the directories made are gone."""
    instead = instead or f"pick another --{setting}"
    parent = path
    while parent and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        raise ValueError(f"cannot write to {setting}={path!r}: {parent} is not a directory; {instead}")
    with contextlib.ExitStack() as stack:
        try:
            made = stack.enter_context(new_directories(path))
            write_probe(path, room)
        except OSError as e:
            full = "free some space or " if e.errno in NO_ROOM else ""
            raise ValueError(f"cannot write to {setting}={path!r}: {e.strerror or e}; {full}{instead}") from None
        yield made


def check_writable(path, example):
    """ValueError, before any work is done, if path cannot be written: it is a directory (the error names a
    file in it, of the name example), or a file cannot be created beside it (a read-only place, no permission)."""
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory; name a file in it, e.g. {os.path.join(path, example)}")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        write_probe(folder)
    except OSError as e:
        raise ValueError(f"cannot write {path}: {e.strerror or e} in {folder}; pick another place") from None


NO_ROOM = (errno.ENOSPC, errno.EDQUOT)  # a write's errors that freeing space mends: a full disk, a user's quota
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)  # and those that permissions do: remounted, chmod, chattr +i


def check_text_file(path, flag, instead="a text file in it"):
    """A ValueError unless path is a file. flag is how the user gave it ("--input=", "--start=FILE:"),
    which the message names; instead says what to give for a directory."""
    if os.path.isdir(path):
        raise ValueError(f"{flag}{path} is a directory; give {instead}")
    if os.path.exists(path) and not os.path.isfile(path):  # there, but read once or never ends: not "no such file"
        raise ValueError(f"{flag}{path} is not a regular file (a pipe or a device, say); save the text in a file "
                         "and give its path")
    if not os.path.isfile(path):
        raise ValueError(f"{flag}{path}: no such file; check the path (a relative one starts in {os.getcwd()})")


def same_folder(path, other):
    """Whether two spellings name one folder (data/x, ./data/x, /abs/path/data/x, a link to it), relative ones
    from here."""
    return os.path.realpath(path) == os.path.realpath(other)


def read_text_file(path, flag):
    """The text of the UTF-8 file that the user gave with flag (see check_text_file); a ValueError that
    names flag and says what to give instead where it cannot be read."""
    check_text_file(path, flag)
    try:  # utf-8-sig: a byte-order mark (Windows' "UTF-8 with BOM") is not text
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag}{path} is not UTF-8 text ({e.reason} at byte {e.start}); give a text file "
                         "saved as UTF-8") from None
    except OSError as e:  # unreadable (permissions), or gone since the check
        raise ValueError(f"{flag}{path} cannot be read ({e.strerror}); give a text file you can read") from None
    if "\0" in text:  # ASCII-only binary data (a token file, say) decodes as UTF-8 too; text has no NUL
        raise ValueError(f"{flag}{path} holds NUL bytes (the first at character {text.index(chr(0)):,}): it is a "
                         "binary file, not text; give a text file")
    return text


def starts_with(path, prefix):
    """Whether the file at path begins with the bytes prefix."""
    with open(path, "rb") as f:
        return f.read(len(prefix)) == prefix


class NotSavedByTorch(ValueError):
    """A file that torch.save did not write: not a zip archive, nor torch's format from before them."""


# how torch.save began a file before torch 1.6 (and with _use_new_zipfile_serialization=False): a pickle of its
# magic number (protocol 2, a 10-byte long), as older models' pytorch_model.bin on the Hugging Face hub were saved
LEGACY_TORCH_SAVE = b"\x80\x02\x8a\x0a" + 0x1950a86a20f9469cfc6c.to_bytes(10, "little")


def load_torch_file(path):
    """What torch.save wrote to path, loaded with weights_only=True: plain data and tensors, so that
    loading a file runs no code from it. A file torch.save did not write (it writes a zip archive) is a
    NotSavedByTorch that says so (its callers name the file), where torch.load would fail in ways of
    its own; a record whose bytes no longer match their checksum is a zipfile.BadZipFile; torch.load's
    own errors (a damaged archive, pickled objects) pass through."""
    import torch  # here, not at the top: data/prepare.py writes through this module and starts without torch
    if not zipfile.is_zipfile(path):
        if starts_with(path, LEGACY_TORCH_SAVE):  # no checksums in that format to check
            return torch.load(path, map_location="cpu", weights_only=True)
        raise NotSavedByTorch("not a file torch.save wrote (a zip archive): truncated, or a file of another kind")
    with zipfile.ZipFile(path) as archive:  # torch.load checks no record's CRC-32: a tensor's flipped bytes would load
        try:
            damaged = archive.testzip()
        except zlib.error as e:  # a flipped bit in a record's header: stored bytes read as compressed ones
            raise zipfile.BadZipFile(f"a record cannot be read ({e}): the file was damaged after it was "
                                     "written") from None
    if damaged is not None:
        raise zipfile.BadZipFile(f"its record {damaged} fails its CRC-32 check: the file was damaged after it was "
                                 "written")
    return torch.load(path, map_location="cpu", weights_only=True)


def check_stdout():
    """ValueError where this process has no stdout at all (started with 1>&-): what it prints would
    otherwise end it in a traceback."""
    if sys.stdout is None:
        raise ValueError("stdout is closed (1>&-); send it to a file, or to /dev/null")


def silence(stream):
    """Point stream's file descriptor at /dev/null: after its reader left (a broken pipe), the stream's
    own last flush, at exit, then goes nowhere rather than into a second BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


class OutputThatMayClose:
    """A text stream (stdout) that may stop taking text: its reader leaves, as `python train.py |
    head -3` does (a BrokenPipeError), and what follows is dropped; or the file it goes to cannot grow
    (a full disk), and what follows goes to stderr. Either way on_close(error) is called once. A
    character its encoding lacks (a sample's, on a cp1252 or ASCII stdout) is written as an escape."""

    def __init__(self, stream, on_close):
        self.stream, self.on_close, self.gone, self.escaped = stream, on_close, False, False

    def write(self, text):
        if not self.gone:
            try:
                return self.stream.write(text)
            except UnicodeEncodeError:
                return self.write(self.escape(text))
            except OSError as e:
                self.closed(e)
        return len(text)

    def escape(self, text):
        """text with what the stream's encoding lacks as escapes (\\u2019), as Python writes them to stderr."""
        encoding = self.stream.encoding
        if not self.escaped:
            self.escaped = True
            print(f"note: stdout's encoding, {encoding}, lacks characters written here: they are written as escapes "
                  "(\\u2019); PYTHONIOENCODING=utf-8 writes them as they are", file=sys.stderr)
        return text.encode(encoding, "backslashreplace").decode(encoding)

    def flush(self):
        if not self.gone:
            try:
                self.stream.flush()
            except OSError as e:
                self.closed(e)

    def closed(self, error):
        if isinstance(error, BrokenPipeError):
            self.gone = True
            silence(self.stream)
        else:  # what is still to say (where a checkpoint went, how to resume) is said where it can be read
            os.dup2(sys.stderr.fileno(), self.stream.fileno())
        self.on_close(error)

    def __getattr__(self, name):  # fileno, isatty, encoding, ...: the stream's own
        return getattr(self.stream, name)
