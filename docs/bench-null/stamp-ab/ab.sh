#!/usr/bin/env bash
# The acknowledgements A/B's script with this A/B's builds and reports. It
# ran as: the warm-up (a discarded 50,000-event run of the old build), then
# ROUNDS="1 2 3 4 5 6 7 8 9 10" docs/bench-null/stamp-ab/ab.sh
AB_BUILDS=/work/ab3 AB_OUT=docs/bench-null/stamp-ab exec "$(dirname "$0")/../acks-ab/ab.sh"
