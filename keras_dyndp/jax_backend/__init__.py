"""keras_dyndp on Keras 3's JAX backend (``KERAS_BACKEND=jax``): the DP optimizers and ``make_private``.

``keras_dyndp.DynamicDPKerasSGD`` (and Adam, Adagrad, RMSprop) and ``keras_dyndp.make_private`` resolve to this
module's names when Keras runs on JAX, so the same user code trains on either backend:

```python
import os; os.environ["KERAS_BACKEND"] = "jax"
import keras, keras_dyndp
model = keras_dyndp.make_private(model)
model.compile(optimizer=keras_dyndp.DynamicDPKerasSGD(target_epsilon=2.0, target_delta=1e-5, num_examples=60000,
                                                      batch_size=256, epochs=10, method="dynamic",
                                                      initial_clip=1.0, rho_mu=1.25, rho_c=2.0, learning_rate=0.5),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"))
```

The schedules, calibration and accounting are the backend-neutral ones (`keras_dyndp.schedules`,
`keras_dyndp.accounting`); so are the optimizers' arguments and config (`keras_dyndp.optimizer_base`). What is
JAX's own: per-example gradients and norms (`train_step`, `taps`, `ghost`, `microbatches`), the step's mechanism and its
secret keys (`optimizer`), the model check (`model_checks`) and Poisson-sampled batches as a ``keras.utils.PyDataset``
(`data`, behind `keras_dyndp.poisson_batches`). The callbacks are backend-neutral (`keras_dyndp.callbacks`).
Installing ``keras_dyndp[jax]`` pulls no TensorFlow.
"""

from keras_dyndp.batch_sizes import SamplingWarning
from keras_dyndp.jax_backend.data import PoissonBatches
from keras_dyndp.jax_backend.model_checks import check_model
from keras_dyndp.jax_backend.optimizer import DynamicDPKerasAdagrad
from keras_dyndp.jax_backend.optimizer import DynamicDPKerasAdam
from keras_dyndp.jax_backend.optimizer import DynamicDPKerasRMSprop
from keras_dyndp.jax_backend.optimizer import DynamicDPKerasSGD
from keras_dyndp.jax_backend.optimizer import JaxDPOptimizerMixin
from keras_dyndp.jax_backend.optimizer import make_dynamic_dp_optimizer_class
from keras_dyndp.jax_backend.train_step import make_private

__all__ = [
    "DynamicDPKerasAdagrad",
    "DynamicDPKerasAdam",
    "DynamicDPKerasRMSprop",
    "DynamicDPKerasSGD",
    "JaxDPOptimizerMixin",
    "PoissonBatches",
    "SamplingWarning",
    "check_model",
    "make_dynamic_dp_optimizer_class",
    "make_private",
]
