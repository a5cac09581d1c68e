"""Tests for keras_dyndp.accounting.registry."""

import dp_accounting
import pytest
from dp_accounting import dp_event
from dp_accounting import pld
from dp_accounting import rdp

from keras_dyndp.accounting import registry
from keras_dyndp.accounting.gdp_clt_accountant import GdpCltAccountant


@pytest.mark.parametrize("name, expected_type", [("gdp_clt", GdpCltAccountant), ("rdp", rdp.RdpAccountant),
                                                 ("pld", pld.PLDAccountant)])
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
    epsilons = {name: registry.make_accountant(name).compose(event, 4800).get_epsilon(1e-5)
                for name in registry.ACCOUNTANT_NAMES}
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
