"""Tests for keras_dyndp.rules.einsum_lora: a LoRA EinsumDense's adapters as the rank equation and B along one output
axis, against numpy's einsum of the merged kernel."""

import numpy as np
import pytest

from keras_dyndp.rules import einsum_lora


@pytest.mark.parametrize(
    "equation, input_shape, kernel_shape",
    [
        ("abc,cd->abd", (2, 5, 4), (4, 3)),
        ("abc,cde->abde", (2, 5, 4), (4, 2, 3)),  # MultiHeadAttention's query projection
        ("abcd,cde->abe", (2, 5, 2, 3), (2, 3, 4)),  # its output projection
        ("...b,bc->...c", (2, 3, 6, 4), (4, 5)),  # two elided axes
        ("ab,bc->ac", (2, 4), (4, 3)),
        ("abc,ced->abde", (2, 5, 4), (4, 3, 2)),  # the kernel's last letter before another output letter
    ],
)
def test_the_rank_equation_then_b_is_the_merged_kernels_einsum(equation, input_shape, kernel_shape):
    rng = np.random.default_rng(0)
    x = rng.normal(size=input_shape)
    a = rng.normal(size=(*kernel_shape[:-1], 2))
    b = rng.normal(size=(2, kernel_shape[-1]))
    plan = einsum_lora.lora_plan(equation, len(input_shape))
    u = np.einsum(plan.rank_equation, x, a)
    applied = np.moveaxis(np.moveaxis(u, plan.axis, -1) @ b, -1, plan.axis)
    np.testing.assert_allclose(applied, np.einsum(equation, x, a @ b), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("equation", ["abc,dc->adb", "abc,cd->abc", "abc,cdd->abd"])
def test_a_kernel_ending_in_no_single_output_letter_has_no_plan(equation):
    assert einsum_lora.lora_plan(equation, 3) is None
