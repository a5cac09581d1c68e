"""keras_compat: the Keras-version-dependent helpers behave as the rest of the package expects, on Keras 2 and 3."""

import numpy as np
import tensorflow as tf

from keras_dyndp.tf_backend import keras_compat

keras = keras_compat.keras


def test_the_keras_in_use_is_tf_keras_and_its_version_is_known():
    assert keras_compat.keras.Model is tf.keras.Model  # The same classes as tf.keras, on both versions.
    assert keras_compat.KERAS_MAJOR_VERSION in (2, 3)
    if keras_compat.KERAS_MAJOR_VERSION == 3:
        assert keras.__version__.startswith("3.") and keras.backend.backend() == "tensorflow"
    assert hasattr(keras, "saving")


def test_per_example_losses_are_told_from_reduced_ones():
    loss_class = keras.losses.SparseCategoricalCrossentropy
    assert keras_compat.is_per_example_loss(loss_class(reduction="none"))
    assert not keras_compat.is_per_example_loss(loss_class())
    assert not keras_compat.is_per_example_loss(loss_class(reduction="sum"))


def test_apply_base_update_applies_the_update_rule_and_counts_the_step():
    optimizer = keras.optimizers.SGD(learning_rate=0.5)
    variable = tf.Variable([1.0, 2.0])
    iterations = keras_compat.apply_base_update(optimizer, [(tf.constant([2.0, -2.0]), variable)])
    np.testing.assert_allclose(variable.numpy(), [0.0, 3.0])
    assert int(optimizer.iterations.numpy()) == 1
    assert int(tf.convert_to_tensor(iterations)) == 1  # The counter (Keras 2: the value its increment returns).


def test_loss_scale_optimizers_are_unwrapped():
    inner = keras.optimizers.SGD()
    wrapped = keras_compat.LOSS_SCALE_OPTIMIZER_CLASSES[0](inner)
    assert keras_compat.unwrap_optimizer(wrapped) is inner
    assert keras_compat.unwrap_optimizer(inner) is inner
    assert keras_compat.unwrap_optimizer(None) is None
    inner = keras.optimizers.SGD()  # An optimizer is wrapped once at most.
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=inner, loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert keras_compat.unwrap_optimizer(model.optimizer) is inner  # compile wrapped it.


def test_model_helpers():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2), keras.Sequential([keras.layers.Dense(1)])])
    model(tf.zeros([3, 4]))
    assert keras_compat.input_signature(model).shape.as_list() == [None, 4]
    layers = list(keras_compat.flatten_layers(model))
    assert model not in layers and sum(isinstance(layer, keras.layers.Dense) for layer in layers) == 2  # Nested.
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight((tf.zeros([3, 4]), tf.ones([3])))
    assert y.shape == [3] and sample_weight is None
    assert keras_compat.steps_per_execution(model) is None  # Not compiled.
    model.compile(loss="mse", steps_per_execution=3)
    assert keras_compat.steps_per_execution(model) == 3
    keras_compat.set_steps_per_execution(model, 1)
    assert keras_compat.steps_per_execution(model) == 1
    model.train_function = lambda iterator: None
    keras_compat.reset_train_function(model)
    assert model.train_function is None
    assert keras.layers.BatchNormalization in keras_compat.BATCH_NORM_CLASSES


def test_set_steps_per_execution_takes_effect_within_fit_and_restores_the_train_function():
    x, y = np.zeros((12, 4), np.float32), np.zeros((12, 2), np.float32)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(), loss="mse", steps_per_execution=4)
    model.fit(x, y, batch_size=1, epochs=1, verbose=0)  # Builds the train function for 4 steps a call.
    original = model.train_function
    steps_taken = []

    class ShortenOnce(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self._before = int(model.optimizer.iterations.numpy())
            if batch == 4:  # The second call runs one step only.
                keras_compat.set_steps_per_execution(model, 1)

        def on_train_batch_end(self, batch, logs=None):
            steps_taken.append(int(model.optimizer.iterations.numpy()) - self._before)
            if batch == 4 or len(steps_taken) == 2:
                model.stop_training = True

    model.fit(x, y, batch_size=1, epochs=1, verbose=0, callbacks=[ShortenOnce()])
    assert steps_taken[:2] == [4, 1]
    keras_compat.set_steps_per_execution(model, 4)
    assert keras_compat.steps_per_execution(model) == 4
    if keras_compat.KERAS_MAJOR_VERSION >= 3:
        assert model.train_function is original  # No retrace for the restored value.


def test_unsupported_optimizer_arguments_name_a_reason():
    for name, reason in keras_compat.UNSUPPORTED_OPTIMIZER_ARGUMENTS.items():
        assert name in ("gradient_accumulation_steps", "loss_scale_factor") and reason
    if keras_compat.KERAS_MAJOR_VERSION == 2:
        assert not keras_compat.UNSUPPORTED_OPTIMIZER_ARGUMENTS


def test_run_progress_bar_counts_steps_and_the_run_s_epochs(capsys):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((12, 2), np.float32), np.ones((12, 1), np.float32)
    bar = keras_compat.RunProgressBar(5)
    model.fit(x, y, batch_size=4, epochs=3, initial_epoch=2, verbose=1, callbacks=[bar])
    out = capsys.readouterr().out
    assert "Epoch 3/5" in out and "3/3" in out and "Epoch 3/3" not in out  # 3 steps of the run's 5 epochs
