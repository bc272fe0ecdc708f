"""The Controls panel: the run form (task, schedule, task arguments), the live settings with
their limits and validators, readouts, and starting a run from the form. `panel.ControlsPanel`
is the interface."""
