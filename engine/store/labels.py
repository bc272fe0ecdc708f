"""What a person says about a run: its tags, a note, and whether it is archived (out of the run
list until shown again). Kept in the run folder as labels.json, beside run.db, so they travel
with the folder and survive a reinstall; the engine never reads or writes them.

run.db has one writer, the engine; labels.json is the user's: the window and `headroom-ctl
tag/note/archive` change it, while the run trains too. A change is read, changed and written
under an flock on the run folder (two editors never lose each other's tag), and written to a
temporary file renamed over the old one (a crash leaves the old labels or the new, never half).
Torch-free.

    labels.read(run_dir)                      # Labels(tags=(...), note="", archived=False)
    labels.change(run_dir, add=("lr-sweep",), note="baseline")
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import dataclass, replace
from typing import Any, Iterable, Optional

from engine.declarations import limits
from engine.declarations.config import ConfigError

LABELS_NAME = "labels.json"
TAG_CHARS = 40  # a tag is a word or two, shown in a table cell
NOTE_CHARS = 4000


@dataclass(frozen=True)
class Labels:
    tags: tuple[str, ...] = ()
    note: str = ""
    archived: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"tags": list(self.tags), "note": self.note, "archived": self.archived}


def labels_path(run_dir: str) -> str:
    return os.path.join(run_dir, LABELS_NAME)


def clean_tag(text: str) -> str:
    """A tag as stored: one line, no surrounding space, no comma (the separator where tags are
    typed as a list); ConfigError for one that is empty or too long."""
    tag = " ".join(str(text).replace(",", " ").split())
    if not tag:
        raise ConfigError("a tag cannot be empty")
    if any(not c.isprintable() for c in tag):
        raise ConfigError(f"a tag is printable text: {limits.quote(tag, 60)}")
    if len(tag) > TAG_CHARS:
        raise ConfigError(f"a tag is at most {TAG_CHARS} characters: {limits.quote(tag, 60)}")
    return tag


def _clean_note(text: str) -> str:
    note = str(text).strip()
    if "\x00" in note:  # no file or command line holds one
        raise ConfigError("a note cannot hold a NUL character")
    if len(note) > NOTE_CHARS:
        raise ConfigError(f"a note is at most {NOTE_CHARS} characters (this one has {len(note)})")
    return note


def from_dict(raw: Any) -> Labels:
    """Labels from what a file says, any shape: what is not a list of short strings, a string
    or a bool is left out, never an error (a hand-edited or damaged file still lists the run)."""
    if not isinstance(raw, dict):
        return Labels()
    tags: list[str] = []
    given = raw.get("tags")
    for t in given if isinstance(given, list) else []:
        if isinstance(t, str):
            try:
                tag = clean_tag(t)
            except ConfigError:
                continue
            if tag not in tags:
                tags.append(tag)
    note = raw.get("note")
    return Labels(tuple(tags), note[:NOTE_CHARS] if isinstance(note, str) else "", raw.get("archived") is True)


def read(run_dir: str) -> Labels:
    """The run's labels; Labels() when it has none or its file cannot be read."""
    try:
        with open(labels_path(run_dir), encoding="utf-8") as f:
            return from_dict(json.load(f))
    except (OSError, ValueError, RecursionError):
        return Labels()


def change(run_dir: str, *, add: Iterable[str] = (), remove: Iterable[str] = (), tags: Optional[Iterable[str]] = None,
           note: Optional[str] = None, archived: Optional[bool] = None) -> Labels:
    """Change a run's labels and return them as written. `tags` replaces the list; `add` and
    `remove` change it (in that order). ConfigError for a folder that is not a run folder, a
    tag or note that cannot be kept, or a folder that cannot be written (nothing is changed)."""
    from engine.store import DB_NAME
    if not os.path.isfile(os.path.join(run_dir, DB_NAME)):
        raise ConfigError(f"{run_dir}: not a run folder (no {DB_NAME})")
    added = [clean_tag(t) for t in add]
    removed = {clean_tag(t) for t in remove}
    given = None if tags is None else [clean_tag(t) for t in tags]
    new_note = None if note is None else _clean_note(note)
    try:
        folder = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise ConfigError(f"{run_dir}: {limits.one_line(e.strerror or e)}") from None
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)  # one editor at a time; released when closed
        old = read(run_dir)
        out = list(dict.fromkeys([*(old.tags if given is None else given), *added]))  # once each, in order
        out = [t for t in out if t not in removed]
        new = replace(old, tags=tuple(out), note=old.note if new_note is None else new_note,
                      archived=old.archived if archived is None else archived)
        if new != old:
            _write(run_dir, new)
        return new
    finally:
        os.close(folder)


def _write(run_dir: str, labels: Labels) -> None:
    path = labels_path(run_dir)
    if os.path.islink(path):
        raise ConfigError(f"{path}: a link; labels are written only as a file of the run folder")
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".labels-", suffix=".tmp", dir=run_dir)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(labels.to_dict(), f, ensure_ascii=False, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise ConfigError(f"{path}: cannot be written: {limits.one_line(e.strerror or e)}") from None


def folder_bytes(run_dir: str) -> int:
    """The bytes a run folder's files hold (apparent sizes, links not followed): the size the
    run table and `headroom-ctl runs` both show."""
    total = 0
    stack = [run_dir]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
    return total


def fmt_bytes(n: Optional[int]) -> str:
    """1.2 GB, 340 MB, 12 kB: decimal units, as file managers show sizes."""
    if n is None:
        return ""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            value = n / size
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{n} B"
