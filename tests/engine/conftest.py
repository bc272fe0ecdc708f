"""The engine tests train with one intra-op thread, in this process and in the engines they start.

Their models are tiny: a second torch thread only adds synchronisation, and on CI's loaded 2-core
machine (2 pytest workers, each training) its spin-waits cost several times the step itself (a
2-epoch mlp run in process: 29.6 s of CPU with 2 threads against 4.3 s with 1, measured at load 7).
Module-scoped, so that the module fixtures that train (run before any function fixture) run with
one thread too; the thread count and OMP_NUM_THREADS are put back after each module.
"""
from __future__ import annotations

from typing import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    import torch
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")  # the engine processes a test starts (testkit.subprocess_env)
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
