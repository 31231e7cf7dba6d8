"""The journal of eldr-record: what a run has recorded so far, so that a rerun continues.

OUT.journal sits next to the trace being recorded. It starts with MAGIC, then holds frames
    [u32 little-endian payload length][u32 crc32 of the payload][payload: one MessagePack map]
appended and fsync'd one at a time:
    {"kind": "header", ...}     first: the settings that shape the recording (model, max_tokens,
                                 label key, --moe-layers); a rerun with other settings is
                                 refused rather than mixing two recordings in one trace
    {"kind": "layers", ...}     once, before the first request: the response geometry and which
                                 layers are MoE layers (eldr_routed_experts.MoeLayerMap.to_dict)
    {"kind": "request", ...}    one per recorded prompt: id, digest of its JSONL line, label,
                                 prompt_tokens, output_tokens, experts (bytes, `width` bytes per
                                 id, little-endian), max_id

A frame is whole or absent: a run killed in the middle of an append leaves a torn last frame,
which the next open() discards (and says so); everything before it is kept. Nothing here talks to
vLLM; decode_frames and plan_resume are pure and unit tested.
"""
import os
import struct
import sys
import zlib

import msgpack

MAGIC = b"eldr-record journal 1\n"
_FRAME = struct.Struct("<II")
MAX_FRAME = 1 << 31


class JournalError(ValueError):
    """A journal that cannot be continued; the message says what to do."""


def encode_frame(obj):
    payload = msgpack.packb(obj, use_bin_type=True)
    if len(payload) >= MAX_FRAME:
        raise JournalError("a journal record of %d bytes is too large" % len(payload))
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def decode_frames(data):
    """-> (objects, good_length, problem). Frames are read from after MAGIC until the data ends
    or a frame is torn or corrupt; good_length is where the good frames end (the file is cut
    there), problem says why reading stopped early ("" when it reached the end cleanly)."""
    if not data.startswith(MAGIC):
        raise JournalError("not an eldr-record journal (bad magic)")
    pos, objs = len(MAGIC), []
    while pos < len(data):
        if len(data) - pos < _FRAME.size:
            return objs, pos, "a torn frame header at byte %d" % pos
        length, crc = _FRAME.unpack_from(data, pos)
        start, end = pos + _FRAME.size, pos + _FRAME.size + length
        if end > len(data):
            return objs, pos, "a torn record at byte %d (%d of %d bytes)" % (
                pos, len(data) - start, length)
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            return objs, pos, "a record with a bad checksum at byte %d" % pos
        try:
            obj = msgpack.unpackb(payload, raw=False)
        except Exception as e:  # a checksummed frame that does not decode: written by a bug
            return objs, pos, "an undecodable record at byte %d: %s" % (pos, e)
        if not isinstance(obj, dict) or "kind" not in obj:
            return objs, pos, "a record without a kind at byte %d" % pos
        objs.append(obj)
        pos = end
    return objs, pos, ""


def check_header(found, wanted):
    """Raises JournalError when a journal's header differs from this run's settings."""
    diffs = ["%s: journal %r, now %r" % (k, found.get(k), wanted[k])
             for k in sorted(wanted) if k != "kind" and found.get(k) != wanted[k]]
    if diffs:
        raise JournalError("the journal was recorded with other settings (%s); rerun with the "
                           "same settings, or pass --restart to discard it" % "; ".join(diffs))


def plan_resume(prompts, recorded):
    """prompts: the prompts file's Prompt list; recorded: {id: request record} from the journal.
    Returns the prompts still to record, in file order. Raises JournalError when a recorded id is
    not in the file any more or its line changed (the trace would not match the file)."""
    by_id = {p.id: p for p in prompts}
    for rid, rec in recorded.items():
        p = by_id.get(rid)
        if p is None:
            raise JournalError("the journal holds prompt %r, which is no longer in the prompts "
                               "file; restore it or pass --restart" % rid)
        if rec.get("digest") != p.digest:
            raise JournalError("prompt %r (line %d) changed since it was recorded; restore it or "
                               "pass --restart" % (rid, p.line))
    return [p for p in prompts if p.id not in recorded]


class Journal:
    """An open journal file. open() reads what is there (cutting a torn tail), append() adds one
    record durably. Not thread safe: one writer."""

    def __init__(self, path, fd, header, layers, requests, notes):
        self.path = path
        self._fd = fd
        self.header = header
        self.layers = layers        # the "layers" record or None
        self.requests = requests    # {id: request record}, in journal order
        self.notes = notes          # what open() had to repair, for the user

    @classmethod
    def open(cls, path, header):
        """Opens path, creating it with header when absent; an existing journal must carry the
        same header (JournalError otherwise)."""
        notes = []
        if not os.path.exists(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            j = cls(path, fd, dict(header), None, {}, notes)
            j._write(MAGIC + encode_frame(dict(header, kind="header")))
            return j
        with open(path, "rb") as f:
            data = f.read()
        objs, good, problem = decode_frames(data)
        if not objs or objs[0]["kind"] != "header":
            raise JournalError("%s has no header record: not a journal this tool wrote; remove "
                               "it or pass --restart" % path)
        check_header(objs[0], header)
        layers, requests = None, {}
        for o in objs[1:]:
            if o["kind"] == "layers" and layers is None:
                layers = o
            elif o["kind"] == "request":
                if o.get("id") in requests:
                    notes.append("prompt %r was journalled twice; the first is kept" % o["id"])
                    continue
                requests[o["id"]] = o
        if problem:
            notes.append("discarded %s (the write an interruption cut short); the %d records "
                          "before it are kept" % (problem, len(objs)))
        fd = os.open(path, os.O_RDWR)
        if good < len(data):
            os.ftruncate(fd, good)
            os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_END)
        return cls(path, fd, objs[0], layers, requests, notes)

    def _write(self, data):
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        os.fsync(self._fd)

    def set_layers(self, record):
        if self.layers is not None:
            raise JournalError("layers recorded twice")
        rec = dict(record, kind="layers")
        self._write(encode_frame(rec))
        self.layers = rec

    def append_request(self, record):
        rec = dict(record, kind="request")
        if rec["id"] in self.requests:
            raise JournalError("prompt %r recorded twice" % rec["id"])
        self._write(encode_frame(rec))
        self.requests[rec["id"]] = rec

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self):
        self.close()
        os.unlink(self.path)


def report_notes(journal, stream=sys.stderr):
    for n in journal.notes:
        print("eldr-record: journal %s: %s" % (journal.path, n), file=stream)
