export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
step() { local log=$1 t=$2; shift 2; local s=$(date +%s); timeout $t "$@" > $OUT/$log 2>&1; echo "=== exit $? in $(( $(date +%s) - s )) s: $log"; }
step auto-picks-tests.log 120 python3 -m pytest -q -rfEs -p no:cacheprovider tests/test_sparse_mla_prefill.py -k "auto_picks"
tail -1 $OUT/auto-picks-tests.log
for i in 4 5; do
  mkdir -p $OUT/bench$i
  step bench$i/bench_transport_pool.log 150 python3 benchmarks/bench_transport_pool.py --out $OUT/bench$i
  grep -E "^\| 256MiB|^\| 64KiB|bar:|256MiB tuning" $OUT/bench$i/bench_transport_pool.log | cut -c1-330
done
