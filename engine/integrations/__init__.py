"""Bring your own loop: other training loops write Headroom run folders.

Three adapters over one writer (`engine.integrations.loop.HeadroomRun`), so a run
from any of them appears in the app like an engine run, live: one `metrics` row per
optimizer step, epochs with validation loss, events, and the `run` table the runs
list reads (task, config, status running -> finished, pid, started).

    # a hand-written PyTorch loop
    from engine.integrations.loop import headroom_run
    with headroom_run(config={"lr": 1e-3}) as run:
        ...
        run.log_step(loss=loss, grad_norm=norm, lr=lr, accum=4, micro_batch=16)
        for cmd in run.poll(): ...

    # Hugging Face Trainer (extra `hf`): its callback API passes no Trainer, so it is handed over
    from engine.integrations.transformers import HeadroomCallback
    HeadroomCallback().attach(trainer)

    # Lightning (extra `lightning`)
    from engine.integrations.lightning import HeadroomCallback
    L.Trainer(..., callbacks=[HeadroomCallback()])

Importing this package imports nothing else: `transformers` and `lightning` load only
when their adapter module is imported, and `import engine` never imports them.

What the app can change, and where. A setting applies at the boundary it was sent for:
at="epoch" (the app's default) at the next epoch start, at="step" between two optimizer
steps; one the framework can never change is refused as it arrives (the command row is
marked "refused" with the reason and a `command_refused` event says why):

=================  ==========================  ============================  ==========================
command            plain loop (`loop`)         Hugging Face Trainer          Lightning
=================  ==========================  ============================  ==========================
set_lr             what your loop applies      every param group and the     the same (param groups +
                   (`set_lr()` scales the      scheduler's base lrs scaled   each scheduler of the
                   optimizer and the           by one factor, so the         optimizer)
                   scheduler's base lrs)       schedule keeps its shape
set_clip           what your loop applies      `args.max_grad_norm`;         `trainer.gradient_clip_
                                               refused under DeepSpeed (it   val`; refused when
                                               clips itself)                 clipping by value or under
                                                                             manual optimization
set_accum          what your loop applies      refused: the Trainer sizes    at the next epoch start
                                               its epochs and schedule from  whatever `at` says (as
                                               it when training starts       GradientAccumulation-
                                                                             Scheduler does); refused
                                                                             with that callback, manual
                                                                             optimization or DeepSpeed
set_micro_batch    what your loop applies      refused (the DataLoader is    refused (same)
                                               built)
set_lr_scaling     what your loop applies      refused (the engine's rule;   refused
                                               send set_lr)
pause / resume     between steps, inside       between optimizer steps       between optimizer steps
                   `run.poll()`
stop               `run.stop_requested`; your  after the step: the Trainer's after the step: `trainer.
                   loop saves and leaves       own checkpoint (`control.     save_checkpoint` (atomic),
                                               should_save`) then `should_   then `trainer.should_stop`
                                               training_stop`
=================  ==========================  ============================  ==========================

Commands are read at step boundaries only, on the training thread, at most every
`poll_interval` (0.05 s): `PRAGMA data_version` says whether anyone committed to run.db,
max(id) of `commands` whether a row is new, and only then RunStore.pending_commands()
reads the table. In a run of several processes (the framework's DDP), process 0 writes the run
folder and every command is refused: a setting applied on one rank alone would make them diverge.
"""
