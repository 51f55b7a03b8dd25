"""How candidates are chosen and priced: the Optuna study (sampler, pruner, suggest), the
training plan of a trial, the cost model's prices, and the multi-fidelity rungs."""
