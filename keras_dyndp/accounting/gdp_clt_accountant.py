"""`GdpCltAccountant`: a `dp_accounting.PrivacyAccountant` that composes by the extended GDP CLT.

This is the accountant of the dynamic DP-SGD paper (Corollary 1): T Poisson-subsampled Gaussian steps with
sampling probability p and noise multipliers z_t (step t is mu_t-GDP with mu_t = 1 / z_t) compose to
mu_tot-GDP with mu_tot = p * sqrt(sum_t (exp(1 / z_t^2) - 1)), and epsilon follows from the GDP duality. Being a
`PrivacyAccountant`, it plugs into anything that speaks `dp_accounting` (ledgers of `DpEvent`s,
`dp_accounting.mechanism_calibration`), side by side with `RdpAccountant` and `PLDAccountant`.

Warning:
    The GDP CLT is an asymptotic approximation, not an upper bound: it can UNDERESTIMATE epsilon (Gopi, Lee and
    Wutschitz 2021, "Numerical Composition of Differential Privacy", arXiv 2106.02848). Measured here for
    p = 250/60000, T = 4800, delta = 1e-5: schedules calibrated to GDP-CLT epsilon 0.4 / 1.2 / 2.0 have PLD
    epsilon 0.40 / 1.25 / 2.21. For a rigorous guarantee report epsilon from
    `dp_accounting.rdp.RdpAccountant` or `dp_accounting.pld.PLDAccountant`
    (`keras_dyndp.accounting.make_accountant('rdp' | 'pld')`, or the fast `keras_dyndp.accounting.rdp_epsilon`).
"""

import math

import dp_accounting
import numpy as np
from dp_accounting import dp_event

from keras_dyndp import validation
from keras_dyndp.accounting import gdp
from keras_dyndp.accounting import noise_range

_CompositionErrorDetails = dp_accounting.PrivacyAccountant.CompositionErrorDetails


class GdpCltAccountant(dp_accounting.PrivacyAccountant):
    """Privacy accountant based on the extended central limit theorem of Gaussian DP.

    Neighbouring relation: add or remove one record (the relation under which Poisson subsampling is analysed).

    Supported events, nested in any way through `SelfComposedDpEvent` and `ComposedDpEvent`:

    * `PoissonSampledDpEvent(p, GaussianDpEvent(z))` with any z per event (heterogeneous schedules): adds
      p^2 * (exp(1 / z^2) - 1) per step to mu_clt^2 (paper Eq. 10). With p = 1 the step is an un-sampled
      Gaussian and is composed exactly (below); with p = 0 it costs nothing.
    * `GaussianDpEvent(z)` without sampling: exact GDP composition, mu_exact^2 += 1 / z^2.
    * `NoOpDpEvent` (nothing) and `NonPrivateDpEvent` (epsilon = inf). A noise multiplier of 0 also gives
      epsilon = inf, and one of inf costs nothing; any other must lie in `noise_range`'s [1e-4, 1e4] (outside it
      1 / z^2 under- or overflows), or `compose` raises `UnsupportedEventError` saying so.

    Several sampling probabilities are combined by the same CLT, mu_clt^2 = sum_t p_t^2 (exp(mu_t^2) - 1): the CLT
    of Dong, Roth and Su (2021, Theorem 5) sums the per-step functionals kl_t ~ p_t^2 (e^{mu_t^2} - 1) / 2 and
    kappa2_t ~ p_t^2 (e^{mu_t^2} - 1) whatever the p_t, and the composition is then
    mu = 2 sum kl / sqrt(sum kappa2) = sqrt(sum_t p_t^2 (e^{mu_t^2} - 1)); it reduces to Corollary 1 for a single
    p. The CLT and exact parts, both GDP, compose as GDP mechanisms do: mu_tot = sqrt(mu_clt^2 + mu_exact^2).

    Any other event (e.g. `LaplaceDpEvent`, `SampledWithoutReplacementDpEvent`, or a Poisson-sampled event whose
    inner event is not a single `GaussianDpEvent`) is rejected with `UnsupportedEventError` by `compose`.

    Warning:
        The GDP CLT can UNDERESTIMATE epsilon (Gopi et al. 2021, arXiv 2106.02848): it is an approximation, not a
        bound. For a rigorous epsilon use `dp_accounting.rdp.RdpAccountant` or `dp_accounting.pld.PLDAccountant`
        on the same events (`keras_dyndp.accounting.make_accountant('rdp')` or `('pld')`).

    Example:
        >>> event = dp_event.PoissonSampledDpEvent(250 / 60000, dp_event.GaussianDpEvent(1.1258165))
        >>> GdpCltAccountant().compose(event, 4800).get_epsilon(1e-5)  # ~1.2
    """

    def __init__(self) -> None:
        super().__init__(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
        self._clt_mu_squared = 0.0
        self._exact_mu_squared = 0.0
        self._non_private = False

    @property
    def mu(self) -> float:
        """GDP parameter mu_tot = sqrt(mu_clt^2 + mu_exact^2) of everything composed so far (inf: non-private)."""
        if self._non_private:
            return math.inf
        return math.sqrt(self._clt_mu_squared + self._exact_mu_squared)

    def _maybe_compose(self, event: dp_event.DpEvent, count: int, do_compose: bool) -> _CompositionErrorDetails | None:
        if isinstance(event, dp_event.NoOpDpEvent):
            return None
        if isinstance(event, dp_event.NonPrivateDpEvent):
            if do_compose and count > 0:
                self._non_private = True
            return None
        if isinstance(event, dp_event.SelfComposedDpEvent):
            return self._maybe_compose(event.event, event.count * count, do_compose)
        if isinstance(event, dp_event.ComposedDpEvent):
            for sub_event in event.events:
                error = self._maybe_compose(sub_event, count, do_compose)
                if error is not None:
                    return error
            return None
        if isinstance(event, dp_event.GaussianDpEvent):
            error = _noise_error(event)
            if error is not None:
                return error
            if do_compose and count > 0:
                self._exact_mu_squared += count * _inverse_square(event.noise_multiplier)
            return None
        if isinstance(event, dp_event.PoissonSampledDpEvent):
            if not isinstance(event.event, dp_event.GaussianDpEvent):
                return _CompositionErrorDetails(
                    invalid_event=event,
                    error_message=(
                        "GdpCltAccountant supports PoissonSampledDpEvent only around a single GaussianDpEvent. "
                        f"Found inner event {event.event}."
                    ),
                )
            error = _noise_error(event.event)
            if error is not None:
                return error
            probability = event.sampling_probability
            if not 0 <= probability <= 1:
                return _CompositionErrorDetails(
                    invalid_event=event,
                    error_message=f"sampling_probability must be in [0, 1]. Found {probability}.",
                )
            if do_compose and count > 0 and probability > 0:
                mu_squared = _inverse_square(event.event.noise_multiplier)
                if probability == 1:
                    self._exact_mu_squared += count * mu_squared
                else:
                    with np.errstate(over="ignore"):
                        per_step = float(np.expm1(mu_squared))
                    self._clt_mu_squared += count * probability**2 * per_step
            return None
        return _CompositionErrorDetails(
            invalid_event=event,
            error_message=(
                "GdpCltAccountant supports only Gaussian, Poisson-sampled Gaussian, NoOp, NonPrivate, "
                f"SelfComposed and Composed events. Found {type(event).__name__}."
            ),
        )

    def get_epsilon(self, target_delta: float) -> float:
        """Returns the GDP-CLT epsilon at `target_delta` (an approximation: see the class warning).

        Args:
            target_delta: Target delta, in [0, 1].

        Returns:
            epsilon >= 0; inf when nothing private is left (non-private events, zero noise, or delta = 0).

        Raises:
            ValueError: If `target_delta` is outside [0, 1].
        """
        target_delta = validation.check_delta(target_delta, "target_delta", allow_ends=True)
        mu = self.mu
        if mu == 0 or (target_delta == 1 and not self._non_private):
            return 0.0
        if math.isinf(mu) or target_delta == 0:
            return math.inf
        return gdp.epsilon_from_mu(mu, target_delta)

    def get_delta(self, target_epsilon: float) -> float:
        """Returns the GDP-CLT delta at `target_epsilon` (an approximation: see the class warning).

        Args:
            target_epsilon: Target epsilon, >= 0 (inf allowed).

        Returns:
            delta in [0, 1]; 1 when non-private events were composed.

        Raises:
            ValueError: If `target_epsilon` is negative or NaN.
        """
        target_epsilon = validation.check_float("target_epsilon", target_epsilon, 0.0, inclusive=True, allow_inf=True)
        mu = self.mu
        if math.isinf(mu):
            return 1.0
        if mu == 0 or math.isinf(target_epsilon):
            return 0.0
        return gdp.delta_from_mu(target_epsilon, mu)


def _noise_error(event: dp_event.GaussianDpEvent) -> _CompositionErrorDetails | None:
    """None if the event's noise multiplier is 0, inf or in `noise_range`'s range; else why not."""
    noise_multiplier = event.noise_multiplier
    if not noise_multiplier >= 0:
        return _CompositionErrorDetails(
            invalid_event=event, error_message=f"noise_multiplier must be >= 0. Found {noise_multiplier}."
        )
    if noise_multiplier in (0, math.inf) or (
        noise_range.MIN_NOISE_MULTIPLIER <= noise_multiplier <= noise_range.MAX_NOISE_MULTIPLIER
    ):
        return None
    return _CompositionErrorDetails(
        invalid_event=event, error_message=noise_range.out_of_range_message(noise_multiplier, None, "gdp_clt")
    )


def _inverse_square(noise_multiplier: float) -> float:
    """1 / z^2, the squared GDP parameter of a Gaussian step; inf for z = 0."""
    if noise_multiplier == 0:
        return math.inf
    return 1.0 / float(noise_multiplier) ** 2
