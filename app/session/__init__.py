"""The run session, Qt-free: the state machine of the run the window shows (session.py) and
the one rule for what the user may do in each state (rules.py); where its data comes from
(sources.py, remote_source.py, rundb.py) and what a start, a launch or a start on a server
sends (configs.py, launch_command.py, server_start.py, remote_runs.py). The Qt parts that run
it are app/runner."""
