"""The contenders of `research.study`: each a schedule method and the hyperparameters its search draws."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Contender:
    """One way to train: a schedule method, and what its own coordinates of the search draw.

    Attributes:
      method: the schedule method (`research.run_flags.METHODS`).
      parameters: the `RunConfig` fields set from the draw's coordinates 2, 3, ... as inverse ratios (1 / value).
      rescale_to_unit_norm: divide the noisy sum by C_t (its learning rate is then scaled by C_0).
      adaptive_clipping: clip adaptively from C_0 (`keras_dyndp.AdaptiveClipping`'s defaults, the paper's: the
        median, learning rate 0.2, count noise n / 20); it draws no coordinates of its own.
    """

    method: str
    parameters: tuple[str, ...] = ()
    rescale_to_unit_norm: bool = False
    adaptive_clipping: bool = False


CONTENDERS = {
    "vanilla": Contender("vanilla"),
    "vanilla_lr_decay": Contender("vanilla", ("lr_decay",)),
    "sensitivity_decay": Contender("sensitivity_decay", ("rho_c",)),
    "growing_mu": Contender("growing_mu", ("rho_mu",)),
    "dynamic": Contender("dynamic", ("rho_mu", "rho_c")),
    "dynamic_rescaled": Contender("dynamic", ("rho_mu", "rho_c"), rescale_to_unit_norm=True),
    # Andrew, Thakkar, McMahan, Ramaswamy (NeurIPS 2021): the vanilla schedule's noise, C_t adapted to the median.
    "adaptive": Contender("vanilla", adaptive_clipping=True),
}
