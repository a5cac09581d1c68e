"""einsum_equation: which EinsumDense equations read as a Dense over positions, and the plan's permutations (checked
against numpy's einsum: each example's kernel gradient a_i^T g_i, put back in the kernel's order)."""

import numpy as np
import pytest

from keras_dyndp.rules import einsum_equation

KERNEL_SHAPES = {
    "abc,cd->abd": (4, 3),
    "abc,cde->abde": (4, 2, 3),
    "abcd,cde->abe": (2, 4, 3),
    "ab,bc->ac": (4, 3),
    "abc,dc->adb": (4, 3),
    "...b,bc->...c": (4, 3),
    "ab...,bc->ac...": (5, 3),
    "abc,c->ab": (4,),
}


@pytest.mark.parametrize("equation", sorted(KERNEL_SHAPES))
def test_the_plan_gives_each_examples_kernel_gradient(equation):
    rng = np.random.default_rng(0)
    kernel_shape = KERNEL_SHAPES[equation]
    inputs = {
        "abc,cd->abd": (2, 5, 4),
        "abc,cde->abde": (2, 5, 4),
        "abcd,cde->abe": (2, 5, 2, 4),
        "ab,bc->ac": (2, 4),
        "abc,dc->adb": (2, 5, 3),
        "...b,bc->...c": (2, 6, 4),
        "ab...,bc->ac...": (2, 5, 6),
        "abc,c->ab": (2, 5, 4),
    }[equation]
    x = rng.normal(size=inputs)
    plan = einsum_equation.plan(equation, kernel_shape, len(inputs))
    assert plan is not None
    output = np.einsum(equation, x, np.zeros(kernel_shape))
    g = rng.normal(size=output.shape)
    for i in range(2):  # each example's gradient of <g_i, einsum(x_i, K)> with respect to K
        a = np.transpose(x[i : i + 1], plan.input_order).reshape(-1, plan.fan_in)
        b = np.transpose(g[i : i + 1], plan.output_order).reshape(-1, plan.fan_out)
        actual = np.transpose((a.T @ b).reshape(plan.gradient_shape), plan.kernel_order)
        eps = 1e-6
        numeric = np.zeros(kernel_shape)
        for index in np.ndindex(*kernel_shape):
            bump = np.zeros(kernel_shape)
            bump[index] = eps
            numeric[index] = np.sum(g[i] * np.einsum(equation, x[i : i + 1], bump)[0]) / eps
        np.testing.assert_allclose(actual, numeric, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(
    "equation,kernel_shape,rank",
    [
        ("ab,ac->bc", (2, 3), 2),  # the batch letter in the kernel
        ("abc,cd->bd", (4, 3), 3),  # the batch summed away
        ("abc,cd->bad", (4, 3), 3),  # the batch not leading the output
        ("abc,bcd->abd", (5, 4, 3), 3),  # a letter in all three operands
        ("abc,cd->ad", (4, 3), 3),  # a position summed without the kernel
        ("abc,cd->abde", (4, 3), 3),  # an axis broadcast in
        ("abc,cde->abd", (4, 3, 2), 3),  # a kernel axis summed away
        ("abb,bc->abc", (4, 3), 3),  # a diagonal
        ("ab,b...->a...", (4,), 2),  # an ellipsis in the kernel
    ],
)
def test_equations_that_mix_examples_or_are_no_dense_have_no_plan(equation, kernel_shape, rank):
    assert einsum_equation.plan(equation, kernel_shape, rank) is None


def test_bias_axes_sum_what_the_bias_broadcasts_over():
    assert einsum_equation.bias_axes((3,), (None, 5, 3)) == [1]
    assert einsum_equation.bias_axes((5, 1), (None, 5, 3)) == [2]
    assert einsum_equation.bias_axes((2, 3), (None, 5, 2, 3)) == [1]
