export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
step() { local log=$1 t=$2; shift 2; local s=$(date +%s); timeout $t "$@" > $OUT/$log 2>&1; echo "=== exit $? in $(( $(date +%s) - s )) s: $log"; }
{ nvidia-smi; python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())'; git log --oneline -1; git status --short; } > $OUT/env.txt 2>&1
