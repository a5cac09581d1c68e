#!/usr/bin/env bash
# The GPU check of the JAX backend, as prepared device runs: non-private against keras_dyndp's
# DP step (and jax_privacy's Keras API) on the paper's CNN and a WideResNet-16-4 (CIFAR-10 shapes), batch 256 and
# 1024, with benchmarks/jax_step_time.py; then the same models in PyTorch, non-private against Opacus, on the same
# GPU (benchmarks/opacus_step_time.py: the image's PyTorch, Opacus carried). Run from the repository root on the
# device machine, which has JAX, PyTorch and Python 3.12 but not keras, dp-accounting, jax-privacy or opacus: those
# travel as wheels in .whl/ (ignored by git; see .library/device/README.md). Download them here once:
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl keras==3.15.1 namex==0.1.0 \
#     optree==0.20.0 dp-accounting==0.6.0 dm-tree==0.1.10 jax-privacy==2.0.0 optax==0.2.8 pydantic==2.14.4 \
#     pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 pytest==9.2.0 pytest-xdist==3.8.0 \
#     execnet==2.1.2 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 opacus==1.6.0
#
# then call the device tool's run with carry [".whl"] and command "bash benchmarks/gpu_jax.sh bench" (the tables,
# keras_dyndp's and Opacus's; timeout_s 540), then "bash benchmarks/gpu_jax.sh extra" (peak memory per path at batch
# 1024, mixed_bfloat16 at batch 256, per-convolution norms; timeout_s 540), then "bash benchmarks/gpu_jax.sh tests"
# (the JAX test suite, its summary printed and in $OUT/tests.log; timeout_s 480), then "bash benchmarks/gpu_jax.sh
# transformers" (the text transformer, the ViT, the paper's text model and LSTM of benchmarks/models.py, batch 256:
# keras_dyndp and jax_privacy beside JAX's non-private step, Opacus beside PyTorch's; timeout_s 360): no argument
# runs all four, longer than one call may last. The GPU's name is in $OUT. A session has 15 minutes of device time, the machine's start
# included: that order puts the goals' numbers first.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 KERAS_BACKEND=jax
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import jax, keras; print('jax', jax.__version__, jax.devices(), 'keras', keras.__version__)" | tee -a "$OUT/gpu.txt"
PARTS="${1:-bench tests extra transformers}"
if [[ "$PARTS" == *tests* ]]; then
  timeout 420 python3 -m pytest tests/jax_backend tests/conformance -q -n 8 2>&1 \
    | tee "$OUT/tests.log" | tail -n 40 || true
fi
cd benchmarks
if [[ "$PARTS" == *bench* ]]; then
  timeout 210 python3 jax_step_time.py --models cnn,wrn --batch_size 256 --steps 20 --repeats 5 \
    --out_md "$OUT/batch256.md" 2>&1 | grep -v Warning | tee "$OUT/batch256.log" | grep -E "repetition|\|" || true
  timeout 180 python3 jax_step_time.py --models wrn --batch_size 1024 --steps 10 --repeats 3 \
    --out_md "$OUT/batch1024.md" 2>&1 | grep -v Warning | tee "$OUT/batch1024.log" | grep -E "repetition|\|" || true
  # Opacus on the same GPU and shapes (eager PyTorch, TF32 as JAX's default): its own non-private step beside it.
  timeout 70 python3 opacus_step_time.py --models cnn,wrn --batch_size 256 --steps 20 --repeats 5 \
    --out_md "$OUT/opacus256.md" 2>&1 | tee "$OUT/opacus256.log" | grep -E "repetition|\|" || true
  timeout 60 python3 opacus_step_time.py --models wrn --batch_size 1024 --steps 10 --repeats 3 \
    --out_md "$OUT/opacus1024.md" 2>&1 | tee "$OUT/opacus1024.log" | grep -E "repetition|\|" || true
fi
if [[ "$PARTS" == *transformers* ]]; then
  # Attention and text models: EinsumDense, LayerNormalization and Embedding rules (JAX), Linear/LayerNorm/Embedding
  # (Opacus); the paper's IMDB text model, whose CPU step is bound by its 160,000 noise draws, and its LSTM.
  timeout 240 python3 jax_step_time.py --models transformer,vit,text,lstm --batch_size 256 --steps 20 --repeats 5 \
    --out_md "$OUT/transformer256.md" 2>&1 | grep -v Warning | tee "$OUT/transformer256.log" \
    | grep -E "repetition|\|" || true
  timeout 90 python3 opacus_step_time.py --models transformer,vit --batch_size 256 --steps 20 --repeats 5 \
    --out_md "$OUT/opacus_transformer256.md" 2>&1 | tee "$OUT/opacus_transformer256.log" | grep -E "repetition|\|" \
    || true
fi
[[ "$PARTS" == *extra* ]] || exit 0
# Peak memory at batch 1024, one process per path set (memory_stats keeps the process's peak); then mixed_bfloat16.
for paths in nonprivate dyndp_fast; do
  timeout 120 python3 jax_step_time.py --models wrn --batch_size 1024 --steps 3 --repeats 1 --paths "$paths" \
    2>&1 | grep -v Warning | tee "$OUT/memory_$paths.log" | grep -E "peak" || true
done
timeout 180 python3 jax_step_time.py --models cnn,wrn --batch_size 256 --steps 20 --repeats 3 \
  --dtype_policy mixed_bfloat16 --out_md "$OUT/bf16.md" 2>&1 | grep -v Warning | tee "$OUT/bf16.log" \
  | grep -E "repetition|\|" || true
# Each convolution's per-example norms: the ghost rule against vmap of its vjp, at 8x the CPU batches.
timeout 60 python3 jax_conv_gradient.py --batch_scale 8 --repeats 5 2>&1 | tee "$OUT/conv.log" | grep "|" || true
