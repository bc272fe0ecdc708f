"""Every `# noqa` and `# type: ignore` in the project names what it silences and says why, on
its line: `# noqa: F401 - imported for its side effect`, `# type: ignore[attr-defined]  # pyqtgraph
has no stubs`. A bare one (no codes, or codes and no reason) fails here. Fast, no Qt, no torch."""
from __future__ import annotations

import io
import os
import re
import tokenize

import pytest

from testkit import ROOT

ROOT = str(ROOT)
FOLDERS = ("engine", "app", "tests", "bench", "resources")
NOQA = re.compile(r"#\s*noqa\b(?P<codes>:\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?(?P<rest>.*)", re.I)
IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<codes>\[[\w\s,-]+\])?(?P<rest>.*)")
REASON = re.compile(r"[A-Za-z]{2,}[^A-Za-z]+(?:[A-Za-z][^A-Za-z]+)*[A-Za-z]{2,}")  # two words at least ("Qt name")


def bare(comment: str) -> list[str]:
    """What is wrong with one comment's suppressions ([] if nothing)."""
    out = []
    for pattern, what in ((NOQA, "noqa"), (IGNORE, "type: ignore")):
        m = pattern.search(comment)
        if m is None:
            continue
        if not m.group("codes"):
            out.append(f"{what} without codes")
        elif not REASON.search(m.group("rest")):
            out.append(f"{what} without a reason")
    return out


def python_files() -> list[str]:
    out = [os.path.join(ROOT, "build_spec.spec")]
    for top in FOLDERS:
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            out += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
    return out


def suppressions() -> list[tuple[str, int, str]]:
    found = []
    for path in python_files():
        with open(path, encoding="utf-8") as f:
            source = f.read()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and (NOQA.search(tok.string) or IGNORE.search(tok.string)):
                found.append((os.path.relpath(path, ROOT), tok.start[0], tok.string))
    return found


def test_every_suppression_says_why():
    found = suppressions()
    assert found, "no suppressions found at all: the scan is broken"
    wrong = [f"{path}:{line}: {', '.join(bare(text))}: {text}" for path, line, text in found if bare(text)]
    assert not wrong, f"{len(wrong)} of {len(found)} suppressions say no why:\n" + "\n".join(wrong)


@pytest.mark.parametrize("comment,problems", [
    ("# noqa: F401 - imported for its side effect", []),
    ("# noqa: N802, N803 - pyqtgraph's names", []),
    ("# type: ignore[attr-defined]  # pyqtgraph has no stubs", []),
    ("# noqa", ["noqa without codes"]),
    ("# noqa: F401", ["noqa without a reason"]),
    ("# noqa: E402,F401 -", ["noqa without a reason"]),
    ("# type: ignore", ["type: ignore without codes"]),
    ("# type: ignore[arg-type]", ["type: ignore without a reason"]),
    ("# the lines between are not read: no noqa here", []),
])
def test_what_counts_as_bare(comment, problems):
    assert bare(comment) == problems
