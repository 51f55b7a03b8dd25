"""Training workers: residual-variant language models, data, the fixed-budget trainer."""
