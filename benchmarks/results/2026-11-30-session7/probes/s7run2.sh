# Session 7 run 2, on next/transport-load-order: lease_probe2 (its path fixed), flag_probe2.
source .probe/s7common.sh
step flag_probe2.log 150 python3 .probe/flag_probe2.py --out $OUT/flag_probe2.json
cut -c1-200 $OUT/flag_probe2.log | tail -12
step lease_probe2.log 120 python3 benchmarks/probes/lease_probe2.py --out $OUT/lease_probe2.json
cut -c1-200 $OUT/lease_probe2.log | tail -8
