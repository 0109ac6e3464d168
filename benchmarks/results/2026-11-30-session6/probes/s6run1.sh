export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
step() { local log=$1 t=$2; shift 2; local s=$(date +%s); timeout $t "$@" > $OUT/$log 2>&1; echo "=== exit $? in $(( $(date +%s) - s )) s: $log"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/smi.txt
step tma_probe.log 300 python3 .probe/tma_probe.py --out $OUT/tma_probe.json
cut -c1-200 $OUT/tma_probe.log | tail -45
