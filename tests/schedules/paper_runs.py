"""The paper's MNIST run (p 250/60000, T 4800, delta 1e-5) calibrated as the schedules tests use it."""

from keras_dyndp import schedules

P = 250 / 60000
T = 4800
DELTA = 1e-5


def calibrate(method, epsilon=1.2, **kwargs):
    """The paper's calibration (GDP-CLT) unless `accountant` is given: its worked numbers are exact there."""
    args = dict(
        target_epsilon=epsilon,
        target_delta=DELTA,
        sampling_probability=P,
        num_steps=T,
        initial_clip=1.5,
        rho_mu=1 / 0.3,
        rho_c=1 / 0.5,
        accountant="gdp_clt",
    )
    args.update(kwargs)
    return schedules.calibrate(method, **args)
