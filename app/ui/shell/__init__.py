"""The window shell: status bar, dialogs, About, the loading overlay, repaint pacing, saved
window and view preferences, and the scripted mode (--screenshot, --quit-when-done)."""
