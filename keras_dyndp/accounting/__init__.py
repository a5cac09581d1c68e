"""Privacy accounting for dynamic DP-SGD: GDP duality, the extended GDP CLT and accountants. No TensorFlow."""

from keras_dyndp.accounting.fast_rdp import DEFAULT_RDP_ORDERS
from keras_dyndp.accounting.fast_rdp import poisson_subsampled_gaussian_rdp
from keras_dyndp.accounting.fast_rdp import rdp_epsilon
from keras_dyndp.accounting.fast_rdp import rdp_epsilons_at
from keras_dyndp.accounting.gdp import clt_mu
from keras_dyndp.accounting.gdp import delta_from_mu
from keras_dyndp.accounting.gdp import epsilon_from_mu
from keras_dyndp.accounting.gdp import mu_from_epsilon
from keras_dyndp.accounting.gdp_clt_accountant import GdpCltAccountant
from keras_dyndp.accounting.noise_range import MAX_NOISE_MULTIPLIER
from keras_dyndp.accounting.noise_range import MIN_NOISE_MULTIPLIER
from keras_dyndp.accounting.noise_range import NoiseOutOfRangeError
from keras_dyndp.accounting.registry import ACCOUNTANT_NAMES
from keras_dyndp.accounting.registry import DEFAULT_ACCOUNTANT
from keras_dyndp.accounting.registry import DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL
from keras_dyndp.accounting.registry import make_accountant

__all__ = [
    "ACCOUNTANT_NAMES",
    "DEFAULT_ACCOUNTANT",
    "DEFAULT_PLD_VALUE_DISCRETIZATION_INTERVAL",
    "DEFAULT_RDP_ORDERS",
    "GdpCltAccountant",
    "MAX_NOISE_MULTIPLIER",
    "MIN_NOISE_MULTIPLIER",
    "NoiseOutOfRangeError",
    "clt_mu",
    "delta_from_mu",
    "epsilon_from_mu",
    "make_accountant",
    "mu_from_epsilon",
    "poisson_subsampled_gaussian_rdp",
    "rdp_epsilon",
    "rdp_epsilons_at",
]
