"""The runner: the loop that asks each job's study for candidates, trains them through a
backend (Ray, or a recorded landscape on a simulated clock), records their outcomes, and
recovers the trials a stopped runner left behind. `python -m nas_service.runner` runs it."""
