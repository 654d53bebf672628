"""Comparisons: a run against itself without its slow subjects (replay, what-if) and a run
against another (profile, diff, ``tf-otel diff``). Imports the analysis core and its rules."""
