"""Training data for the DP optimizers: Poisson batches (`sampling`, behind `keras_dyndp.poisson_batches`) and examples
read on demand from files, array records and tfds (`sources`). The paper's datasets are in `keras_dyndp.datasets`."""
