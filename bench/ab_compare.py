#!/usr/bin/python3
"""Compares two builds of the same Google Benchmark program side by side on a noisy machine.

Runs OLD and NEW alternately (old, new, old, new, ...) for --rounds rounds, each run with
--repetitions repetitions, and prints a Markdown table of the median CPU time of every benchmark
over all repetitions of each build, and the ratio new / old. Alternating spreads the machine's
load changes over both builds instead of charging them to whichever ran second.

usage: ab_compare.py OLD_BINARY NEW_BINARY [--rounds 3] [--repetitions 5] [--filter REGEX]
                     [--min-time 0.2]
Benchmarks present in only one build are listed with a dash for the other.
"""
import argparse
import json
import statistics
import subprocess
import sys


def run(binary, args):
    cmd = [binary, "--benchmark_format=json", "--benchmark_repetitions=%d" % args.repetitions,
           "--benchmark_min_time=%s" % args.min_time]
    if args.filter:
        cmd.append("--benchmark_filter=" + args.filter)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    times = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
        times.setdefault(b["run_name"], []).append(b["cpu_time"] * scale)
    return times


def main():
    p = argparse.ArgumentParser()
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--filter", default="")
    p.add_argument("--min-time", default="0.2")
    args = p.parse_args()
    old, new, order = {}, {}, []
    for _ in range(args.rounds):
        for into, binary in ((old, args.old), (new, args.new)):
            for name, t in run(binary, args).items():
                if name not in order:
                    order.append(name)
                into.setdefault(name, []).extend(t)
    print("| benchmark | old median CPU | new median CPU | new / old | samples |")
    print("| --- | --- | --- | --- | --- |")

    def fmt(ns):
        return "%.2f us" % (ns / 1e3) if ns >= 1e3 else "%.0f ns" % ns

    for name in order:
        o = statistics.median(old[name]) if name in old else None
        n = statistics.median(new[name]) if name in new else None
        ratio = "%.3f" % (n / o) if o and n else "-"
        print("| %s | %s | %s | %s | %d + %d |" % (
            name, fmt(o) if o else "-", fmt(n) if n else "-", ratio, len(old.get(name, [])),
            len(new.get(name, []))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
