"""The Keras plumbing both backends share: the DP optimizers' registration for ``load_model`` (`registration`), what
``make_private`` means (`private_model`), the data each Keras entry point hands a model (`entry_points`) and the
values joining the epoch logs (`epoch_logs`)."""
