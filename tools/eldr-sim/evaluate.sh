#!/bin/sh
# Reproduces every table and plot of docs/evaluation.md: one eldr-sim command per table.
#   tools/eldr-sim/evaluate.sh [BUILD_DIR] [OUT_DIR] [TABLE...]
# Tables: rates task topics language no-locality ablations gptoss prefix esft (the paper's
# comparisons), and the eldr-adaptive matrix (issue 15): every workload at 5 rates from light to
# saturated with 8 and 16 decode workers, named <workload>-<D> with workload one of task language
# topics no-locality gptoss prefix esft held-out (e.g. task-16, esft-8; "adaptive" runs all 16),
# plus sensitivity (cost model +-50%, tau, slack, where grouping starts, refit interval) and seeds
# (held-out at 3 seeds); adaptive-summary and sensitivity-summary lay their verdicts side by side
# in OUT_DIR/adaptive.md and OUT_DIR/sensitivity.md. routers (not in the default list): 1, 2 and 4
# routers with stale load views on the ESFT trace (issue 14's herding goal); routers-summary
# writes OUT_DIR/routers.md; routers-cluster runs the cluster benchmark's herding traffic in the
# model (OUT_DIR/routers-cluster.md), routers-cluster-lag with the decisions one interval late
# (all three with each router counting its own decisions only); routers-estimate compares that
# with the peer estimate at 1,000 req/s (OUT_DIR/routers-estimate.md); routers-idle runs it with
# only some of 4 routers getting requests, the estimate counting the membership or the routers
# seen deciding (OUT_DIR/routers-idle.md).
# Default: all. Each writes OUT_DIR/<table>/summary.{csv,md}, fit.json and PNG plots (gnuplot).
set -eu
build=${1:-build-release}
out=${2:-out/evaluation}
shift 2 2>/dev/null || shift $#
matrix="task-16 task-8 language-16 language-8 topics-16 topics-8 no-locality-16 no-locality-8
gptoss-16 gptoss-8 prefix-16 prefix-8 esft-16 esft-8 held-out-16 held-out-8"
tables=${*:-"rates task topics language no-locality ablations gptoss prefix esft $matrix sensitivity seeds"}
sim="$build/tools/eldr-sim/eldr-sim"
mkdir -p "$out"  # the suites that write OUT_DIR/<suite>.md write before any eldr-sim makes it
# The cluster benchmark's herding traffic at 1,000 req/s (routers-estimate, routers-idle).
herding_1000="--synthetic qwen-task --requests 10000 --rate 1000 --decode-workers 8
  --output-tokens 16 --max-batch 256 --prompt-max 512 --prefill-base-ms 0 --prefill-per-token-ms 0
  --seed 1 --quiet --load-sync-ms 5"
data=${ELDR_SHARED_DATA:-$(dirname "$0")/../../../shared/data}
all="rr,random,jsq,p2c,domain,eldr,eldr-online,eldr-adaptive,clairvoyant"
# The matrix: the paper's balancers, the oracle, the paper's rule, the adaptive rule, the bound.
cmp="rr,random,jsq,p2c,domain,eldr,eldr-adaptive,clairvoyant"
# Requests per matrix run (the paper's tables use 7,200; the matrix's 160 runs use fewer).
n=${ELDR_EVAL_REQUESTS:-2000}
esft="$data/esft-deepseek-v2-lite.eldrtrace"
# The held-out workload with domain locality of issue 15: the Language preset with 64-token
# answers and a seed no preset was tuned on.
heldout="--synthetic qwen-language --output-tokens 64 --seed 11"

# matrix WORKLOAD D: the workload's 5 rates for D decode workers (light to saturated).
matrix() {
  w=$1; d=$2
  case $d in 16) s=1 ;; 8) s=2 ;; *) echo "evaluate.sh: D must be 8 or 16" >&2; exit 1 ;; esac
  # rates for 16 workers, halved for 8
  case $w in
    task|topics|prefix|no-locality) r="20 40 60 80 100" ;;
    language) r="20 40 60 80 100" ;;
    gptoss) r="20 40 80 120 160" ;;
    esft) r="25 50 100 200 400" ;;
    held-out) r="20 40 80 160 320" ;;
  esac
  rates=$(echo $r | awk -v s=$s '{for (i = 1; i <= NF; i++) printf "%s%g", (i > 1 ? "," : ""), $i / s}')
  common="--quiet --requests $n --rate $rates --decode-workers $d --plots --out $out/$w-$d"
  case $w in
    task) "$sim" --synthetic qwen-task --policies "$cmp" --seed 1 $common ;;
    language) "$sim" --synthetic qwen-language --policies "$cmp" --seed 1 $common ;;
    topics) "$sim" --synthetic qwen-task --subdomains 4 --subdomain-weight 0.5 --policies "$cmp" \
              --seed 1 $common ;;
    no-locality) "$sim" --synthetic no-locality --policies rr,random,jsq,p2c,eldr,eldr-adaptive \
                   --seed 1 $common ;;
    gptoss) "$sim" --synthetic gpt-oss-task --policies "$cmp" --seed 1 $common ;;
    prefix) "$sim" --synthetic qwen-task --prefix-caching --prompt-pool $((n / 4)) \
              --policies rr,random,jsq,p2c,eldr,eldr-adaptive --seed 1 $common ;;
    esft) "$sim" --trace "$esft" --policies "$cmp" --seed 1 $common ;;
    held-out) "$sim" $heldout --policies "$cmp" $common ;;
  esac
}

# routers_summary PREFIX RATES POLICIES SYNCS SEEDS: OUT_DIR/PREFIX.md from the runs
# OUT_DIR/PREFIX-s<seed>-r1 and OUT_DIR/PREFIX-s<seed>-r<2|4>-<ms>: every (rate, policy, routers,
# interval), seed 1's figures and their ratio to one router's (x1), the worst x1 over the seeds of
# the TPOTs and in-flight max/mean and of the decisions CV, and whether all four are within 5% of
# one router's on every seed (lower is better for all four).
routers_summary() {
  prefix=$1; seeds=$5
  for seed in $(seq 1 "$seeds"); do
    f="$out/$prefix-s$seed-r1/summary.csv"
    [ -f "$f" ] || { echo "evaluate.sh: $f is missing: run the $prefix table first" >&2; exit 1; }
  done
  {
    echo "| rate | policy | routers | load_sync_ms | TPOT p50 ms (x1) | TPOT p99 ms (x1) | in-flight max/mean (x1) | decisions CV (x1) | worst x1 TPOT, in-flight (seeds 1-$seeds) | worst x1 CV | all within 5% |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    awk -F, -v rates="$2" -v policies="$3" -v syncs="$4" -v seeds="$seeds" '
      FNR == 1 { n = split(FILENAME, a, "/"); m = split(a[n - 1], p, "-")
                 seed = substr(p[m - 1], 2); r = substr(p[m], 2); ms = 0
                 if (substr(p[m - 1], 1, 1) == "r") { seed = substr(p[m - 2], 2); r = substr(p[m - 1], 2); ms = p[m] }
                 next }
      { k = seed SUBSEP $12 SUBSEP $1 SUBSEP r SUBSEP ms
        v[k, 1] = $2; v[k, 2] = $3; v[k, 3] = $17; v[k, 4] = $18 }
      function cell(k, b, i) { return sprintf("%.3f (%.2f)", v[k, i], v[k, i] / v[b, i]) }
      END {
        nr = split(rates, R, " "); np = split(policies, P, " "); ns = split(syncs, S, " ")
        for (i = 1; i <= nr; i++) for (j = 1; j <= np; j++) {
          b = 1 SUBSEP R[i] SUBSEP P[j] SUBSEP 1 SUBSEP 0
          printf "| %g | %s | 1 | any | %s | %s | %s | %s | 1.000 | 1.000 | |\n", R[i], P[j],
                 cell(b, b, 1), cell(b, b, 2), cell(b, b, 3), cell(b, b, 4)
          for (rr = 2; rr <= 4; rr += 2) for (m = 1; m <= ns; m++) {
            k = 1 SUBSEP R[i] SUBSEP P[j] SUBSEP rr SUBSEP S[m]
            worst = 0; worst_cv = 0
            for (seed = 1; seed <= seeds; seed++) {
              ks = seed SUBSEP R[i] SUBSEP P[j] SUBSEP rr SUBSEP S[m]
              bs = seed SUBSEP R[i] SUBSEP P[j] SUBSEP 1 SUBSEP 0
              for (f = 1; f <= 3; f++) if (v[ks, f] / v[bs, f] > worst) worst = v[ks, f] / v[bs, f]
              if (v[ks, 4] / v[bs, 4] > worst_cv) worst_cv = v[ks, 4] / v[bs, 4]
            }
            printf "| %g | %s | %d | %s | %s | %s | %s | %s | %.3f | %.3f | %s |\n", R[i], P[j],
                   rr, S[m], cell(k, b, 1), cell(k, b, 2), cell(k, b, 3), cell(k, b, 4), worst,
                   worst_cv, (worst <= 1.05 && worst_cv <= 1.05 ? "yes" : "**no**")
          }
        }
      }' "$out"/"$prefix"-s*/summary.csv
  } > "$out/$prefix.md"
  echo "wrote $out/$prefix.md"
}

for t in $tables; do
  case $t in
    rates) "$sim" --synthetic qwen-task --requests 7200 --rate 20,40,60,80,100 \
             --policies rr,eldr --seed 1 --plots --out "$out/rates" ;;
    task) "$sim" --synthetic qwen-task --requests 7200 --rate 40,60 --policies "$all" \
            --seed 1 --plots --out "$out/task" ;;
    language) "$sim" --synthetic qwen-language --requests 7200 --rate 40,60 --policies "$all" \
                --seed 1 --plots --out "$out/language" ;;
    no-locality) "$sim" --synthetic no-locality --requests 7200 --rate 40 \
                   --policies rr,random,jsq,p2c,eldr,eldr-adaptive --seed 1 --plots \
                   --out "$out/no-locality" ;;
    topics) "$sim" --synthetic qwen-task --subdomains 4 --subdomain-weight 0.5 --requests 7200 \
              --rate 40 --policies "$all" --seed 1 --plots --out "$out/topics" ;;
    gptoss) "$sim" --synthetic gpt-oss-task --requests 7200 --rate 40 \
              --policies rr,jsq,eldr,eldr/kmeans=vanilla,eldr-adaptive --seed 1 --plots \
              --out "$out/gptoss" ;;
    ablations) "$sim" --synthetic qwen-task --requests 7200 --rate 40 --seed 1 --plots \
                 --policies rr,eldr,eldr/transform=count,eldr/transform=sqrt,eldr/transform=count_idf,eldr/transform=binary,eldr/layers=all,eldr/kmeans=vanilla,eldr/tau=0,eldr/tau=0.2,eldr/tau=0.3 \
                 --out "$out/ablations" ;;
    prefix) "$sim" --synthetic qwen-task --requests 7200 --rate 40 --prefix-caching \
              --prompt-pool 1800 --policies rr,jsq,eldr,eldr-adaptive --seed 1 --plots \
              --out "$out/prefix" ;;
    esft) "$sim" --trace "$esft" --requests 7200 --rate 100,200 \
            --policies "$all" --seed 1 --plots --out "$out/esft" ;;
    adaptive) for m in $matrix; do "$0" "$build" "$out" "$m"; done
              "$0" "$build" "$out" adaptive-summary ;;
    adaptive-summary)
      # One table over the matrix's runs, from each run's verdicts.csv (eldr-sim computes the
      # verdicts; this only lays them side by side): OUT_DIR/adaptive.md.
      {
        echo "| workload | D | rate | eldr p50 / p99 vs best | eldr-adaptive p50 / p99 vs best | adaptive's share of the clairvoyant median gain | eldr-adaptive |"
        echo "|---|---|---|---|---|---|---|"
        for m in $matrix; do
          f="$out/$m/verdicts.csv"
          [ -f "$f" ] || { echo "evaluate.sh: $f is missing: run the $m table first" >&2; exit 1; }
          awk -F, -v w="${m%-*}" -v d="${m##*-}" '
            function pct(x) { return sprintf("%+.1f%%", x) }
            NR > 1 && $2 == "eldr" { e[$1] = pct($9) " / " pct($10) }
            NR > 1 && $2 == "eldr-adaptive" {
              rate[++n] = $1; a[$1] = pct($9) " / " pct($10)
              s[$1] = ($12 == "" ? "-" : sprintf("%.0f%%", $12)); v[$1] = $13
            }
            END {
              for (i = 1; i <= n; i++) {
                r = rate[i]
                printf "| %s | %s | %g | %s | %s | %s | %s |\n", (i == 1 ? w : ""), (i == 1 ? d : ""),
                       r, (r in e ? e[r] : "-"), a[r], s[r], (v[r] == "does not lose" ? v[r] : "**" v[r] "**")
              }
            }' "$f"
        done
        for m in $matrix; do cat "$out/$m/verdicts.csv"; done | awk -F, '
          $2 == "eldr-adaptive" { n++; if ($13 != "does not lose") l++ }
          $2 == "eldr" { m++; if ($13 != "does not lose") k++ }
          END { printf "\neldr-adaptive loses in %d of %d runs; eldr (the paper rule) in %d of %d.\n", l, n, k, m }'
      } > "$out/adaptive.md"
      echo "wrote $out/adaptive.md" ;;
    *-16|*-8) matrix "${t%-*}" "${t##*-}" ;;
    sensitivity)
      # The adaptive rule's own knobs and the cost model, on the held-out workload at a light,
      # a middle and a heavy rate (16 workers).
      p="rr,jsq,p2c,eldr,eldr-adaptive,eldr-adaptive/slack=0.25,eldr-adaptive/slack=1,eldr-adaptive/tau=0.05,eldr-adaptive/tau=0.2,eldr-adaptive-online"
      "$sim" $heldout --requests "$n" --rate 20,80,160 --policies "$p" --out "$out/sens-knobs"
      "$sim" $heldout --requests "$n" --rate 20,80,160 --policies rr,jsq,eldr,eldr-adaptive-online \
        --refit-interval-s 1 --out "$out/sens-refit-1s"
      "$sim" $heldout --requests "$n" --rate 20,80,160 --policies rr,jsq,eldr,eldr-adaptive-online \
        --refit-interval-s 4 --out "$out/sens-refit-4s"
      # Where grouping starts (group_min_load, /min-load=N): 0 groups from the lightest load 2
      # (the rule before the threshold), 3 the default, 6 later; 16 and 8 workers, and the
      # cheaper step (base 3.25 ms) that showed the 80 req/s p99 loss at 0.
      g="rr,random,jsq,p2c,eldr-adaptive/min-load=0,eldr-adaptive,eldr-adaptive/min-load=6"
      "$sim" $heldout --requests "$n" --rate 20,40,80,160 --policies "$g" --out "$out/sens-min-load-16"
      "$sim" $heldout --requests "$n" --rate 10,20,40,80 --decode-workers 8 --policies "$g" \
        --out "$out/sens-min-load-8"
      "$sim" $heldout --requests "$n" --rate 80,160 --cost-base-ms 3.25 --policies "$g" \
        --out "$out/sens-min-load-base-3.25"
      for c in "base-ms 3.25" "base-ms 9.75" "expert-ms 0.00175" "expert-ms 0.00525" \
               "sequence-ms 0.005" "sequence-ms 0.015" "kilotoken-ms 0.002" "kilotoken-ms 0.006"; do
        set -- $c
        "$sim" $heldout --requests "$n" --rate 20,80,160 --policies rr,jsq,p2c,eldr,eldr-adaptive \
          --cost-$1 $2 --out "$out/sens-$1-$2"
      done ;;
    seeds)
      for s in 12 13 14; do
        "$sim" --synthetic qwen-language --output-tokens 64 --seed $s --requests "$n" \
          --rate 20,40,80,160,320 --policies rr,random,jsq,p2c,eldr,eldr-adaptive \
          --out "$out/seed-$s"
      done ;;
    routers)
      # Issue 14's herding goal: 1, 2 and 4 routers at the same total rate, each seeing its peers'
      # decisions and the finishes only every load_sync_ms (sim_config::routers); a light and a
      # heavy rate, 16 decode workers, 3 seeds (arrival draws). One router is exact at any
      # interval, so it runs once per seed. Each router counts its own decisions only
      # (--no-peer-estimate), as the node did before cluster.peer_estimate: the staleness alone;
      # routers-estimate measures the estimate.
      for seed in 1 2 3; do
        "$sim" --trace "$esft" --requests 7200 --rate 50,200 --policies jsq,eldr,eldr-adaptive \
          --seed $seed --quiet --routers 1 --out "$out/routers-s$seed-r1"
        for r in 2 4; do
          for ms in 1 2 5 10 20 50 100; do
            "$sim" --trace "$esft" --requests 7200 --rate 50,200 \
              --policies jsq,eldr,eldr-adaptive --seed $seed --quiet --routers $r \
              --load-sync-ms $ms --no-peer-estimate --out "$out/routers-s$seed-r$r-$ms"
          done
        done
      done ;;
    routers-summary) routers_summary routers "50.00 200.00" "jsq eldr eldr-adaptive" \
                       "5 50 1 2 10 20 100" 3 ;;
    routers-cluster)
      # The cluster benchmark's herding case (BENCHMARKS.md, "Herding with load authorities"):
      # its eldr-loadgen traffic at 500 req/s, zero prefill, the 5 ms KV transfer eldr-loadgen
      # also waits by default, 8 decode workers, one seed. Writes
      # OUT_DIR/routers-cluster.md.
      for r in 1 2 4; do
        for ms in 5 10 20 50; do
          [ $r = 1 ] && [ $ms != 5 ] && continue
          d="$out/routers-cluster-s1-r$r-$ms"; [ $r = 1 ] && d="$out/routers-cluster-s1-r1"
          "$sim" --synthetic qwen-task --requests 5000 --rate 500 --decode-workers 8 \
            --policies jsq,eldr --output-tokens 16 --max-batch 256 --prompt-max 512 \
            --prefill-base-ms 0 --prefill-per-token-ms 0 --seed 1 --quiet \
            --routers $r --load-sync-ms $ms --no-peer-estimate --out "$d"
        done
      done
      routers_summary routers-cluster "500.00" "jsq eldr" "5 10 20 50" 1 ;;
    routers-estimate)
      # The peer estimate (cluster.peer_estimate; docs/cluster.md, "Peer estimate"): the cluster
      # benchmark's herding traffic at 1,000 req/s, the load shared every 5 ms and the decisions
      # 1, 4 and 16 intervals late, 1, 2 and 4 routers, each counting its own decisions only or
      # its peers' estimated too. Writes OUT_DIR/routers-estimate.md: each figure and its ratio
      # to one router's.
      md="$out/routers-estimate.md"
      {
        echo "| lag | estimate | policy | routers | TPOT p50 ms (x1) | TPOT p99 ms (x1) | in-flight max/mean (x1) | decisions CV (x1) | distinct experts/layer |"
        echo "|---|---|---|---|---|---|---|---|---|"
      } > "$md"
      for lag in 1 4 16; do
        for est in own estimate; do
          flag=--peer-estimate; [ $est = own ] && flag=--no-peer-estimate
          for r in 1 2 4; do
            d="$out/routers-estimate-l$lag-$est-r$r"
            # shellcheck disable=SC2086
            "$sim" $herding_1000 --policies jsq,eldr,eldr-adaptive --routers $r \
              --load-sync-lag $lag $flag --out "$d"
          done
          # summary.csv columns: 1 policy, 2 tpot_p50, 3 tpot_p99, 5 distinct experts,
          # 17 inflight_imbalance, 18 decision_cv.
          for r in 1 2 4; do
            awk -F, -v lag=$lag -v est=$est -v r=$r '
              NR == FNR { if (FNR > 1) { p50[$1] = $2; p99[$1] = $3; inf[$1] = $17; cv[$1] = $18 }; next }
              FNR > 1 { printf "| %s | %s | %s | %s | %.2f (%.3f) | %.2f (%.3f) | %.3f (%.3f) | %.4f (%.3f) | %.1f |\n",
                        lag, est, $1, r, $2, $2 / p50[$1], $3, $3 / p99[$1], $17, $17 / inf[$1],
                        $18, $18 / cv[$1], $5 }' \
              "$out/routers-estimate-l$lag-$est-r1/summary.csv" \
              "$out/routers-estimate-l$lag-$est-r$r/summary.csv" >> "$md"
          done
        done
      done ;;
    routers-idle)
      # The peer estimate when not every router gets requests (core/membership/router_activity.hpp):
      # the same traffic as routers-estimate, 4 routers of which 1, 2 or 4 get requests, the
      # decisions 4 or 16 intervals late; each router counting its own decisions only (own), its
      # peers' as if all 4 decided (membership: the rule before router_activity) or as the
      # routers the vectors show deciding (active: the node's). Writes OUT_DIR/routers-idle.md:
      # each figure and its ratio to one router's.
      md="$out/routers-idle.md"
      {
        echo "| lag | with traffic | estimate | policy | TPOT p50 ms (x1) | TPOT p99 ms (x1) | in-flight max/mean (x1) | distinct experts/layer |"
        echo "|---|---|---|---|---|---|---|---|"
      } > "$md"
      common="$herding_1000 --policies jsq,eldr-adaptive"
      # shellcheck disable=SC2086
      "$sim" $common --routers 1 --out "$out/routers-idle-r1"
      for lag in 4 16; do
        for t in 1 2 4; do
          for est in own membership active; do
            case $est in
              own) flag=--no-peer-estimate ;;
              membership) flag="--peer-estimate --peer-estimate-routers 4" ;;
              active) flag=--peer-estimate ;;
            esac
            d="$out/routers-idle-l$lag-t$t-$est"
            # shellcheck disable=SC2086
            "$sim" $common --routers 4 --routers-with-traffic $t --load-sync-lag $lag $flag \
              --out "$d"
            # summary.csv columns: 1 policy, 2 tpot_p50, 3 tpot_p99, 5 distinct experts,
            # 17 inflight_imbalance.
            awk -F, -v lag=$lag -v t=$t -v est=$est '
              NR == FNR { if (FNR > 1) { p50[$1] = $2; p99[$1] = $3; inf[$1] = $17 }; next }
              FNR > 1 { printf "| %s | %s | %s | %s | %.2f (%.3f) | %.2f (%.3f) | %.3f (%.3f) | %.1f |\n",
                        lag, t, est, $1, $2, $2 / p50[$1], $3, $3 / p99[$1], $17, $17 / inf[$1], $5 }' \
              "$out/routers-idle-r1/summary.csv" "$d/summary.csv" >> "$md"
          done
        done
      done ;;
    routers-cluster-lag)
      # The same with the routers' decisions one interval late in the shared vector
      # (--load-sync-lag 1): OUT_DIR/routers-cluster-lag.md.
      for r in 1 2 4; do
        for ms in 5 10; do
          [ $r = 1 ] && [ $ms != 5 ] && continue
          d="$out/routers-cluster-lag-s1-r$r-$ms"; [ $r = 1 ] && d="$out/routers-cluster-lag-s1-r1"
          "$sim" --synthetic qwen-task --requests 5000 --rate 500 --decode-workers 8 \
            --policies jsq,eldr --output-tokens 16 --max-batch 256 --prompt-max 512 \
            --prefill-base-ms 0 --prefill-per-token-ms 0 --seed 1 --quiet \
            --routers $r --load-sync-ms $ms --load-sync-lag 1 --no-peer-estimate --out "$d"
        done
      done
      routers_summary routers-cluster-lag "500.00" "jsq eldr" "5 10" 1 ;;
    sensitivity-summary)
      # Every locality policy's verdict in the sensitivity and seed runs, from their
      # verdicts.csv: OUT_DIR/sensitivity.md.
      {
        echo "| run | rate | policy | p50 / p99 vs best balancer | verdict |"
        echo "|---|---|---|---|---|"
        for d in "$out"/sens-* "$out"/seed-*; do
          f="$d/verdicts.csv"
          [ -f "$f" ] || { echo "evaluate.sh: $f is missing: run sensitivity and seeds first" >&2; exit 1; }
          r=$(basename "$d")
          awk -F, -v r="$r" 'NR > 1 {
              printf "| %s | %g | %s | %+.1f%% / %+.1f%% | %s |\n", r, $1, $2, $9, $10,
                     ($13 == "does not lose" ? $13 : "**" $13 "**") }' "$f"
        done
      } > "$out/sensitivity.md"
      echo "wrote $out/sensitivity.md" ;;
    *) echo "evaluate.sh: unknown table $t" >&2; exit 1 ;;
  esac
done
