"""The conformance suite's view of the stack it runs on, through keras_dyndp's public API only.

`test_dp_invariants` is written once; this module gives it what differs between TensorFlow (Keras 2 or 3) and
JAX: the Keras module, the per-example clipping methods ``make_private`` takes, the error types a refused step
raises, and small helpers (a tiny model, one DP step through ``fit`` on exactly the given rows, the weights).
"""

import numpy as np

import keras_dyndp

BACKEND = keras_dyndp.keras_backend()
if BACKEND == "jax":
    import keras

    METHODS = ("vectorized", "ghost")
    STEP_REFUSALS: tuple[type[BaseException], ...] = (RuntimeError,)
else:
    import tensorflow as tf

    from keras_dyndp.tf_backend.keras_compat import keras  # tf.keras on Keras 2, keras on Keras 3.

    METHODS = ("vectorized", "ghost")
    # A refusal inside the traced step is a TensorFlow assertion.
    STEP_REFUSALS = (RuntimeError, tf.errors.InvalidArgumentError)

KERAS_MAJOR = 3 if hasattr(keras, "ops") else 2  # tf.keras 2.x has no keras.ops (nor __version__)


def loss():
    """Mean squared error per example (no reduction over the batch), as make_private needs."""
    return keras.losses.MeanSquaredError(reduction="none")


def dense_model(num_inputs: int = 5, num_outputs: int = 3, seed: int = 0):
    """A linear regression (one Dense layer), with the same initial weights for the same seed."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((num_inputs,)), keras.layers.Dense(num_outputs)])


class Batches(keras.utils.Sequence):
    """Exactly the given batches, in order: ``fit`` refuses arrays for an optimizer with ``expected_batch_size``
    (they are not Poisson batches), and takes a Sequence with a SamplingWarning (filtered by the suite)."""

    def __init__(self, batches):
        super().__init__()
        self._batches = [tuple(part for part in batch if part is not None) for batch in batches]

    def __len__(self):
        return len(self._batches)

    def __getitem__(self, index):
        return self._batches[index]


def fit_batches(model, batches, **kwargs):
    """``model.fit`` on exactly ``batches`` (tuples x, y[, sample_weight]), one DP step each.

    TensorFlow gets a ``tf.data.Dataset``: Keras 2 gives a Sequence's batches no static shape at all, where ghost
    clipping cannot prove its taps' rows and ``method='ghost'`` refuses the model."""
    if BACKEND == "jax":
        return model.fit(Batches(batches), epochs=1, verbose=0, shuffle=False, **kwargs)
    parts = [tuple(part for part in batch if part is not None) for batch in batches]
    dataset = tf.data.Dataset.from_tensors(parts[0])
    for batch in parts[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
    return model.fit(dataset, epochs=1, verbose=0, shuffle=False, **kwargs)


def weights(model):
    """The model's weights as float64 numpy arrays."""
    return [np.asarray(w, np.float64) for w in model.get_weights()]


class _WeightsAfterEachStep(keras.callbacks.Callback):
    def __init__(self, record):
        super().__init__()
        self._record = record

    def on_train_batch_end(self, batch, logs=None):
        self._record.append(weights(self.model))


def weights_after_each_step(model, batches):
    """[w_0, w_1, ...]: the weights before the first batch and after each (one ``fit``, one DP step a batch)."""
    record = [weights(model)]
    fit_batches(model, batches, callbacks=[_WeightsAfterEachStep(record)])
    return record


def dp_step(model) -> int:
    """The optimizer's DP step counter."""
    return (
        int(keras.ops.convert_to_numpy(model.optimizer.dp_step))
        if KERAS_MAJOR == 3
        else int(model.optimizer.dp_step.numpy())
    )


def optimizer_variables(optimizer):
    """The optimizer's variables (a property on Keras 3 and Keras 2's optimizers, a method on legacy ones)."""
    variables = optimizer.variables
    return variables() if callable(variables) else variables
