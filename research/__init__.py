"""The paper's experiments over keras_dyndp (research/README.md has their commands and the tasks' table).

* the shared trainer (absl flags -> `RunConfig` -> `train`), a module per job: `run_flags` (the flags and
  `config_from_flags`), `run_config` (`Task`, `RunConfig`), `trainer` (`train`, `run`), `batches` (Poisson batches,
  epochs, seeds), `checkpoints` (resume), `distribute` (tf.distribute), `results` (`RunResult`, the results CSV,
  the privacy curve);
* one module per task of the paper, each a `run_config.Task` (data, model, the paper's hyperparameters) and its
  command: `digits`, `mnist`, `fashion_mnist`, `imdb`, `names`, `chest_xray`, `federated_mnist`; `tasks` lists
  them for the drivers: `sweep` (the paper's grid over 1/rho_mu, 1/rho_c, epsilons and seeds: Table 1, Fig. 4) and
  `study` (does a dynamic schedule beat a tuned vanilla DP-SGD at the same rigorous epsilon?).

Importing this package quiets TensorFlow's start-up logs as `examples` does.
"""

import examples  # noqa: F401  (quiets TensorFlow's C++ start-up lines before any research module imports it)
