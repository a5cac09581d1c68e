"""Tests of keras_dyndp.keras_glue.entry_points (no backend: fake data adapters stand in for Keras 3's)."""

import types

from keras_dyndp.keras_glue import entry_points


def _iterator(adapter):
    return types.SimpleNamespace(data_adapter=adapter)


def test_fit_input_comes_from_each_kind_of_data_adapter():
    seen = entry_points.DataSeen()
    sequence, generator, dataset = object(), object(), object()
    for adapter, expected in (
        (types.SimpleNamespace(py_dataset=sequence), sequence),  # PyDatasetAdapter
        (types.SimpleNamespace(generator=generator), generator),  # GeneratorDataAdapter
        (types.SimpleNamespace(_inputs=("x", "y")), "x"),  # ArrayDataAdapter: x of (x, y)
        (types.SimpleNamespace(_inputs="x"), "x"),  # ArrayDataAdapter: x alone (no y, no sample weight)
        (types.SimpleNamespace(_dataset=dataset), dataset),  # TFDatasetAdapter
    ):
        seen.record(iterator=_iterator(adapter))
        assert seen.take() == (entry_points.FIT, expected)


def test_what_was_seen_is_taken_once_and_nothing_seen_is_none():
    seen = entry_points.DataSeen()
    assert seen.take() is None
    seen.record(data_batch=("x", "y"))
    assert seen.take() == (entry_points.TRAIN_ON_BATCH, "x")
    assert seen.take() is None


def test_the_batch_as_the_user_gave_it_is_kept_over_the_converted_one():
    """make_private's own train_on_batch records the user's batch; JAX's conversion of it, recorded after, must not
    replace it (the check must see what the user passed)."""
    seen = entry_points.DataSeen()
    seen.record_call(entry_points.TRAIN_ON_BATCH, "user's x")
    seen.record(data_batch=("converted x", "y"))
    assert seen.take() == (entry_points.TRAIN_ON_BATCH, "user's x")
    seen.record_call(entry_points.FIT, "arrays")
    seen.record(iterator=_iterator(types.SimpleNamespace(_inputs=("x", "y"))))  # fit's own data wins
    assert seen.take() == (entry_points.FIT, "x")
