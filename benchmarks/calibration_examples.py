"""docs/accounting.md's calibration examples (delta 1e-5, constant clip 1): ``(name, calibrate_shape arguments)``,
timed by `benchmarks/accounting.py --calibration_examples` and recomputed by `benchmarks/doc_numbers.py`."""

import numpy as np

# The calibration examples: (name, calibrate_shape arguments); delta 1e-5, constant clip 1.
_BOOSTED_END = np.ones(4800)
_BOOSTED_END[-5:] = 3.0
EXAMPLES = (
    ("vanilla p 0.01, T 20, eps 1", dict(mu_shape=1.0, target_epsilon=1.0, sampling_probability=0.01, num_steps=20)),
    (
        "vanilla p 0.00427, T 500, eps 1",
        dict(mu_shape=1.0, target_epsilon=1.0, sampling_probability=256 / 60000, num_steps=500),
    ),
    (
        "dynamic 1/rho_mu 0.8 (the noise multipliers of growing mu), p 256/60000, T 4688, eps 8",
        dict(
            mu_shape=lambda t: 1.25 ** (t / 4688), target_epsilon=8.0, sampling_probability=256 / 60000, num_steps=4688
        ),
    ),
    (
        "last 5 steps at 3x mu, p 250/60000, T 4800, eps 1",
        dict(mu_shape=_BOOSTED_END, target_epsilon=1.0, sampling_probability=250 / 60000, num_steps=4800),
    ),
    (
        "growing mu 1/rho_mu 0.1, p 250/60000, T 4800, eps 1.2",
        dict(
            mu_shape=lambda t: 10.0 ** (t / 4800), target_epsilon=1.2, sampling_probability=250 / 60000, num_steps=4800
        ),
    ),
)
