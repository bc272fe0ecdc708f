"""A run's labels (its tags, its note, archived or not: engine/store/labels.py), read or changed
here or on a server: what `headroom-ctl tag`, `note`, `archive` and `unarchive` do, and what
the window calls for a local or a remote run. One change is one command (one ssh connection
for a remote run), applied under the run folder's lock. Labels live beside run.db but are not
run.db: a run that is training is labelled too. Torch-free."""
from __future__ import annotations

import os
from typing import Any, Iterable, Iterator, Optional

from engine.declarations import limits
from engine.declarations.config import ConfigError
from engine.store import labels

from ..local import run_path
from ..protocol import EXIT_REMOTE, CtlError
from .records import AnyRecord, Labelled, typed
from .targets import Remote, Target, run_target, words


def label(target: Target, *, add: Iterable[str] = (), remove: Iterable[str] = (),
          tags: Optional[Iterable[str]] = None, note: Optional[str] = None, archived: Optional[bool] = None,
          remote_python: Optional[str] = None) -> Iterator[AnyRecord]:
    """Change the run's labels and yield them as written (a `Labelled`); with nothing to change,
    yield them as they are. `tags` replaces the list, then `add` and `remove` change it; `note`
    replaces the note ('' empties it). CtlError: not a run folder, or a tag or note that cannot
    be kept (exit 2, nothing changed); the remote not reached (5)."""
    add, remove = list(add), list(remove)
    given = None if tags is None else list(tags)
    remote, path = run_target(target)
    if remote is not None:
        yield from Remote(remote, words("tag", *_options([*(given or []), *add], remove, given is not None, note,
                                                         archived), "--", path), remote_python).records()
        return
    yield typed(_change(path, add, remove, given, note, archived))


def label_run(target: Target, *, add: Iterable[str] = (), remove: Iterable[str] = (),
              tags: Optional[Iterable[str]] = None, note: Optional[str] = None, archived: Optional[bool] = None,
              remote_python: Optional[str] = None) -> Labelled:
    """`label`'s answer: the run's labels after the change (the window's call, here or remote)."""
    for answer in label(target, add=add, remove=remove, tags=tags, note=note, archived=archived,
                        remote_python=remote_python):
        if isinstance(answer, Labelled):
            return answer
    raise CtlError(f"{target}: headroom-ctl tag said nothing about the run's labels", EXIT_REMOTE)


def _options(add: list[str], remove: list[str], clear: bool, note: Optional[str],
             archived: Optional[bool]) -> list[str]:
    """`tag`'s options for the change, each value after `=` (a tag or note may begin with '-')."""
    options = ["--clear"] if clear else []
    options += [f"--add={t}" for t in add]
    options += [f"--remove={t}" for t in remove]
    options += [f"--note={note}"] if note is not None else []
    options += [] if archived is None else ["--archive" if archived else "--unarchive"]
    return options


def _change(path: str, add: list[str], remove: list[str], tags: Optional[list[str]], note: Optional[str],
            archived: Optional[bool]) -> dict[str, Any]:
    run_dir = run_path(path)
    if not os.path.isdir(run_dir):
        raise CtlError(f"{path}: no such run folder")
    try:
        now = labels.change(run_dir, add=add, remove=remove, tags=tags, note=note, archived=archived)
    except ConfigError as e:
        raise CtlError(limits.one_line(e)) from None
    return {"kind": "labels", "run_dir": run_dir, **now.to_dict()}


__all__ = ["label", "label_run"]
