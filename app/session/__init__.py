"""The run session: the Qt-free state machine of the run the window shows (session.py,
state.py), where its data comes from (sources.py), and the Qt parts that run it: the engine
thread (worker.py), torchrun launches (launcher.py), the driver (controller.py) and the
adapter that publishes typed signals to the views (signals.py)."""
