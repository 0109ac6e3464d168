source .probe/s6common.sh
step phase_probe.log 200 python3 .probe/phase_probe.py --out $OUT/phase_probe.json
cut -c1-250 $OUT/phase_probe.log | tail -12
