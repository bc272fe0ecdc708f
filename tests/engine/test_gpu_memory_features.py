"""Out-of-memory recovery, the micro-batch finder, fp16 scaler skips and the no-GPU
paths, on CPU with out-of-memory errors injected from the task's loss."""
from __future__ import annotations

from typing import Iterator

import pytest
import torch
import torch.nn.functional as F

from engine.accumulation.oom import is_oom
from engine.declarations.config import TrainConfig
from engine.declarations.events import MicroBatchFound, OomRecovered, ScalerSkip, StepMetrics
from engine.memory.telemetry import NO_GPU, MemoryProbe, nvml_status
from engine.tasks.task import Task
from engine.trainer.finder import MemoryModel, search
from engine.trainer.trainer import Trainer
from engine_in_process import engine, frozen_heap

OOM = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.fixture(autouse=True)
def heap_out_of_the_collectors_reach() -> Iterator[None]:
    """Every out-of-memory error here costs a full gc.collect() (free_memory): of the run's own
    objects only, as in an engine process of its own (engine_in_process.frozen_heap)."""
    with frozen_heap():
        yield


def tiny_task(seed: int = 0, n: int = 96, oom_above: int | None = None, oom_calls: set[int] | None = None,
              dtype=torch.float64) -> Task:
    """A float64 regression task; the loss raises OOM for micro-batches larger than
    `oom_above`, or on the given call numbers (to hit the middle of a window)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(dtype)
    g = torch.Generator().manual_seed(99)
    x = torch.randn(n, 8, generator=g, dtype=dtype)
    y = x[:, :1] * 2 + torch.randn(n, 1, generator=g, dtype=dtype)
    calls = {"n": 0}

    def loss(m, batch):
        xb, yb = batch
        if not m.training:  # the engine's up-front check of the task: not a training call
            return F.mse_loss(m(xb), yb, reduction="sum"), len(xb)
        calls["n"] += 1
        if oom_above is not None and len(xb) > oom_above and (oom_calls is None or calls["n"] in oom_calls):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return F.mse_loss(m(xb), yb, reduction="sum"), len(xb)

    return Task(model=model, train_data=torch.utils.data.TensorDataset(x, y), loss=loss,
                optimizer=lambda p, lr: torch.optim.SGD(p, lr=lr), name="tiny")


def run(tmp_path, name, task, **cfg):
    events = []
    cfg.setdefault("clip", 0.0)
    cfg.setdefault("lr", 0.01)
    t = Trainer(TrainConfig(run_dir=str(tmp_path / name), **cfg), task=task, sink=events.append)
    result = t.run()
    return t, result, events


def weights(trainer):
    return torch.cat([p.detach().flatten() for p in trainer.model.parameters()])


def test_is_oom_by_type_and_message():
    assert is_oom(OOM)
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("out of memory"))  # only errors torch raises for memory


def test_oom_recovery_equals_clean_run_at_new_shape(tmp_path):
    # Every micro-batch above 8 fails: 32x2 -> 16x4 -> 8x8 on the first window.
    t_rec, r_rec, ev = run(tmp_path, "rec", tiny_task(oom_above=8), micro_batch=32, accum=2, epochs=2)
    rec = [e for e in ev if isinstance(e, OomRecovered)]
    assert [(e.old_micro_batch, e.old_accum, e.new_micro_batch, e.new_accum) for e in rec] == [(32, 2, 16, 4),
                                                                                            (16, 4, 8, 8)]
    steps = [e for e in ev if isinstance(e, StepMetrics)]
    assert all(s.micro_batch == 8 for s in steps)  # later windows keep the new shape
    assert [s.accum for s in steps] == [8, 4, 8, 4]  # 96 samples: a full window of 64, a short one of 32
    t_clean, r_clean, _ = run(tmp_path, "clean", tiny_task(), micro_batch=8, accum=8, epochs=2)
    assert r_rec.steps == r_clean.steps == 4
    assert torch.allclose(weights(t_rec), weights(t_clean), rtol=0, atol=1e-10)


def test_oom_in_the_middle_of_a_window_redoes_it_from_its_first_sample(tmp_path, monkeypatch):
    # Calls 1-2 are window 1 (16x2); call 4 is the second micro-batch of window 2: half
    # the window's gradient is already accumulated when it fails.
    t_rec, _, ev = run(tmp_path, "mid", tiny_task(oom_above=8, oom_calls={4}), micro_batch=16, accum=2, epochs=1)
    assert len([e for e in ev if isinstance(e, OomRecovered)]) == 1
    shapes = [(e.micro_batch, e.accum) for e in ev if isinstance(e, StepMetrics)]
    assert shapes[0] == (16, 2) and all(s == (8, 4) for s in shapes[1:])
    # Same windows, exact accumulation: equal to a clean run whatever the shape.
    t_clean, _, _ = run(tmp_path, "clean", tiny_task(), micro_batch=8, accum=4, epochs=1)
    assert torch.allclose(weights(t_rec), weights(t_clean), rtol=0, atol=1e-10)
    # Negative control: a recovery that kept the failed window's partial gradient is caught.
    monkeypatch.setattr(Trainer, "drop_window_grads", lambda self: None)
    t_bad, _, _ = run(tmp_path, "leaky", tiny_task(oom_above=8, oom_calls={4}), micro_batch=16, accum=2, epochs=1)
    assert not torch.allclose(weights(t_bad), weights(t_clean), rtol=0, atol=1e-6)


def test_oom_recovery_off_stops_with_checkpoint(tmp_path):
    from engine.trainer.trainer import OutOfMemoryStop
    task = tiny_task(oom_above=8, oom_calls={5})
    with pytest.raises(OutOfMemoryStop, match="oom-recovery off"):
        run(tmp_path, "off", task, micro_batch=16, accum=2, epochs=1, oom_recovery=False)
    from engine.checkpoints.files import last_path, load
    assert load(last_path(str(tmp_path / "off")))["step"] == 2


def test_oom_at_micro_batch_one_stops_clearly(tmp_path):
    from engine.trainer.trainer import OutOfMemoryStop
    with pytest.raises(OutOfMemoryStop, match="micro-batch 1"):
        run(tmp_path, "one", tiny_task(oom_above=0), micro_batch=4, accum=1, epochs=1)


@pytest.mark.slow
@pytest.mark.parametrize("limit,effective,want_accum", [(12, 64, 6), (5, 20, 4), (64, 48, 1), (1, 8, 8)])
def test_finder_picks_largest_size_that_fits(tmp_path, limit, effective, want_accum):
    task = tiny_task(n=96, oom_above=limit)
    t, _, ev = run(tmp_path, "f", task, find_micro_batch=True, effective_batch=effective, epochs=1, max_steps=1)
    found = [e for e in ev if isinstance(e, MicroBatchFound)]
    assert len(found) == 1
    assert found[0].micro_batch == min(limit, effective)
    assert found[0].accum == want_accum
    assert found[0].probes <= 8
    steps = [e for e in ev if isinstance(e, StepMetrics)]
    assert steps[0].micro_batch == found[0].micro_batch


@pytest.mark.slow
def test_finder_restores_model_and_optimizer(tmp_path):
    t0, _, _ = run(tmp_path, "plain", tiny_task(), micro_batch=12, accum=6, epochs=1)
    t1, _, _ = run(tmp_path, "found", tiny_task(oom_above=12), find_micro_batch=True, effective_batch=64, epochs=1)
    # Probing trained nothing: the same weights as starting at 12x6 directly.
    assert torch.allclose(weights(t0), weights(t1), rtol=0, atol=1e-12)


def test_search_uses_memory_model_when_capacity_known():
    # Simulated device: 1 GB fixed + 40 MB per sample, capacity 2 GB -> 25 fits, 26 does not.
    class FakeProber:
        def __init__(self):
            self.model, self.probes, self.seen = MemoryModel(), 0, []

        def __call__(self, b):
            self.probes += 1
            self.seen.append(b)
            peak = 1e9 + 40e6 * b
            ok = peak <= 2e9
            if ok:
                self.model.add(b, int(peak))
            return ok

    p = FakeProber()
    best = search(p, upper=64, capacity=2e9, margin=0.0)
    assert best == 25 and p.probes <= 5, p.seen
    p = FakeProber()
    assert search(p, upper=64, capacity=2e9, margin=0.2) == 15  # margin keeps 20% free


def test_memory_model_needs_two_sizes():
    m = MemoryModel()
    m.add(4, 100)
    assert m.predict(8) is None
    m.add(8, 180)
    assert m.predict(16) == pytest.approx(340)
    assert m.largest_fitting(500) == 24  # (500 - 20) / 20


def _fp16_run(tmp_path, name, inject_at=None):
    task = tiny_task(dtype=torch.float32)
    state = {"done": 0}
    first = next(task.model.parameters())
    # An inf in one gradient on one window only; the loss stays finite.
    first.register_hook(lambda g: g * float("inf") if state["done"] + 1 == inject_at else g)
    events, snaps = [], {}

    def sink(e):
        events.append(e)
        if isinstance(e, StepMetrics):
            state["done"] = e.step
            snaps[e.step] = weights(t).clone()

    t = Trainer(TrainConfig(run_dir=str(tmp_path / name), precision="fp16", micro_batch=8, accum=2, epochs=1,
                            clip=0.0), task=task, sink=sink)
    return t, t.run(), events, snaps


def test_fp16_scaler_skip_is_counted_apart_from_nonfinite(tmp_path):
    _, base, base_events, _ = _fp16_run(tmp_path, "base")
    natural = {e.step for e in base_events if isinstance(e, ScalerSkip)}  # real fp16 overflows, if any
    k = next(s for s in range(3, 7) if s not in natural and s - 1 not in natural)
    t, result, events, snaps = _fp16_run(tmp_path, "inj", inject_at=k)
    skips = {e.step: e for e in events if isinstance(e, ScalerSkip)}
    steps = {e.step: e for e in events if isinstance(e, StepMetrics)}
    assert set(skips) == natural | {k}
    assert result.scaler_skips == len(natural) + 1 and result.nonfinite_steps == 0
    assert steps[k].scaler_skipped and not steps[k].nonfinite
    assert not any(e.kind == "nonfinite" for e in events)
    assert torch.equal(snaps[k - 1], snaps[k])  # the skipped step changed no weight
    assert not torch.equal(snaps[k], snaps[k + 1])  # the next one trains again
    scale_before = [e.scale for e in events if isinstance(e, ScalerSkip)]
    assert skips[k].scale < 65536.0 and skips[k].scale in scale_before  # the scaler backed off
    from engine.checkpoints.files import last_path, load
    saved = load(last_path(str(tmp_path / "inj")))["scaler"]
    assert saved["scale"] == t.scaler.get_scale()  # scaler state is in the checkpoint


def test_cpu_telemetry_says_no_gpu(tmp_path):
    probe = MemoryProbe(torch.device("cpu"))
    assert not probe.available and "no GPU" in probe.reason
    assert probe.sample() == NO_GPU
    _, _, ev = run(tmp_path, "cpu", tiny_task(), epochs=1, max_steps=2)
    steps = [e for e in ev if isinstance(e, StepMetrics)]
    assert all(s.mem_used is None and s.mem_total is None for s in steps)
    from engine.store import RunReader
    rows = RunReader(str(tmp_path / "cpu")).metrics()
    assert rows and all(r["mem_used"] is None and r["mem_total"] is None for r in rows)


def test_nvml_without_driver_reports_instead_of_failing():
    # This machine has nvidia-ml-py but no NVIDIA driver: the real library call fails
    # and the status says so, it never raises.
    msg = nvml_status()
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert msg.startswith("NVML unavailable")


@pytest.mark.slow
def test_vram_limit_refused_on_cpu(tmp_path):
    r = engine("--device", "cpu", "--vram-limit", "24GiB", "--run-dir", tmp_path / "v")  # engine.cli.main
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and r.stderr.startswith("error: ")
    assert "CUDA" in r.stderr
    assert not (tmp_path / "v").exists()
