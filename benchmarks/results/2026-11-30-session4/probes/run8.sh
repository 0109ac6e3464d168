export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
export WS_VARIANTS='[{}, {"num_stages": 3, "lag": 2}, {"pipeline": true}, {"pipeline": true, "num_stages": 3, "lag": 2}, {"pipeline": true, "num_stages": 3, "lag": 1}]'
timeout 150 python3 .probe/ws_sweep2.py 2>&1 | tee $OUT/sweep.log | grep -v "^ " | cut -c1-250
if grep -q "'pipeline': True}, 'us'" $OUT/sweep.log && ! grep -q "'pipeline': True.*error" $OUT/sweep.log; then
  sed -i 's/"pipeline": False}/"pipeline": True}/' ops/_sparse_mla_gluon.py
  grep -n '"pipeline"' ops/_sparse_mla_gluon.py
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider -m gpu -k "sparse" tests compile_tests 2>&1 | tail -15 | tee $OUT/tests.log
fi
timeout 170 python3 .probe/transport_variants2.py --out $OUT/transport-variants2.json 2>&1 | tail -70 > $OUT/transport.log; tail -45 $OUT/transport.log
