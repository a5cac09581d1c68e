"""The DP core, backend-neutral (no TensorFlow or JAX): the DP-SGD step (`mechanism`), its refusals (`step_checks`,
`refusals`), Poisson batch sizes (`batch_sizes`), the noise seed (`noise_seed`) and argument checks (`validation`)."""
