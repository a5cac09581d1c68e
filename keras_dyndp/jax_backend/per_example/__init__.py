"""Per-example clipping on JAX beside ``jax.vmap``: the taps that record a layer's input and output gradient (`taps`),
the built-in ghost-clipping rules registered into the one registry, `keras_dyndp.rules.registry` (`rules`), and Keras
3's LoRA adapters (`lora`): the counterparts of `keras_dyndp.tf_backend.per_example`'s modules of the same names."""
