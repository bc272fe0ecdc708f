"""In-process pieces of the torchrun strategies: the shape that keeps the effective batch, the
tightest rank's memory, optimizer state by name and by index, which blocks FSDP shards.

The engine's modules load inside the tests: the first test phase collects this file on every
xdist worker only to deselect it (`ddp`), and engine.checkpoints.sharded alone brings in
torch.distributed.checkpoint (seconds)."""
from __future__ import annotations

import pytest
import torch

from engine.declarations.config import ConfigError, TrainConfig


@pytest.mark.parametrize("micro, accum, old, new, want", [
    (2, 2, 2, 1, (2, 4)), (2, 2, 2, 4, (2, 1)), (2, 1, 2, 4, (1, 1)), (4, 3, 1, 2, (3, 2)), (2, 2, 2, 2, (2, 2))])
def test_shape_for_keeps_the_effective_batch(micro, accum, old, new, want):
    from engine.distributed.world import shape_for
    m, a = shape_for(micro, accum, old, new)
    assert (m, a) == want and m * a * new == micro * accum * old


def test_shape_for_refuses_a_batch_that_does_not_split():
    from engine.distributed.world import shape_for
    with pytest.raises(ConfigError, match="does not split over 3 ranks"):
        shape_for(2, 2, 2, 3)


def test_the_tightest_rank_is_the_one_with_the_least_headroom():
    from engine.accumulation.step import pack, tightest, unpack
    slots = [10, 20, 30, 500, 1000] + [11, 21, 31, 900, 1000] + [0, 0, 0, 0, 0]
    assert tightest(slots) == (11, 21, 31, 900, 1000)
    agree = torch.tensor([0.0, -2.0, 0.0] + slots, dtype=torch.float64)
    nums = unpack(pack(torch.tensor([6.0, 3.0], dtype=torch.float64), agree, torch.tensor(5.0),
                       torch.tensor([3.0, 4.0])).tolist(), agree.numel())
    assert nums.memory == (11, 21, 31, 900, 1000) and nums.min_micro == 2 and nums.per_param == (3.0, 4.0)
    assert unpack([6.0, 3.0, 0.0, -2.0, 0.0, 5.0, 3.0, 4.0], True).memory == ()  # the flags alone


def test_optimizer_state_by_name_and_back_by_index():
    from engine.checkpoints.sharded import by_name
    from engine.export import by_index
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD([{"params": [model[2].weight, model[0].weight]},
                           {"params": [model[0].bias, model[2].bias], "lr": 0.5}], lr=0.1, momentum=0.9)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    saved = opt.state_dict()
    named = by_name(saved, model, opt)
    assert named["param_groups"][0]["params"] == ["2.weight", "0.weight"]
    assert torch.equal(named["state"]["0.bias"]["momentum_buffer"], saved["state"][2]["momentum_buffer"])
    back = by_index(named)
    assert back["param_groups"] == saved["param_groups"]
    assert all(torch.equal(back["state"][i]["momentum_buffer"], saved["state"][i]["momentum_buffer"]) for i in range(4))


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)


class Tied(torch.nn.Module):
    _no_split_modules = ["Layer"]

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.layers = torch.nn.ModuleList([Layer(), Layer()])
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied


def test_blocks_from_the_task_from_no_split_modules_and_top_level_children():
    from engine.distributed.fsdp import find_blocks
    m = Tied()
    assert find_blocks(m) == [m.layers[0], m.layers[1]]  # Hugging Face's _no_split_modules names
    assert find_blocks(m, lambda model: [model.layers[1]]) == [m.layers[1]]  # the task's blocks
    Tied._no_split_modules = []
    try:  # top-level children with parameters, but not the tied embedding and head (the root keeps those)
        assert find_blocks(m) == [m.layers[0], m.layers[1]]  # a ModuleList has no forward: its children
    finally:
        Tied._no_split_modules = ["Layer"]
    with pytest.raises(ConfigError, match="submodules of the model"):
        find_blocks(m, lambda model: [model])


def test_config_refuses_fsdp_flags_without_fsdp():
    with pytest.raises(ConfigError, match="--fsdp-reduce needs --strategy fsdp"):
        TrainConfig(fsdp_reduce="every").validate()
    with pytest.raises(ConfigError, match="--strategy must be one of"):
        TrainConfig(strategy="zero3").validate()
    TrainConfig(strategy="fsdp", fsdp_reduce="every", cpu_offload=True).validate()
    with pytest.raises(ConfigError, match="fp32 or bf16"):
        TrainConfig(strategy="fsdp", precision="fp16").validate()
    with pytest.raises(ConfigError, match="rollback"):
        TrainConfig(strategy="fsdp", nonfinite="rollback").validate()


def test_what_ranks_disagree_on_is_said_by_flag_with_each_value_and_its_ranks(tmp_path):
    """On 4 ranks: every differing setting by its flag, each value with the ranks that hold it; a
    task file compared by its content (two nodes may hold the same checkout in other folders)."""
    from engine.distributed.agree import differences, settings_said
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "task.py").write_text("def build_task(seed): ...\n")
    said = [settings_said(TrainConfig(task=str(a / "task.py"), lr=0.001)),
            settings_said(TrainConfig(task=str(b / "task.py"), lr=0.5)),
            settings_said(TrainConfig(task=str(a / "task.py"), lr=0.5, task_args={"n": 3}, max_steps=9)),
            settings_said(TrainConfig(task=str(b / "task.py"), lr=0.5))]
    assert differences(said) == [("--task-arg", [("none", [0, 1, 3]), ("n=3", [2])]),
                                 ("--max-steps", [("no limit", [0, 1, 3]), ("9", [2])]),
                                 ("--lr", [("0.001", [0]), ("0.5", [1, 2, 3])])]
    (b / "task.py").write_text("def build_task(seed): return None\n")
    assert [name for name, _ in differences([settings_said(TrainConfig(task=str(d / "task.py"))) for d in (a, b)])] \
        == ["--task"]
