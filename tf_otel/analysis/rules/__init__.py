"""The findings and the rules that make them (straggler, input-bound, GPU, replicas, whole-step,
GC pauses): each reads analysed steps and says what it found with evidence. Imports the
analysis core (steps, paths, results) below it; never the CLI or the comparisons."""
