"""The bottom layer: files, folders and process-wide set-up every other layer may use
(resources, the log, preferences, run folders, shortcuts, binding work-arounds).
Imports nothing from the rest of the app."""
