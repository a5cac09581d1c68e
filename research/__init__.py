"""The paper's experiments: one trainer for every task, the sweep and the tuned-contender study.

Research code over keras_dyndp, kept apart from the short trainers of examples/ (which show the public API):

* the shared trainer (absl flags -> `RunConfig` -> `train`), a module per job: `research.run_flags` (the flags and
  `config_from_flags`), `research.run_config` (`Task`, `RunConfig`), `research.trainer` (`train`, `run`),
  `research.batches` (Poisson batches, epochs, seeds), `research.checkpoints` (resume), `research.distribute`
  (tf.distribute), `research.results` (`RunResult`, the results CSV, the privacy curve).
* one module per task of the paper, each a `run_config.Task` (data, model, the paper's hyperparameters) and its
  command: `digits`, `mnist`, `fashion_mnist`, `imdb`, `names`, `chest_xray`, `federated_mnist`;
  `research.tasks` lists them for the drivers.
* the data come from the package's offline loaders (`keras_dyndp.datasets`) and the privacy summary from
  `keras_dyndp.run_summary`, as in examples/.
* `research.sweep`: the paper's grid over 1/rho_mu, 1/rho_c, epsilons and seeds (Table 1, Fig. 4).
* `research.study`: does a dynamic schedule beat a tuned vanilla DP-SGD at the same rigorous epsilon?

Run them as modules from the repository root:

    python -m research.mnist --method=dynamic --epsilon=1.2 --results_csv=runs/mnist.csv
    python -m research.sweep --task=digits --methods=vanilla,dynamic --epsilons=1,3 --sweep_dir=/tmp/sweep
    python -m research.study --task=digits --epsilons=1,3 --study_dir=/tmp/study --verbose=0

Importing this package quiets TensorFlow's start-up logs as `examples` does.
"""

import examples  # noqa: F401  (quiets TensorFlow's C++ start-up lines before any research module imports it)
