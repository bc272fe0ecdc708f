"""The run tree as the app reads it from run folders: which run a fork came from (its run
table's `parent` key: {run_dir, checkpoint, step, changed}), what checkpoints a run folder
holds and at which step each was written, the settings a run had at a step, the TrainConfig
fields a fork starts with, and where a fork's steps begin on the samples, tokens and time
axes (its parents' counts before the fork point). Torch-free and Qt-free: the app reads
only run.db and file names, never a checkpoint.
"""
from __future__ import annotations

import math
import os
import sqlite3
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional
from urllib.parse import quote

from engine.declarations import checkpoint_names as ckpt_names
from engine.declarations.config import overlay
from engine.declarations.settings import BY_NAME as SETTINGS_BY_NAME
from engine.declarations.settings import LIVE_NAMES
from engine.store import DB_NAME, RunReader, StoreError

from .fields import fmt_value, words
from .stored import changes, event_data, number, whole

# Config keys that say where a run is, not how it trains (engine/checkpoints/run_tree.py NOT_SETTINGS,
# with what the CLI drops from a saved config for --fork).
NOT_SETTINGS = ("run_dir", "resume", "fork", "find_micro_batch", "effective_batch", "memory_margin")
DROPPED = ("run_dir", "resume", "fork", "find_micro_batch")
MAX_DEPTH = 64  # a parent chain longer than this is damaged (or loops)
AXES = ("samples", "tokens", "time")


@dataclass(frozen=True)
class Parent:
    run_dir: str
    checkpoint: str  # "last", "epoch-N" or "step-S"
    step: int
    changed: dict = field(default_factory=dict)

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> Optional["Parent"]:
        p = info.get("parent")
        if not isinstance(p, dict) or not isinstance(p.get("run_dir"), str):
            return None
        step = whole(p.get("step"))
        changed = p.get("changed")
        return cls(os.path.abspath(p["run_dir"]), str(p.get("checkpoint") or "last"), step,
                   dict(changed) if isinstance(changed, dict) else {})


def changed_text(changed: dict[str, Any]) -> str:
    """{'lr': 0.0005, 'accum': 4} -> 'lr 0.0005, accum 4' ('no change' when empty)."""
    if not changed:
        return "no change"
    return ", ".join(f"{words(k)} {fmt_value(v) if v is not None else none_word(k)}" for k, v in changed.items())


def none_word(name: str) -> str:
    """What a setting's None means, as its flag says it ('all', 'off', 'auto')."""
    s = SETTINGS_BY_NAME.get(name)
    return (s.none_means if s is not None else "") or "off"


def fork_text(p: Parent) -> str:
    """How the run history names a fork: 'step-8 (step 8): lr 0.0005, accum 4'."""
    where = p.checkpoint if p.checkpoint.startswith("step-") else f"{p.checkpoint}, step {p.step}"
    return f"@{where}: {changed_text(p.changed)}"


def read_info(run_dir: str) -> dict[str, Any]:
    try:
        r = RunReader(run_dir)
    except StoreError:
        return {}
    try:
        return r.info()
    except StoreError:
        return {}
    finally:
        r.close()


# -- the tree -------------------------------------------------------------------------------
@dataclass
class RunNode:
    path: str
    parent: Optional[Parent]  # the run's own record of its parent, as stored
    children: list[str] = field(default_factory=list)
    up: Optional[str] = None  # the parent in the tree: a run among these, never making a loop
    loops: bool = False  # its parent link closes a loop of parent links (a damaged record): a root here


def build_tree(paths: Iterable[str], infos: Optional[dict[str, dict[str, Any]]] = None) -> dict[str, RunNode]:
    """Every run by absolute path, each with its parent link and its children (in the order
    given) among these runs: always a forest. Parent records are input: a loop of them (fork,
    delete the parent, fork back into its folder) is cut where the walk closes it, so nothing
    that walks the tree (the history's items, Qt's own item tree) can go round for ever.
    infos: run table contents already read, by path."""
    nodes: dict[str, RunNode] = {}
    for p in paths:
        a = os.path.abspath(p)
        info = (infos or {}).get(p)
        nodes[a] = RunNode(a, Parent.from_info(info if info is not None else read_info(a)))
    for n in nodes.values():
        up = n.parent.run_dir if n.parent is not None else None
        n.up = up if up in nodes and up != n.path else None
    _cut_loops(nodes)
    for n in nodes.values():
        if n.up is not None:
            nodes[n.up].children.append(n.path)
    return nodes


def _cut_loops(nodes: dict[str, RunNode]) -> None:
    """Walk up from every run; a run met again on the same walk closes a loop: it becomes a root."""
    done: set[str] = set()
    for start in nodes:
        walk: list[str] = []
        on_walk: set[str] = set()
        cur: Optional[str] = start
        while cur is not None and cur not in done and cur not in on_walk:
            walk.append(cur)
            on_walk.add(cur)
            cur = nodes[cur].up
        if cur is not None and cur in on_walk:
            nodes[cur].up, nodes[cur].loops = None, True
        done.update(walk)


def ancestors(path: str, nodes: dict[str, RunNode]) -> list[str]:
    """The run's parent, its parent's parent, ... as far as they are known (nearest first)."""
    start = os.path.abspath(path)
    out: list[str] = []
    seen = {start}  # a loop of parent records ends the walk where it closes, at the run itself too
    cur = nodes.get(start)
    while cur is not None and cur.parent is not None and len(out) < MAX_DEPTH:
        up = cur.parent.run_dir
        if up in seen:
            break
        out.append(up)
        seen.add(up)
        cur = nodes.get(up)
    return out


def family(path: str, nodes: dict[str, RunNode]) -> list[str]:
    """What a run is compared with: its ancestors and its siblings (the other forks of its
    parent) and its own forks, among the runs known."""
    a = os.path.abspath(path)
    node = nodes.get(a)
    out = [p for p in ancestors(a, nodes) if p in nodes]
    if node is not None and node.parent is not None and node.parent.run_dir in nodes:
        out += [c for c in nodes[node.parent.run_dir].children if c != a]
    if node is not None:
        out += node.children
    return list(dict.fromkeys(p for p in out if p != a))


# -- checkpoints ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    name: str  # "step-40", "epoch-2" or "last" (what --fork DIR@NAME takes)
    step: Optional[int]  # the optimizer steps done when it was written (None: not known)
    path: str

    def spec(self, run_dir: str) -> str:
        return f"{os.path.abspath(run_dir)}@{self.name}"

    @property
    def label(self) -> str:
        if self.name.startswith("step-"):
            return self.name
        return f"{self.name} (step {self.step})" if self.step is not None else f"{self.name} (step ?)"


def _db(run_dir: str) -> sqlite3.Connection:
    path = os.path.abspath(os.path.join(run_dir, DB_NAME))
    return sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=2)


def _steps_of(run_dir: str) -> tuple[dict[int, int], Optional[int]]:
    """(epoch -> the step it ended at, the step of the last checkpoint written) from run.db."""
    ends: dict[int, int] = {}
    last: Optional[int] = None
    try:
        db = _db(run_dir)
    except sqlite3.Error:
        return ends, last
    try:
        for kind, step, epoch in db.execute("SELECT kind, step, epoch FROM events WHERE kind IN "
                                            "('epoch_end', 'checkpoint') ORDER BY id"):
            if not isinstance(step, int):
                continue
            if kind == "epoch_end" and isinstance(epoch, int):
                ends[epoch] = step
            elif kind == "checkpoint":
                last = step
    except sqlite3.Error:
        pass
    finally:
        db.close()
    return ends, last


def checkpoints(run_dir: str) -> list[Checkpoint]:
    """The checkpoints in a run folder, oldest first: step-S, epoch-N, last; each a file or a
    sharded run's folder, as the engine lists them (engine/declarations/checkpoint_names.py)."""
    found = ckpt_names.candidates(run_dir)
    if not found:
        return []
    ends, last = _steps_of(run_dir)
    out = []
    for path in found:
        name = ckpt_names.name_of(path)
        kind, _, n = name.partition("-")
        step = last if name == "last" else int(n) if kind == "step" else ends.get(int(n))
        out.append(Checkpoint(name, step, path))
    # By step; at one step a numbered one (it never changes) before last (it moves on).
    out.sort(key=lambda c: (c.step if c.step is not None else math.inf, c.name == "last", c.name))
    return out


def nearest(cps: list[Checkpoint], step: int) -> Optional[Checkpoint]:
    """The newest checkpoint at or before `step` (a numbered one before last at one step)."""
    best: Optional[Checkpoint] = None
    for c in cps:
        if c.step is not None and c.step <= step:
            if best is None or best.step is None or c.step > best.step or (c.step == best.step and best.name == "last"):
                best = c
    return best


# -- settings and the fork's config -----------------------------------------------------------
def settings_at(run_dir: str, step: int, config: dict[str, Any]) -> dict[str, Any]:
    """The live settings (micro-batch, accum, lr peak, clip, lr scaling) the run had after `step`,
    from its config and the events that changed them (settings applied, out-of-memory
    recoveries, the micro-batch finder, rollbacks' lr)."""
    out = {k: config.get(k) for k in LIVE_NAMES if k in config}
    try:
        reader = RunReader(run_dir)
    except StoreError:
        return out
    try:
        events = reader.events(kinds={"settings_applied", "oom_recovered", "micro_batch_found", "rolled_back"})
    except StoreError:
        events = []
    finally:
        reader.close()
    for e in events:
        d, at = event_data(e), e.get("step")  # stored input: read through app/model/stored.py
        if not isinstance(at, int):
            continue
        kind = e.get("kind")
        if kind == "settings_applied":
            if (whole(d.get("from_step")) or at + 1) <= step:  # from_step 0: not recorded
                for name, _old, new in changes(d.get("changes")):
                    if name in LIVE_NAMES:
                        out[name] = new
        elif kind == "oom_recovered" and at < step:
            out.update(micro_batch=d.get("new_micro_batch", out.get("micro_batch")),
                       accum=d.get("new_accum", out.get("accum")))
        elif kind == "micro_batch_found" and at <= step:
            out.update(micro_batch=d.get("micro_batch", out.get("micro_batch")), accum=d.get("accum", out.get("accum")))
        elif kind == "rolled_back" and step > whole(d.get("to_step"), at) and number(d.get("new_lr"), None) is not None:
            out["lr"] = d["new_lr"]
    return out


def fork_config(parent_config: dict[str, Any], edits: dict[str, Any], spec: str) -> dict[str, Any]:
    """The TrainConfig fields of a fork: the parent's config (as the engine's --fork reads it)
    with the edited fields changed. Fields left alone keep the parent's values, so the engine
    records exactly the edits as the fork's change."""
    cfg = overlay({k: v for k, v in parent_config.items() if k not in DROPPED}, edits)
    cfg["fork"] = spec
    cfg["fork_changes"] = tuple(edits)  # a change even when set back to the parent's start value
    return cfg


# -- where a fork begins on each axis ---------------------------------------------------------
def axis_offsets(run_dir: str) -> dict[str, float]:
    """Samples, tokens and seconds of training before this run's first row: a fork continues
    its parent's counts from the fork point (and the parent its own parent's). {} for a run
    that is no fork, or whose parents cannot be read."""
    out = {a: 0.0 for a in AXES}
    seen: set[str] = set()
    cur = os.path.abspath(run_dir)
    for _ in range(MAX_DEPTH):
        parent = Parent.from_info(read_info(cur))
        if parent is None or parent.run_dir in seen or parent.run_dir == cur:
            break
        seen.add(cur)
        before = _counts_to(parent.run_dir, parent.step)
        if before is None:
            break
        for a in AXES:
            out[a] += before[a]
        cur = parent.run_dir
    return out if any(out.values()) else {}


def _counts_to(run_dir: str, step: int) -> Optional[dict[str, float]]:
    try:
        db = _db(run_dir)
    except sqlite3.Error:
        return None
    try:
        row = db.execute("SELECT total(samples), total(tokens), min(time), max(time) FROM metrics WHERE step <= ?",
                         (int(step),)).fetchone()
    except sqlite3.Error:
        return None
    finally:
        db.close()
    samples, tokens, t0, t1 = row
    secs = float(t1 - t0) if isinstance(t0, (int, float)) and isinstance(t1, (int, float)) else 0.0
    return {"samples": float(samples or 0.0), "tokens": float(tokens or 0.0), "time": max(0.0, secs)}
