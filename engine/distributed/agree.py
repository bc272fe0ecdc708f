"""Every rank of a torchrun job runs the same job: the same settings, the same data sets.

Checked once, right after the process group starts and before any window is cut: each rank's
settings (every TrainConfig field) and data set lengths go round in one all-gather, and a
difference is refused on every rank alike (then leaving.leave_refused), naming the flag and the ranks:
`ranks disagree on --lr: rank 0 has 0.001, rank 1 has 0.5`. Without it two nodes started with
different flags train to the end, and run.db records rank 0's. A task file is compared by its
content, not its path (two nodes may hold the same checkout in different folders).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Optional

import torch.distributed as dist

from engine.declarations.config import ConfigError, TrainConfig
from engine.declarations.settings import BY_NAME

if TYPE_CHECKING:
    from engine.distributed import DistContext

Said = tuple[str, str]  # (what ranks compare, what the error line shows)


def agree_on_run(config: TrainConfig, lengths: dict[str, int], ctx: DistContext) -> None:
    """One all-gather of every rank's settings and data set lengths (-1: none); the same
    one-line refusal on every rank if any differ, or if the job asks what its strategy cannot do."""
    if not ctx.enabled:
        return
    mine = {"settings": settings_said(config), "data": {k: (str(n), _samples(n)) for k, n in lengths.items()}}
    every: list[Any] = [None] * ctx.world
    dist.all_gather_object(every, mine)
    settings = differences([e["settings"] for e in every])
    if settings:
        raise ConfigError("ranks disagree on " + "; and on ".join(
            f"{name}: " + ", ".join(f"{_ranks(r)} {'have' if len(r) > 1 else 'has'} {shown}" for shown, r in groups)
            for name, groups in settings))
    data = differences([e["data"] for e in every])
    if data:
        said = " / ".join(f"{name}: " + "; ".join(f"{shown} on {_ranks(r)}" for shown, r in groups)
                          for name, groups in data)
        raise ConfigError(f"under torchrun every rank must build the same data sets (each rank cuts the windows "
                          f"from its length): {said}")
    why = unsupported(config)
    if why:
        raise ConfigError(why)  # the settings are the same on every rank: so is this verdict


def unsupported(config: TrainConfig) -> Optional[str]:
    """What a job on several ranks cannot run, said before anything is written."""
    if config.strategy == "fsdp" and config.find_micro_batch and not (config.resume or config.fork):
        return ("--find-micro-batch does not work with --strategy fsdp (its probes would run the sharded model, whose "
                "collectives every rank must make in step, and one rank out of memory would leave the others "
                "waiting): find the micro-batch with --strategy ddp or in one process, then give --micro-batch")
    return None


def settings_said(config: TrainConfig) -> dict[str, Said]:
    """Each field by its flag (or its name, for those set in code): its value as compared and as shown."""
    said: dict[str, Said] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        setting = BY_NAME.get(f.name)
        name = setting.option if setting is not None else f.name
        shown = _shown(value, setting.none_means if setting is not None else None)
        said[name] = (_task_identity(value) if f.name == "task" else repr(_plain(value)), shown)
    return said


def differences(every: list[dict[str, Said]]) -> list[tuple[str, list[tuple[str, list[int]]]]]:
    """Each name whose compared value differs between ranks, with each value (as shown) and its ranks."""
    out = []
    for name in every[0]:
        by_value: dict[str, tuple[str, list[int]]] = {}
        for rank, said in enumerate(every):
            key, shown = said.get(name, ("<missing>", "nothing"))
            by_value.setdefault(key, (shown, []))[1].append(rank)
        if len(by_value) > 1:
            out.append((name, list(by_value.values())))
    return out


def _ranks(ranks: list[int]) -> str:
    """'rank 1', 'ranks 1, 3'."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _samples(n: int) -> str:
    return "none" if n < 0 else f"{n} samples"


def _plain(value: Any) -> Any:
    """A value compared as its repr: a dict in key order (task args read in any order)."""
    if isinstance(value, dict):
        return sorted((str(k), _plain(v)) for k, v in value.items())
    return value


def _shown(value: Any, none_means: Optional[str]) -> str:
    if value is None:
        return none_means or "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items()) or "none"
    return str(value)


def _task_identity(task: str) -> str:
    """A task file by its content (the same checkout may live in another folder on each node);
    a built-in name or module:attr as written."""
    if os.path.isfile(task):
        try:
            with open(task, "rb") as f:
                return "file " + hashlib.sha256(f.read()).hexdigest()
        except OSError:
            pass
    return task
