"""The per-layer ghost-clipping rules both backends share: the one registry (`registry`), the rule contract and
ready-made rules (`layer_rules`), the choice of form per weight (`ghost_cost`), EinsumDense and LoRA as Dense-like steps
(`einsum_equation`, `einsum_lora`), Keras's attention layers (`dense_attention`) and the layers a layer holds
(`sublayers`)."""
