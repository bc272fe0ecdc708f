"""Steering a running run: commands arrive (`inbox`: a queue in process, run.db's commands
table otherwise, shared across ranks), are validated and applied to the live settings at an
epoch or step boundary (`boundaries`, by the torch-free engine.declarations.rules), and the
optimizer's lr follows (`lr`, the one writer of the optimizer's learning rate)."""
