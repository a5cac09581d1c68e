"""`GdpCltAccountant`: a `dp_accounting.PrivacyAccountant` that composes by the extended GDP CLT, the paper's
(Corollary 1): mu_tot = p sqrt(sum_t (exp(1 / z_t^2) - 1)), epsilon by the GDP duality (`gdp`). An asymptotic
approximation, not an upper bound: it can UNDERESTIMATE epsilon (Gopi, Lee and Wutschitz 2021, arXiv 2106.02848;
examples: docs/privacy.md); for a guarantee use `keras_dyndp.accounting.make_accountant('rdp' | 'pld')`."""

import math

import dp_accounting
import numpy as np
from dp_accounting import dp_event

from keras_dyndp.accounting import gdp
from keras_dyndp.accounting import noise_range
from keras_dyndp.core import validation

_CompositionErrorDetails = dp_accounting.PrivacyAccountant.CompositionErrorDetails


class GdpCltAccountant(dp_accounting.PrivacyAccountant):
    """Privacy accountant of the extended GDP CLT, under add-or-remove-one neighbours.

    Events, nested in any way through `SelfComposedDpEvent` and `ComposedDpEvent`: `PoissonSampledDpEvent(p,
    GaussianDpEvent(z))` adds p^2 (exp(1 / z^2) - 1) per step to mu_clt^2 (paper Eq. 10; several p combine by the
    same CLT: Dong, Roth and Su 2021, Theorem 5, sums kl_t ~ p_t^2 (e^{mu_t^2} - 1) / 2 and kappa2_t ~ 2 kl_t, so
    mu = 2 sum kl / sqrt(sum kappa2)); `GaussianDpEvent(z)` (and p = 1) compose exactly, mu_exact^2 += 1 / z^2;
    mu_tot = sqrt(mu_clt^2 + mu_exact^2); `NoOpDpEvent` costs nothing, `NonPrivateDpEvent` makes epsilon inf. z = 0
    gives epsilon inf and z = inf costs nothing; another z outside `noise_range`'s [1e-4, 1e4], or another event,
    makes `compose` raise `UnsupportedEventError` saying why.

    Example:
        >>> event = dp_event.PoissonSampledDpEvent(250 / 60000, dp_event.GaussianDpEvent(1.1258165))
        >>> GdpCltAccountant().compose(event, 4800).get_epsilon(1e-5)  # ~1.2
    """

    def __init__(self) -> None:
        super().__init__(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
        self._clt_mu_squared, self._exact_mu_squared, self._non_private = 0.0, 0.0, False

    @property
    def mu(self) -> float:
        """GDP parameter mu_tot = sqrt(mu_clt^2 + mu_exact^2) of everything composed so far (inf: non-private)."""
        return math.inf if self._non_private else math.sqrt(self._clt_mu_squared + self._exact_mu_squared)

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
            errors = (self._maybe_compose(sub_event, count, do_compose) for sub_event in event.events)
            return next((error for error in errors if error is not None), None)  # Composed up to the first error.
        if isinstance(event, (dp_event.GaussianDpEvent, dp_event.PoissonSampledDpEvent)):
            sampled = isinstance(event, dp_event.PoissonSampledDpEvent)
            gaussian = event.event if sampled else event
            if not isinstance(gaussian, dp_event.GaussianDpEvent):
                return _CompositionErrorDetails(
                    event,
                    "GdpCltAccountant supports PoissonSampledDpEvent only around a single GaussianDpEvent. "
                    f"Found inner event {event.event}.",
                )
            error = _noise_error(gaussian)
            if error is not None:
                return error
            probability = event.sampling_probability if sampled else 1
            if not 0 <= probability <= 1:
                return _CompositionErrorDetails(event, f"sampling_probability must be in [0, 1]. Found {probability}.")
            if do_compose and count > 0 and probability > 0:
                z = gaussian.noise_multiplier  # mu^2 = 1 / z^2 of a Gaussian step, inf for z = 0.
                mu_squared = math.inf if z == 0 else 1.0 / float(z) ** 2
                if probability == 1:
                    self._exact_mu_squared += count * mu_squared
                else:
                    with np.errstate(over="ignore"):
                        per_step = float(np.expm1(mu_squared))
                    self._clt_mu_squared += count * probability**2 * per_step
            return None
        return _CompositionErrorDetails(
            event,
            "GdpCltAccountant supports only Gaussian, Poisson-sampled Gaussian, NoOp, NonPrivate, "
            f"SelfComposed and Composed events. Found {type(event).__name__}.",
        )

    def get_epsilon(self, target_delta: float) -> float:
        """GDP-CLT epsilon >= 0 at `target_delta` in [0, 1]; inf for non-private events, zero noise or delta 0."""
        target_delta = validation.check_delta(target_delta, "target_delta", allow_ends=True)
        mu = self.mu
        if mu == 0 or (target_delta == 1 and not self._non_private):
            return 0.0
        if math.isinf(mu) or target_delta == 0:
            return math.inf
        return gdp.epsilon_from_mu(mu, target_delta)

    def get_delta(self, target_epsilon: float) -> float:
        """GDP-CLT delta in [0, 1] at `target_epsilon` >= 0 (inf allowed); 1 after non-private events."""
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
        return _CompositionErrorDetails(event, f"noise_multiplier must be >= 0. Found {noise_multiplier}.")
    if noise_multiplier in (0, math.inf) or (
        noise_range.MIN_NOISE_MULTIPLIER <= noise_multiplier <= noise_range.MAX_NOISE_MULTIPLIER
    ):
        return None
    return _CompositionErrorDetails(event, noise_range.out_of_range_message(noise_multiplier, None, "gdp_clt"))
