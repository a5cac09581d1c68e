"""vectorized: per-example clipping by tf.vectorized_map (or tf.map_fn where pfor fails) on any model."""

import pathlib

import pytest

JOB = pathlib.Path(__file__).with_name("transformer_job.py")


@pytest.mark.parametrize("method", ["auto", "vectorized", "ghost", "jacobian"])
def test_a_transformer_trains_by_every_method_and_never_kills_the_process(example_server, method):
    """Keras 3's MultiHeadAttention and EinsumDense under tf.vectorized_map killed the process with a segmentation
    fault at batch 32: every method must train (each example clipped: the update's norm at most C = 1 times the
    steps over p N), in a process (forked from the one that imported TensorFlow) that exits cleanly."""
    result = example_server.run(str(JOB), [method], timeout=300)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    outcome, _, detail = result.stdout.strip().splitlines()[-1].partition(" ")
    assert outcome == "trained", detail  # 'ghost' and 'auto' by the EinsumDense and LayerNormalization rules
    assert 0 < float(detail) <= 32 * 1.0 / 16 * (1 + 1e-5)  # at most B C / (p N), learning rate 1


def test_a_refusal_raised_in_one_examples_pass_leaves_no_variable_scope_behind():
    """tf.map_fn (the path of recurrent models) sets the variable scope's caching device until it returns: a refusal
    raised inside one example's pass (here a [B, L] weight beside [B] losses) left it set, and every later
    ``strategy.scope()`` of the process failed ("Caching devices is not yet supported when eager execution")."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import keras_dyndp  # pylint: disable=import-outside-toplevel
    from keras_dyndp.tf_backend.keras_compat import keras  # pylint: disable=import-outside-toplevel

    model = keras_dyndp.make_private(
        keras.Sequential([keras.Input((4, 2)), keras.layers.LSTM(3), keras.layers.Dense(2)]), "vectorized"
    )
    schedule = keras_dyndp.DPSchedule(np.ones(4), np.ones(4), 0.5)
    model.compile(
        keras_dyndp.DynamicDPKerasSGD(schedule=schedule, expected_batch_size=2.0),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
    )
    x, y, mask = np.ones((2, 4, 2), np.float32), np.zeros(2, np.int32), np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match="sample_weight"):
        model.train_on_batch(x, y, sample_weight=mask)
    assert tf.compat.v1.get_variable_scope().caching_device is None
    devices = [device.name for device in tf.config.list_logical_devices("CPU")][:2]
    with tf.distribute.MirroredStrategy(devices).scope():  # failed after the refusal
        keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
