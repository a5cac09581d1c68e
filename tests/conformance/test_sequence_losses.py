"""A causal language model's per-example loss, on every stack: y [B, L] (the next tokens), sample_weight [B, L] (the
padding mask), losses [B, L] per token. Each example's tokens are reduced alone, with its own mask, as Keras's default
reduction weighs them (`keras_dyndp.core.mechanism.per_example_losses`), so one example's whole gradient is clipped to
C.

Measured on the released update of one DP step at sigma 0 and learning rate 1 (S = -(w_1 - w_0) * expected batch
size), against brute-force per-example gradients: each example alone through Keras's own non-private step (SGD at
learning rate 1, Keras's default loss reduction), clipped and summed.
"""

import functools
import warnings

import conformance_backend as backend
import numpy as np
import pytest

import keras_dyndp
from keras_dyndp.schedules import DPSchedule

keras = backend.keras
VOCABULARY, LENGTH, EXPECTED = 11, 6, 2.0
# (path id, optimizer arguments, make_private method)
PATHS = [
    *[(method, {}, method) for method in backend.METHODS],
    ("accumulation", {"accumulation_steps": 2}, backend.METHODS[0]),
]
PATH_IDS = [path[0] for path in PATHS]


def _model():
    """A tiny causal language model (one token's embedding, then logits over the vocabulary), same weights each call."""
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((LENGTH,), dtype="int32"),
            keras.layers.Embedding(VOCABULARY, 4),
            keras.layers.Dense(VOCABULARY, kernel_initializer=keras.initializers.RandomNormal(stddev=2.0)),
        ]
    )


def _batch(lengths):
    """``(x, y, sample_weight)``: token ids, the next tokens and the padding mask of examples of ``lengths`` tokens
    (0: a padding row)."""
    ids = np.random.default_rng(0).integers(1, VOCABULARY, (len(lengths), LENGTH + 1)).astype("int32")
    mask = (np.arange(LENGTH)[None] < np.asarray(lengths)[:, None]).astype("float32")
    return ids[:, :-1] * mask.astype("int32"), ids[:, 1:], mask


def _released_sum(batch, clip_norm, path=PATHS[0]):
    """S of one DP step on ``batch`` from `_model`'s weights (sigma 0), flattened. A path without microbatches runs
    every step of a clip norm on one model (`_shared_model`), set back to its initial weights: a step of SGD at a
    constant (C, 0) schedule depends on nothing else. Microbatches take a fresh model and optimizer per call, so that
    the calls compared draw the same microbatch memberships."""
    if "num_microbatches" in path[1]:
        model = _private_model(clip_norm, path)
    else:
        model, initial = _shared_model(clip_norm, path[0])
        model.set_weights(initial)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # batches not from poisson_batches
        before, after = backend.weights_after_each_step(model, [batch])
    return np.concatenate([(b - a).ravel() for a, b in zip(after, before)]) * EXPECTED


def _private_model(clip_norm, path, num_steps=2):
    """`_model` made private on ``path``, compiled with DP SGD at learning rate 1 and a schedule of ``num_steps``
    steps at (``clip_norm``, 0)."""
    _, optimizer_kwargs, method = path
    model = keras_dyndp.make_private(_model(), method)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sigma 0, noise_seed
        optimizer = keras_dyndp.DynamicDPKerasSGD(
            schedule=DPSchedule(np.full(num_steps, clip_norm), np.zeros(num_steps), 0.5),
            expected_batch_size=EXPECTED,
            learning_rate=1.0,
            allow_degenerate_noise=True,
            noise_seed=0,
            **optimizer_kwargs,
        )
    model.compile(optimizer=optimizer, loss=_per_token_loss())
    return model


@functools.cache
def _shared_model(clip_norm, path_id):
    """``(model, its initial weights)``: one `_private_model` per clip norm and path of `PATHS`, built and traced
    once for every step this module takes with them (at most 8)."""
    model = _private_model(clip_norm, PATHS[PATH_IDS.index(path_id)], num_steps=8)
    return model, model.get_weights()


def _per_token_loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def _brute_force_gradient(x, y, mask):
    """One example's gradient, flattened, from Keras's own step on it alone (SGD at learning rate 1, Keras's
    default reduction of the per-token losses weighted by ``mask``)."""
    model = _model()
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=keras.losses.SparseCategoricalCrossentropy(True))
    before = backend.weights(model)
    model.train_on_batch(x[None], y[None], sample_weight=mask[None])
    return np.concatenate([(b - a).ravel() for a, b in zip(backend.weights(model), before)])


@functools.cache
def _brute_force(lengths):
    """The brute-force per-example gradients of `_batch(lengths)` (rows of a matrix)."""
    return np.stack([_brute_force_gradient(*example) for example in zip(*_batch(lengths))])


LENGTHS = (6, 3, 1, 0)  # examples of 6, 3 and 1 tokens and a padding row


@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
def test_each_example_is_clipped_alone_as_brute_force_per_example_gradients_say(path):
    gradients = _brute_force(LENGTHS)
    norms = np.linalg.norm(gradients, axis=1)
    assert norms[-1] == 0 and np.all(norms[:-1] > 0)
    clip_norm = float(np.median(norms[:-1]))  # the longest and the shortest example on either side of C
    assert np.sum(norms > clip_norm) == 1 and np.sum((norms > 0) & (norms < clip_norm)) == 1
    expected = np.sum(gradients * np.minimum(1, clip_norm / np.maximum(norms, 1e-30))[:, None], axis=0)
    released = _released_sum(_batch(LENGTHS), clip_norm, path)
    np.testing.assert_allclose(released, expected, rtol=2e-4, atol=1e-6 * clip_norm)


def test_one_example_moves_the_release_by_at_most_the_clip_norm():
    """The 6-token example with a small C: removed (its mask all 0, as a Poisson batch pads), S moves by C."""
    x, y, mask = _batch(LENGTHS)
    removed = mask.copy()
    removed[0] = 0
    clip_norm = 0.1 * float(np.min(np.linalg.norm(_brute_force(LENGTHS)[:-1], axis=1)))
    move = np.linalg.norm(_released_sum((x, y, mask), clip_norm) - _released_sum((x, y, removed), clip_norm))
    np.testing.assert_allclose(move, clip_norm, rtol=1e-4)


def test_padding_tokens_add_nothing():
    """Other tokens and targets where the mask is 0 release the same update."""
    x, y, mask = _batch(LENGTHS)
    other = np.random.default_rng(1).integers(1, VOCABULARY, (2, *x.shape)).astype("int32")
    x2, y2 = np.where(mask == 0, other[0], x), np.where(mask == 0, other[1], y)
    assert np.any(x2 != x) and np.any(y2 != y)
    np.testing.assert_array_equal(_released_sum((x, y, mask), 1.0), _released_sum((x2, y2, mask), 1.0))


def test_an_examples_contribution_does_not_depend_on_the_others_token_counts():
    """Example 0's share of S is the same beside a 1-token and a 6-token example: nothing is divided by the batch's
    token count (Keras's 'mean_with_sample_weight' would be)."""
    shares = []
    for other in (1, 6):
        x, y, mask = _batch((5, other))
        without = mask.copy()
        without[0] = 0
        shares.append(_released_sum((x, y, mask), 1e3) - _released_sum((x, y, without), 1e3))
    size = np.linalg.norm(shares[0])
    assert size > 0
    np.testing.assert_allclose(shares[0], shares[1], rtol=1e-4, atol=1e-3 * size)  # float32 weights' differences


def test_poisson_batches_take_a_padding_mask_per_token_and_pad_with_all_zero_rows():
    """``poisson_batches`` with the [N, L] mask as ``sample_weight``: each row of a batch carries its example's mask
    (padding rows all 0), and ``fit`` takes a DP step on each."""
    lengths = [6, 5, 4, 3, 2, 1, 6, 3]
    x, y, mask = _batch(lengths)
    batches = keras_dyndp.poisson_batches(x, y, sample_weight=mask, sampling_probability=0.5, seed=0)
    model = keras_dyndp.make_private(_model(), backend.METHODS[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sigma 0
        optimizer = keras_dyndp.DynamicDPKerasSGD(
            schedule=DPSchedule(np.ones(4), np.zeros(4), 0.5), expected_batch_size=4.0, allow_degenerate_noise=True
        )
    model.compile(optimizer=optimizer, loss=_per_token_loss())
    before = backend.weights(model)
    model.fit(batches, epochs=1, verbose=0)
    assert backend.dp_step(model) == len(batches)
    assert any(np.any(a != b) for a, b in zip(before, backend.weights(model)))
    batch_x, _, weights = (np.asarray(part) for part in next(iter(batches)))
    assert weights.shape == (len(batch_x), LENGTH)
    for row_x, row_weights in zip(batch_x, weights):
        present = [i for i in range(len(x)) if np.array_equal(x[i], row_x) and np.array_equal(mask[i], row_weights)]
        assert present or not np.any(row_weights)


def test_weights_with_more_axes_than_the_losses_are_refused():
    """A [B, L] sample weight beside one loss per example ([B]) cannot weight its entries: refused, naming both (on
    JAX Keras's own build of the compiled loss refuses it first)."""
    model = keras_dyndp.make_private(backend.dense_model(LENGTH, 3), backend.METHODS[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sigma 0
        optimizer = keras_dyndp.DynamicDPKerasSGD(
            schedule=DPSchedule(np.ones(2), np.zeros(2), 0.5), expected_batch_size=EXPECTED, allow_degenerate_noise=True
        )
    model.compile(optimizer=optimizer, loss=backend.loss())
    x, y, mask = np.zeros((4, LENGTH), "float32"), np.zeros((4, 3), "float32"), np.ones((4, LENGTH), "float32")
    ours = r"`sample_weight` must hold one weight per .* axes \(6,\) after the batch"
    keras_own = r"Incompatible shapes for broadcasting"  # Keras 3 on JAX builds its compiled loss first
    with pytest.raises(ValueError, match=ours if backend.BACKEND != "jax" else f"{ours}|{keras_own}"):
        backend.fit_batches(model, [(x, y, mask)])


def test_with_microbatches_removing_one_example_moves_the_release_by_at_most_twice_the_clip_norm():
    """[B, L] padding masks with ``num_microbatches``: each example's tokens reduce to its loss before the rows are
    drawn into microbatches, and a removed example (mask all 0) adds nothing to its microbatch: S moves by at most
    2 C, the microbatch sensitivity, and padding tokens release the same update."""
    x, y, mask = _batch(LENGTHS)
    removed = mask.copy()
    removed[0] = 0
    clip_norm = 0.1 * float(np.min(np.linalg.norm(_brute_force(LENGTHS)[:-1], axis=1)))
    path = ("microbatches", {"num_microbatches": 2}, backend.METHODS[0])
    full = _released_sum((x, y, mask), clip_norm, path)
    assert np.all(np.isfinite(full)) and np.linalg.norm(full) > 0
    move = np.linalg.norm(full - _released_sum((x, y, removed), clip_norm, path))
    assert 0 < move <= 2 * clip_norm * (1 + 1e-4)
    other = np.random.default_rng(1).integers(1, VOCABULARY, x.shape).astype("int32")
    np.testing.assert_array_equal(_released_sum((np.where(mask == 0, other, x), y, mask), clip_norm, path), full)
