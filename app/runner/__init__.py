"""The Qt side of running: the engine's QThread worker (worker.py), torchrun launches
(launcher.py), the typed signals the views subscribe to (signals.py) and the controller that
joins them to the Qt-free session (controller.py, over app/session)."""
