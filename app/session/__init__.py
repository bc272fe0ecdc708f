"""The run session: the Qt-free state machine of the run the window shows (session.py) and
the one rule for what the user may do in each state (rules.py); where its data comes from
(sources.py) and what a start or a launch sends (configs.py, launch_command.py); and the Qt
parts that run it: the engine thread (worker.py), torchrun launches (launcher.py), the
driver (controller.py) and the adapter that publishes typed signals to the views (signals.py)."""
