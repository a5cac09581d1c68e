"""Tests for keras_dyndp.epoch_logs: values that join the next epoch logs once, and the hook's removal."""

from keras_dyndp import epoch_logs


class _Model:
    def _get_metrics_result_or_logs(self, logs):
        return {"loss": logs["loss"]}


def test_values_join_the_next_epoch_logs_once_and_the_hook_is_removed():
    model = _Model()
    epoch_logs.add(model, {"epsilon": 1.5})
    epoch_logs.add(model, {"epsilon": 2.0})  # the latest values win; one hook
    assert model._get_metrics_result_or_logs({"loss": 0.3}) == {"loss": 0.3, "epsilon": 2.0}
    assert model._get_metrics_result_or_logs({"loss": 0.2}) == {"loss": 0.2}
    epoch_logs.remove_hook(model)
    assert "_get_metrics_result_or_logs" not in vars(model)
    epoch_logs.remove_hook(model)  # nothing to remove


def test_an_instance_override_is_restored():
    model = _Model()
    own = lambda logs: {"own": 1}  # noqa: E731
    model._get_metrics_result_or_logs = own
    epoch_logs.add(model, {"epsilon": 1.0})
    assert model._get_metrics_result_or_logs({}) == {"own": 1, "epsilon": 1.0}
    epoch_logs.remove_hook(model)
    assert model._get_metrics_result_or_logs is own
