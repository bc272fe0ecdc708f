"""Every path the project's text names is a file (or folder) that exists: the comments and
docstrings of the Python code, README.md, pyproject.toml, the Makefile, .ci/run and the comments
of the stylesheets. A file moved or renamed leaves its old name in the prose that explains it;
this test finds that name. Fast, no Qt, no torch.

What counts as a path (see PATH): a word ending in one of the project's file types (.py, .qss,
.toml, .md, ...) with or without folders before it (engine/store/_reader.py, ui/plots/panel.py,
hover.py, the glob test_*.py), or a word that starts with one of the repository's top folders
(app/ui/plots, tests/x11/; app/ui/theme.PALETTES is read as app/ui/theme.py). A path with folders
is resolved against the naming file's folder, then each folder above it up to the repository; a
bare file name the same way, else anywhere in the repository (prose names engine/accumulation's
accumulate.py as "accumulate.py" from engine/trainer). A glob must match at least one file.

Not checked: URLs, absolute and home paths, a folder the build or a run writes (build/, dist/,
.venv/, runs/), a path under another installed package (torch/cuda/memory.py: its first folder
is a package Python finds outside the repository), the placeholders of examples (path/to/...)
and the few names in NOT_OURS.
"""
from __future__ import annotations

import ast
import fnmatch
import functools
import glob
import importlib.util
import io
import os
import re
import tokenize

import pytest

from testkit import ROOT

ROOT = str(ROOT)
TOP = ("engine", "app", "tests", "bench", "resources", ".ci")
# Written by the build, a run or a test, never in the repository.
WRITTEN = ("build", "dist", ".venv", "runs", "site-packages", "headroom.egg-info", "share")
EXTENSIONS = ("py", "qss", "toml", "md", "spec", "svg", "desktop", "sh", "txt", "png", "pyi")
# Names the text gives to files that are not the project's: the user's (a task file, a job
# script), what a run or the app writes (screenshots), the notes beside the repository.
NOT_OURS = {
    "task.py": "the user's task file (--task path/to/task.py)",
    "my_task.py": "the README's example of a user's task file",
    "train.sh": "the README's example of a user's sbatch script",
    "shot.png": "a screenshot the app writes (--screenshot)",
    "out.png": "a screenshot the app writes (--screenshot)",
    "screenshot.png": "a screenshot the app writes (--screenshot)",
    "run.png": "the plot image the app writes",
    "ANCHORS.md": "the project's benchmark notes, ../shared/ANCHORS.md beside the repository",
    "DESIGN.md": "the project's design notes, ../shared/DESIGN.md beside the repository",
}
# pyproject.toml's package-data globs are relative to their package.
EXTRA_BASES = {"pyproject.toml": ("engine", "app")}
_SEG = r"[\w*.-]*[\w*]"
PATH = re.compile(
    r"(?<![\w/.:~$@\\-])"  # not inside a URL, an absolute or home path, a dotted name, $VAR/..
    rf"((?:{_SEG}/)*[\w*-][\w*.-]*\.(?:{'|'.join(EXTENSIONS)})"  # a file: [folders/]name.ext
    rf"(?![\w/*-]|\.\w)"  # the whole word (not a prefix of a longer name, nor name.py.bak)
    rf"|(?:{'|'.join(re.escape(t) for t in TOP)})(?:/[\w*-]+)+/?(?![\w/*${{-]))")  # or in a top folder


def texts_of_python(path: str) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python file, each with its line."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.append((body[0].lineno, body[0].value.value))
    return out


def texts_of_stylesheet(path: str) -> list[tuple[int, str]]:
    with open(path, encoding="utf-8") as f:
        source = f.read()
    return [(source.count("\n", 0, m.start()) + 1, m.group(0)) for m in re.finditer(r"/\*.*?\*/", source, re.S)]


def texts_of_whole(path: str) -> list[tuple[int, str]]:
    with open(path, encoding="utf-8") as f:
        return list(enumerate(f.read().splitlines(), 1))


def project_texts() -> list[tuple[str, int, str]]:
    """(file relative to the repository, line, text) for every text this test reads."""
    out: list[tuple[str, int, str]] = []

    def add(rel: str, reader) -> None:
        out.extend((rel, line, text) for line, text in reader(os.path.join(ROOT, rel)))

    for top in ("engine", "app", "tests", "bench", "resources"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for name in sorted(files):
                rel = os.path.relpath(os.path.join(folder, name), ROOT)
                if name.endswith(".py"):
                    add(rel, texts_of_python)
                elif name.endswith(".qss"):
                    add(rel, texts_of_stylesheet)
    for rel in ("README.md", "pyproject.toml", "Makefile", ".ci/run"):
        if os.path.exists(os.path.join(ROOT, rel)):
            add(rel, texts_of_whole)
    add("build_spec.spec", texts_of_python)
    # This file's own examples of paths that resolve and paths that do not are not the project's.
    return [t for t in out if t[0] != os.path.join("tests", "test_named_paths.py")]


def bases(naming: str) -> list[str]:
    """The naming file's folder and each one above it, up to the repository (absolute)."""
    folder = os.path.dirname(naming)
    out = [os.path.join(ROOT, extra) for extra in EXTRA_BASES.get(naming, ())]
    while True:
        out.append(os.path.join(ROOT, folder))
        if not folder:
            return out
        folder = os.path.dirname(folder)


def _external(first: str) -> bool:
    """A path under a package installed outside the repository (torch/..., transformers/...)."""
    if not first.isidentifier() or first in TOP:
        return False
    try:
        spec = importlib.util.find_spec(first)
    except (ImportError, ValueError):
        return False
    origin = spec and (spec.origin or next(iter(spec.submodule_search_locations or []), None))
    if not origin:
        return False
    origin = os.path.abspath(origin)
    return not origin.startswith(ROOT + os.sep) or "site-packages" in origin.split(os.sep)


def resolves(naming: str, path: str) -> bool:
    """Whether `path`, named in the file `naming`, is a file or folder (a glob: matches one)."""
    path = path.rstrip("/")
    for base in bases(naming):
        full = os.path.join(base, path)
        if glob.glob(full) if glob.has_magic(path) else os.path.exists(full) or os.path.isfile(full + ".py"):
            return True
    return "/" not in path and any(fnmatch.filter(files, path) for files in repository_files().values())


@functools.lru_cache(maxsize=1)
def repository_files() -> dict[str, list[str]]:
    """Every folder of the repository's own tree and its file names."""
    out = {}
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".") and d not in WRITTEN]
        out[folder] = files
    return out


def checked(path: str) -> bool:
    first = path.split("/")[0]
    return (first not in WRITTEN and path not in NOT_OURS and not path.startswith("path/to/")
            and not ("/" in path and not glob.has_magic(first) and _external(first)))


def dead_paths(texts) -> list[str]:
    dead = []
    for naming, line, text in texts:
        for m in PATH.finditer(text):
            path = m.group(1)
            if checked(path) and not resolves(naming, path):
                dead.append(f"{naming}:{line}: {path}")
    return sorted(set(dead))


def test_every_named_path_exists():
    dead = dead_paths(project_texts())
    assert not dead, f"{len(dead)} paths name no file:\n" + "\n".join(dead)


@pytest.mark.parametrize("text,found", [
    ("(engine/store/_reader.py)", ["engine/store/_reader.py"]),
    ("see plots/panel.py's", ["plots/panel.py"]),
    ("plot_*.py and windows.py.", ["plot_*.py", "windows.py"]),
    ("the folder app/ui/plots/ holds", ["app/ui/plots/"]),
    ("resources/icons/headroom-$$s.png", []),
    ("engine/declarations/config.check_value", ["engine/declarations/config"]),
    ("https://example.org/engine/x.py ~/engine/y.py /tmp/app/z.py engine.cli a.b.py.bak", []),
])
def test_what_counts_as_a_path(text, found):
    assert [m.group(1) for m in PATH.finditer(text)] == found


def test_a_dead_path_fails():
    """The check can fail: a moved file, a glob that matches nothing, a bare name beside no file."""
    texts = [("engine/accumulation/policy.py", 1, "(engine/memory/levers.py), plot_*.py, windows.py, torch/nn/x.py"),
             ("app/ui/plots/panel.py", 2, "the parts (hover.py, ui/plots/build.py, app/ui/plots/, accumulate.py)"),
             ("app/ui/plots/panel.py", 3, "app/ui/theme.PALETTES, ui/hover.py, engine/accumulation/pol*.py")]
    assert dead_paths(texts) == ["app/ui/plots/panel.py:3: ui/hover.py", "engine/accumulation/policy.py:1: engine/memory/levers.py",
                                 "engine/accumulation/policy.py:1: plot_*.py", "engine/accumulation/policy.py:1: windows.py"]


def test_app_layers_listed_as_the_contract_has_them():
    """app/__init__.py's list of layers names the layers of pyproject.toml's contract, in order."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        contract = re.search(r'layers = \[("app\..*?)\]', f.read(), re.S)
    assert contract, "pyproject.toml has no layers contract for the app"
    layers = re.findall(r'"(app\.\w+)"', contract.group(1))
    with open(os.path.join(ROOT, "app", "__init__.py"), encoding="utf-8") as f:
        listed = re.findall(r"^ {4}(app\.\w+) ", ast.get_docstring(ast.parse(f.read())) or "", re.M)
    assert listed == layers
