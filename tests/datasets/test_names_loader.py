"""Tests for keras_dyndp.datasets.names: the public encoding of surnames (the loader runs through the research
trainer in tests/research/test_text_and_image_tasks.py)."""

from keras_dyndp.datasets import names


def test_names_encoding_is_left_padded_ascii():
    ids = names.encode(["Zoë", "Ab"], 4)
    assert ids.tolist()[1][:2] == [0, 0] and ids[1, 2] == names.ALPHABET.index("A") + 1
    assert ids[0, 1:].tolist() == [names.ALPHABET.index(c) + 1 for c in "Zoe"]
    assert names.encode(["x€"], 2)[0, 1] == names.NUM_CHAR_IDS - 1
