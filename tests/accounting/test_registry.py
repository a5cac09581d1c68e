"""Tests for keras_dyndp.accounting.registry."""

import ast
import pathlib

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting import pld
from dp_accounting import rdp

from keras_dyndp.accounting import fast_pld
from keras_dyndp.accounting import registry
from keras_dyndp.accounting.gdp_clt_accountant import GdpCltAccountant


@pytest.mark.parametrize(
    "name, expected_type", [("gdp_clt", GdpCltAccountant), ("rdp", rdp.RdpAccountant), ("pld", pld.PLDAccountant)]
)
def test_make_accountant_types(name, expected_type):
    accountant = registry.make_accountant(name)
    assert type(accountant) is expected_type
    assert accountant.neighboring_relation == dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    assert accountant.get_epsilon(1e-5) == 0


def test_names_cover_registry():
    assert registry.ACCOUNTANT_NAMES == ("gdp_clt", "rdp", "pld")
    for name in registry.ACCOUNTANT_NAMES:
        registry.make_accountant(name)


def test_each_call_is_fresh():
    event = dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.0))
    for name in registry.ACCOUNTANT_NAMES:
        first = registry.make_accountant(name).compose(event, 100)
        assert first.get_epsilon(1e-5) > 0
        assert registry.make_accountant(name).get_epsilon(1e-5) == 0


def test_rigorous_accountants_are_not_below_gdp_clt_on_worked_example():
    event = dp_event.PoissonSampledDpEvent(250 / 60000, dp_event.GaussianDpEvent(1.1258165))
    epsilons = {
        name: registry.make_accountant(name).compose(event, 4800).get_epsilon(1e-5)
        for name in registry.ACCOUNTANT_NAMES
    }
    assert epsilons["gdp_clt"] == pytest.approx(1.2, rel=1e-6)
    assert epsilons["pld"] > epsilons["gdp_clt"]
    assert epsilons["rdp"] > epsilons["pld"]


def test_pld_interval_is_passed_and_checked():
    event = dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.0))
    coarse = registry.make_accountant("pld", pld_value_discretization_interval=1e-2).compose(event, 100)
    fine = registry.make_accountant("pld", pld_value_discretization_interval=1e-3).compose(event, 100)
    assert coarse.get_epsilon(1e-5) > fine.get_epsilon(1e-5)
    with pytest.raises(ValueError, match="`pld_value_discretization_interval`"):
        registry.make_accountant("pld", pld_value_discretization_interval=0.0)


@pytest.mark.parametrize("name", ["", "RDP", "gdp", "prv"])
def test_unknown_name_lists_valid_names(name):
    with pytest.raises(ValueError, match=r"`name` must be one of \('gdp_clt', 'rdp', 'pld'\)"):
        registry.make_accountant(name)


def _constant(sampling_probability=0.01, noise_multiplier=1.0, size=50, clip=1.0):
    """(p, clip norms, noise stds) of a constant schedule: the arrays the registry works on."""
    return sampling_probability, np.full(size, clip), np.full(size, noise_multiplier * clip)


def test_names_are_the_tables_keys_and_the_pld_interval_is_one_constant():
    assert registry.ACCOUNTANT_NAMES == tuple(registry.get(name).name for name in registry.ACCOUNTANT_NAMES)
    assert registry.DEFAULT_ACCOUNTANT in registry.ACCOUNTANT_NAMES
    assert registry.DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL == fast_pld.DEFAULT_VALUE_DISCRETIZATION_INTERVAL
    assert registry.RIGOROUS_ACCOUNTANT_NAMES == ("rdp", "pld")


@pytest.mark.parametrize("name", ["gdp_clt", "rdp", "pld"])
def test_entry_epsilon_matches_its_constructor_and_its_curve(name):
    entry = registry.get(name)
    p, clips, noise = _constant()
    epsilon = entry.epsilon(p, clips[:30], noise[:30], 1e-5)
    composed = entry.make().compose(registry.dp_event(p, noise[:30] / clips[:30])).get_epsilon(1e-5)
    # The fast RDP and PLD match dp_accounting's to its version's rounding and the PLD's grouping (`fast_rdp`,
    # `fast_pld`); the GDP-CLT entry composes the same accountant.
    assert epsilon == pytest.approx(composed, rel={"gdp_clt": 1e-12, "rdp": 1e-6, "pld": 1e-2}[name])
    curve = entry.epsilons_at(p, clips, noise, 1e-5, np.array([0, 10, 30]))
    assert curve[0] == 0 and curve[1] < curve[2]
    assert curve[2] == pytest.approx(epsilon, rel=1e-9)


def test_options_reach_epsilon_and_final_options_are_tighter():
    entry = registry.get("pld")
    arrays = _constant()
    default = entry.epsilon(*arrays, 1e-5)
    final = entry.epsilon(*arrays, 1e-5, **entry.final_options)
    assert final < default
    with pytest.raises(TypeError):  # The table is shared: its options are read-only.
        entry.final_options["value_discretization_interval"] = 1.0
    assert entry.min_noise_multiplier(**entry.final_options) > entry.min_noise_multiplier()
    orders = registry.get("rdp").check_options({"orders": [2, 4, 8]})["orders"]
    assert registry.get("rdp").epsilon(*arrays, 1e-5, orders=orders) >= registry.get("rdp").epsilon(*arrays, 1e-5)


@pytest.mark.parametrize(
    "name, options, match",
    [
        ("gdp_clt", {"value_discretization_interval": 1e-4}, "Options of the 'gdp_clt' accountant must be among ()"),
        ("pld", {"orders": [2]}, r"among \('value_discretization_interval',\)"),
        ("pld", {"value_discretization_interval": 0.0}, "`value_discretization_interval` must be > 0"),
        ("rdp", {"orders": [0.5]}, "`orders` must be"),
    ],
)
def test_bad_options_name_the_option(name, options, match):
    with pytest.raises(ValueError, match=match):
        registry.get(name).check_options(options)


def test_get_unknown_name_names_the_argument():
    with pytest.raises(
        ValueError,
        match=r"`accountant` must be one of \('gdp_clt', 'rdp', 'pld'\). "
        r"Received: accountant='prv'",
    ):
        registry.get("prv")


@pytest.mark.parametrize("name", ["gdp_clt", "rdp", "pld"])
def test_entries_read_the_noise_multipliers_of_the_arrays_not_their_scale(name):
    entry = registry.get(name)
    p, clips, noise = _constant(noise_multiplier=1.3, size=40)
    assert entry.epsilon(p, 3 * clips, 3 * noise, 1e-5) == pytest.approx(entry.epsilon(p, clips, noise, 1e-5), 1e-12)
    steps = np.array([5, 40])
    assert np.allclose(
        entry.epsilons_at(p, 3 * clips, 3 * noise, 1e-5, steps), entry.epsilons_at(p, clips, noise, 1e-5, steps)
    )


def test_the_accountant_specific_choices_are_attributes():
    # The callers (schedules, callbacks) branch on these, never on a name.
    by_name = {name: registry.get(name) for name in registry.ACCOUNTANT_NAMES}
    assert {name for name, entry in by_name.items() if not entry.rigorous} == {"gdp_clt"}
    assert {name for name, entry in by_name.items() if entry.clt_calibration} == {"gdp_clt"}
    assert registry.ALWAYS_LOGGED_ACCOUNTANT_NAMES == ("gdp_clt",)


def test_dp_event_groups_runs_of_equal_noise_multipliers():
    assert registry.dp_event(0.1, np.array([])) == dp_event.NoOpDpEvent()
    step = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(2.0))
    assert registry.dp_event(0.1, np.full(3, 2.0)) == dp_event.SelfComposedDpEvent(step, 3)
    last = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0))
    assert registry.dp_event(0.1, np.array([2.0, 2.0, 1.0])) == dp_event.ComposedDpEvent(
        [dp_event.SelfComposedDpEvent(step, 2), dp_event.SelfComposedDpEvent(last, 1)]
    )


def test_accounting_imports_nothing_of_schedules():
    package = pathlib.Path(registry.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            assert not [name for name in names if name.startswith("keras_dyndp.schedules")], path
