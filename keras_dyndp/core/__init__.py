"""The DP core, backend-neutral (no TensorFlow or JAX): the DP-SGD step (`mechanism`), the step's refusals
(`step_checks`, `refusals`), Poisson sampling's batch sizes (`batch_sizes`), the noise seed (`noise_seed`) and the
argument checks (`validation`)."""
