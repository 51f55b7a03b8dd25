"""A setting is chosen by its mean over seeds, never by its luckiest seed: seeds that differ
enough that the lowest seed and the mean choose differently (`profiles.profile`,
`profiles.fixed_view`)."""

from __future__ import annotations

import pytest

from nas_service.results import profiles
from tests.results.test_profiles import arch, make_row, setting

#: Wide seeds (one lucky, one not): mean 2.5, lowest seed 2.0.
WIDE = [2.0, 3.0]
#: Narrow seeds: mean 2.35, lowest seed 2.3.
NARROW = [2.3, 2.4]


@pytest.mark.parametrize("joint", [True, False], ids=["across-trials", "one-trial"])
def test_profile_picks_the_lowest_mean_not_the_lowest_seed(joint: bool) -> None:
    shape = arch("baseline", 4, 128)
    runs = [(setting(1e-3), WIDE), (setting(3e-3), NARROW)]
    rows = (
        [make_row(0, shape, [runs[0]]), make_row(1, shape, [runs[1]])]
        if joint
        else [make_row(0, shape, runs)]
    )
    (row,) = profiles.profile(rows)
    assert row.setting == setting(3e-3)
    assert row.loss == pytest.approx(2.35)
    assert row.seeds == NARROW
    assert row.n_settings == 2


def test_fixed_view_picks_the_setting_of_the_lowest_means() -> None:
    # every architecture at both settings: the wide one has the lowest seeds everywhere
    rows = []
    for i, (n_layers, d_model) in enumerate([(4, 128), (6, 192), (8, 256)]):
        shape = arch("baseline", n_layers, d_model)
        shift = 0.01 * i
        rows.append(
            make_row(
                i,
                shape,
                [
                    (setting(1e-3), [v + shift for v in WIDE]),
                    (setting(3e-3), [v + shift for v in NARROW]),
                ],
            )
        )
    shared, fixed = profiles.fixed_view(rows)
    assert shared == setting(3e-3)
    assert [p.loss for p in fixed] == pytest.approx([2.35, 2.36, 2.37])
    # an architecture trained at the shared setting in two trials counts its best mean
    shape = arch("baseline", 4, 128)
    again = make_row(3, shape, [(setting(3e-3), [1.9, 3.0])])  # lowest seed, worse mean
    shared, fixed = profiles.fixed_view([*rows, again])
    assert shared == setting(3e-3)
    assert [p.row.number for p in fixed if p.row.arch == shape] == [0]
