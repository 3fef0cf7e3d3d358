# shellcheck shell=bash
# The lab scenarios of issue 10 (BENCHMARKS.md §4), shared by the scripts that run them:
# `scenario_links NAME` prints the `braid lab` link arguments of a scenario (sourced, not run).
SCENARIO_NAMES=(default 10-20-50 ratio7 lossy lte spread100 mixed lossy-fast far spread200)

scenario_links() {
  case $1 in
    default) echo "--link 1mbit/10ms --link 2mbit/10ms --link 3mbit/10ms" ;;
    10-20-50) echo "--link 10mbit/5ms --link 20mbit/20ms --link 50mbit/40ms" ;;
    ratio7) echo "--link 50mbit/10ms --link 20mbit/60ms --link 7mbit/150ms" ;;
    lossy) echo "--link 20mbit/10ms --link 20mbit/40ms/1.5%" ;;
    lte) echo "--link 30mbit/30ms/0%/20ms --link 10mbit/15ms" ;;
    # Equal rates, one-way delays 100 ms apart: the spread on the default equalisation bound.
    spread100) echo "--link 10mbit/20ms --link 10mbit/120ms" ;;
    # A fast line, a slower lossy one, a slow far one (BENCHMARKS.md §4, "Slow links").
    mixed) echo "--link 40mbit/20ms --link 8mbit/50ms/1% --link 4mbit/80ms" ;;
    # 2% random loss on the *faster* of two equal links (BENCHMARKS.md §4, "Scenarios beyond
    # the recorded grid"): BBR behind MPTCP.
    lossy-fast) echo "--link 10mbit/20ms/2% --link 10mbit/30ms" ;;
    # A link 280 ms slower than the other, beyond the default equalisation bound (same).
    far) echo "--link 20mbit/20ms --link 5mbit/300ms" ;;
    # Two links 200 ms apart: in the taper of the default 150 ms equalisation bound (same).
    spread200) echo "--link 20mbit/10ms --link 10mbit/210ms" ;;
    # The links come from the caller's own arguments.
    custom) echo "" ;;
    *) echo "unknown scenario $1 (one of: ${SCENARIO_NAMES[*]} custom)" >&2; return 2 ;;
  esac
}
