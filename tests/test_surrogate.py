"""The surrogate landscape (`bench/surrogate.py`): its fit recovers a known model, its seed
noise and cross-validation measure what they say, and what it generates loads as a landscape
that the simulated backend replays."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench import surrogate as sg
from nas_service.results.landscape import load_landscape

TRUE = {
    "baseline": [2.0, -0.3, 0.05, 0.2, 0.02, 0.01],
    "block_attnres": [1.9, -0.25, 0.04, 0.2, 0.02, 0.0, 0.01, 0.03],
}


def _synthetic(noise: float = 0.0, seed: int = 0, seeds: int = 1) -> list[sg.Run]:
    rng = np.random.default_rng(seed)
    runs = []
    shapes = [(v, c, x) for v, c in TRUE.items() for x in (2.0, 2.7, 3.4, 4.1)]
    for number, (variant, coef, x) in enumerate(shapes):  # one trial per architecture
        for lr in (0.002, 0.004, 0.008):
            for dlm in (0.1, 1.0, 10.0) if variant != "baseline" else (1.0,):
                u, w = math.log(lr), (math.log(dlm) if variant != "baseline" else 0.0)
                mean = float(np.dot(coef, sg.features(variant, x, u, w)))
                for _ in range(seeds):
                    loss = mean + noise * float(rng.standard_normal())
                    runs.append(sg.Run(variant, x, u, w, loss, (), (number, lr, dlm)))
    return runs


def test_the_fit_recovers_a_known_model() -> None:
    model = sg.fit(_synthetic())
    for variant, coef in TRUE.items():
        assert model.coef[variant] == pytest.approx(coef, abs=1e-9)
    assert model.residual_rmse == pytest.approx(0.0, abs=1e-9)


def test_cross_validation_is_zero_on_an_exact_model_and_near_the_noise_otherwise() -> None:
    assert sg.cross_validate(_synthetic())["rmse"] == pytest.approx(0.0, abs=1e-8)
    noisy = sg.cross_validate(_synthetic(noise=0.05, seeds=3))
    assert 0.04 < noisy["rmse"] < 0.07  # the noise, plus a little for coefficients estimated


def test_seed_sigma_pools_the_spread_of_repeated_points(tmp_path: Path) -> None:
    doc = json.loads(sg.NOISE_FROM.read_text())
    # three seeds per point in the recorded cosine landscape; shift one seed of every point
    for t in doc["trials"]:
        for r in t["train"]:
            if r["seed"] == 0 and r["final_val_loss"] is not None:
                r["final_val_loss"] += 1.0
    path = tmp_path / "shifted.json"
    path.write_text(json.dumps(doc))
    assert sg.seed_sigma(load_landscape(path)) > 0.5  # a spread of ~0.58 added
    assert sg.seed_sigma(load_landscape(sg.NOISE_FROM)) < 0.2


def test_a_generated_landscape_loads_and_its_points_follow_the_model(tmp_path: Path) -> None:
    recorded = load_landscape(sg.RECORDED)
    model = sg.fit(sg.recorded_runs(recorded), sigma=0.0)
    doc = sg.generate(model, recorded, depths=(2, 4), lrs=(0.002, 0.004), dlms=(0.1, 1.0), seeds=2)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    assert len(load_landscape(path).trials) == 6  # 3 variants × 2 depths, in the format
    for t in doc["trials"]:
        x = math.log(t["arch"]["d_model"] / t["arch"]["n_layers"])
        settings = 2 if t["variant"] == "baseline" else 4
        assert len(t["train"]) == settings * 2
        for r in t["train"]:
            lr, dlm = r["setting"]["lr"], r["setting"]["depth_lr_mult"]
            w = math.log(dlm) if t["variant"] in sg.MIXED else 0.0
            # no noise: every seed is the model's mean, and the curve ends at it
            mean = model.mean(t["variant"], x, math.log(lr), w)
            assert r["final_val_loss"] == pytest.approx(mean)
            assert r["curve"][-1][3] == pytest.approx(r["final_val_loss"])
        assert t["values"][0] == pytest.approx(min(s["mean"] for s in t["settings"]))
    assert doc["generator"]["sigma"] == 0.0 and doc["generator"]["seeds"] == 2
