#!/usr/bin/python3
"""eldr_routed_experts: the expert ids vLLM returns with --enable-return-routed-experts, decoded
and reduced to a model's MoE layers.

What vLLM sends (checked in vLLM's source, see docs/vllm.md for the commits):
- vllm/entrypoints/openai/completion/protocol.py, CompletionResponseChoice.routed_experts: a
  base64 string of the bytes numpy's np.save writes (a .npy file), or null when the server runs
  without --enable-return-routed-experts. Decoded shape (num_tokens - 1, num_layers, top_k),
  dtype uint8, uint16 or int32. num_tokens is prompt + generated tokens; the last generated
  token was never forwarded, so it has no row. The chat completion choice carries the same field.
  It is only in non-streaming responses.
- vllm/model_executor/layers/fused_moe/routed_experts_capturer.py: the capture buffer has
  hf_config.num_hidden_layers layers and is zero-filled; only MoE layers write their rows, so a
  dense layer (e.g. DeepSeek's first_k_dense_replace leading layers) comes back as all zeros.

Older and forked vLLM builds returned the same array as nested JSON lists; decode() takes both.

    arr = decode(choice["routed_experts"])            # (tokens, response layers, top_k) ints
    layer_map = MoeLayerMap.from_spec("auto", arr)     # or "1-26": which layers are MoE layers
    moe = layer_map.select(arr)                        # (tokens, MoE layers, top_k)

    answer = load_answer(body_bytes)                   # json.loads, faster with them

Requirements: Debian's python3-numpy.
"""
import ast
import binascii
import json
import re

import numpy as np

NPY_MAGIC = b"\x93NUMPY"


# A key named routed_experts and the opening quote of its string value. In valid JSON these bytes
# are a key: every quote inside a string is escaped, and a string is followed by ':' only as a key.
_ROUTED_EXPERTS_KEY = re.compile(rb'"routed_experts"[ \t\n\r]*:[ \t\n\r]*"')


def load_answer(raw):
    """json.loads of a vLLM answer (bytes): the same value or the same ValueError, in a fraction
    of its time when the answer carries routed experts. Their base64 string (2 MB for 4,096
    tokens of a 48 x 128 x 8 model, where json.loads takes 2.3 ms and this 0.9:
    tools/eldr-proxy/bench_conversion.py's answer stages) is found by a byte search and taken
    out before the rest is parsed, then put back as the str json.loads makes of it. Taken this
    way only when the answer holds exactly one such key, at choices[0], and its string is plain
    printable ASCII without escapes; otherwise all of it is parsed as it is. eldr-proxy parses
    every prefill answer with it, eldr-record every recorded answer."""
    found = _ROUTED_EXPERTS_KEY.search(raw)
    if found is None or (found.start() > 0 and raw[found.start() - 1] == 0x5c):  # an escaped quote
        return json.loads(raw)
    begin = found.end()
    end = raw.find(b'"', begin)
    value = np.frombuffer(raw, dtype=np.uint8, count=max(end - begin, 0), offset=begin)
    if (end < 0 or raw.find(b"\\", begin, end) >= 0 or
            (value.size and (value.min() < 0x20 or value.max() > 0x7e)) or
            _ROUTED_EXPERTS_KEY.search(raw, end) is not None):
        return json.loads(raw)
    answer = json.loads(raw[:begin] + raw[end:])
    try:
        choice = answer["choices"][0]
        where_cut = choice.get("routed_experts") == ""
    except (TypeError, KeyError, IndexError, AttributeError):
        where_cut = False
    if not where_cut:  # the key was elsewhere (or the body is not an answer): parse it whole
        return json.loads(raw)
    choice["routed_experts"] = raw[begin:end].decode("ascii")
    return answer


class RoutedExpertsError(ValueError):
    """The routed experts of a response cannot be used; the message says why."""


_DTYPES = (np.dtype("u1"), np.dtype("<u2"), np.dtype("<i4"), np.dtype("<u4"), np.dtype("<i8"))


def decode(value):
    """The routed experts of one choice as an integer array (tokens, layers, top_k): the dtype
    vLLM sent (uint8, uint16 or int32; int64 for nested lists), ids >= 0.

    value is vLLM's field: a base64 .npy string or nested lists. Raises RoutedExpertsError for
    None (the server does not return routed experts) and for anything malformed. A .npy comes
    back as a read-only view of the decoded bytes (no copy: eldr-proxy decodes one per request,
    megabytes for a long prompt); its header is read with ast.literal_eval, never pickle."""
    if value is None:
        raise RoutedExpertsError("the response has no routed experts (null): is vLLM running "
                                 "with --enable-return-routed-experts?")
    if isinstance(value, str):
        try:
            raw = binascii.a2b_base64(value, strict_mode=True)
        except (binascii.Error, ValueError) as e:
            raise RoutedExpertsError("routed_experts is not valid base64: %s" % e) from None
        arr = _npy_view(raw)
    elif isinstance(value, list):
        try:
            arr = np.asarray(value, dtype=np.int64)
        except (ValueError, TypeError, OverflowError) as e:
            raise RoutedExpertsError("routed_experts lists are ragged or not integers: %s"
                                     % e) from None
    else:
        raise RoutedExpertsError("routed_experts must be a base64 string or a list, got %s"
                                 % type(value).__name__)
    if arr.ndim != 3:
        raise RoutedExpertsError("routed_experts must have 3 dimensions (tokens, layers, top_k), "
                                 "got shape %s" % (arr.shape,))
    if arr.size and arr.dtype.kind == "i" and int(arr.min()) < 0:
        raise RoutedExpertsError("routed_experts holds a negative expert id (%d)" % int(arr.min()))
    return arr


def _npy_view(raw):
    """The array of a .npy file's bytes (format 1.0, 2.0 or 3.0), as a view of them."""
    if not raw.startswith(NPY_MAGIC) or len(raw) < 10:
        raise RoutedExpertsError("routed_experts is base64 but not a .npy array (no %r magic)"
                                 % NPY_MAGIC)
    if raw[6] == 1:
        hlen, start = int.from_bytes(raw[8:10], "little"), 10
    elif raw[6] in (2, 3) and len(raw) >= 12:
        hlen, start = int.from_bytes(raw[8:12], "little"), 12
    else:
        raise RoutedExpertsError("routed_experts is a .npy array of unknown version %d" % raw[6])
    try:
        if start + hlen > len(raw) or hlen > 65536:
            raise ValueError("a header of %d bytes" % hlen)
        header = ast.literal_eval(raw[start:start + hlen].decode("latin-1"))
        dtype = np.dtype(header["descr"])
        shape = tuple(int(n) for n in header["shape"])
        fortran = header["fortran_order"]
        if any(n < 0 for n in shape) or fortran not in (True, False):
            raise ValueError("shape %s" % (shape,))
    except Exception as e:  # a literal of the wrong shape raises anything
        raise RoutedExpertsError("routed_experts is not a readable .npy array: %s" % e) from None
    if dtype not in _DTYPES:
        raise RoutedExpertsError("routed_experts must hold integers, got %s" % dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) - start - hlen != count * dtype.itemsize:
        raise RoutedExpertsError("routed_experts is not a readable .npy array: %d data bytes "
                                 "for shape %s of %s" % (len(raw) - start - hlen, shape, dtype))
    flat = np.frombuffer(raw, dtype=dtype, count=count, offset=start + hlen)
    return flat.reshape(shape, order="F" if fortran else "C")


def dense_layers_of(arr):
    """The response layers whose every id is 0 over all tokens: layers vLLM never captured,
    i.e. dense layers. Only meaningful for top_k >= 2, where a routed layer picks k distinct
    ids, so at least one is nonzero for every token."""
    if arr.shape[0] == 0:
        return []
    return [int(l) for l in np.flatnonzero(~arr.any(axis=(0, 2)))]


def parse_layer_list(spec, total_layers):
    """'1-26' or '1,3,5-9' (inclusive ranges) -> sorted distinct layer indices < total_layers."""
    layers = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            raise ValueError("empty item in layer list %r" % spec)
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise ValueError("layer list %r: %r is not a layer index or a range a-b"
                             % (spec, part)) from None
        if a < 0 or b < a:
            raise ValueError("layer list %r: bad range %r" % (spec, part))
        if b >= total_layers:
            raise ValueError("layer list %r: layer %d, but the responses have %d layers "
                             "(0..%d)" % (spec, b, total_layers, total_layers - 1))
        layers.update(range(a, b + 1))
    return sorted(layers)


def format_layer_list(layers):
    """[1, 2, 3, 5] -> '1-3,5': the inverse of parse_layer_list."""
    parts, run = [], []
    for l in sorted(layers):
        if run and l == run[-1] + 1:
            run.append(l)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else "%d-%d" % (run[0], run[-1]))
        run = [l]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else "%d-%d" % (run[0], run[-1]))
    return ",".join(parts)


class MoeLayerMap:
    """Which of vLLM's layers (hf_config.num_hidden_layers of them) are MoE layers, in order.

    eldr's geometry counts MoE layers only: eldr layer i is response layer moe_layers[i]. The
    other layers are dense: vLLM returns them as zeros."""

    def __init__(self, response_layers, top_k, moe_layers):
        self.response_layers = response_layers
        self.top_k = top_k
        self.moe_layers = sorted(set(moe_layers))
        if not self.moe_layers:
            raise RoutedExpertsError("none of the %d layers is a MoE layer: nothing to record"
                                     % response_layers)
        if self.moe_layers[0] < 0 or self.moe_layers[-1] >= response_layers:
            raise RoutedExpertsError("MoE layer %d is outside the %d layers of the responses"
                                     % (self.moe_layers[-1], response_layers))
        moe = set(self.moe_layers)
        self.dense_layers = [l for l in range(response_layers) if l not in moe]
        first, last = self.moe_layers[0], self.moe_layers[-1]
        # Contiguous MoE layers (the usual case) are selected as a view, not a copy.
        self._select = (slice(first, last + 1) if last - first + 1 == len(self.moe_layers)
                        else self.moe_layers)

    @classmethod
    def from_spec(cls, spec, arr):
        """spec: 'auto' (the MoE layers are those of arr that are not all zeros; needs
        top_k >= 2), 'all', or a layer list such as '1-26' (DeepSeek-V2-Lite: layer 0 is dense).
        The same list as eldr-proxy's --moe-layers."""
        _, layers, top_k = arr.shape
        if layers < 1 or top_k < 1:
            raise RoutedExpertsError("routed_experts has shape %s: no layers or no experts per "
                                     "token" % (arr.shape,))
        if spec == "auto":
            if top_k < 2:
                raise RoutedExpertsError(
                    "top_k is 1, so dense layers (all zeros) cannot be told from MoE layers that "
                    "picked expert 0: pass --moe-layers all or a list such as 1-26")
            if arr.shape[0] == 0:
                raise RoutedExpertsError("no tokens to tell dense layers from")
            dense = set(dense_layers_of(arr))
            return cls(layers, top_k, [l for l in range(layers) if l not in dense])
        if spec == "all":
            return cls(layers, top_k, range(layers))
        try:
            return cls(layers, top_k, parse_layer_list(spec, layers))
        except ValueError as e:
            raise RoutedExpertsError("--moe-layers: %s" % e) from None

    def to_dict(self):
        return {"response_layers": self.response_layers, "top_k": self.top_k,
                "moe_layers": list(self.moe_layers)}

    @classmethod
    def from_dict(cls, d):
        return cls(int(d["response_layers"]), int(d["top_k"]), [int(x) for x in d["moe_layers"]])

    def select(self, arr):
        """The MoE layers of arr (tokens, MoE layers, top_k), checked against this map: the same
        layer count and top_k, and the other layers still all zeros (else the map is wrong)."""
        if arr.shape[1:] != (self.response_layers, self.top_k):
            raise RoutedExpertsError(
                "routed_experts has %d layers x top_k %d, earlier responses had %d x %d"
                % (arr.shape[1], arr.shape[2], self.response_layers, self.top_k))
        if self.dense_layers and arr.shape[0]:
            used = arr[:, self.dense_layers, :].any(axis=(0, 2))
            if used.any():
                layer = self.dense_layers[int(np.flatnonzero(used)[0])]
                raise RoutedExpertsError(
                    "layer %d was taken as dense (all zeros) but this response has routed "
                    "experts there: give --moe-layers explicitly" % layer)
        return arr[:, self._select, :]
