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


def test_make_privates_own_fit_is_what_the_checks_see_only_where_keras_received_its_batches():
    """A model class's fit may map over the batches (KerasHub's preprocessing), not re-cut them: what Keras's fit
    received is checked itself unless the backend says it yields the given batches one for one."""
    seen = entry_points.DataSeen()
    given, mapped, recut = object(), object(), object()
    with seen.fit_call(given, lambda received, x: received is x or received is mapped):
        seen.record(iterator=_iterator(types.SimpleNamespace(_dataset=mapped)))  # Keras 3
        assert seen.take() == (entry_points.FIT, given)
        seen.record(iterator=_iterator(types.SimpleNamespace(_dataset=recut)))
        assert seen.take() == (entry_points.FIT, recut)
        assert seen.received_by_fit(mapped) == (entry_points.FIT, given)  # Keras 2: from Keras's fit's frame
        assert seen.received_by_fit(recut) == (entry_points.FIT, recut)
        assert seen.take() is None
    with seen.fit_call(given):  # by default only the given data itself
        assert seen.received_by_fit(mapped) == (entry_points.FIT, mapped)
    assert seen.received_by_fit(given) == (entry_points.FIT, given)  # outside make_private's fit: as received
