# Session 7 run 1, on next/transport-load-order (volatile copy-phase source load):
# lease_probe2 (modes 0-5), flag_probe, phase_probe, the benchmark; then main's kernel
# (.probe/transport_pool_main.py) for phase_probe and the benchmark again.
source .probe/s7common.sh
step lease_probe2.log 120 python3 benchmarks/probes/lease_probe2.py --out $OUT/lease_probe2.json
cut -c1-200 $OUT/lease_probe2.log | tail -8
step phase_probe-volatile.log 120 python3 .probe/phase_probe.py --out $OUT/phase_probe-volatile.json
cut -c1-200 $OUT/phase_probe-volatile.log | tail -8
step flag_probe-volatile.log 120 python3 .probe/flag_probe.py --out $OUT/flag_probe-volatile.json
cut -c1-200 $OUT/flag_probe-volatile.log | tail -8
mkdir -p $OUT/bench-volatile $OUT/bench-main
step bench-volatile/bench_transport_pool.log 200 python3 benchmarks/bench_transport_pool.py --out $OUT/bench-volatile
grep -E "^\| (64KiB|1MiB|16MiB|256MiB)|bar:|rounds" $OUT/bench-volatile/bench_transport_pool.log | cut -c1-330
cp ops/transport_pool.py /tmp/tp_branch.py && cp .probe/transport_pool_main.py ops/transport_pool.py
step phase_probe-main.log 120 python3 .probe/phase_probe.py --out $OUT/phase_probe-main.json
cut -c1-200 $OUT/phase_probe-main.log | tail -8
step bench-main/bench_transport_pool.log 200 python3 benchmarks/bench_transport_pool.py --out $OUT/bench-main
grep -E "^\| (64KiB|1MiB|16MiB|256MiB)|bar:|rounds" $OUT/bench-main/bench_transport_pool.log | cut -c1-330
cp /tmp/tp_branch.py ops/transport_pool.py
