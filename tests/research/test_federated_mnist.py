"""Tests for research.federated_mnist: generated client data and client-level DP training end to end."""

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import flagsaver

from keras_dyndp import datasets
from keras_dyndp.tf_backend import per_example
from research import federated_mnist
from research import run_config
from research import trainer

# The trainers run with --seed here, for reproducible tests; a seeded run's noise seed is known, which warns by design.
pytestmark = pytest.mark.filterwarnings("ignore::keras_dyndp.core.noise_seed.NoiseSeedWarning")


@pytest.mark.parametrize("images_per_client", [1, 2])
def test_client_level_training_end_to_end(images_per_client, capsys):
    with flagsaver.flagsaver(
        base="digits",
        num_clients=200,
        images_per_client=images_per_client,
    ):
        data = federated_mnist.load_data()
        config = run_config.RunConfig(batch_size=8, seed=0, verbose=0, max_steps=2, epochs=1.0)
        result = trainer.train(federated_mnist.make_task(), config)
    assert data.num_train == 200 and data.x_test.shape[-4 if images_per_client == 1 else -5] == 360
    assert result.steps == 2 and result.config.delta == pytest.approx(1 / 2000)
    out = capsys.readouterr().out
    assert "per client (all its images)" in out and "client-level DP" in out


def test_default_sampling_rate_is_the_papers():
    with flagsaver.flagsaver(num_clients=250000):
        assert federated_mnist.make_task().batch_size == 250  # p = 250 / 250000 = 1e-3.


def test_missing_base_set(monkeypatch):
    def missing():
        raise datasets.DataNotFoundError("no mnist here")

    monkeypatch.setattr(federated_mnist.mnist, "load_data", missing)
    with flagsaver.flagsaver(base="mnist"):
        with pytest.raises(datasets.DataNotFoundError, match="no base set found: no mnist here"):
            federated_mnist.load_data()


def client_gradients(model, loss, x, y) -> list[list[np.ndarray]]:
    """Each client's gradient alone (a batch of one client), eagerly: the reference."""
    gradients = []
    for i in range(len(x)):
        with tf.GradientTape() as tape:
            client_loss = tf.reduce_mean(loss(y[i : i + 1], model(x[i : i + 1], training=True)))  # Mean over images.
        gradients.append([g.numpy() for g in tape.gradient(client_loss, model.trainable_variables)])
    return gradients


def test_several_images_per_client_are_clipped_as_one_unit():
    """Batches of 2 and then 1 client, traced as in fit (unknown numbers of clients and images): the ghost path
    (TimeDistributed rules) gives each client one norm, that of the gradient of its MEAN loss over its images,
    and clips the client's whole update."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (2, 3, 28, 28, 1)).astype(np.uint8)
    y = rng.integers(0, 10, (2, 3))
    model = federated_mnist.build_model(datasets.TaskData(x, y, x, y, 10, ""))
    loss = trainer.make_loss_and_metric(federated_mnist.make_task(), private=True)[0]
    ghost = tf.function(
        lambda x, y: per_example.clipped_gradient_sum(
            model, loss, x, y, None, 1e-3, model.trainable_variables, method="ghost"
        ),
        input_signature=[tf.TensorSpec([None, None, 28, 28, 1], tf.uint8), tf.TensorSpec([None, None], tf.int64)],
    )
    gradients = client_gradients(model, loss, x, y)
    expected_norms = np.array([np.sqrt(sum(np.sum(np.square(g)) for g in client)) for client in gradients])
    assert expected_norms.min() > 1e-3  # Every client is clipped.
    for clients in (2, 1):
        sums, norms = ghost(x[:clients], y[:clients])
        np.testing.assert_allclose(norms, expected_norms[:clients], rtol=1e-5)  # One norm per client.
        for j, actual in enumerate(sums):
            expected = sum(client[j] * 1e-3 / norm for client, norm in zip(gradients[:clients], expected_norms))
            np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-9)
