#!/bin/sh
# Reproduces every table and plot of docs/evaluation.md: one eldr-sim command per table.
#   tools/eldr-sim/evaluate.sh [BUILD_DIR] [OUT_DIR] [TABLE...]
# Tables: rates task topics language no-locality ablations gptoss prefix esft (default: all). Each writes
# OUT_DIR/<table>/summary.{csv,md}, fit.json and PNG plots (gnuplot).
set -eu
build=${1:-build-release}
out=${2:-out/evaluation}
shift 2 2>/dev/null || shift $#
tables=${*:-"rates task topics language no-locality ablations gptoss prefix esft"}
sim="$build/tools/eldr-sim/eldr-sim"
data=${ELDR_SHARED_DATA:-$(dirname "$0")/../../../shared/data}
all="rr,random,jsq,p2c,domain,eldr,eldr-online,clairvoyant"
for t in $tables; do
  case $t in
    rates) "$sim" --synthetic qwen-task --requests 7200 --rate 20,40,60,80,100 \
             --policies rr,eldr --seed 1 --plots --out "$out/rates" ;;
    task) "$sim" --synthetic qwen-task --requests 7200 --rate 40,60 --policies "$all" \
            --seed 1 --plots --out "$out/task" ;;
    language) "$sim" --synthetic qwen-language --requests 7200 --rate 40,60 --policies "$all" \
                --seed 1 --plots --out "$out/language" ;;
    no-locality) "$sim" --synthetic no-locality --requests 7200 --rate 40 \
                   --policies rr,random,jsq,p2c,eldr --seed 1 --plots --out "$out/no-locality" ;;
    topics) "$sim" --synthetic qwen-task --subdomains 4 --subdomain-weight 0.5 --requests 7200 \
              --rate 40 --policies "$all" --seed 1 --plots --out "$out/topics" ;;
    gptoss) "$sim" --synthetic gpt-oss-task --requests 7200 --rate 40 \
              --policies rr,jsq,eldr,eldr/kmeans=vanilla --seed 1 --plots --out "$out/gptoss" ;;
    ablations) "$sim" --synthetic qwen-task --requests 7200 --rate 40 --seed 1 --plots \
                 --policies rr,eldr,eldr/transform=count,eldr/transform=sqrt,eldr/transform=count_idf,eldr/transform=binary,eldr/layers=all,eldr/kmeans=vanilla,eldr/tau=0,eldr/tau=0.2,eldr/tau=0.3 \
                 --out "$out/ablations" ;;
    prefix) "$sim" --synthetic qwen-task --requests 7200 --rate 40 --prefix-caching \
              --prompt-pool 1800 --policies rr,jsq,eldr --seed 1 --plots --out "$out/prefix" ;;
    esft) "$sim" --trace "$data/esft-deepseek-v2-lite.eldrtrace" --requests 7200 --rate 100,200 \
            --policies "$all" --seed 1 --plots --out "$out/esft" ;;
    *) echo "evaluate.sh: unknown table $t" >&2; exit 1 ;;
  esac
done
