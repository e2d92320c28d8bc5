"""Reading, syntax-checking and writing user source files.

Every file ddpify touches goes through here, so that one set of rules holds
everywhere: a user's file is never corrupted (bytes round-trip exactly, writes
are atomic) and never crashes the tool (every problem becomes a one-line
``SourceError`` naming the file, and the line where there is one). Finding the
files under a directory is `ddpify.python_files`.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import functools
import hashlib
import io
import os
import re
import stat
import tempfile
import tokenize
import warnings
from dataclasses import dataclass, field
from typing import Iterator

__all__ = [
    "SourceError",
    "Source",
    "read_source",
    "check_syntax",
    "write_atomic",
    "write_beside",
    "put_in_place",
    "unchanged_since_read",
    "mentions_torch",
]


class SourceError(Exception):
    """A user file that can't be processed; ``str(e)`` is ``path:line: message`` or ``path: message``."""

    def __init__(self, path: str | os.PathLike, message: str, *, line: int | None = None):
        self.path = os.fspath(path)
        self.line = line
        self.message = " ".join(str(message).split())  # always one line
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {self.message}")

    def __reduce__(self):
        """Survive pickling (e.g. when returned from a worker process)."""
        return (functools.partial(type(self), line=self.line), (self.path, self.message))


@dataclass(frozen=True)
class Source:
    """A user file as read: its text plus what is needed to write it back the same way."""

    path: str
    text: str
    encoding: str
    bom: bool
    mode: int | None
    _digest: str = field(default="", repr=False, compare=False)

    def encode(self, new_text: str) -> bytes:
        """Encode ``new_text`` with this file's encoding and BOM."""
        try:
            data = new_text.encode(self.encoding)
        except UnicodeEncodeError as e:
            line = new_text.count("\n", 0, e.start) + 1
            bad = new_text[e.start : e.end]
            raise SourceError(
                self.path, f"cannot encode {bad!r} in the file's encoding ({self.encoding})", line=line
            ) from None
        return codecs.BOM_UTF8 + data if self.bom else data


# --------------------------------------------------------------------------- reading


def read_source(path: str | os.PathLike) -> Source:
    """Read a Python file, decoding it the way Python would (PEP 263 cookie, BOM)."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise SourceError(path, "is a directory, expected a file")
        if not stat.S_ISREG(st.st_mode):
            raise SourceError(path, "not a regular file")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SourceError(path, describe_os_error(e)) from None
    encoding, bom = _detect_encoding(path, data)
    text = _decode(path, data[len(codecs.BOM_UTF8) :] if bom else data, encoding)
    return Source(
        path=path,
        text=text,
        encoding=encoding,
        bom=bom,
        mode=stat.S_IMODE(st.st_mode),
        _digest=_digest(data),
    )


def describe_os_error(e: OSError) -> str:
    """A short lower-case reason for an OS error, without the path (the caller names it)."""
    if e.errno == errno.ELOOP:
        return "symlink loop (too many levels of symbolic links)"
    return (e.strerror or type(e).__name__).lower()


def _detect_encoding(path: str, data: bytes) -> tuple[str, bool]:
    """Return (encoding, has_utf8_bom) using ``tokenize.detect_encoding`` rules."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise SourceError(path, "UTF-16 encoded files are not supported; re-save it as UTF-8")
    if b"\0" in data:
        raise SourceError(path, "binary file (contains NUL bytes), not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as e:
        if str(e).startswith("invalid or missing encoding declaration"):
            return "utf-8", False  # undecodable first lines: _decode names the bad byte
        raise SourceError(path, f"bad encoding declaration: {e}") from None
    if encoding == "utf-8-sig":
        return "utf-8", True
    return encoding, False


def _decode(path: str, data: bytes, encoding: str) -> str:
    """Decode strictly; name the line of the first undecodable byte."""
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SourceError(
            path,
            f"byte 0x{data[e.start]:02x} is not valid {encoding}; "
            "re-save the file as UTF-8 or declare its encoding (# -*- coding: ... -*-)",
            line=line,
        ) from None
    except LookupError as e:  # e.g. a cookie naming a bytes-to-bytes codec
        raise SourceError(path, f"cannot decode with declared encoding: {e}") from None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unchanged_since_read(source: Source) -> bool:
    """True if the file on disk still holds exactly the bytes that were read into ``source``."""
    expected = source._digest or _digest(source.encode(source.text))
    try:
        with open(source.path, "rb") as f:
            return _digest(f.read()) == expected
    except OSError:
        return False


def mentions_torch(text: str) -> bool:
    """Cheap pre-filter before parsing: does the text mention torch at all?"""
    return "torch" in text


# --------------------------------------------------------------------------- syntax

# (pattern on the offending line or SyntaxError message, what the Python 2 construct is)
_PY2_BY_MESSAGE = (
    ("Missing parentheses in call to 'print'", "print statement"),
    ("Missing parentheses in call to 'exec'", "exec statement"),
    ("leading zeros in decimal integer literals", "0777-style octal literal"),
    ("Function parameters cannot be parenthesized", "tuple parameter"),
)
_PY2_BY_LINE = (
    (re.compile(r"^\s*except\s+[^,:]+,\s*\w+\s*:"), "'except X, e'"),
    (re.compile(r"^\s*raise\s+[\w.]+\s*,"), "'raise E, msg'"),
    (re.compile(r"`"), "backticks"),
    (re.compile(r"<>"), "'<>' operator"),
    (re.compile(r"\b(?:0[xX][0-9a-fA-F]+|\d+)[lL]\b"), "long integer literal"),
    (re.compile(r"\b[uU][rR]['\"]"), "ur'' string prefix"),
)
# `print >>f, x` is valid Python 3 (a tuple expression), so it is looked for separately.
_PY2_PRINT_CHEVRON = re.compile(r"^[ \t]*print[ \t]*>>", re.MULTILINE)
_PY2_UNSUPPORTED = "Python 2 syntax is not supported"


def check_syntax(source: Source) -> None:
    """Raise ``SourceError`` (with the line) if ``source`` is not valid Python 3."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. invalid escape sequences: not ours to report
            # a full compile (not just ast.parse) also catches e.g. 'return' outside a function
            compile(source.text, source.path, "exec", dont_inherit=True)
    except SyntaxError as e:
        line_text = e.text if e.text is not None else _line_of(source.text, e.lineno)
        construct = _python2_construct(e.msg or "", line_text)
        if construct:
            message = f"{_PY2_UNSUPPORTED} ({construct})"
        else:
            message = f"syntax error: {e.msg}"
        raise SourceError(source.path, message, line=e.lineno) from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise SourceError(source.path, f"cannot be parsed: {type(e).__name__}: {e}") from None
    chevron = _PY2_PRINT_CHEVRON.search(source.text)
    if chevron:
        line = source.text.count("\n", 0, chevron.start()) + 1
        raise SourceError(source.path, f"{_PY2_UNSUPPORTED} (print >>file statement)", line=line)


def _line_of(text: str, lineno: int | None) -> str:
    lines = text.splitlines()
    return lines[lineno - 1] if lineno and 0 < lineno <= len(lines) else ""


def _python2_construct(message: str, line_text: str) -> str | None:
    """Name the Python 2 construct a SyntaxError points at, or None."""
    for prefix, construct in _PY2_BY_MESSAGE:
        if message.startswith(prefix):
            return construct
    for pattern, construct in _PY2_BY_LINE:
        if pattern.search(line_text):
            return construct
    return None


# --------------------------------------------------------------------------- writing


def write_atomic(path: str | os.PathLike, data: bytes, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically: readers (and crashes) see old or new, never half.

    Writes a temp file beside it (``write_beside``) and renames it over the target (``put_in_place``).
    Raises ``SourceError`` if it can't; the original is then untouched and no temp file is left.
    """
    put_in_place(write_beside(path, data, mode), path)


def write_beside(path: str | os.PathLike, data: bytes, mode: int | None = None) -> str:
    """Write ``data`` to a new temp file in ``path``'s directory, to be renamed over it: its name.

    Fsynced, with ``mode`` (default: the existing file's permission bits, else the umask default)
    and the existing file's owner and group (where this user may). A symlinked ``path`` is
    followed, so the link stays and its target is replaced. Like black and ruff, which write into
    the file itself, a file this user may not write to (read-only) is refused, not replaced.
    Raises ``SourceError`` if it can't, leaving no temp file.
    """
    target = os.path.realpath(path)
    directory, name = os.path.split(target)
    existing = _existing_stat(target)
    if existing is not None and not os.access(target, os.W_OK):
        raise SourceError(path, "cannot write: read-only file (permission denied); left unchanged")
    if mode is None:
        mode = stat.S_IMODE(existing.st_mode) if existing else _new_file_mode()
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".ddpify-tmp")
    except OSError as e:
        raise SourceError(path, f"cannot write: {describe_os_error(e)}") from None
    with _removed_on_failure(tmp, path), os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        if existing is not None:
            _keep_owner(f.fileno(), existing)
        os.fchmod(f.fileno(), mode)
        os.fsync(f.fileno())
    return tmp


def put_in_place(tmp: str, path: str | os.PathLike) -> None:
    """Rename the temp file ``write_beside`` made over ``path`` (its target, where it is a symlink);
    where that fails, remove it and raise ``SourceError``."""
    target = os.path.realpath(path)
    with _removed_on_failure(tmp, path):
        os.replace(tmp, target)
    _fsync_directory(os.path.dirname(target))


@contextlib.contextmanager
def _removed_on_failure(tmp: str, path: str | os.PathLike) -> Iterator[None]:
    """Remove the temp file where the block fails; an OSError becomes a SourceError naming ``path``."""
    try:
        yield
    except BaseException as e:
        _remove_quietly(tmp)
        if isinstance(e, OSError):
            raise SourceError(path, f"cannot write: {describe_os_error(e)}") from None
        raise


def _existing_stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _new_file_mode() -> int:
    """What a new file gets under the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _keep_owner(fd: int, existing: os.stat_result) -> None:
    """Give the replacement the original's owner and group; only root may give away a file."""
    if (existing.st_uid, existing.st_gid) == (os.geteuid(), os.getegid()):
        return
    try:
        os.fchown(fd, existing.st_uid, existing.st_gid)
    except PermissionError:
        try:  # an ordinary user may still keep the group, if they belong to it
            os.fchown(fd, -1, existing.st_gid)
        except PermissionError:
            pass


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_directory(directory: str) -> None:
    """Make the rename durable across power loss, where the platform allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
