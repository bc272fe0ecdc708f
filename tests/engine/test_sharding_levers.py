"""engine.memory.what_fits.sharding: the "what fits" table's sharding levers, against figures worked out by hand.

The run (as tests/engine/test_levers.py): fp32, checkpointing off, peaks 4000 B at micro-batch 2
and 6000 B at 4 (line: fixed 2000 + 1000 per sample), micro-batch 4 x accum 8 on 2 ranks
(effective 64); parameters 400 B, gradients 400 B, optimizer state 800 B whole; a GPU of 5000 B.
On the GPU besides activations (P + G + O = 1600 under ddp):

  N  reduce  offload   resident                     peak = 6000 - 1600 + resident   largest micro-batch
  2  last    -         1600/2 + 800 = 1600           6000  no                        (5000-2000-0)/1000    = 3
  2  every   -         1600/2       =  800           5200  no                        (5000-2000+800)/1000  = 3
  2  every   offload   0 (host 800)                  4400  yes                       (5000-2000+1600)/1000 = 4
  3  last    -         533.3 + 800  = 1333.3         5733  no                        3
  3  every   -         533.3                         4933  yes                       4
  4  last    -         400 + 800    = 1200           5600  no                        3
  4  every   -         400                           4800  yes                       4
  4  every   offload   0 (host 400)                  4400  yes                       4
Accumulation keeping 64: ceil(64 / (4 x N)) = 8, 6, 4.
"""
from __future__ import annotations

import json

import engine_helpers  # noqa: F401 - for its set-up: testkit's sys.path before the engine imports

from engine.declarations.events import MemoryLevers, StepMetrics
from engine.declarations.settings import LiveSettings
from engine.memory.what_fits.forecast import MemoryModel
from engine.memory.what_fits.levers import CheckpointModel, Current, Persistent, build_table
from engine.memory.what_fits.sharding import Layout, ShardingRow, Whole, rows

CUR = Current(micro_batch=4, accum=8, precision="fp32", checkpointing=False, world=2)
WHOLE = Persistent(params=400, grads=400, optimizer=800, param_dtypes={"float32": 400})


def models(points=None):
    m = MemoryModel()
    for b, p in (points or {2: 4000, 4: 6000}).items():
        m.add(b, p)
    return {("fp32", False): m}


def table(gpus=4, capacity=5000, persistent=WHOLE, layout=None, points=None, current=CUR):
    return build_table(models(points), current, capacity=capacity, persistent=persistent,
                       checkpoint=CheckpointModel(layers=4), micro_batches=(2, 4, 8), layout=layout, gpus=gpus)


def by_lever(t):
    return {(r.world, r.fsdp_reduce, r.cpu_offload): r for r in t.sharding}


def test_fsdp_over_each_n_of_four_gpus_from_a_ddp_run():
    got = by_lever(table())
    want = {(2, "last", False): (6000, False, 3, 0, 8), (2, "every", False): (5200, False, 3, 0, 8),
            (2, "every", True): (4400, True, 4, 800, 8),
            (3, "last", False): (5733, False, 3, 0, 6), (3, "every", False): (4933, True, 4, 0, 6),
            (3, "every", True): (4400, True, 4, 533, 6),
            (4, "last", False): (5600, False, 3, 0, 4), (4, "every", False): (4800, True, 4, 0, 4),
            (4, "every", True): (4400, True, 4, 400, 4)}
    assert {k: (r.predicted_peak, r.fits, r.largest, r.host_bytes, r.accum) for k, r in got.items()} == want
    for r in got.values():
        assert r.source == "estimate" and r.basis.startswith("estimate:") and not r.current
        assert r.micro_batch == 4
    assert "one block's gathered parameters, not counted" in got[(2, "every", False)].basis
    assert got[(4, "every", True)].label == "FSDP over 4 GPUs, reduce every, CPU offload"


def test_the_runs_own_fsdp_layout_predicts_its_measured_peak_and_the_others_agree():
    """A run already under fsdp over 2, reduce every: its rows hold shards (200, 200, 400), its
    peak 5200 at micro-batch 4. Its own lever is the measurement; the others are the same figures
    as from the ddp run above (the whole model is the shards x 2)."""
    shards = Persistent(params=200, grads=200, optimizer=400, param_dtypes={"float32": 200})
    t = table(persistent=shards, layout=Layout(2, "fsdp", "every", False), points={2: 3200, 4: 5200})
    got = by_lever(t)
    own = got[(2, "every", False)]
    assert own.current and own.predicted_peak == 5200 and sum(r.current for r in t.sharding) == 1
    assert (got[(4, "every", False)].predicted_peak, got[(2, "last", False)].predicted_peak) == (4800, 6000)
    # negative control: the same rows read as whole (the layout ignored) say otherwise at N=4:
    # 5200 - 800 + 800 / 4 = 4600
    naive = by_lever(table(persistent=shards, layout=Layout(2, "ddp"), points={2: 3200, 4: 5200}))
    assert naive[(4, "every", False)].predicted_peak == 4600 and not any(r.current for r in naive.values())


def test_the_runs_own_layout_is_a_row_when_it_is_not_one_of_the_offered_levers():
    shards = Persistent(params=200, grads=200, optimizer=400)
    t = table(gpus=0, persistent=shards, layout=Layout(2, "fsdp", "last", True), points={2: 3200, 4: 5200})
    assert sorted((r.world, r.fsdp_reduce, r.cpu_offload) for r in t.sharding) == \
        [(2, "every", False), (2, "every", True), (2, "last", False), (2, "last", True)]
    own = by_lever(t)[(2, "last", True)]
    assert own.current and own.predicted_peak == 5200 and own.host_bytes == 800


def test_nothing_extra_on_one_gpu_unless_the_run_is_distributed():
    one = Current(micro_batch=4, accum=16, precision="fp32", checkpointing=False, world=1)
    assert table(gpus=1, current=one).sharding == ()  # negative control: no lever this machine allows
    assert table(gpus=0, current=one).sharding == ()
    assert table(gpus=4, persistent=None).sharding == ()  # no breakdown: nothing to estimate from
    t = table(gpus=1)  # a ddp run over 2 (another node's GPU): FSDP over its own 2
    assert {r.world for r in t.sharding} == {2}


def test_the_arithmetic_of_the_layouts():
    w = Whole(400, 400, 800)
    assert w.resident(Layout(1)) == (1600, 0) and w.resident(Layout(8, "ddp")) == (1600, 0)
    assert w.resident(Layout(4, "fsdp", "every")) == (400, 0)
    assert w.resident(Layout(4, "fsdp", "last")) == (1200, 0)
    assert w.resident(Layout(4, "fsdp", "last", True)) == (800, 400)
    assert w.resident(Layout(4, "fsdp", "every", True)) == (0, 400)
    assert Whole.from_rank(100, 100, 200, Layout(4, "fsdp")) == w and Whole.from_rank(400, 400, 800, Layout(4)) == w
    assert rows(w, Layout(1), gpus=4, micro_batch=4, effective=64, peak=None, usable=5000) == ()
    no_cap = rows(w, Layout(1), gpus=2, micro_batch=4, effective=64, peak=6000, usable=None, line=(2000, 1000))
    assert [(r.fits, r.largest) for r in no_cap] == [(None, None)] * 3


def test_the_rows_go_through_the_event_and_run_db_json():
    t = table()
    ev = MemoryLevers(5, 1, capacity=5000, usable=5000, rows=(), sharding=tuple(r.to_row() for r in t.sharding))
    back = json.loads(json.dumps(ev.to_dict()))
    assert tuple(ShardingRow.from_row(r) for r in back["sharding"]) == t.sharding
    assert "9 sharding estimates" in ev.message()
    assert MemoryLevers(5, 1, capacity=1, usable=1, rows=()).sharding == ()  # an old row: none


def test_the_levers_watcher_passes_the_gpu_count_and_the_layout():
    from engine.trainer.watchers import LeversWatcher
    w = LeversWatcher("fp32", 2, None, 0.0, None, 4, True, layout=Layout(2, "ddp"), gpus=4)
    s = LiveSettings(micro_batch=4, accum=8)

    def step(n, micro, peak):
        return StepMetrics(n, 1, loss=1.0, grad_norm=1.0, clipped=False, lr=1e-3, accum=8, clip=1.0,
                           micro_batch=micro, samples=64, tokens=64, step_time=0.1, throughput=1.0, nonfinite=False,
                           scaler_skipped=False, mem_allocated=peak, mem_reserved=peak, mem_peak=peak, mem_used=peak,
                           mem_total=5000, mem_params=400, mem_grads=400, mem_optimizer=800)
    w.on_step(step(1, 2, 4000), s.with_(micro_batch=2))
    ev, = w.on_step(step(2, 4, 6000), s)
    assert {tuple(r[:3]) for r in ev.sharding} == {(n, red, off) for n in (2, 3, 4)
                                                   for red, off in (("last", False), ("every", False),
                                                                    ("every", True))}
    assert {tuple(r[:3]): r[5] for r in ev.sharding}[(4, "every", False)] == 4800
