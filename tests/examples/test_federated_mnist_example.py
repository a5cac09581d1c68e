"""examples/federated_mnist.py: client-level DP over generated clients, one deformed digit each."""


def test_a_short_run_over_generated_clients_stays_within_budget(run_example):
    _, steps, total, epsilon, target, out = run_example(
        "federated_mnist", "--num_clients=200", "--batch_size=20", "--epochs=1"
    )
    assert "200 clients from" in out and "per client" in out
    assert steps == total == 10 and target == 0.4 and epsilon <= target
