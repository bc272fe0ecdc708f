"""Built-in tasks. Each module has build_task(seed) -> engine.Task."""
from . import charlm, cnn_bn, mlp

BUILTIN_MODULES = {"mlp": mlp, "charlm": charlm, "cnn-bn": cnn_bn}
