"""Parent records are input (issue 23): whatever a run table says of its parent - loops,
itself, runs that are not there, the wrong types, huge or negative steps, odd `changed` -
the run tree is a forest, every walk up it ends, and the history's texts are made without
raising (a loop of parent links once made every app start spin for ever)."""
from __future__ import annotations

import os

from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.model import lineage

ROOT = "/runs"
NAMES = [f"{ROOT}/r{i}" for i in range(6)]
ODD = st.one_of(st.none(), st.integers(-10**20, 10**20), st.floats(allow_nan=True), st.text(max_size=12),
                st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
RUN_DIR = st.one_of(st.sampled_from(NAMES), st.sampled_from([n + "/" for n in NAMES]), st.text(max_size=20), ODD)
PARENT = st.one_of(ODD, st.fixed_dictionaries({"run_dir": RUN_DIR}, optional={
    "checkpoint": st.one_of(st.sampled_from(["last", "step-3", "epoch-1"]), ODD),
    "step": ODD, "changed": st.one_of(ODD, st.dictionaries(st.sampled_from(["lr", "accum", "x"]), ODD, max_size=3))}))


@settings(max_examples=300, deadline=None)
@given(parents=st.lists(PARENT, min_size=len(NAMES), max_size=len(NAMES)))
@example(parents=[{"run_dir": NAMES[4]}, None, None, None, {"run_dir": NAMES[0]}, None])  # CI found it: a 2-run loop
@example(parents=[None, None, None, None, None, {"run_dir": NAMES[0], "step": float("inf")}])  # CI: int(inf)
def test_any_parent_records_make_a_forest_and_every_walk_ends(parents):
    infos = {n: {"parent": p} for n, p in zip(NAMES, parents)}
    nodes = lineage.build_tree(NAMES, infos)
    assert set(nodes) == {os.path.abspath(n) for n in NAMES}
    for path, node in nodes.items():
        seen: set[str] = set()
        cur = path
        while cur is not None:  # up the tree: to a root, never round
            assert cur not in seen and cur in nodes
            seen.add(cur)
            cur = nodes[cur].up
        ups = lineage.ancestors(path, nodes)
        assert len(ups) == len(set(ups)) <= lineage.MAX_DEPTH and path not in ups
        assert path not in lineage.family(path, nodes)
        if node.parent is not None:
            assert lineage.fork_text(node.parent)  # the history's text for it
    assert sum(len(n.children) for n in nodes.values()) == sum(n.up is not None for n in nodes.values())
    assert all(c != p for p, n in nodes.items() for c in n.children)
