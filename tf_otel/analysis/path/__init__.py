"""A step's cross-rank critical path: the walk (critical_path) over each rank's span indexes
(rank_index) and the points where ranks meet (sync_points), what a rank carried in from its
previous step (carry), the repair of clock-skewed causality (causality). Imports the step model
(steps, model) only."""
