"""Widgets and views: the Controls panel, the plots, alerts, run history, the status bar,
dialogs and the window's actions. Views show the session's models and follow its typed
signals; none of them decides where a run stands or when a change applies."""
