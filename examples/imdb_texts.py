"""IMDB reviews for the text fine-tuning examples (imdb_transformer, hub_finetune): the private training reviews, a
public share of the test split and the evaluation share, as word ids of a vocabulary counted on the public reviews
only, and a Keras callback timing the steps.

IMDB's test reviews are of other movies than its training reviews (aclImdb's README), so the public and private sets
are disjoint; calling the test reviews public is the simulation's premise (they are published with the data set), as
it would be for a public pretraining corpus. Nothing is downloaded (`keras_dyndp.datasets.load_imdb_texts`).
"""

import collections
import re
import time

import numpy as np

from keras_dyndp import datasets


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower().replace("<br />", " "))


def vectorizer(public_texts: np.ndarray, max_tokens: int, sequence_length: int):
    """``texts -> int32 [n, sequence_length]`` word ids: lower-cased words, ids 2.. by frequency in ``public_texts``
    (at most ``max_tokens`` ids in all; 0 padding, 1 out of vocabulary), cut or padded to ``sequence_length``. Its
    ``words(ids)`` is the text of word ids (padding left out; an id of no word: <unknown>)."""
    counts = collections.Counter(word for text in public_texts for word in _words(text))
    ids = {word: i + 2 for i, (word, _) in enumerate(counts.most_common(max_tokens - 2))}

    def vectorize(texts: np.ndarray) -> np.ndarray:
        out = np.zeros((len(texts), sequence_length), np.int32)
        for row, text in enumerate(texts):
            tokens = [ids.get(word, 1) for word in _words(text)][:sequence_length]
            out[row, : len(tokens)] = tokens
        return out

    words = {i: word for word, i in ids.items()}
    vectorize.words = lambda row: " ".join(words.get(int(i), "<unknown>") for i in row if i)
    return vectorize


def imdb_splits(imdb_dir: str | None, data_dir: str | None, public_fraction: float) -> dict:
    """``{"private", "public", "evaluation"}`` -> (texts as str, int labels): IMDB's training split
    (private), a seeded ``public_fraction`` of its test split (public) and the rest of it (evaluation)."""
    (train_x, train_y), (test_x, test_y), source = datasets.load_imdb_texts(imdb_dir, data_dir)
    text = lambda texts: np.array([t.decode() if isinstance(t, bytes) else str(t) for t in texts], object)  # noqa: E731
    order = np.random.default_rng(0).permutation(len(test_y))
    cut = int(round(public_fraction * len(test_y)))
    public, evaluation = order[:cut], order[cut:]
    test_x, test_y = text(test_x), np.asarray(test_y)
    print(
        f"imdb from {source}: {len(train_y)} private training / {len(public)} public (of the test split) / "
        f"{len(evaluation)} evaluation reviews; vocabulary from the public reviews"
    )
    return {
        "private": (text(train_x), np.asarray(train_y)),
        "public": (test_x[public], test_y[public]),
        "evaluation": (test_x[evaluation], test_y[evaluation]),
    }


def step_timer(keras):
    """A ``keras.callbacks.Callback`` whose ``intervals`` are the seconds between consecutive training steps within
    an epoch (the first two of each, compiling, excluded)."""

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.intervals, self._last = [], None

        def on_epoch_begin(self, epoch, logs=None):
            self._last = None

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self._last is not None and batch > 1:
                self.intervals.append(now - self._last)
            self._last = now

    return StepTimer()
