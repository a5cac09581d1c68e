"""The black-box canary audit (`keras_dyndp.audit.black_box`) on a tiny task: the report, the canaries, refusals."""

import numpy as np
import pytest

import keras_dyndp
from keras_dyndp import audit
from keras_dyndp import backend
from keras_dyndp.audit import black_box
from keras_dyndp.audit import white_box

N, FEATURES, CLASSES = 160, 6, 3


def _data():
    rng = np.random.default_rng(0)
    y = rng.integers(0, CLASSES, size=N)
    x = (rng.standard_normal((N, FEATURES)) + y[:, None]).astype("float32")
    return x, y


def _model():
    keras = backend.keras_module()
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)])


def _optimizer_fn(sizes):
    def make(num_examples):
        sizes.append(num_examples)
        return keras_dyndp.DynamicDPKerasSGD(
            target_epsilon=2.0,
            target_delta=1e-5,
            num_examples=num_examples,
            batch_size=40,
            epochs=2,
            method="dynamic",
            initial_clip=1.0,
            rho_mu=1.25,
            rho_c=1 / 0.3,
            learning_rate=0.5,
        )

    return make


@pytest.mark.parametrize("canaries", black_box.CANARIES)
def test_a_correct_run_reports_bounds_below_its_claim(canaries):
    x, y = _data()
    sizes = []
    report = audit.black_box_audit(
        x, y, model_fn=_model, optimizer_fn=_optimizer_fn(sizes), num_canaries=40, canaries=canaries, epochs=2, seed=1
    )
    print(f"\n{report}")
    assert isinstance(report, white_box.CanaryAuditReport) and report.score == "loss"
    assert report.result.num_canaries == 40 and report.result.confidence == 0.95
    assert report.claimed_epsilon == pytest.approx(2.0, rel=2e-3)
    assert 0.0 <= report.epsilon_one_run < report.claimed_epsilon
    assert 0.0 <= report.epsilon_fdp < report.claimed_epsilon
    included = sizes[0] - (N - 40 if canaries == "mislabeled" else N)  # the kept rows plus the included canaries
    assert 0 < included < 40


def test_mislabeled_canaries_are_held_out_rows_with_a_wrong_label():
    x, y = _data()
    rng = np.random.default_rng(0)
    train_x, train_y, canary_x, canary_y = black_box._make_canaries(  # pylint: disable=protected-access
        x, y, 30, CLASSES, "mislabeled", rng
    )
    assert len(train_y) == N - 30 and len(canary_y) == 30
    rows = [int(np.flatnonzero(np.all(x == row, axis=1))[0]) for row in canary_x]
    assert np.all(canary_y != y[rows])
    assert not {tuple(row) for row in canary_x} & {tuple(row) for row in train_x}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"canaries": "random"}, "`canaries` must be one of"),
        ({"num_canaries": N}, "num_canaries must be < N"),
        ({"num_canaries": 1}, "`num_canaries` must be an integer >= 2"),
        ({"num_classes": 1}, "`num_classes` must be an integer >= 2"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    x, y = _data()
    with pytest.raises(ValueError, match=match):
        audit.black_box_audit(x, y, model_fn=_model, optimizer_fn=_optimizer_fn([]), **kwargs)


def test_float_labels_are_refused():
    x, y = _data()
    with pytest.raises(ValueError, match="integer class labels"):
        audit.black_box_audit(x, y.astype("float32"), model_fn=_model, optimizer_fn=_optimizer_fn([]))
