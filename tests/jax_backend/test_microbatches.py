"""Tests for keras_dyndp.jax_backend.microbatches: random microbatches on the JAX backend, as on TensorFlow."""

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402
from keras_dyndp.jax_backend import microbatches  # noqa: E402

pytestmark = [
    # Tests that measure the clipped sum without noise, and arrays with public_batch_size=True (fixed-size batches
    # by declaration): both warned by design.
    pytest.mark.filterwarnings("ignore::keras_dyndp.optimizer_base.DegenerateNoiseWarning"),
    pytest.mark.filterwarnings("ignore:model.fit received x of type ndarray:keras_dyndp.SamplingWarning"),
]

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(3)])


def _data(num_rows, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(num_rows, 5)).astype("float32") * 3, rng.integers(0, 3, size=num_rows).astype("int32")


def _weighted_losses(model, values, x, y, weights):
    y_pred, _ = model.stateless_call(values, [], x, training=True)
    return LOSS(y, y_pred) * weights


def _brute_force(model, x, y, weights, assignment, num_microbatches, clip_norm):
    """sum_j clip(grad L_j, C) with L_j = (sum of its rows' weighted losses) / (its rows with a non-zero loss)."""
    values = [v.value for v in model.trainable_variables]
    losses = np.asarray(_weighted_losses(model, values, x, y, weights))
    total = [np.zeros(v.shape) for v in values]
    for j in range(num_microbatches):
        members = assignment == j
        count = max(1, int(np.sum(members & (losses != 0))))
        microbatch_loss = lambda values, members=members, count=count: (  # noqa: E731
            jnp.sum(_weighted_losses(model, values, x[members], y[members], weights[members])) / count
        )
        grads = [np.asarray(g, np.float64) for g in jax.grad(microbatch_loss)(values)]
        norm = np.sqrt(sum(np.sum(g**2) for g in grads))
        factor = min(1.0, clip_norm / norm) if norm > 0 else 1.0
        total = [t + factor * g for t, g in zip(total, grads)]
    return total


def _per_example(model, x, y, weights):
    values = [v.value for v in model.trainable_variables]

    def loss(values, x_i, y_i, w_i):
        return _weighted_losses(model, values, x_i[None], y_i[None], w_i[None])[0]

    return jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0))(values, x, y, weights), _weighted_losses(
        model, values, x, y, weights
    )


def test_clipped_sum_equals_clipping_each_microbatch_loss_gradient():
    model = _model()
    x, y = _data(9)
    weights = np.array([1, 1, 0, 1, 1, 0, 1, 1, 1], "float32")  # padding rows count in no microbatch's n_j
    assignment = np.array([0, 2, 2, 0, 0, 3, 2, 0, 2], "int32")  # microbatch 1 is empty
    grads, losses = _per_example(model, x, y, weights)
    got, _ = microbatches.clipped_sum(grads, losses, jnp.asarray(assignment), 4, jnp.float32(0.3))
    want = _brute_force(model, x, y, weights, assignment, 4, 0.3)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-6)


def test_one_added_example_moves_the_clipped_sum_by_at_most_twice_the_clip_norm():
    """The attacker's neighbour: one example of large gradient inserted anywhere, memberships coupled."""
    model = _model(1)
    rng = np.random.default_rng(2)
    clip_norm, num_microbatches = 0.2, 3
    worst = 0.0
    for trial in range(10):
        x, y = _data(8, seed=trial)
        assignment = rng.integers(0, num_microbatches, size=8).astype("int32")
        position = int(rng.integers(0, 9))
        x_new = np.insert(x, position, 50.0 * rng.normal(size=5).astype("float32"), axis=0)
        y_new = np.insert(y, position, int(rng.integers(0, 3)))
        assignment_new = np.insert(assignment, position, int(rng.integers(0, num_microbatches)))
        sums = []
        for xs, ys, a in ((x, y, assignment), (x_new, y_new, assignment_new)):
            weights = np.ones(len(xs), "float32")
            grads, losses = _per_example(model, xs, ys, weights)
            sums.append(microbatches.clipped_sum(grads, losses, jnp.asarray(a), num_microbatches, clip_norm)[0])
        difference = np.sqrt(sum(np.sum((np.asarray(a) - np.asarray(b)) ** 2) for a, b in zip(*sums)))
        worst = max(worst, difference)
    assert worst <= 2 * clip_norm * (1 + 1e-5)
    assert worst > clip_norm  # the bound is approached: the test can fail


def _fit_one_step(model, optimizer, x, y):
    model.compile(optimizer=optimizer, loss=LOSS)
    before = [np.asarray(v.value, np.float64) for v in model.trainable_variables]
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False)
    return [np.asarray(v.value, np.float64) - b for v, b in zip(model.trainable_variables, before)]


def test_fit_applies_the_microbatch_sum_over_m_with_the_drawn_assignment(monkeypatch):
    model = make_private(_model(2))
    x, y = _data(10, seed=3)
    schedule = schedules.DPSchedule(np.array([0.25, 0.25]), np.zeros(2), 0.5)
    optimizer = DynamicDPKerasSGD(
        schedule=schedule, public_batch_size=True, num_microbatches=4, learning_rate=1.0, allow_degenerate_noise=True
    )
    assignment = np.array([3, 0, 1, 1, 3, 0, 0, 2, 3, 1], "int32")
    drawn = []

    def fixed(optimizer_variables, num_rows):
        drawn.append(num_rows)
        return jnp.asarray(assignment)

    monkeypatch.setattr(optimizer, "microbatch_assignment", fixed)
    want = _brute_force(model, x, y, np.ones(10, "float32"), assignment, 4, 0.25)
    updates = _fit_one_step(model, optimizer, x, y)
    assert drawn == [10]
    for update, total in zip(updates, want):
        np.testing.assert_allclose(update, -total / 4, rtol=1e-4, atol=1e-6)


def test_the_noise_on_the_microbatch_sum_is_twice_sigma():
    keras.utils.set_random_seed(0)
    model = make_private(keras.Sequential([keras.Input((100,)), keras.layers.Dense(50, use_bias=False)]))
    schedule = schedules.DPSchedule(np.array([1e-6]), np.array([3.0]), 0.5)
    optimizer = DynamicDPKerasSGD(
        schedule=schedule, public_batch_size=True, num_microbatches=2, learning_rate=1.0, allow_degenerate_noise=True
    )
    model.compile(optimizer=optimizer, loss=keras.losses.MeanSquaredError(reduction="none"))
    before = np.asarray(model.trainable_variables[0].value)
    model.fit(np.ones((8, 100), "float32"), np.zeros((8, 50), "float32"), batch_size=8, epochs=1, verbose=0)
    update = np.asarray(model.trainable_variables[0].value) - before  # -(sum + N(0, (2 * 3)^2)) / 2
    assert np.std(update) == pytest.approx(2 * 3.0 / 2, rel=0.05)


def test_the_assignment_is_uniform_and_fresh_at_every_step():
    optimizer = DynamicDPKerasSGD(
        schedule=schedules.DPSchedule(np.ones(2), np.ones(2), 0.5), public_batch_size=True, num_microbatches=4
    )
    optimizer.build([keras.Variable(np.zeros(3, "float32"))])
    step = optimizer.variables.index(optimizer.iterations)

    def draw(k):  # the assignment of step k
        state = [variable.value if i != step else k for i, variable in enumerate(optimizer.variables)]
        return np.asarray(jax.jit(optimizer.microbatch_assignment, static_argnums=1)(state, 4000))

    first, second = draw(0), draw(1)
    assert np.mean(first == second) < 0.4  # independent draws agree on about 1/4 of the rows
    for assignment in (first, second):
        counts = np.bincount(assignment, minlength=4)
        assert len(counts) == 4 and np.all(np.abs(counts - 1000) < 150)  # 4.9 standard deviations
