"""The subclassed layers of keras.io's "Text classification with Transformer" example (``TokenAndPositionEmbedding``,
``TransformerBlock``), a learned position embedding and docs/usage.md's rule example, for the layer-rule tests of
each backend (Keras 3; ``keras`` and ``ops`` given, so that tf_keras models can be built too)."""

import pathlib

USAGE = pathlib.Path(__file__).parents[1] / "docs" / "usage.md"


def register(keras_dyndp, classes) -> None:
    """Registers `layers`' ``classes`` with their one-line rules (docs/usage.md)."""
    token_and_position, block, position = classes
    keras_dyndp.register_layer_rule(block, per_example=True)
    rules = keras_dyndp.rules.layer_rules
    keras_dyndp.register_layer_rule(token_and_position, **rules.token_and_position_embedding())
    keras_dyndp.register_layer_rule(position, **rules.added_weight("position_embeddings"))


def documented_rule_example(keras=None, ops=None) -> dict:
    """Runs the rule example of docs/usage.md's "Layer rules" section (it registers its rule); returns its names.
    With ``keras`` and ``ops``, on them instead of its imports (tf_keras on the legacy stack, TensorFlow's functions
    on Keras 2.15)."""
    section = USAGE.read_text().split("## Layer rules")[1]
    code = section.split("```python\n")[1].split("```")[0]
    names = {}
    if keras is not None:
        code = code.replace("import keras\n", "").replace("from keras import ops\n", "")
        names.update(keras=keras, ops=ops)
    exec(code, names)  # pylint: disable=exec-used
    return names


def layers(keras, arange):
    """``(TokenAndPositionEmbedding, TransformerBlock, PositionEmbedding)`` on ``keras`` (``arange(n)``: 0..n-1),
    new classes at each call."""

    class TransformerBlock(keras.layers.Layer):
        def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
            super().__init__()
            self.att = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
            self.ffn = keras.Sequential([keras.layers.Dense(ff_dim, activation="relu"), keras.layers.Dense(embed_dim)])
            self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6)
            self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6)
            self.dropout1 = keras.layers.Dropout(rate)
            self.dropout2 = keras.layers.Dropout(rate)

        def call(self, inputs):
            attn_output = self.att(inputs, inputs)
            attn_output = self.dropout1(attn_output)
            out1 = self.layernorm1(inputs + attn_output)
            ffn_output = self.ffn(out1)
            ffn_output = self.dropout2(ffn_output)
            return self.layernorm2(out1 + ffn_output)

    class TokenAndPositionEmbedding(keras.layers.Layer):
        def __init__(self, maxlen, vocab_size, embed_dim):
            super().__init__()
            self.token_emb = keras.layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
            self.pos_emb = keras.layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

        def call(self, x):
            positions = self.pos_emb(arange(x.shape[-1]))
            return self.token_emb(x) + positions

    class PositionEmbedding(keras.layers.Layer):
        """A learned position embedding: adds an (L, d) weight to its input [B, L, d]."""

        def build(self, input_shape):
            self.position_embeddings = self.add_weight(
                name="position_embeddings", shape=tuple(input_shape[-2:]), initializer="random_normal"
            )

        def call(self, inputs):
            return inputs + self.position_embeddings

    return TokenAndPositionEmbedding, TransformerBlock, PositionEmbedding


def classifier(keras, classes, maxlen=5, vocab_size=12, embed_dim=4, learned_positions=False):
    """The example's model (small; dropout 0, to compare with per-example loops) of `layers`' ``classes``: ids ->
    embeddings -> Transformer block -> mean over positions -> Dense -> 3 logits; with ``learned_positions``, a
    PositionEmbedding after the embeddings."""
    token_and_position, block, position = classes
    inputs = keras.Input(shape=(maxlen,), dtype="int32")
    hidden = token_and_position(maxlen + 2, vocab_size, embed_dim)(inputs)
    if learned_positions:
        hidden = position()(hidden)
    hidden = block(embed_dim, 2, 6, rate=0.0)(hidden)
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Dense(5, activation="tanh")(hidden)))
