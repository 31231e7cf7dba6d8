"""The prompts file of eldr-record: JSON Lines, one request per line.

Each non-blank line is a JSON object with either
    "prompt":   a non-empty string                  -> POST /v1/completions
    "messages": a non-empty list of chat messages   -> POST /v1/chat/completions
and optionally
    "id":         a string or integer, unique in the file (default "line-N")
    "max_tokens": a positive integer overriding --max-tokens for this prompt
    <label key>:  the label (a string) when --label-key names it; absent -> ""
Other keys are ignored. Errors name the file and the line (1-based).
"""
import dataclasses
import hashlib
import json

MAX_ID_CHARS = 256


class PromptError(ValueError):
    """A prompts file that cannot be used; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class Prompt:
    line: int            # 1-based line number in the file
    id: str
    label: str
    kind: str            # "completion" or "chat"
    body: object         # the prompt string or the messages list
    max_tokens: object   # int or None (use --max-tokens)
    digest: str          # sha256 of the line's JSON value, canonicalised: resume checks it

    def request_json(self, model, default_max_tokens):
        """The body of the vLLM request (non-streaming: vLLM returns routed experts only there)."""
        body = {"model": model,
                "max_tokens": self.max_tokens if self.max_tokens is not None
                else default_max_tokens}
        body["prompt" if self.kind == "completion" else "messages"] = self.body
        return body

    @property
    def path(self):
        return "/v1/completions" if self.kind == "completion" else "/v1/chat/completions"


def _check_message(msg, where):
    if not isinstance(msg, dict):
        raise PromptError("%s: every item of messages must be an object" % where)
    if not isinstance(msg.get("role"), str) or not msg["role"]:
        raise PromptError("%s: every message needs a non-empty string role" % where)
    content = msg.get("content")
    if not isinstance(content, (str, list)) and content is not None:
        raise PromptError("%s: a message's content must be a string or a list of parts" % where)


def parse_line(text, line, name, label_key=None):
    """One line -> Prompt, or None for a blank line. Raises PromptError naming name:line."""
    where = "%s:%d" % (name, line)
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise PromptError("%s: not valid JSON: %s" % (where, e.msg)) from None
    if not isinstance(obj, dict):
        raise PromptError("%s: each line must be a JSON object" % where)
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        raise PromptError("%s: needs exactly one of \"prompt\" (a string) or \"messages\" (a "
                          "chat)" % where)
    if has_prompt:
        body, kind = obj["prompt"], "completion"
        if not isinstance(body, str) or not body:
            raise PromptError("%s: \"prompt\" must be a non-empty string" % where)
    else:
        body, kind = obj["messages"], "chat"
        if not isinstance(body, list) or not body:
            raise PromptError("%s: \"messages\" must be a non-empty list" % where)
        for m in body:
            _check_message(m, where)
    rid = obj.get("id", "line-%d" % line)
    if isinstance(rid, int) and not isinstance(rid, bool):
        rid = str(rid)
    if not isinstance(rid, str) or not rid or len(rid) > MAX_ID_CHARS:
        raise PromptError("%s: \"id\" must be a non-empty string (at most %d characters) or an "
                          "integer" % (where, MAX_ID_CHARS))
    label = ""
    if label_key is not None and label_key in obj:
        label = obj[label_key]
        if not isinstance(label, str):
            raise PromptError("%s: label %r must be a string, got %s"
                              % (where, label_key, type(label).__name__))
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 1):
        raise PromptError("%s: \"max_tokens\" must be a positive integer" % where)
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    return Prompt(line, rid, label, kind, body, max_tokens, digest)


def parse_prompts(lines, name, label_key=None):
    """lines: an iterable of str (without or with newline). Returns (prompts, missing_labels):
    missing_labels counts prompts without the label key when one was given."""
    prompts, seen, missing = [], {}, 0
    for i, text in enumerate(lines, start=1):
        p = parse_line(text, i, name, label_key)
        if p is None:
            continue
        if p.id in seen:
            raise PromptError("%s:%d: id %r is already used on line %d" % (name, i, p.id,
                                                                          seen[p.id]))
        seen[p.id] = i
        if label_key is not None and not p.label:
            missing += 1
        prompts.append(p)
    if not prompts:
        raise PromptError("%s: no prompts (the file has no non-blank line)" % name)
    return prompts, missing


def load_prompts(path, label_key=None):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise PromptError("%s: cannot read: %s" % (path, e.strerror)) from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    decoded = []
    for i, raw in enumerate(lines, start=1):
        try:
            decoded.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise PromptError("%s:%d: not UTF-8 (byte %d)" % (path, i, e.start)) from None
    return parse_prompts(decoded, path, label_key)
