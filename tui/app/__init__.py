"""benchtui: the interactive Textual app over the benchmark suite (entry point: tui.app.main)."""
