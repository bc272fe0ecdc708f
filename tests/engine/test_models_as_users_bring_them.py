"""Models, batches and task files as users bring them (issue 11): frozen BatchNorm kept in
eval, models built in eval mode trained in train mode, any batch container moved to the
device, task files importing their neighbours, resume from another folder, IterableDataset
refused with one line."""
from __future__ import annotations

import collections
import dataclasses
import textwrap
from typing import NamedTuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.declarations.config import TrainConfig
from engine.distributed.devices import to_device
from engine.tasks.task import Task
from engine.trainer.modes import TrainModes
from engine.trainer.trainer import Trainer
from engine_in_process import engine


def classifier_task(model: nn.Module, n: int = 64, seed: int = 0) -> Task:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long()

    def loss(m, batch):
        xb, yb = batch
        return F.cross_entropy(m(xb), yb, reduction="sum"), len(yb)

    return Task(model=model, train_data=torch.utils.data.TensorDataset(x, y), loss=loss,
                val_data=torch.utils.data.TensorDataset(x[:16], y[:16]), name="cls")


def frozen_bn_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    with torch.no_grad():  # statistics the frozen layer must keep
        m[1].running_mean.uniform_(-1, 1)
        m[1].running_var.uniform_(0.5, 2)
    m[1].eval()
    m[1].requires_grad_(False)
    return m


def train(task: Task, tmp_path, name: str, **cfg) -> Trainer:
    settings = dict(device="cpu", epochs=2, lr=0.05, clip=0.0, micro_batch=4, accum=4, optimizer="sgd")
    settings.update(cfg)
    t = Trainer(TrainConfig(run_dir=str(tmp_path / name), **settings), task=task)
    t.run()
    return t


def test_a_frozen_batchnorm_keeps_its_statistics_and_4x4_equals_16x1(tmp_path):
    model = frozen_bn_model()
    before = (model[1].running_mean.clone(), model[1].running_var.clone())
    t = train(classifier_task(model), tmp_path, "4x4")
    assert torch.equal(t.model[1].running_mean, before[0]) and torch.equal(t.model[1].running_var, before[1])
    assert not t.model[1].training and t.model[0].training  # after validation: the exact training state
    t16 = train(classifier_task(frozen_bn_model()), tmp_path, "16x1", micro_batch=16, accum=1)
    for a, b in zip(t.model.parameters(), t16.model.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)


def test_negative_control_a_trainable_batchnorm_does_move(tmp_path):
    model = frozen_bn_model()
    model[1].train()  # not frozen: built in train mode
    before = model[1].running_mean.clone()
    t = train(classifier_task(model), tmp_path, "bn")
    assert not torch.equal(t.model[1].running_mean, before)


def test_a_model_built_in_eval_mode_trains_with_dropout_on(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.5), nn.Linear(32, 2)).eval()  # as from_pretrained
    seen = []
    task = classifier_task(model)
    task.val_data = None  # validation runs in eval mode by design; this test is about training
    inner = task.loss

    def loss(m, batch):
        seen.append(m[1].training)
        return inner(m, batch)

    task.loss = loss
    train(task, tmp_path, "eval-built", epochs=1)
    assert seen[0] is False  # the pre-flight check runs in eval mode
    assert all(seen[1:]) and len(seen) > 1  # every training micro-batch: dropout on


def test_train_modes_rule_keeps_whole_frozen_subtrees():
    enc = nn.Sequential(nn.Linear(2, 2), nn.Dropout())
    model = nn.Sequential(enc, nn.Linear(2, 2), nn.Dropout()).eval()
    enc.requires_grad_(False)
    modes = TrainModes.record(model)
    modes.train_mode(model)
    assert [m.training for m in (model, enc, enc[0], enc[1], model[1], model[2])] == \
        [True, False, False, False, True, True]
    modes.restore_built(model)
    assert not any(m.training for m in model.modules())


# -- batches ------------------------------------------------------------------------------------
class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    meta: dict
    label: str = "b"


class Encoding(collections.abc.Mapping):
    """Like transformers' BatchEncoding: a Mapping, not a dict, with its own .to()."""

    def __init__(self, data):
        self.data = data

    def __getitem__(self, k):
        return self.data[k]

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)

    def to(self, device):
        return Encoding({k: v.to(device) for k, v in self.data.items()})


class Plain(collections.abc.Mapping):  # a Mapping without .to()
    def __init__(self, data):
        self.data = data

    def __getitem__(self, k):
        return self.data[k]

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)


def tensors_in(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from tensors_in(o)
    elif isinstance(obj, collections.abc.Mapping):
        for o in obj.values():
            yield from tensors_in(o)
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from tensors_in(getattr(obj, f.name))


@pytest.mark.parametrize("batch,kind", [
    (Pair(torch.ones(2), torch.zeros(2)), Pair),
    (Batch(torch.ones(2), {"mask": torch.ones(2), "n": 3}), Batch),
    (Encoding({"input_ids": torch.ones(2), "attention_mask": torch.ones(2)}), Encoding),
    (Plain({"a": torch.ones(2)}), dict),
    (collections.OrderedDict(a=torch.ones(1), b=[torch.ones(1), (torch.ones(1), "s")]), collections.OrderedDict),
    ({"a": Pair(torch.ones(1), torch.ones(1))}, dict),
])
def test_to_device_moves_every_tensor_in_any_container(batch, kind):
    meta = torch.device("meta")  # a real second device on any machine
    moved = to_device(batch, meta)
    assert isinstance(moved, kind)
    found = list(tensors_in(moved))
    assert found and all(t.device.type == "meta" for t in found)
    assert all(t.device.type == "cpu" for t in tensors_in(batch))  # the original is untouched


def test_namedtuple_batches_train(tmp_path):
    task = classifier_task(nn.Linear(8, 2))
    base = task.train_data
    task.collate = lambda samples: Pair(torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples]))
    assert isinstance(task.collate([base[0], base[1]]), Pair)
    t = train(task, tmp_path, "nt", epochs=1)
    assert t.step == 4


# -- task files ----------------------------------------------------------------------------------
TASK = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from engine import Task
    from my_helpers import make_data   # a sibling module

    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y, reduction="sum"), len(y)

    def build_task(seed):
        torch.manual_seed(seed)
        return Task(model=torch.nn.Linear(4, 2), train_data=make_data(), loss=loss)
""")
HELPERS = textwrap.dedent("""
    import torch
    def make_data():
        x = torch.randn(32, 4)
        return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
""")


def cli(*args, cwd):
    """The command line through engine.cli.main in this process, run in `cwd`. Between two runs the
    task's folder leaves sys.path and its modules sys.modules (engine_in_process), so a resume
    from another folder imports the task's neighbours afresh, as the new process it stands for."""
    return engine(*args, cwd=cwd)


@pytest.mark.slow
def test_a_task_file_imports_its_neighbours_and_resumes_from_another_folder(tmp_path):
    proj = tmp_path / "proj" / "tasks"
    proj.mkdir(parents=True)
    (proj / "my_task.py").write_text(TASK)
    (proj / "my_helpers.py").write_text(HELPERS)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_dir = tmp_path / "run"
    r = cli("--task", "tasks/my_task.py", "--epochs", "1", "--micro-batch", "4", "--accum", "2", "--device", "cpu",
            "--run-dir", str(run_dir), cwd=tmp_path / "proj")
    assert r.returncode == 0, r.stderr
    from engine.store import RunReader
    assert RunReader(str(run_dir)).info()["config"]["task"] == str(proj / "my_task.py")  # resolved
    r = cli("--resume", str(run_dir), "--epochs", "2", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    rows = RunReader(str(run_dir)).metrics()
    assert [m["step"] for m in rows] == list(range(1, 9)) and rows[-1]["epoch"] == 2


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter([torch.zeros(2)])

    def __len__(self):
        return 1


@pytest.mark.slow
def test_an_iterable_dataset_is_refused_with_one_line(tmp_path):
    f = tmp_path / "it.py"
    f.write_text(textwrap.dedent("""
        import torch
        from engine import Task
        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self):
                return iter([torch.zeros(2)])
            def __len__(self):
                return 1
        def build_task(seed):
            return Task(model=torch.nn.Linear(2, 1), train_data=Stream(), loss=lambda m, b: (m(b).sum(), 1))
    """))
    r = cli("--task", str(f), "--device", "cpu", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "map-style" in r.stderr
    assert "IterableDataset" in r.stderr and not (tmp_path / "run").exists()
