"""SV's model-free logic: the (S, A) acceptance table, information gain, goodput and γ choice."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specpilot.errors import ConfigError
from specpilot.policies.latency import VerifyLatency, read_verify_curves
from specpilot.policies.sv_length import (
    allocate_batch,
    choose_length,
    expected_accepted,
    goodput,
)
from specpilot.policies.sv_table import AcceptanceTable, information_gain


def linear_latency(base: float, per_token: float):
    return lambda n: base + per_token * n


# ---------------------------------------------------------------- acceptance table: binning


def test_alpha_depending_only_on_s_is_recovered():
    rng = np.random.default_rng(0)
    n = 20000
    s = rng.uniform(0, 1, n)
    a = np.where(rng.uniform(size=n) < 0.2, 1.0, rng.uniform(0, 1, n))
    table = AcceptanceTable.fit(s, a, alpha=s)
    assert table.shape == (16, 17)
    grid = np.array(table.cells)
    assert np.ptp(grid, axis=1).max() < 0.02  # A carries no information: rows are flat
    probe = np.linspace(0.05, 0.95, 19)
    assert np.abs(table.lookup(probe, 0.5) - probe).max() < 0.07
    assert np.abs(table.lookup(probe, 1.0) - probe).max() < 0.07


def test_discrete_s_gives_exact_cells():
    rng = np.random.default_rng(1)
    s = np.repeat([0.0, 1.0, 2.0, 3.0], 250)
    a = np.where(rng.uniform(size=s.size) < 0.3, 1.0, rng.uniform(0, 0.9, s.size))
    table = AcceptanceTable.fit(s, a, alpha=0.2 * s + 0.1, s_bins=4, a_bins=2)
    assert table.s_edges == [0.5, 1.5, 2.5]
    assert np.array(table.counts).sum() == s.size
    expected = np.repeat((0.2 * np.arange(4) + 0.1)[:, None], 3, axis=1)  # 2 A<1 bins + A=1
    np.testing.assert_allclose(table.cells, expected)


def test_a_equal_one_has_its_own_bin():
    rng = np.random.default_rng(2)
    n = 3000
    s = rng.uniform(0, 1, n)
    is_one = rng.uniform(size=n) < 0.3
    a = np.where(is_one, 1.0, rng.uniform(0, 0.99, n))
    alpha = np.where(is_one, 0.9, 0.2)
    table = AcceptanceTable.fit(s, a, alpha, s_bins=4, a_bins=4, min_count=10)
    assert np.array(table.counts)[:, -1].sum() == is_one.sum()
    assert np.array(table.counts)[:, :-1].sum() == (~is_one).sum()
    assert table.lookup(0.5, 1.0) == pytest.approx(0.9)
    assert table.lookup(0.5, 1.0 - 1e-12) == pytest.approx(0.9)  # rounding noise still counts
    assert table.lookup(0.5, 0.999999) == pytest.approx(0.2)
    assert table.lookup(0.5, 0.3) == pytest.approx(0.2)


def test_duplicate_edges_collapse_to_fewer_bins():
    ones = np.ones(200)
    two_values = np.r_[np.full(50, 0.3), np.full(150, 0.7)]
    table = AcceptanceTable.fit(two_values, ones, 0.5 * ones, s_bins=16)
    assert table.s_edges == [0.5]
    assert table.a_edges == []  # every A is 1: no A < 1 records to cut
    assert table.shape == (2, 2)
    constant = AcceptanceTable.fit(0.4 * ones, 0.5 * ones, 0.5 * ones)
    assert constant.s_edges == [] and constant.a_edges == []
    # a cut inside a run of ties moves to the run's end instead of making an empty bin
    skewed, half = np.r_[np.zeros(10), np.ones(90)], np.full(100, 0.5)
    assert AcceptanceTable.fit(skewed, half, half, s_bins=4).s_edges == [0.5]


def test_sparse_cell_falls_back_to_s_marginal():
    s = np.repeat([0.0, 1.0], 105)
    a = np.r_[np.full(100, 0.2), np.full(5, 0.6), np.full(100, 0.6), np.full(5, 0.2)]
    alpha = np.r_[np.full(100, 0.3), np.full(5, 0.9), np.full(100, 0.5), np.full(5, 0.1)]
    table = AcceptanceTable.fit(s, a, alpha, s_bins=2, a_bins=2)
    assert table.s_edges == [0.5] and table.a_edges == [pytest.approx(0.4)]
    assert table.counts == [[100, 5, 0], [5, 100, 0]]
    row0, row1 = (100 * 0.3 + 5 * 0.9) / 105, (100 * 0.5 + 5 * 0.1) / 105
    np.testing.assert_allclose(table.cells, [[0.3, row0, row0], [row1, 0.5, row1]])
    np.testing.assert_allclose(table.s_marginal, [row0, row1])


def test_sparse_s_bin_falls_back_to_global_mean():
    s = np.r_[np.zeros(100), np.ones(10), np.full(100, 2.0)]
    alpha = np.r_[np.full(100, 0.2), np.full(10, 0.8), np.full(100, 0.6)]
    table = AcceptanceTable.fit(s, np.full(210, 0.5), alpha, s_bins=3)
    assert table.s_edges == [0.5, 1.5]
    assert table.counts[1] == [10, 0]
    global_mean = (100 * 0.2 + 10 * 0.8 + 100 * 0.6) / 210
    assert table.global_mean == pytest.approx(global_mean)
    np.testing.assert_allclose(table.cells, [[0.2, 0.2], [global_mean] * 2, [0.6, 0.6]])
    assert table.lookup(1.0, 0.5) == pytest.approx(global_mean)
    assert table.lookup(1.0, 1.0) == pytest.approx(global_mean)


def test_lookup_accepts_scalars_arrays_and_tensors():
    rng = np.random.default_rng(3)
    s, a = rng.uniform(size=500), rng.uniform(size=500)
    table = AcceptanceTable.fit(s, a, s, s_bins=4, a_bins=2)
    scalar = table.lookup(0.3, 0.4)
    assert isinstance(scalar, float)
    from_list = table.lookup([0.1, 0.3, 0.9], [0.4, 0.4, 1.0])
    assert isinstance(from_list, np.ndarray) and from_list.shape == (3,)
    assert from_list[1] == scalar
    from_tensor = table.lookup(torch.tensor([0.1, 0.3, 0.9]), torch.tensor([0.4, 0.4, 1.0]))
    np.testing.assert_array_equal(from_tensor, from_list)
    assert table.lookup(-5.0, 0.4) == table.lookup(0.0, 0.4)  # outside the range: end bin
    assert 0.0 <= table.lookup(50.0, -3.0) <= 1.0
    with pytest.raises(ConfigError, match="shapes differ"):
        table.lookup([0.1, 0.2], [0.1, 0.2, 0.3])


def test_fit_rejects_bad_input():
    with pytest.raises(ConfigError, match="empty"):
        AcceptanceTable.fit([], [], [])
    with pytest.raises(ConfigError, match="differ in length"):
        AcceptanceTable.fit([0.1, 0.2], [0.5], [0.5, 0.5])
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        AcceptanceTable.fit([0.1], [0.5], [1.5])
    with pytest.raises(ConfigError, match="NaN"):
        AcceptanceTable.fit([float("nan")], [0.5], [0.5])
    with pytest.raises(ConfigError, match="s_bins"):
        AcceptanceTable.fit([0.1], [0.5], [0.5], s_bins=0)


# ---------------------------------------------------------------- acceptance table: serialising


def test_to_dict_from_dict_round_trip():
    rng = np.random.default_rng(4)
    s, a = (
        rng.uniform(size=2000),
        np.where(rng.uniform(size=2000) < 0.4, 1.0, rng.uniform(size=2000)),
    )
    table = AcceptanceTable.fit(s, a, 0.5 * s + 0.3 * a, s_bins=8, a_bins=4, min_count=5)
    restored = AcceptanceTable.from_dict(json.loads(json.dumps(table.to_dict())))
    assert restored == table
    probe_s, probe_a = rng.uniform(size=100), rng.uniform(size=100)
    np.testing.assert_array_equal(restored.lookup(probe_s, probe_a), table.lookup(probe_s, probe_a))


def test_malformed_table_is_a_config_error():
    table = AcceptanceTable.fit([0.1, 0.9] * 30, [0.5, 1.0] * 30, [0.2, 0.8] * 30, s_bins=2)
    d = table.to_dict()
    missing = dict(d)
    del missing["cells"]
    with pytest.raises(ConfigError, match="missing key 'cells'"):
        AcceptanceTable.from_dict(missing)
    with pytest.raises(ConfigError, match="must be a dict"):
        AcceptanceTable.from_dict([1, 2])
    with pytest.raises(ConfigError, match="cells must be 2 S bins"):
        AcceptanceTable.from_dict({**d, "cells": d["cells"][:1]})
    with pytest.raises(ConfigError, match="min_count"):
        AcceptanceTable.from_dict({**d, "min_count": 0})
    with pytest.raises(ConfigError, match="strictly increasing"):
        AcceptanceTable.from_dict({**d, "s_edges": [0.5, 0.5], "s_marginal": [0.1] * 3})


# ---------------------------------------------------------------- information gain


def test_information_gain_of_fully_informative_s():
    rng = np.random.default_rng(5)
    s = rng.permutation(np.repeat(np.arange(4.0), 250))
    alpha = np.array([0.1, 0.35, 0.6, 0.85])[s.astype(int)]
    ig = information_gain(s, rng.uniform(size=s.size), alpha, x_bins=4, s_bins=4, a_bins=4)
    assert ig["H_X"] == pytest.approx(2.0)
    assert ig["IG_S"] == pytest.approx(ig["H_X"])
    assert ig["IG_SA"] == pytest.approx(ig["H_X"])
    assert ig["relative_SA"] == pytest.approx(1.0)
    assert ig["IG_A"] < 0.05
    assert ig["n"] == 1000 and ig["s_bins_used"] == 4


def test_information_gain_of_independent_noise_is_small():
    rng = np.random.default_rng(6)
    s, a, alpha = rng.uniform(size=(3, 20000))
    ig = information_gain(s, a, alpha)
    assert ig["H_X"] == pytest.approx(np.log2(10), abs=0.01)
    # plug-in bias is about 16·17·9 / (2·20000·ln 2) ≈ 0.09 bits over the 272 joint cells
    assert ig["IG_SA"] < 0.15 and ig["relative_SA"] < 0.05
    assert ig["IG_S"] < 0.02 and ig["IG_A"] < 0.02


def test_joint_information_gain_dominates_each_indicator():
    rng = np.random.default_rng(7)
    s, a = rng.uniform(size=(2, 5000))
    alpha = np.clip(0.5 * s + 0.5 * a + rng.normal(0, 0.05, 5000), 0, 1)
    ig = information_gain(s, a, alpha)
    assert ig["IG_SA"] >= max(ig["IG_S"], ig["IG_A"]) - 1e-9
    assert ig["IG_S"] > 0.2 and ig["IG_A"] > 0.2
    assert ig["H_X_given_SA"] == pytest.approx(ig["H_X"] - ig["IG_SA"])


def test_information_gain_of_constant_alpha():
    ig = information_gain([0.1, 0.5, 0.9], [0.2, 1.0, 0.3], [1.0, 1.0, 1.0])
    assert ig["H_X"] == 0.0 and ig["IG_SA"] == 0.0 and ig["relative_SA"] == 0.0


# ---------------------------------------------------------------- expected accepted, goodput


def test_expected_accepted_by_hand():
    p = [0.5, 0.4, 0.9]
    assert expected_accepted(p, 0) == 0.0
    assert expected_accepted(p, 1) == pytest.approx(0.5)
    assert expected_accepted(p, 2) == pytest.approx(0.5 + 0.2)
    assert expected_accepted(p, 3) == pytest.approx(0.5 + 0.2 + 0.18)
    assert expected_accepted([1.0] * 4, 4) == 4.0
    with pytest.raises(ConfigError, match="gamma"):
        expected_accepted(p, 4)
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        expected_accepted([1.2], 1)


def test_goodput_by_hand():
    latency = linear_latency(0.8, 0.2)  # T(n) = 0.8 + 0.2 n
    assert goodput([0.9, 0.5], 0, latency) == pytest.approx(1 / 1.0)
    assert goodput([0.9, 0.5], 2, latency) == pytest.approx((1 + 0.9 + 0.45) / 1.4)
    assert goodput([0.9, 0.5], 2, latency, plus_one=False) == pytest.approx((0.9 + 0.45) / 1.4)


# ---------------------------------------------------------------- single-request length


def test_confident_drafts_and_flat_latency_verify_everything():
    assert choose_length([0.95] * 10, lambda n: 0.05) == 10


def test_hopeless_drafts_verify_nothing():
    assert choose_length([0.01] * 8, linear_latency(0.8, 0.2)) == 0


def test_middle_case_by_hand():
    # T(n) = 0.8 + 0.2 n: G(0) = 1/1 = 1, G(1) = 1.9/1.2 = 1.583, G(2) = 2.35/1.4 = 1.679,
    # G(3) = 2.44/1.6 = 1.525 < G(2): stop at 2.
    latency = linear_latency(0.8, 0.2)
    assert choose_length([0.9, 0.5, 0.2], latency) == 2
    g = [goodput([0.9, 0.5, 0.2], k, latency) for k in range(4)]
    assert g[2] == max(g)


def test_without_plus_one_the_first_token_is_always_tried():
    latency = linear_latency(0.8, 0.2)
    # G(0) = 0 without the bonus token, so any p_1 > 0 beats it; G(2) = 0.0101/1.4 < 0.01/1.2.
    assert choose_length([0.01] * 8, latency, plus_one=False) == 1
    assert choose_length([0.0] * 8, latency, plus_one=False) == 0
    assert choose_length([0.9, 0.5, 0.2], latency, plus_one=False) == 2  # 0.75, 0.964, 0.9


def test_choose_length_edge_cases():
    assert choose_length([], lambda n: 1.0) == 0
    with pytest.raises(ConfigError, match="must be > 0"):
        choose_length([0.5], lambda n: 0.0)


# ---------------------------------------------------------------- batch allocation


def test_allocate_batch_by_hand():
    # T(n) = 0.5 + 0.25 n. Start: E = 2, n = 2, G = 2/1 = 2.
    # +row 0 (gain 0.9): 2.9/1.25 = 2.32 > 2       -> [1, 0]; row 0's next gain 0.45
    # +row 1 (gain 0.6): 3.5/1.5 = 2.333 > 2.32    -> [1, 1]
    # +row 0 (gain 0.45): 3.95/1.75 = 2.257 < 2.333 -> stop
    assert allocate_batch([[0.9, 0.5], [0.6, 0.6]], linear_latency(0.5, 0.25)) == [1, 1]


def test_hopeless_row_gets_nothing_while_confident_row_gets_many():
    latency = linear_latency(0.02, 0.001)
    assert allocate_batch([[0.01] * 8, [0.97] * 8], latency) == [0, 8]
    assert allocate_batch([[0.01] * 5] * 3, latency) == [0, 0, 0]


def test_allocate_batch_respects_caps_and_breaks_ties_by_row():
    assert allocate_batch([[0.99] * 2, [0.99] * 5, [], [0.99]], lambda n: 1.0) == [2, 5, 0, 1]
    assert allocate_batch([], lambda n: 1.0) == []
    steps = {2: 1.0, 3: 1.4, 4: 100.0}
    assert allocate_batch([[0.9], [0.9]], steps.__getitem__) == [1, 0]
    rng = np.random.default_rng(8)
    for _ in range(50):
        rows = [rng.uniform(size=rng.integers(0, 7)).tolist() for _ in range(rng.integers(1, 6))]
        gammas = allocate_batch(rows, linear_latency(rng.uniform(0.01, 1), rng.uniform(0, 0.1)))
        assert all(0 <= g <= len(row) for g, row in zip(gammas, rows, strict=True))
        assert sum(gammas) <= sum(len(row) for row in rows)


def test_one_row_batch_matches_single_request_rule():
    rng = np.random.default_rng(9)
    for _ in range(50):
        p = np.sort(rng.uniform(size=rng.integers(1, 9)))[::-1].tolist()
        latency = linear_latency(rng.uniform(0.01, 1), rng.uniform(0, 0.2))
        assert allocate_batch([p], latency) == [choose_length(p, latency)]


# ---------------------------------------------------------------- verify latency


def test_verify_latency_interpolates_and_extrapolates():
    t = VerifyLatency([(4, 0.016), (1, 0.010), (2, 0.012)])  # unsorted input is fine
    assert t(1) == pytest.approx(0.010)
    assert t(1.5) == pytest.approx(0.011)
    assert t(3) == pytest.approx(0.014)
    assert t(6) == pytest.approx(0.020)  # slope of the last two points: 0.002 per token
    falling = VerifyLatency([(1, 0.010), (2, 0.009)])
    assert falling(5) == pytest.approx(0.009)  # never below the last value
    assert VerifyLatency([(3, 0.02)])(1) == 0.02 == VerifyLatency([(3, 0.02)])(9)


def test_verify_latency_from_profile_picks_nearest_context():
    profile = {"contexts": [128, 1024], "verify_ms": {"128": [10, 12, 14], "1024": [20, 25, 30]}}
    assert VerifyLatency.from_profile(profile)(2) == pytest.approx(0.012)  # default: shortest
    near_long = VerifyLatency.from_profile(profile, context=900)
    assert near_long.context == 1024 and near_long(2) == pytest.approx(0.025)
    assert near_long(5) == pytest.approx(0.040)
    assert VerifyLatency.from_profile(profile, context=576).context == 128  # tie: the shorter


def test_verify_curves_read_from_a_profile_file(tmp_path):
    """One reader for every user of a profile's verify_ms (SV, goodput prior, LTD's cost model)."""
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"verify_ms": {"512": [20, 25], "128": [10, 12]}}))
    assert read_verify_curves(path) == {128: [10.0, 12.0], 512: [20.0, 25.0]}
    assert VerifyLatency.from_profile(str(path))(2) == pytest.approx(0.012)
    with pytest.raises(ConfigError, match="cannot read latency profile"):
        read_verify_curves(tmp_path / "missing.json")
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read latency profile"):
        read_verify_curves(path)


def test_verify_latency_errors():
    with pytest.raises(ConfigError, match="specpilot profile --out PATH"):
        VerifyLatency.from_profile({"contexts": [128]})
    with pytest.raises(ConfigError, match="non-empty list"):
        VerifyLatency.from_profile({"verify_ms": {"128": []}})
    with pytest.raises(ConfigError, match="context lengths"):
        VerifyLatency.from_profile({"verify_ms": {"long": [1.0]}})
    with pytest.raises(ConfigError, match="at least one"):
        VerifyLatency([])
    with pytest.raises(ConfigError, match="repeat"):
        VerifyLatency([(1, 0.01), (1, 0.02)])
    with pytest.raises(ConfigError, match="> 0 seconds"):
        VerifyLatency([(1, 0.0)])
    with pytest.raises(ConfigError, match="n >= 1"):
        VerifyLatency([(1, 0.01)])(0)


def test_corrected_information_gain_removes_small_sample_bias():
    from specpilot.policies.sv_table import information_gain

    rng = np.random.default_rng(3)
    n = 800
    s, a = rng.uniform(0, 1, n), rng.uniform(0, 0.99, n)
    alpha = (rng.uniform(0, 1, n) < 0.7).astype(float)  # independent of S and A
    gain = information_gain(s, a, alpha)
    assert gain["IG_SA"] > 0.1  # plug-in: many cells, few records, looks informative
    assert gain["IG_SA_corrected"] < 0.03
    informative = information_gain(s, a, (rng.uniform(0, 1, n) < s).astype(float))
    assert informative["IG_S_corrected"] > 0.1
