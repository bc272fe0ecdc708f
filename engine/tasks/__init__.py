"""Tasks: what a run trains. `Task` (the model, data and loss a task file's
`build_task(seed)` returns), `load_task` (a built-in name, a file or `module:attr`) and the
built-in tasks (`builtin`: mlp, charlm, cnn-bn)."""
from engine.tasks.loader import load_task
from engine.tasks.task import Task, TaskError

__all__ = ["Task", "TaskError", "load_task"]
