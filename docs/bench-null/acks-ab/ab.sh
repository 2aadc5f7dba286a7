#!/usr/bin/env bash
# A/B: the same bench command, builds taking turns. AB_BUILDS: where the
# old/ and new/ builds are; AB_OUT: where each round's report goes.
cd /work/main
builds=${AB_BUILDS:-/work/ab}
out=${AB_OUT:-docs/bench-null/acks-ab}
pid=$(pgrep -f kafka.Kafka | head -1)
run() { $builds/$1/modstream-bench --bootstrap 127.0.0.1:39092 --broker-pid $pid --batch-sizes 64 --delays-ms 20 \
  --loads --step-seconds 0 --repeat-shares --overload 0 --workers 2 --target-p99-ms 0 \
  --model models/null-text --events "$2" --own-runs 3 --out "$3"; }
[ -n "$ROUNDS" ] || run old 50000 $builds/warm > $builds/warm.log 2>&1
for r in ${ROUNDS:-1 2 3 4}; do
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for b in $order; do
    date; echo "round $r $b"
    run $b 100000 $out/$b-$r > $builds/$b-$r.log 2>&1; echo rc=$?
  done
done
