"""The torch-free declarations: what a run is configured with (`config`, `limits`), the live
settings (`settings`) and the command-line flags made from them (`run_flags`), the commands that
change them (`commands`) and what a batch of them does (`rules`), the events a run emits
(`events`), run-folder naming (`paths`) and the checkpoints a folder holds by name
(`checkpoint_names`), the lr schedule over samples seen (`schedule`) and how a run ended
(`outcome`).

Nothing here imports torch or numpy: the app and `headroom-ctl` load these first.
"""
