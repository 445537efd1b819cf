"""benchtui: the interactive Textual app over the benchmark suite (entry point: shardbench.tui.app.main)."""
