"""The app's screens: one module per screen (matrix, runs, logs, results) plus help and prompts."""
