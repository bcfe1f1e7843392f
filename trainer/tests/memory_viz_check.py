"""Reads a Plimsoll memory_snapshot.pickle with Python's pickle and checks the structure PyTorch's
memory_viz expects of torch.cuda.memory._snapshot(): segments whose blocks tile them, a device
trace of known actions whose allocations and frees pair up by address, and only the pickle
opcodes memory_viz's own JavaScript unpickler reads. Usage: memory_viz_check.py SNAPSHOT TIMELINE_JSON
Prints one line of counts; exits non-zero with the reason on any mismatch."""
import json
import pickle
import pickletools
import sys

# The opcodes MemoryViz.js's unpickler handles (torch/utils/viz/MemoryViz.js).
VIEWER_OPCODES = {
    "APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME",
    "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP",
    "TUPLE2", "APPEND", "NEWFALSE", "BINPUT", "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE",
    "BINFLOAT", "SETITEM", "TUPLE", "LONG_BINPUT", "TUPLE1", "TUPLE3",
}
SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size",
                "requested_size", "stream", "segment_type", "segment_pool_id", "is_expandable",
                "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"}


def fail(message):
    print("memory_viz check failed: " + message)
    sys.exit(1)


def main(snapshot_path, timeline_path):
    raw = open(snapshot_path, "rb").read()
    used = {op.name for op, _, _ in pickletools.genops(raw)}
    if not used <= VIEWER_OPCODES:
        fail("opcodes memory_viz cannot read: %s" % sorted(used - VIEWER_OPCODES))
    data = pickle.loads(raw)
    for key in ("segments", "device_traces", "categories"):
        if key not in data:
            fail("no %r" % key)
    live_blocks = {}
    for seg in data["segments"]:
        if not SEGMENT_KEYS <= set(seg):
            fail("segment keys missing: %s" % sorted(SEGMENT_KEYS - set(seg)))
        at = seg["address"]
        active = 0
        for block in seg["blocks"]:
            if not BLOCK_KEYS <= set(block):
                fail("block keys missing: %s" % sorted(BLOCK_KEYS - set(block)))
            if block["address"] != at:
                fail("blocks do not tile segment %#x at %#x" % (seg["address"], at))
            at += block["size"]
            if block["state"] == "active_allocated":
                active += block["size"]
                live_blocks[block["address"]] = block["size"]
            elif block["state"] != "inactive":
                fail("block state %r" % block["state"])
        if at != seg["address"] + seg["total_size"]:
            fail("blocks cover %d of %d bytes" % (at - seg["address"], seg["total_size"]))
        if active != seg["allocated_size"]:
            fail("allocated_size %d, active blocks %d" % (seg["allocated_size"], active))
    if len(data["device_traces"]) != 1:
        fail("%d device traces" % len(data["device_traces"]))
    trace = data["device_traces"][0]
    allocated_in_trace = {}
    counts = {}
    last_time = 0
    for entry in trace:
        action = entry["action"]
        if action not in ACTIONS:
            fail("action %r" % action)
        counts[action] = counts.get(action, 0) + 1
        if entry["time_us"] < last_time:
            fail("time goes back")
        last_time = entry["time_us"]
        if action == "alloc":
            if entry["addr"] in allocated_in_trace:
                fail("address %#x allocated twice" % entry["addr"])
            allocated_in_trace[entry["addr"]] = entry["size"]
            if not entry["frames"] or entry["category"] not in data["categories"]:
                fail("alloc without a label frame or category: %r" % entry)
        elif action == "free_completed":
            allocated_in_trace.pop(entry["addr"], None)
        elif action == "oom" and "device_free" not in entry:
            fail("oom without device_free")
    # What the trace allocated and did not free is live in the final segments, at its size.
    for addr, size in allocated_in_trace.items():
        if live_blocks.get(addr) != size:
            fail("allocation at %#x (%d bytes) is not a live block at the end" % (addr, size))
    # The same events as the timeline's own JSON.
    timeline = json.load(open(timeline_path))
    kinds = [e[1] for e in timeline["events"]]
    expected = {"alloc": kinds.count(0), "free_completed": kinds.count(1),
                "segment_alloc": kinds.count(2), "segment_free": kinds.count(3), "oom": kinds.count(4)}
    for action, n in expected.items():
        if counts.get(action, 0) != n:
            fail("%d %s entries, the timeline has %d" % (counts.get(action, 0), action, n))
    print("memory_viz snapshot ok: %d segments, %d trace entries, %s"
          % (len(data["segments"]), len(trace), json.dumps(counts, sort_keys=True)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
