"""The Qt side of running: the engine's QThread worker (worker.py), torchrun launches
(launcher.py), the typed signals the views subscribe to (signals.py) and the session driver that
joins them to the Qt-free session (session_driver.py, over app/session)."""
