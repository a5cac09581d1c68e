"""research.digits: the digits task with its default flags learns within its budget; its CNN."""

import numpy as np
import pytest

from keras_dyndp import datasets
from research import digits
from research import run_config
from research import trainer

# The trainers run with --seed here, for reproducible tests; a seeded run's noise seed is known, which warns by design.
pytestmark = pytest.mark.filterwarnings("ignore::keras_dyndp.core.noise_seed.NoiseSeedWarning")


def test_default_dynamic_run_learns_within_budget():
    result = trainer.train(digits.make_task(), run_config.RunConfig(seed=0, verbose=0))
    assert result.config.method == "dynamic" and result.config.epsilon == 3.0
    assert result.steps == result.total_steps
    assert result.epsilon_gdp_clt <= 3.0 + 1e-9
    assert result.test_accuracy > 0.8


def test_the_cnn_maps_8x8_images_to_one_logit_per_class():
    model = digits.build_model(datasets.TaskData(*[np.zeros((2, 8, 8, 1))] * 4, num_classes=10, description=""))
    assert [type(layer).__name__ for layer in model.layers] == [
        "Conv2D",
        "MaxPooling2D",
        "Flatten",
        "Dense",
        "Dense",
    ]
    logits = model(np.zeros((3, 8, 8, 1), "float32"))
    assert tuple(logits.shape) == (3, 10)
    assert model.layers[-1].get_config()["activation"] == "linear"  # logits, for from_logits=True losses
