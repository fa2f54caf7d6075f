#!/bin/sh
# What bench/gpu_truth.py needs on a GPU machine that has Python 3.12 with PyTorch,
# nvidia-ml-py, psutil, pluggy, PyYAML, typer, rich, httpx and tqdm but no network and no
# uv: this checkout's distributions as wheels, and the wheels of the few packages such an
# image lacks (pinned as in constraints.txt).  Run here, in the checkout:
#
#     sh bench/gpu_truth_pack.sh [FOLDER]          # default .whl (about 4 MB)
#
# then, there, in the checkout with FOLDER beside it:
#
#     python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
#       && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 bench/gpu_truth.py --out results/gpu_truth
set -eu
out=${1:-.whl}
mkdir -p "$out"
uv build --all-packages --wheel -o "$out"
pins=""
for name in pydantic pydantic-core annotated-types typing-inspection typing-extensions fastapi starlette opentelemetry-api uvicorn websockets; do
    pin=$(grep -i "^$name==" constraints.txt) || { echo "no pin for $name in constraints.txt" >&2; exit 1; }
    pins="$pins $pin"
done
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$out" $pins
ls "$out"
