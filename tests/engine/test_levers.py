"""engine.memory.what_fits.levers: the "what fits" table, against numbers worked out by hand.

The run: fp32, checkpointing off, measured peaks 4000 B at micro-batch 2 and 6000 B at
4, so the line is fixed 2000 + 1000 per sample. Parameters: 100 fp32 elements (400 B),
grads 400 B, AdamW state 800 B. Checkpointing model: 4 layers, inside 0.5, boundary
1/16, so keep = 0.5 + 0.5 x (1/4 + 1/16) = 0.65625.
"""
from __future__ import annotations

import json
import subprocess
import sys

import engine_helpers  # noqa: F401 - for its set-up: testkit's sys.path before the engine imports
import pytest

from engine.declarations.commands import COMMANDS as MEM_COMMANDS
from engine.declarations.commands import SetAccum, SetCheckpointing, SetMicroBatch, SetPrecision
from engine.declarations.config import ConfigError
from engine.memory.what_fits.forecast import MemoryModel
from engine.memory.what_fits.levers import (
    CheckpointModel,
    Current,
    Persistent,
    accum_for,
    build_table,
    cast_bytes,
    commands_for,
    lines_for,
)

PERSIST = Persistent(params=400, grads=400, optimizer=800, param_dtypes={"float32": 400})
CKPT = CheckpointModel(layers=4, inside=0.5, boundary=1 / 16)
CUR = Current(micro_batch=4, accum=8, precision="fp32", checkpointing=False, world=2)  # effective 64


def mm(points: dict[int, int]) -> MemoryModel:
    m = MemoryModel()
    for b, p in points.items():
        m.add(b, p)
    return m


def table(models, capacity=8000, margin=0.0, sizes=(2, 3, 4, 8), **kw):
    return build_table(models, kw.pop("current", CUR), capacity=capacity, margin=margin,
                       persistent=kw.pop("persistent", PERSIST), checkpoint=kw.pop("checkpoint", CKPT),
                       micro_batches=sizes, **kw)


BASE = {("fp32", False): mm({2: 4000, 4: 6000})}


def test_keep_fraction():
    assert CKPT.keep() == pytest.approx(0.65625)
    assert CheckpointModel(layers=10, inside=1.0, boundary=0.0).keep() == pytest.approx(0.1)  # 1/layers
    assert CheckpointModel(layers=None, inside=1.0, boundary=0.0).keep() == pytest.approx(0.25)  # 4 assumed


def test_current_state_measured_and_fitted_cells():
    t = table(BASE)
    c2 = t.cell(2, "fp32", False)
    assert (c2.predicted_peak, c2.source, c2.measured) == (4000, "measured", True)
    c8 = t.cell(8, "fp32", False)
    assert (c8.predicted_peak, c8.source, c8.fits) == (2000 + 8 * 1000, "fit", False)  # 10000 > 8000
    c3 = t.cell(3, "fp32", False)
    assert (c3.predicted_peak, c3.fits) == (5000, True)
    assert t.cell(4, "fp32", False).current and not c8.current


def test_accumulation_keeps_the_effective_batch():
    t = table(BASE)
    assert t.cell(8, "fp32", False).accum == 4  # ceil(64 / (8 x 2))
    c3 = t.cell(3, "fp32", False)
    assert (c3.accum, c3.effective_batch) == (11, 66)  # ceil(64 / 6) = 11; 3 x 11 x 2 = 66
    assert accum_for(64, 64, 1) == 1 and accum_for(64, 100, 1) == 1


def test_precision_extrapolation():
    t = table(BASE)
    # bf16: activations 2/4 -> 500 per sample; weight copies 100 elements x 2 B = 200 more fixed
    c8 = t.cell(8, "bf16", False)
    assert (c8.predicted_peak, c8.source, c8.measured, c8.fits) == (2200 + 8 * 500, "extrapolated", False, True)
    assert t.cell(8, "fp16", False).predicted_peak == 6200  # same bytes per element as bf16
    assert t.cell(2, "bf16", False).source == "extrapolated"  # measured only in fp32
    assert "extrapolated from fp32" in c8.basis


def test_checkpointing_extrapolation():
    t = table(BASE)
    assert t.cell(8, "fp32", True).predicted_peak == 2000 + 8 * 656.25  # 7250
    assert t.cell(8, "bf16", True).predicted_peak == round(2200 + 8 * 500 * 0.65625)  # 4825
    assert t.cell(8, "fp32", True).fits is True


def test_largest_fitting_per_state():
    t = table(BASE)
    assert t.largest[("fp32", False)] == 6  # floor((8000 - 2000) / 1000)
    assert t.largest[("bf16", False)] == 11  # floor((8000 - 2200) / 500)
    assert t.largest[("fp32", True)] == 9  # floor(6000 / 656.25) = floor(9.14)
    t = table(BASE, margin=0.25)  # usable 6000
    assert t.usable == 6000 and t.largest[("fp32", False)] == 4
    assert t.cell(4, "fp32", False).fits is True and t.cell(8, "bf16", False).fits is False  # 6200 > 6000
    t = table(BASE, capacity=10**9)
    assert t.largest[("fp32", False)] == 32  # capped at the effective batch per rank (64 / 2)


def test_default_sizes_include_powers_current_measured_and_largest():
    t = build_table(BASE, Current(micro_batch=3, accum=4, world=1), capacity=8000, persistent=PERSIST,
                    checkpoint=CKPT)
    sizes = sorted({c.micro_batch for c in t.cells})
    # powers of two up to 12, current 3, measured 2 and 4, largest fitting 6 (fp32), 11 (bf16), 9 (ckpt),
    # 12 would be the cap (bf16 + ckpt fits the whole batch: floor(5800 / 328.1) = 17 -> 12)
    assert sizes == [1, 2, 3, 4, 6, 8, 9, 11, 12]


def test_a_measured_state_uses_its_own_fit():
    models = dict(BASE)
    models[("bf16", False)] = mm({2: 3000, 4: 3800})  # fixed 2200, 400 per sample
    t = table(models)
    c8 = t.cell(8, "bf16", False)
    assert (c8.predicted_peak, c8.source) == (2200 + 8 * 400, "fit")
    # bf16 + checkpointing now comes from the bf16 fit (one axis away), not from fp32
    assert t.cell(8, "bf16", True).predicted_peak == 2200 + 8 * 400 * 0.65625  # 4300
    assert "extrapolated from bf16" in t.cell(8, "bf16", True).basis


def test_extrapolation_back_from_checkpointing_on_and_bf16():
    models = {("bf16", True): mm({2: 3000, 4: 4000})}  # fixed 2000, 500 per sample
    cur = Current(micro_batch=4, accum=2, precision="bf16", checkpointing=True)
    t = table(models, current=cur)
    # fp32, off: fixed 2000 - 200 (no weight copies) = 1800; per sample 500 x 4/2 / 0.65625
    assert t.cell(8, "fp32", False).predicted_peak == round(1800 + 8 * 1000 / 0.65625)  # 13990


def test_one_measured_size_uses_the_persistent_bytes():
    models = {("fp32", False): mm({4: 6000})}
    t = table(models)
    # fixed = 1600 (params + grads + optimizer), per sample (6000 - 1600) / 4 = 1100
    assert t.cell(8, "fp32", False).predicted_peak == 1600 + 8 * 1100
    assert t.cell(8, "fp32", False).source == "fit"
    assert table(models, persistent=None).cell(8, "fp32", False).predicted_peak is None  # no fixed part known


def test_nothing_measured_and_cpu():
    t = table({})
    assert all(c.predicted_peak is None and c.fits is None and c.source == "unknown" for c in t.cells)
    t = table(BASE, capacity=None)  # CPU: predictions without a capacity
    assert t.cell(8, "fp32", False).predicted_peak == 10000 and t.cell(8, "fp32", False).fits is None
    assert t.largest[("fp32", False)] is None


def test_bf16_parameters_have_no_weight_copies_under_bf16():
    p = Persistent(params=200, grads=200, optimizer=400, param_dtypes={"bfloat16": 200})  # 100 elements
    assert cast_bytes("bf16", p) == 0 and cast_bytes("fp16", p) == 200 and cast_bytes("fp32", p) == 0
    models = {("fp32", False): mm({2: 3000, 4: 4000})}  # activations already 2 bytes per element
    t = table(models, persistent=p)
    assert t.cell(8, "bf16", False).predicted_peak == t.cell(8, "fp32", False).predicted_peak == 6000
    assert t.cell(8, "fp16", False).predicted_peak == 6200


def test_without_a_switch_checkpointing_cells_are_unavailable():
    t = table(BASE, can_checkpoint=False)
    cell = t.cell(8, "fp32", True)
    assert not cell.available and cell.predicted_peak == 7250
    with pytest.raises(ValueError):
        commands_for(cell, CUR)
    assert any("checkpointing" in n for n in t.notes)


def test_commands_for_a_chosen_cell():
    t = table(BASE)
    assert commands_for(t.cell(4, "fp32", False), CUR) == []  # the current setting
    cmds = commands_for(t.cell(8, "bf16", True), CUR)
    assert cmds == [SetCheckpointing(True), SetPrecision("bf16"), SetMicroBatch(8), SetAccum(4)]
    assert commands_for(t.cell(2, "fp32", False), CUR) == [SetMicroBatch(2), SetAccum(16)]


def test_lines_for_prefers_fewest_axes_changed():
    models = {("fp32", False): mm({2: 4000, 4: 6000}), ("fp32", True): mm({2: 3000, 4: 3500})}
    lines = lines_for(models, ("fp32", False), PERSIST, CKPT)
    assert lines[("bf16", True)].basis.startswith("extrapolated from fp32, checkpointing on")
    assert lines[("bf16", True)].per_sample == 250 * 0.5  # 500 -> bf16 halves it
    assert lines[("bf16", False)].basis.startswith("extrapolated from fp32, checkpointing off")


def test_mem_commands_validate_and_round_trip():
    assert SetCheckpointing(True).kind == "set_checkpointing" and json.loads(SetCheckpointing(True).to_json()) == {"checkpointing": True, "at": "epoch"}
    assert MEM_COMMANDS["set_precision"](**{"precision": "bf16"}) == SetPrecision("bf16")
    with pytest.raises(ConfigError):
        SetCheckpointing(1)
    with pytest.raises(ConfigError):
        SetPrecision("fp8")


def test_levers_import_no_torch():
    code = "import sys, engine.memory.what_fits.levers, engine.declarations.commands; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=engine_helpers.ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
