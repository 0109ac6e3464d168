export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
timeout 70 python3 benchmarks/bench_transport_pool.py --out $OUT > $OUT/bench_transport_pool.log 2>&1; echo "transport bench rc $?"; tail -12 $OUT/bench_transport_pool.log
timeout 70 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_transport_pool.py compile_tests/test_transport_pool_compile.py > $OUT/transport-gpu-tests.log 2>&1; echo "transport tests rc $?"; tail -3 $OUT/transport-gpu-tests.log
