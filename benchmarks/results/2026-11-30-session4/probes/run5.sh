set -x
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
timeout 200 python3 .probe/ws_sweep2.py 2>&1 | tee $OUT/sweep.log | grep -v "^ "
timeout 240 python3 -m pytest -q -x -p no:cacheprovider -m gpu -k "sparse" tests compile_tests 2>&1 | tail -30 | tee $OUT/tests.log
