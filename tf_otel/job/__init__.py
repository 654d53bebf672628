"""Where this process stands in the training job: rank, world size, host, launcher, job id
(``topology``), and the per-job key every cross-rank connection proves (``job_secret``).
Below the clock and the pipeline: both ask it, it asks neither."""
