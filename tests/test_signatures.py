"""No function in engine/ or app/ takes more than 8 positional parameters (self and cls not
counted; keyword-only ones are free): a longer call is a record, or keywords. The check
reads the source with ast, and is shown to fail on a function that breaks the rule."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_POSITIONAL = 8


def too_many_positional(source: str, path: str = "<source>") -> list[str]:
    """'path:line name (n)' for each function or lambda in `source` over the limit."""
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        names = [a.arg for a in node.args.posonlyargs + node.args.args]
        if names and names[0] in ("self", "cls"):
            names = names[1:]
        if len(names) > MAX_POSITIONAL:
            found.append(f"{path}:{node.lineno} {getattr(node, 'name', 'lambda')} ({len(names)})")
    return found


def test_no_function_in_engine_or_app_takes_more_than_8_positional_parameters():
    found = []
    for package in ("engine", "app"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as f:
                        found += too_many_positional(f.read(), os.path.relpath(path, ROOT))
    assert not found, "more than 8 positional parameters:\n" + "\n".join(found)


def test_the_check_counts_what_the_rule_says():
    nine = "def f(a, b, c, d, e, g, h, i, j): pass\n"
    assert too_many_positional(nine) == ["<source>:1 f (9)"]  # the negative control: it can fail
    assert too_many_positional("class C:\n    def m(self, a, b, c, d, e, g, h, i): pass\n") == []
    assert too_many_positional("def f(a, b, c, d, *, e, g, h, i, j, k): pass\n") == []  # keyword-only
    assert too_many_positional("f = lambda a, b, c, d, e, g, h, i, j: 0\n") == ["<source>:1 lambda (9)"]
    assert too_many_positional("def f(a, b, c, d, e, /, g, h, i, j): pass\n") == ["<source>:1 f (9)"]
