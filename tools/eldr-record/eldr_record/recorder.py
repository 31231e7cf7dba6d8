"""eldr-record: records an eldr-trace of your own MoE model from a running vLLM.

For each prompt of a JSON Lines file it sends one non-streaming request to vLLM (started with
--enable-return-routed-experts), takes the expert ids the router chose for every prompt and
generated token from the response, keeps the MoE layers, and appends them to a journal. When
every prompt is recorded it writes the trace (shared/formats/eldr-trace.md) atomically and
removes the journal. Interrupted (Ctrl-C, SIGTERM, a kill, a crash), the same command continues
with the prompts not yet recorded: each prompt lands in the trace exactly once.

Exit codes: 0 the trace is written; 1 some prompts failed (listed; nothing is lost: rerun, or use
--skip-failed); 2 usage, prompts file or journal problem; 3 vLLM cannot be used (unreachable, the
model is not served, no routed experts in its responses, responses of changing shape);
130/143 interrupted by SIGINT/SIGTERM (rerun to continue).
"""
import argparse
import asyncio
import datetime
import json
import os
import signal
import sys

import aiohttp
import numpy as np

import eldr_routed_experts as rex
import eldr_trace

from . import journal as jr
from .progress import Progress
from .prompts import PromptError, load_prompts

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_VLLM = 0, 1, 2, 3
MAX_EXPERTS = eldr_trace.MAX_EXPERTS    # the format's bound (ids are 1 or 2 bytes)


class Fatal(Exception):
    """vLLM cannot be used for this recording; stops the whole run (exit 3)."""


class PromptFailed(Exception):
    """This prompt could not be recorded; the others go on."""


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="eldr-record",
        description="Record an eldr-trace of your MoE model from a running vLLM started with "
                    "--enable-return-routed-experts. Resumable: rerun the same command after an "
                    "interruption and it continues where it stopped.",
        epilog="The prompts file is JSON Lines: one object per line with \"prompt\" (a string, "
               "sent to /v1/completions) or \"messages\" (a chat, sent to /v1/chat/completions), "
               "optionally \"id\" (unique; default line-N), \"max_tokens\", and the label under "
               "--label-key. Progress goes to stderr. Exit codes: 0 written, 1 prompts failed, "
               "2 usage/file error, 3 vLLM unusable, 130/143 interrupted.")
    p.add_argument("--vllm", required=True, metavar="URL",
                   help="base URL of the vLLM OpenAI server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, metavar="NAME",
                   help="the served model name to request; also the model name in the trace")
    p.add_argument("--prompts", required=True, metavar="FILE.jsonl", help="the prompts")
    p.add_argument("--out", required=True, metavar="TRACE",
                   help="the trace to write; OUT.journal holds progress until it is written")
    p.add_argument("--max-tokens", type=int, default=128, metavar="N",
                   help="tokens to generate per prompt (its decode phase; default 128)")
    p.add_argument("--label-key", metavar="KEY",
                   help="JSONL key holding each prompt's label (task, domain, language)")
    p.add_argument("--concurrency", type=int, default=8, metavar="C",
                   help="requests in flight at once (default 8)")
    p.add_argument("--moe-layers", default="auto", metavar="auto|all|LIST",
                   help="which of vLLM's layers are MoE layers, i.e. recorded: auto (those whose "
                        "ids are not all zero: vLLM returns dense layers as zeros; needs top_k "
                        ">= 2), all, or a list such as 1-26 (DeepSeek-V2-Lite, whose layer 0 is "
                        "dense: first_k_dense_replace), as eldr-proxy's --moe-layers. Default "
                        "auto")
    p.add_argument("--experts", type=int, metavar="E",
                   help="routed experts per layer (the model's n_routed_experts / num_experts); "
                        "without it the largest id seen + 1 is used, and said so")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="seconds one request may take (default 600)")
    p.add_argument("--retries", type=int, default=3, metavar="N",
                   help="retries of a request that failed with a connection error, a timeout or "
                        "a 5xx answer (default 3; waits 1, 2, 4 ... s)")
    p.add_argument("--retry-delay", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--skip-failed", action="store_true",
                   help="write the trace without the prompts vLLM refused (they are listed)")
    p.add_argument("--restart", action="store_true",
                   help="discard an existing journal of OUT and record from the start")
    p.add_argument("--force", action="store_true", help="overwrite OUT when it exists")
    p.add_argument("--progress", choices=("auto", "bar", "lines", "none"), default="auto",
                   help="progress on stderr: a bar on a terminal, lines otherwise (auto)")
    a = p.parse_args(argv)
    if a.max_tokens < 1:
        p.error("--max-tokens must be >= 1")
    if a.concurrency < 1:
        p.error("--concurrency must be >= 1")
    if a.experts is not None and not 1 <= a.experts <= MAX_EXPERTS:
        p.error("--experts must be in 1..%d" % MAX_EXPERTS)
    if a.timeout <= 0 or a.retries < 0 or a.retry_delay < 0:
        p.error("--timeout must be > 0, --retries >= 0")
    if not a.vllm.startswith(("http://", "https://")):
        p.error("--vllm must be an http:// or https:// URL, got %r" % a.vllm)
    a.vllm = a.vllm.rstrip("/")
    if a.moe_layers not in ("auto", "all"):
        try:
            rex.parse_layer_list(a.moe_layers, 1 << 30)
        except ValueError as e:
            p.error("--moe-layers: %s" % e)
    return a


def routed_experts_of(doc):
    """A vLLM completion or chat completion response -> (ids (tokens, layers, k), P, O).

    P is usage.prompt_tokens; vLLM returns one row per forwarded token, i.e. the prompt and every
    generated token but the last, so O = rows - P tokens were routed during decode."""
    if not isinstance(doc, dict):
        raise PromptFailed("the response is not a JSON object")
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise PromptFailed("the response has no choices")
    choice = choices[0]
    if choice.get("routed_experts") is None:
        raise Fatal("vLLM returned no routed experts (\"routed_experts\" is %s): start it with "
                    "--enable-return-routed-experts" %
                    ("null" if "routed_experts" in choice else "absent"))
    try:
        arr = rex.decode(choice["routed_experts"])
    except rex.RoutedExpertsError as e:
        raise PromptFailed(str(e)) from None
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        raise PromptFailed("the response has no usage")
    p_tokens, c_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
    for name, v in (("prompt_tokens", p_tokens), ("completion_tokens", c_tokens)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise PromptFailed("usage.%s must be a non-negative integer, got %r" % (name, v))
    if p_tokens < 1:
        raise PromptFailed("usage.prompt_tokens is 0")
    rows = arr.shape[0]
    if not p_tokens <= rows <= p_tokens + c_tokens:
        raise PromptFailed("routed_experts has %d token rows, expected between prompt_tokens "
                           "(%d) and prompt + completion tokens (%d)"
                           % (rows, p_tokens, p_tokens + c_tokens))
    return arr, p_tokens, rows - p_tokens


class Recording:
    """What is being recorded: checks each response against the first one's geometry and turns
    it into a journal record. Pure logic plus journal appends."""

    def __init__(self, journal, moe_spec, experts):
        self.journal = journal
        self.moe_spec = moe_spec
        self.experts = experts
        self.layer_map = (rex.MoeLayerMap.from_dict(journal.layers)
                          if journal.layers is not None else None)

    def accept(self, prompt, doc):
        arr, p_tokens, o_tokens = routed_experts_of(doc)
        if self.layer_map is None:
            try:
                layer_map = rex.MoeLayerMap.from_spec(self.moe_spec, arr)
            except rex.RoutedExpertsError as e:
                raise Fatal(str(e)) from None
            self.journal.set_layers(layer_map.to_dict())
            self.layer_map = layer_map
        try:
            moe = self.layer_map.select(arr)
        except rex.RoutedExpertsError as e:
            raise Fatal("prompt %r (line %d): %s" % (prompt.id, prompt.line, e)) from None
        max_id = int(moe.max()) if moe.size else 0
        if self.experts is not None and max_id >= self.experts:
            raise Fatal("prompt %r (line %d): expert id %d, but --experts is %d"
                        % (prompt.id, prompt.line, max_id, self.experts))
        if max_id >= MAX_EXPERTS:
            raise Fatal("prompt %r (line %d): expert id %d, but eldr-trace holds at most %d "
                        "experts" % (prompt.id, prompt.line, max_id, MAX_EXPERTS))
        geometry = eldr_trace.Geometry(moe.shape[1], self.experts or max(max_id + 1, moe.shape[2]),
                                       moe.shape[2])
        req = eldr_trace.TraceRequest(prompt.id, prompt.label, p_tokens, o_tokens, moe)
        try:
            eldr_trace.validate_request(geometry, req)
        except eldr_trace.TraceError as e:
            raise PromptFailed("vLLM's routed experts are not a valid routing: %s" % e) from None
        width = 1 if max_id < 256 else 2
        self.journal.append_request({
            "id": prompt.id, "digest": prompt.digest, "label": prompt.label,
            "prompt_tokens": p_tokens, "output_tokens": o_tokens, "max_id": max_id,
            "width": width, "experts": moe.astype("<u%d" % width).tobytes()})


async def preflight(session, args):
    url = args.vllm + "/v1/models"
    try:
        async with session.get(url) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise Fatal("GET %s answered %d: %s" % (url, resp.status, text[:300]))
            doc = json.loads(text)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise Fatal("cannot reach vLLM at %s: %s" % (args.vllm, e or type(e).__name__)) from None
    except ValueError:
        raise Fatal("GET %s did not answer JSON: is this a vLLM OpenAI server?" % url) from None
    served = [m.get("id") for m in doc.get("data", []) if isinstance(m, dict)] \
        if isinstance(doc, dict) and isinstance(doc.get("data"), list) else []
    if args.model not in served:
        raise Fatal("vLLM at %s does not serve model %r (it serves %s); pass its served name "
                    "with --model" % (args.vllm, args.model, ", ".join(map(repr, served)) or
                                      "nothing"))


async def fetch(session, args, prompt):
    """POSTs one prompt; returns the decoded JSON response. Retries connection errors, timeouts
    and 5xx answers; a 4xx answer is this prompt's failure (vLLM's message is kept)."""
    url = args.vllm + prompt.path
    body = prompt.request_json(args.model, args.max_tokens)
    last = None
    for attempt in range(args.retries + 1):
        if attempt:
            await asyncio.sleep(args.retry_delay * (1 << (attempt - 1)))
        try:
            async with session.post(url, json=body) as resp:
                raw = await resp.read()
                if resp.status >= 500:
                    last = PromptFailed("vLLM answered %d: %s" % (resp.status, _excerpt(raw)))
                    continue
                if resp.status != 200:
                    raise PromptFailed("vLLM answered %d: %s" % (resp.status, _excerpt(raw)))
                try:
                    # json.loads, without scanning the routed experts' megabytes of base64
                    return rex.load_answer(raw)
                except ValueError:
                    raise PromptFailed("vLLM's answer is not JSON: %s" % _excerpt(raw)) \
                        from None
        except aiohttp.ClientConnectionError as e:
            last = Fatal("lost vLLM at %s: %s" % (args.vllm, e))
        except asyncio.TimeoutError:
            last = PromptFailed("no answer within --timeout %g s" % args.timeout)
    raise last


def _excerpt(raw):
    text = " ".join(raw.decode("utf-8", "replace").split())
    return text if len(text) <= 300 else text[:300] + " ..."


async def record_all(args, todo, recording, progress):
    """Records `todo` with at most args.concurrency requests in flight. Returns the failures
    [(prompt, reason)]; raises Fatal. Cancelled (a signal), it stops at once: in-flight requests
    are dropped and will be sent again by the next run."""
    failures = []
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await preflight(session, args)
        pending = iter(todo)

        async def worker():
            for prompt in pending:
                try:
                    doc = await fetch(session, args, prompt)
                    recording.accept(prompt, doc)
                    progress.advance()
                except PromptFailed as e:
                    failures.append((prompt, str(e)))
                    progress.advance(ok=False)
                    progress.message("eldr-record: prompt %r (line %d) failed: %s"
                                     % (prompt.id, prompt.line, e))

        tasks = [asyncio.ensure_future(worker()) for _ in range(min(args.concurrency, len(todo)))]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if t.exception() is not None:
                    raise t.exception()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return failures


def finalize(args, prompts, journal, failed_ids):
    """Writes the trace from the journal, in prompts-file order, then removes the journal."""
    layers = journal.layers
    recs = journal.requests
    if layers is None or not recs:
        raise Fatal("nothing was recorded")
    layer_map = rex.MoeLayerMap.from_dict(layers)
    max_id = max(int(r["max_id"]) for r in recs.values())
    top_k = layer_map.top_k
    if args.experts is not None:
        experts = args.experts
    else:
        experts = max(max_id + 1, top_k)
        print("eldr-record: experts per layer taken as %d (the largest id seen + 1); pass "
              "--experts with the model's routed experts if it has more" % experts,
              file=sys.stderr)
    geometry = eldr_trace.Geometry(len(layer_map.moe_layers), experts, top_k)
    requests = []
    for p in prompts:
        r = recs.get(p.id)
        if r is None:
            if p.id not in failed_ids:
                raise Fatal("prompt %r was neither recorded nor failed" % p.id)
            continue
        ids = np.frombuffer(r["experts"], dtype="<u%d" % int(r["width"]))
        requests.append(eldr_trace.TraceRequest(r["id"], r["label"], int(r["prompt_tokens"]),
                                                int(r["output_tokens"]), ids))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    source = ("eldr-record %s: vLLM %s, model %s, prompts %s, max_tokens %d, MoE layers %s of "
              "%d" % (when, args.vllm, args.model, os.path.basename(args.prompts),
                      args.max_tokens, rex.format_layer_list(layer_map.moe_layers),
                      layer_map.response_layers))
    eldr_trace.write_trace(args.out, args.model, geometry, source, requests)
    journal.remove()
    return geometry, layer_map, requests


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return _run(args)
    except (PromptError, jr.JournalError, eldr_trace.TraceError) as e:
        print("eldr-record: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    except Fatal as e:
        print("eldr-record: %s" % e, file=sys.stderr)
        return EXIT_VLLM


def _run(args):
    prompts, missing = load_prompts(args.prompts, args.label_key)
    if missing:
        print("eldr-record: %d of %d prompts have no label %r; their label is \"\""
              % (missing, len(prompts), args.label_key), file=sys.stderr)
    journal_path = args.out + ".journal"
    in_progress = os.path.exists(journal_path)   # then OUT, if present, is what we replace
    if args.restart and in_progress:
        os.unlink(journal_path)
    if os.path.exists(args.out) and not in_progress and not args.force:
        raise jr.JournalError("%s exists and no recording of it is in progress; pass --force to "
                              "overwrite it" % args.out)
    header = {"model": args.model, "max_tokens": args.max_tokens, "label_key": args.label_key,
              "moe_layers": args.moe_layers}
    journal = jr.Journal.open(journal_path, header)
    try:
        jr.report_notes(journal)
        todo = jr.plan_resume(prompts, journal.requests)
        if journal.requests:
            print("eldr-record: continuing %s: %d of %d prompts already recorded"
                  % (args.out, len(journal.requests), len(prompts)), file=sys.stderr)
        progress = _progress(args, len(prompts), len(prompts) - len(todo))
        recording = Recording(journal, args.moe_layers, args.experts)
        failures = []
        if todo:
            failures, signum = _run_loop(args, todo, recording, progress)
            progress.finish()
            if signum is not None:
                print("eldr-record: interrupted by %s; %d of %d prompts are recorded in %s: "
                      "rerun the same command to continue"
                      % (signal.Signals(signum).name, len(journal.requests), len(prompts),
                         journal_path), file=sys.stderr)
                return 128 + signum
        if failures and not args.skip_failed:
            print("eldr-record: %d prompts failed (above); %d of %d are recorded in %s. The "
                  "trace is not written: fix or remove them and rerun to continue, or rerun with "
                  "--skip-failed to write it without them"
                  % (len(failures), len(journal.requests), len(prompts), journal_path),
                  file=sys.stderr)
            return EXIT_FAILED
        geometry, layer_map, requests = finalize(args, prompts, journal,
                                                 {p.id for p, _ in failures})
    finally:
        journal.close()
    tokens_p = sum(r.prompt_tokens for r in requests)
    tokens_o = sum(r.output_tokens for r in requests)
    print("eldr-record: wrote %s: %d requests, %d prompt + %d output tokens; %d MoE layers "
          "(of %d; dense %s), %d experts, top_k %d%s"
          % (args.out, len(requests), tokens_p, tokens_o, geometry.layers,
             layer_map.response_layers, layer_map.dense_layers or "none", geometry.experts,
             geometry.top_k, "; skipped %d failed prompts" % len(failures) if failures else ""),
          file=sys.stderr)
    return EXIT_OK


class _Quiet:
    """A stream that drops everything: --progress none."""

    def write(self, text):
        pass

    def flush(self):
        pass

    def isatty(self):
        return False


def _progress(args, total, done):
    mode = args.progress
    if mode == "none":
        return Progress(total, done, stream=_Quiet(), tty=False)
    tty = None if mode == "auto" else mode == "bar"
    return Progress(total, done, stream=sys.stderr, tty=tty)


def _run_loop(args, todo, recording, progress):
    """Runs record_all until done or a SIGINT/SIGTERM; returns (failures, signal or None)."""
    loop = asyncio.new_event_loop()
    caught = []
    main_task = loop.create_task(record_all(args, todo, recording, progress))

    def on_signal(signum):
        if not caught:
            caught.append(signum)
            main_task.cancel()

    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, on_signal, s)
    try:
        progress.draw(force=True)
        try:
            return loop.run_until_complete(main_task), None
        except asyncio.CancelledError:
            return [], caught[0] if caught else signal.SIGINT
    finally:
        for s in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(s)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
