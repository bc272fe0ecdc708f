"""Task files that are wrong in one way each, written to disk by the tests."""

HEADER = "import torch\nimport torch.nn.functional as F\nfrom engine import Task\n"
GOOD_MODEL = "torch.nn.Linear(4, 2)"
GOOD_DATA = "torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))"
GOOD_LOSS = "def loss(m, b):\n    x, y = b\n    return F.cross_entropy(m(x), y, reduction='sum'), len(y)\n"


def task_file(model=GOOD_MODEL, data=GOOD_DATA, loss=GOOD_LOSS, extra="") -> str:
    return (HEADER + extra + loss +
            f"def build_task(seed):\n    return Task(model={model}, train_data={data}, loss=loss)\n")


CASES = {
    # name: (file text or None for a missing file, words the error line must contain)
    "missing": (None, "no such file"),
    "syntax": ("def build_task(seed)\n    return 1\n", "syntax error"),
    "import_error": ("import no_such_module_xyz\n", "no_such_module_xyz"),
    "no_build_task": ("x = 1\n", "build_task"),
    "wrong_return": ("def build_task(seed):\n    return 42\n", "engine.Task"),
    "raises_in_build": ("def build_task(seed):\n    raise RuntimeError('boom')\n", "boom"),
    "nonscalar_loss": (task_file(loss="def loss(m, b):\n    x, y = b\n    return m(x).sum(1), len(y)\n"),
                       "scalar"),
    "no_count": (task_file(loss="def loss(m, b):\n    x, y = b\n    return m(x).sum()\n"), "(loss_sum, count)"),
    "no_parameters": (task_file(model="torch.nn.ReLU()"), "no trainable parameters"),
    "empty_data": (task_file(data="torch.utils.data.TensorDataset(torch.randn(0, 4), torch.zeros(0))"), "empty"),
    "loss_raises": (task_file(loss="def loss(m, b):\n    raise KeyError('label')\n"), "KeyError"),
    "not_a_dataset": (task_file(data="42"), "map-style"),
    "system_exit": ("import sys\nsys.exit(3)\n", "SystemExit"),
}
