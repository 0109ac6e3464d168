export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
export WS_VARIANTS='[{"pipeline": false}, {}, {"num_stages": 3, "lag": 2}, {"pipeline": false, "num_stages": 3, "lag": 2}, {"consumer_regs": 232, "producer_regs": 40}, {"num_stages": 3, "lag": 1}]'
timeout 200 python3 .probe/ws_sweep2.py 2>&1 | tee $OUT/sweep.log | grep -v "^ " | cut -c1-260
timeout 200 python3 -m pytest -q -x -p no:cacheprovider -m gpu -k "sparse" tests compile_tests 2>&1 | tail -15 | tee $OUT/tests.log
